//! `pack`: walks the input, plans partitions, reads and compresses files on
//! every core, appends them to the partitions in a fixed order, and writes
//! the manifest last.
//!
//! Pipeline: the files of all partitions form one job list in partition-id
//! order. `threads` workers claim batches of consecutive jobs in that order
//! (bounded by a window of batches and of bytes held in memory), read +
//! check + compress + hash them, and send each batch's results to the
//! writer (the calling thread), which appends results strictly in job
//! order. So the bytes written never depend on the thread count or on
//! timing.
//!
//! Files larger than [`STREAM_THRESHOLD`] stored raw are never held in
//! memory: the worker only opens them and the writer streams them into the
//! partition with [`PartitionWriter::append_raw_stream`]. Compressed big
//! files are compressed as a stream into memory (the result is smaller than
//! the file, or the file is stored raw).
//!
//! Failure safety: partitions are written first, the manifest last (to a
//! temporary name, fsync, rename, fsync of the directory). A failed run
//! removes every file it wrote, so no output it leaves behind passes
//! `verify`, and the output directory is refused if it already holds a
//! dataset or partitions of an unfinished one.

use crate::assign::{self, AssignError, FileWeight, PartitionCount, PlannedPartition};
use crate::holes::HoleAwareReader;
use crate::ident;
use crate::progress::{Progress, ProgressMode, ScanProgress};
use crate::sys;
use crate::walk::{self, display_path, EntryKind, Tree, WalkError, WalkOptions};
use fanstore_core::align;
use fanstore_core::checksum::xxh3;
use fanstore_core::codec::{self, Codec, Compression};
use fanstore_core::manifest::{self, BuildEntry, BuildError, BuildKind, ManifestBuilder, ManifestLayout, PartitionInfo};
use fanstore_core::partition::{self, PartitionWriter, FLAG_REPLICATED, HEADER_LEN};
use fanstore_core::FormatError;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// Files above this size stored raw are streamed, never held in memory.
pub const STREAM_THRESHOLD: u64 = 64 << 20;
/// Bytes of read or compressed payloads the workers may hold ahead of the writer.
const IN_FLIGHT_BUDGET: u64 = 256 << 20;
/// Name of the manifest while it is being written.
const MANIFEST_TMP: &str = ".manifest.fsm.tmp";

/// What to pack and how.
#[derive(Debug, Clone)]
pub struct PackOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    pub partitions: PartitionCount,
    pub compression: Compression,
    /// Directories (relative to the input) whose files every node loads.
    pub replicate_dirs: Vec<PathBuf>,
    /// Worker threads (at least 1).
    pub threads: usize,
    pub skip_unreadable: bool,
    pub skip_special: bool,
    pub progress: ProgressMode,
    /// Time between plain progress lines.
    pub progress_interval: std::time::Duration,
}

/// What a pack did.
#[derive(Debug, Clone, PartialEq)]
pub struct PackSummary {
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    /// Entries left out by `--skip-unreadable` / `--skip-special`.
    pub skipped: u64,
    /// Logical bytes of the packed files.
    pub bytes_in: u64,
    /// Payload bytes in the partitions (after compression).
    pub bytes_stored: u64,
    pub partitions: u32,
    pub replicated_partitions: u32,
    pub dataset_id: u64,
    pub seconds: f64,
}

impl std::fmt::Display for PackSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.seconds.max(1e-9);
        let ratio = if self.bytes_stored == 0 { 1.0 } else { self.bytes_in as f64 / self.bytes_stored as f64 };
        write!(
            f,
            "packed {} files, {} directories, {} symlinks ({} skipped) into {} partitions ({} replicated): \
             {:.1} MB in, {:.1} MB stored, ratio {ratio:.2}, {:.2} s, {:.1} MB/s, {:.0} files/s, dataset id {:#018x}",
            self.files,
            self.directories,
            self.symlinks,
            self.skipped,
            self.partitions,
            self.replicated_partitions,
            self.bytes_in as f64 / 1e6,
            self.bytes_stored as f64 / 1e6,
            self.seconds,
            self.bytes_in as f64 / 1e6 / secs,
            self.files as f64 / secs,
            self.dataset_id
        )
    }
}

/// Why a pack failed. Each names the path at fault.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{}: already holds a dataset ({found}); choose another --output or remove it first", .dir.display())]
    OutputHoldsDataset { dir: PathBuf, found: String },
    #[error("output {} is inside the input tree {}", .output.display(), .input.display())]
    OutputInsideInput { output: PathBuf, input: PathBuf },
    #[error("output {}: {source}", .path.display())]
    OutputDir { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Walk(#[from] WalkError),
    #[error("--replicate-dir {dir}: {problem}")]
    ReplicateDir { dir: String, problem: String },
    #[error(transparent)]
    Assign(#[from] AssignError),
    #[error("{}: unreadable file: {source} (use --skip-unreadable to leave it out)", .path.display())]
    Unreadable { path: PathBuf, source: io::Error },
    #[error("{}: read error while streaming it into a partition: {source}", .path.display())]
    ReadMidStream { path: PathBuf, source: io::Error },
    #[error("{}: changed size while being packed (listed with {listed} bytes, {found})", .path.display())]
    ChangedSize { path: PathBuf, listed: u64, found: String },
    #[error("{}: is no longer a regular file (it changed while being packed)", .path.display())]
    Replaced { path: PathBuf },
    #[error("{}: compression failed: {source}", .path.display())]
    Compress { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("cannot build the manifest: {0}")]
    Manifest(#[from] BuildError),
    #[error("{}: cannot write the manifest: {source}", .path.display())]
    WriteManifest { path: PathBuf, source: io::Error },
    #[error("internal error: {0}")]
    Internal(String),
}

/// Packs `opts.input` into the dataset directory `opts.output`.
pub fn pack(opts: &PackOptions) -> Result<PackSummary, PackError> {
    let start = Instant::now();
    let mut phase = PhaseTimer::new();
    let mut out = OutputDir::prepare(&opts.output)?;
    refuse_output_inside_input(&opts.input, &opts.output)?;

    let mut scan = ScanProgress::new(opts.progress, opts.progress_interval);
    let walk_opts = WalkOptions { skip_unreadable: opts.skip_unreadable, skip_special: opts.skip_special, threads: opts.threads };
    let tree = walk::walk(&opts.input, walk_opts, |n| scan.update(n))?;
    scan.finish();
    phase.done("walk");

    let replicate = replicate_prefixes(&opts.replicate_dirs, &tree)?;
    let files: Vec<usize> = (0..tree.entries.len()).filter(|&i| matches!(tree.entries[i].kind, EntryKind::File { .. })).collect();
    let weights: Vec<FileWeight> = files
        .iter()
        .map(|&i| {
            let e = &tree.entries[i];
            FileWeight { size: file_size(&e.kind), replicated: replicate.iter().any(|r| is_under(&e.path, r)) }
        })
        .collect();
    let plan = assign::plan(&weights, opts.partitions)?;
    let dataset_id = ident::dataset_id(&tree.entries, opts.compression, &plan);
    log::debug!("{} files in {} partitions, dataset id {dataset_id:#018x}", files.len(), plan.len());
    phase.done("plan and dataset id");

    let written = write_partitions(opts, &tree, &files, &plan, dataset_id, &mut out)?;
    phase.done("partitions");

    // The tree is not needed any more: its paths move into the manifest
    // builder (1.28M copies of paths were a tenth of the manifest phase).
    let walk_skipped = tree.skipped.len();
    let mut builder = ManifestBuilder::new(dataset_id);
    let (mut directories, mut symlinks) = (0u64, 0u64);
    let mut file_no = 0usize;
    for e in tree.entries {
        let size = file_size(&e.kind);
        let kind = match e.kind {
            EntryKind::Dir => {
                directories += 1;
                BuildKind::Dir
            }
            EntryKind::Symlink { target } => {
                symlinks += 1;
                BuildKind::Symlink { target }
            }
            EntryKind::File { .. } => {
                let place = written.places[file_no];
                file_no += 1;
                let Some(p) = place else { continue };
                BuildKind::File {
                    partition: p.partition,
                    payload_offset: p.payload_offset,
                    stored_len: p.stored_len,
                    codec: p.codec,
                    checksum: p.checksum,
                    replicated: p.replicated,
                }
            }
        };
        builder.add(BuildEntry {
            path: e.path,
            perm: e.perm,
            size,
            mtime_ns: e.mtime_ns,
            atime_ns: e.atime_ns,
            ctime_ns: e.ctime_ns,
            kind,
        });
    }
    for info in &written.infos {
        builder.add_partition(*info);
    }
    let manifest = builder.build()?;
    phase.done("manifest build");
    out.write_manifest(&manifest)?;
    out.commit();
    phase.done("manifest write");

    let packed = written.places.iter().flatten();
    Ok(PackSummary {
        files: packed.clone().count() as u64,
        directories: directories.saturating_sub(1), // the root is not counted
        symlinks,
        skipped: (walk_skipped + written.skipped) as u64,
        bytes_in: packed.clone().map(|p| p.raw_len).sum(),
        bytes_stored: packed.map(|p| p.stored_len).sum(),
        partitions: plan.len() as u32,
        replicated_partitions: plan.iter().filter(|p| p.replicated).count() as u32,
        dataset_id,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Logs (at debug level) how long each phase of a pack took.
struct PhaseTimer(Instant);

impl PhaseTimer {
    fn new() -> PhaseTimer {
        PhaseTimer(Instant::now())
    }

    fn done(&mut self, phase: &str) {
        let now = Instant::now();
        log::debug!("{phase}: {:.3} s", (now - self.0).as_secs_f64());
        self.0 = now;
    }
}

fn file_size(kind: &EntryKind) -> u64 {
    match kind {
        EntryKind::File { size } => *size,
        _ => 0,
    }
}

/// `path` is `dir` or below it (`dir` empty: everything).
fn is_under(path: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() || (path.starts_with(dir) && path.get(dir.len()) == Some(&b'/'))
}

/// Checks each `--replicate-dir` names a directory of the tree and returns
/// them as normalised relative byte paths.
fn replicate_prefixes(dirs: &[PathBuf], tree: &Tree) -> Result<Vec<Vec<u8>>, PackError> {
    let mut out = Vec::new();
    for d in dirs {
        let shown = d.display().to_string();
        let bad = |problem: &str| PackError::ReplicateDir { dir: shown.clone(), problem: problem.into() };
        let raw = d.as_os_str().as_bytes();
        if raw.first() == Some(&b'/') {
            return Err(bad("must be relative to --input"));
        }
        let comps: Vec<&[u8]> = walk::components(raw).filter(|c| *c != b".").collect();
        if comps.iter().any(|c| *c == b"..") {
            return Err(bad("must not contain '..'"));
        }
        let rel = comps.join(&b'/');
        let found = tree.entries.binary_search_by(|e| walk::tree_order(&e.path, &rel));
        match found.map(|i| &tree.entries[i].kind) {
            Ok(EntryKind::Dir) => out.push(rel),
            Ok(_) => return Err(bad("is not a directory of the input")),
            Err(_) => return Err(bad("no such directory in the input")),
        }
    }
    Ok(out)
}

fn refuse_output_inside_input(input: &Path, output: &Path) -> Result<(), PackError> {
    let (Ok(i), Ok(o)) = (std::fs::canonicalize(input), std::fs::canonicalize(output)) else {
        return Ok(()); // the walk reports a missing input with its own message
    };
    if o.starts_with(&i) {
        return Err(PackError::OutputInsideInput { output: output.into(), input: input.into() });
    }
    Ok(())
}

/// Where one file ended up.
#[derive(Debug, Clone, Copy)]
struct FilePlace {
    partition: u32,
    payload_offset: u64,
    raw_len: u64,
    stored_len: u64,
    codec: Codec,
    checksum: u64,
    replicated: bool,
}

/// What the writer produced.
struct Written {
    /// One per file (indexing the packer's file list); `None` if skipped.
    places: Vec<Option<FilePlace>>,
    infos: Vec<PartitionInfo>,
    skipped: usize,
}

/// A file read (and maybe compressed) by a worker.
enum Loaded {
    /// The payload is `bytes[start..]` (what is before is padding).
    Memory { codec: Codec, bytes: Vec<u8>, start: usize, checksum: u64 },
    /// A small file: its payload is the next `len` bytes of its batch's data.
    Small { codec: Codec, len: usize, checksum: u64 },
    /// A big raw file: the writer streams it from this reader.
    Stream(HoleAwareReader),
}

/// Why a worker could not load a file (the writer adds the path).
enum LoadError {
    Unreadable(io::Error),
    ChangedSize(String),
    Replaced,
    Compress(io::Error),
}

/// One unit of work: file `file` (index into the file list) goes to partition `part`.
struct Job {
    file: usize,
    part: usize,
}

fn write_partitions(
    opts: &PackOptions,
    tree: &Tree,
    files: &[usize],
    plan: &[PlannedPartition],
    dataset_id: u64,
    out: &mut OutputDir,
) -> Result<Written, PackError> {
    let jobs: Vec<Job> = plan.iter().enumerate().flat_map(|(part, p)| p.files.iter().map(move |&file| Job { file, part })).collect();
    let size_of = |job: &Job| file_size(&tree.entries[files[job.file]].kind);
    let cost_of = |job: &Job| {
        let size = size_of(job);
        if size > STREAM_THRESHOLD && opts.compression.codec == Codec::None {
            0
        } else {
            size
        }
    };
    let threads = opts.threads.max(1);
    let sched = Scheduler::new(jobs.len(), threads * 4 + 4, IN_FLIGHT_BUDGET);
    let pool = BufferPool::new(IN_FLIGHT_BUDGET as usize);
    let total_bytes: u64 = jobs.iter().map(size_of).sum();
    let mut progress = Progress::new(opts.progress, opts.progress_interval, "packing", jobs.len() as u64, total_bytes);
    let (tx, rx) = mpsc::channel::<Batch>();
    let root = tree.root_fd.as_fd();
    let result = std::thread::scope(|s| {
        for _ in 0..threads {
            let tx = tx.clone();
            let (sched, jobs, pool) = (&sched, &jobs, &pool);
            s.spawn(move || {
                let _guard = AbortOnPanic(sched);
                let mut bufs = WorkerBuffers { z: codec::Compressor::new(), scratch: Vec::new(), data: Vec::new() };
                while let Some(claim) = sched.claim(|i| size_of(&jobs[i]), |i| cost_of(&jobs[i])) {
                    let mut results = Vec::with_capacity(claim.costs.len());
                    let small: u64 = (claim.start..claim.start + claim.costs.len())
                        .map(|i| size_of(&jobs[i]))
                        .filter(|&n| n <= SMALL_MAX)
                        .sum();
                    bufs.data = pool.take(small as usize);
                    for (k, &cost) in claim.costs.iter().enumerate() {
                        let e = &tree.entries[files[jobs[claim.start + k].file]];
                        results.push((cost, load(root, &e.path, file_size(&e.kind), opts.compression, pool, &mut bufs)));
                    }
                    let data = std::mem::take(&mut bufs.data);
                    if tx.send(Batch { start: claim.start, results, data }).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut writer = Writer {
            opts,
            tree,
            files,
            plan,
            jobs: &jobs,
            sched: &sched,
            pool: &pool,
            rx,
            pending: HashMap::new(),
            next: 0,
            batch: Vec::new().into_iter(),
            batch_data: Vec::new(),
            batch_pos: 0,
            batch_jobs: 0,
            batch_cost: 0,
        };
        let r = writer.run(dataset_id, out, &mut progress);
        if r.is_err() {
            sched.abort();
        }
        r
    });
    progress.finish();
    result
}

/// The writer half of the pipeline: appends results in job order.
struct Writer<'a> {
    opts: &'a PackOptions,
    tree: &'a Tree,
    files: &'a [usize],
    plan: &'a [PlannedPartition],
    jobs: &'a [Job],
    sched: &'a Scheduler,
    pool: &'a BufferPool,
    rx: mpsc::Receiver<Batch>,
    /// Batches received ahead of their turn, by first job.
    pending: HashMap<usize, Batch>,
    /// The job to append next.
    next: usize,
    /// What is left of the batch being appended, its job count and cost.
    batch: std::vec::IntoIter<JobResult>,
    /// The batch's small payloads, and how far the writer got in them.
    batch_data: Vec<u8>,
    batch_pos: usize,
    batch_jobs: usize,
    batch_cost: u64,
}

/// A worker's result for one job: its cost against the byte budget, and the loaded file.
type JobResult = (u64, Result<Loaded, LoadError>);

/// A worker's results for the jobs `start..start + results.len()`; the
/// payloads of the small files among them, one after the other, in `data`
/// (one allocation per batch instead of two or three per file).
struct Batch {
    start: usize,
    results: Vec<JobResult>,
    data: Vec<u8>,
}

/// Files up to this size are read into the worker's scratch buffer and
/// their payloads appended to the batch's data.
const SMALL_MAX: u64 = codec::REUSE_MAX as u64;

/// What a worker reuses from file to file.
struct WorkerBuffers {
    z: codec::Compressor,
    /// The raw bytes of the small file being loaded.
    scratch: Vec<u8>,
    /// The current batch's small payloads.
    data: Vec<u8>,
}

impl Writer<'_> {
    /// The result of job `self.next`, waiting for its batch if need be.
    fn next_result(&mut self) -> Result<Result<Loaded, LoadError>, PackError> {
        if let Some((_, r)) = self.batch.next() {
            return Ok(r);
        }
        let Batch { results, data, .. } = loop {
            if let Some(b) = self.pending.remove(&self.next) {
                break b;
            }
            match self.rx.recv() {
                Ok(b) => {
                    self.pending.insert(b.start, b);
                }
                Err(_) => return Err(PackError::Internal("the worker threads stopped early".into())),
            }
        };
        self.pool.give(std::mem::replace(&mut self.batch_data, data));
        self.batch_pos = 0;
        self.batch_jobs = results.len();
        self.batch_cost = results.iter().map(|(cost, _)| cost).sum();
        self.batch = results.into_iter();
        match self.batch.next() {
            Some((_, r)) => Ok(r),
            None => Err(PackError::Internal(format!("empty batch at job {}", self.next))),
        }
    }

    /// Job `self.next` is appended: the scheduler learns when its whole batch is.
    fn job_written(&mut self) {
        self.next += 1;
        if self.batch.len() == 0 {
            self.sched.written(self.batch_jobs, self.batch_cost);
            self.batch_jobs = 0;
            self.batch_cost = 0;
        }
    }

    fn run(&mut self, dataset_id: u64, out: &mut OutputDir, progress: &mut Progress) -> Result<Written, PackError> {
        let mut places: Vec<Option<FilePlace>> = vec![None; self.files.len()];
        let mut infos = Vec::with_capacity(self.plan.len());
        let mut skipped = 0;
        for (part_index, part) in self.plan.iter().enumerate() {
            let path = out.dir.join(partition::file_name(part.id));
            out.track(path.clone());
            let flags = if part.replicated { FLAG_REPLICATED } else { 0 };
            let mut w = PartitionWriter::create(&path, part.id, flags)?;
            let mut logical_bytes = 0u64;
            for _ in &part.files {
                let job = &self.jobs[self.next];
                debug_assert_eq!(job.part, part_index);
                let entry = &self.tree.entries[self.files[job.file]];
                let size = file_size(&entry.kind);
                let shown = || display_path(&self.tree.root, &entry.path);
                let loaded = self.next_result()?;
                let path_hash = xxh3(&entry.path);
                let place = match loaded {
                    Ok(Loaded::Small { codec, len, checksum }) => {
                        let end = self.batch_pos + len;
                        let Some(bytes) = self.batch_data.get(self.batch_pos..end) else {
                            return Err(PackError::Internal(format!("batch data too short for job {}", self.next)));
                        };
                        let off = w.append(path_hash, size, codec, bytes)?;
                        self.batch_pos = end;
                        Some((off, len as u64, codec, checksum))
                    }
                    Ok(Loaded::Memory { codec, bytes, start, checksum }) => {
                        let off = w.append(path_hash, size, codec, &bytes[start..])?;
                        let stored_len = (bytes.len() - start) as u64;
                        self.pool.give(bytes);
                        Some((off, stored_len, codec, checksum))
                    }
                    Ok(Loaded::Stream(reader)) => {
                        let mut input = TrackingReader { inner: reader, count: 0, error: None };
                        match w.append_raw_stream(path_hash, size, &mut input) {
                            Ok((off, checksum)) => match check_size_unchanged(input.inner.file(), size) {
                                Ok(()) => Some((off, size, Codec::None, checksum)),
                                Err(LoadError::ChangedSize(found)) => return Err(PackError::ChangedSize { path: shown(), listed: size, found }),
                                Err(_) => return Err(PackError::Replaced { path: shown() }),
                            },
                            Err(e) => {
                                return Err(if let Some(source) = input.error {
                                    PackError::ReadMidStream { path: shown(), source }
                                } else if input.count != size {
                                    PackError::ChangedSize { path: shown(), listed: size, found: describe_count(input.count, size) }
                                } else {
                                    PackError::Format(FormatError::io(&path, e))
                                });
                            }
                        }
                    }
                    Err(LoadError::Unreadable(e)) if self.opts.skip_unreadable => {
                        log::warn!("skipping unreadable file {}: {e}", shown().display());
                        skipped += 1;
                        None
                    }
                    Err(LoadError::Unreadable(source)) => return Err(PackError::Unreadable { path: shown(), source }),
                    Err(LoadError::ChangedSize(found)) => return Err(PackError::ChangedSize { path: shown(), listed: size, found }),
                    Err(LoadError::Replaced) => return Err(PackError::Replaced { path: shown() }),
                    Err(LoadError::Compress(source)) => return Err(PackError::Compress { path: shown(), source }),
                };
                if let Some((payload_offset, stored_len, codec, checksum)) = place {
                    logical_bytes += size;
                    places[job.file] = Some(FilePlace {
                        partition: part.id,
                        payload_offset,
                        raw_len: size,
                        stored_len,
                        codec,
                        checksum,
                        replicated: part.replicated,
                    });
                }
                self.job_written();
                progress.advance(1, size);
            }
            let header = w.finish(dataset_id)?;
            infos.push(PartitionInfo {
                id: part.id,
                flags,
                file_len: HEADER_LEN as u64 + header.data_len,
                entry_count: header.entry_count,
                logical_bytes,
                header_checksum: header.checksum,
            });
        }
        Ok(Written { places, infos, skipped })
    }
}

fn describe_count(count: u64, listed: u64) -> String {
    if count > listed {
        format!("it now has more than {listed} bytes")
    } else {
        format!("only {count} bytes could be read")
    }
}

/// Opens a file of the tree for reading without following symlinks,
/// without blocking (should it have become a fifo), and without updating
/// its access time where the kernel allows.
fn open_input(root: BorrowedFd<'_>, rel: &[u8]) -> io::Result<File> {
    let flags = libc::O_RDONLY | libc::O_NONBLOCK;
    let fd = match sys::open_beneath(root, rel, flags | libc::O_NOATIME, 0) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => sys::open_beneath(root, rel, flags, 0)?,
        other => other?,
    };
    Ok(File::from(fd))
}

/// Reads one file, checks it still has its listed size, and compresses it
/// if that shrinks it.
fn load(root: BorrowedFd<'_>, rel: &[u8], listed: u64, c: Compression, pool: &BufferPool, bufs: &mut WorkerBuffers) -> Result<Loaded, LoadError> {
    let mut file = open_input(root, rel).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => LoadError::Replaced,
        _ => LoadError::Unreadable(e),
    })?;
    let st = sys::fstat(file.as_fd()).map_err(LoadError::Unreadable)?;
    if st.kind != sys::InodeKind::File {
        return Err(LoadError::Replaced);
    }
    if st.size != listed {
        return Err(LoadError::ChangedSize(format!("it now has {} bytes", st.size)));
    }
    if listed > STREAM_THRESHOLD {
        if c.codec == Codec::None {
            return Ok(Loaded::Stream(HoleAwareReader::new(file, listed)));
        }
        let mut counting = TrackingReader { inner: HoleAwareReader::new(file.try_clone().map_err(LoadError::Unreadable)?, listed).take(listed + 1), count: 0, error: None };
        return match codec::compress(c, &mut counting, listed) {
            Ok(Some(bytes)) if counting.count == listed => {
                check_size_unchanged(&file, listed)?;
                Ok(Loaded::Memory { codec: c.codec, checksum: xxh3(&bytes), bytes, start: 0 })
            }
            Ok(Some(_)) => Err(LoadError::ChangedSize(describe_count(counting.count, listed))),
            Ok(None) => Ok(Loaded::Stream(HoleAwareReader::new(file, listed))),
            Err(e) => Err(match counting.error {
                Some(read_error) => LoadError::Unreadable(read_error),
                None => LoadError::Compress(e),
            }),
        };
    }
    if listed <= SMALL_MAX {
        let scratch = &mut bufs.scratch;
        let pad = read_aligned(&mut file, listed, scratch).map_err(LoadError::Unreadable)?;
        let raw = &scratch[pad..];
        if raw.len() as u64 != listed {
            return Err(LoadError::ChangedSize(describe_count(raw.len() as u64, listed)));
        }
        check_size_unchanged(&file, listed)?;
        let start = bufs.data.len();
        let compressed = c.codec != Codec::None && listed > 0 && bufs.z.compress_into(c, raw, &mut bufs.data).map_err(LoadError::Compress)?;
        if !compressed {
            bufs.data.extend_from_slice(raw);
        }
        let payload = &bufs.data[start..];
        let codec = if compressed { c.codec } else { Codec::None };
        return Ok(Loaded::Small { codec, len: payload.len(), checksum: xxh3(payload) });
    }
    let mut bytes = pool.take(listed as usize + 1 + align::READ_ALIGN);
    let start = read_aligned(&mut file, listed, &mut bytes).map_err(LoadError::Unreadable)?;
    if (bytes.len() - start) as u64 != listed {
        return Err(LoadError::ChangedSize(describe_count((bytes.len() - start) as u64, listed)));
    }
    check_size_unchanged(&file, listed)?;
    if c.codec != Codec::None && listed > 0 {
        match bufs.z.compress(c, &bytes[start..]) {
            Ok(Some(z)) => {
                pool.give(bytes);
                return Ok(Loaded::Memory { codec: c.codec, checksum: xxh3(&z), bytes: z, start: 0 });
            }
            Ok(None) => {}
            Err(e) => return Err(LoadError::Compress(e)),
        }
    }
    Ok(Loaded::Memory { codec: Codec::None, checksum: xxh3(&bytes[start..]), bytes, start })
}

/// Empties `buf` and reads `file` into it as [`read_listed`] does, the
/// bytes starting at the first 64-byte boundary of `buf`'s allocation
/// (a file read into memory 16 bytes past a page, where malloc puts large
/// buffers, copies several times slower on AMD CPUs: [`align`]). Returns
/// where the bytes start; what lies before is padding.
fn read_aligned(file: &mut File, listed: u64, buf: &mut Vec<u8>) -> io::Result<usize> {
    buf.clear();
    buf.reserve(listed as usize + 1 + align::READ_ALIGN);
    let pad = align::pad_to(buf.as_ptr());
    buf.resize(pad, 0);
    read_listed(file, listed, buf)?;
    Ok(pad)
}

/// Reads `file` into `buf` until it holds `listed` bytes or the file ends.
/// Once `listed` bytes are read, the end of the file is not probed with
/// another read: the file had `listed` bytes just before and the caller
/// checks its size again after reading, so a file that grew is still
/// refused. (tar reads small files the same way; the probe was a sixth of
/// pack's system calls on 100-byte files.) Empty files are probed:
/// pseudo-files (procfs) list as empty and still have bytes.
fn read_listed(file: &mut File, listed: u64, buf: &mut Vec<u8>) -> io::Result<()> {
    // `Take` answers "end" itself once its limit is reached: no system call.
    file.take(listed.max(1)).read_to_end(buf).map(|_| ())
}

/// A second look at the size after reading: catches a file truncated and
/// rewritten while it was read.
fn check_size_unchanged(file: &File, listed: u64) -> Result<(), LoadError> {
    let st = sys::fstat(file.as_fd()).map_err(LoadError::Unreadable)?;
    if st.size != listed {
        return Err(LoadError::ChangedSize(format!("it has {} bytes after being read", st.size)));
    }
    Ok(())
}

/// A reader that counts the bytes it yields and keeps its first error, so
/// that a failed append can tell a read fault from a write fault.
struct TrackingReader<R> {
    inner: R,
    count: u64,
    error: Option<io::Error>,
}

impl<R: Read> Read for TrackingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inner.read(buf) {
            Ok(n) => {
                self.count += n as u64;
                Ok(n)
            }
            Err(e) => {
                let copy = io::Error::new(e.kind(), e.to_string());
                self.error.get_or_insert(e);
                Err(copy)
            }
        }
    }
}

/// Recycled payload buffers. Allocating and freeing a fresh multi-MB
/// buffer per file costs page faults, and with several threads munmap's
/// TLB shootdowns: packing raw files on 2 threads spent 2-3x the kernel time
/// of 1 thread until buffers were reused.
///
/// Every operation is O(1) in the number of buffers kept: buffers sit in
/// power-of-two size classes and the kept capacity is a running total.
/// (The first version summed the whole free list on every `give` and
/// scanned it on every `take`; with 100-byte files the list held millions
/// of buffers and pack was quadratic in the file count.) Buffers smaller
/// than [`MIN_POOLED`] are left to malloc, which recycles them cheaply
/// without page faults.
struct BufferPool {
    free: Mutex<PoolState>,
    /// Most bytes of capacity kept; more is freed.
    max_kept: usize,
}

/// Buffers below this capacity are not pooled.
const MIN_POOLED: usize = 64 << 10;
/// Size classes: class `k` holds buffers of capacity in `[2^k, 2^(k+1))`.
const POOL_CLASSES: usize = usize::BITS as usize;

struct PoolState {
    classes: Vec<Vec<Vec<u8>>>,
    kept: usize,
}

fn size_class(capacity: usize) -> usize {
    (usize::BITS - 1 - capacity.max(1).leading_zeros()) as usize
}

impl BufferPool {
    fn new(max_kept: usize) -> BufferPool {
        BufferPool { free: Mutex::new(PoolState { classes: vec![Vec::new(); POOL_CLASSES], kept: 0 }), max_kept }
    }

    /// An empty buffer with room for at least `len` bytes.
    fn take(&self, len: usize) -> Vec<u8> {
        let found = if len < MIN_POOLED / 2 {
            None
        } else {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let st = &mut *free;
            // The last buffer of `len`'s own class if it fits, else one of
            // the smallest non-empty class above (always fits), else the
            // largest buffer below, grown (its pages are already mapped).
            // Each step looks at one buffer per class: O(classes).
            let want = size_class(len);
            let own_fits = st.classes[want].last().is_some_and(|b| b.capacity() >= len);
            let pick = if own_fits {
                Some(want)
            } else {
                (want + 1..POOL_CLASSES).find(|&k| !st.classes[k].is_empty()).or_else(|| (0..=want).rev().find(|&k| !st.classes[k].is_empty()))
            };
            pick.and_then(|k| st.classes[k].pop()).inspect(|b| st.kept -= b.capacity())
        };
        let mut buf = found.unwrap_or_default();
        buf.clear();
        buf.reserve(len);
        buf
    }

    /// Returns a buffer for reuse.
    fn give(&self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap < MIN_POOLED || cap > STREAM_THRESHOLD as usize {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.kept + cap <= self.max_kept {
            free.kept += cap;
            free.classes[size_class(cap)].push(buf);
        }
    }
}

/// Most jobs in one batch.
const BATCH_JOBS: usize = 256;
/// A batch takes no more jobs once it holds this many bytes of files.
const BATCH_BYTES: u64 = 1 << 20;

/// Hands out jobs in order, in batches of consecutive jobs, keeping at most
/// `max_batches` batches and `budget` bytes ahead of the writer. The job
/// the writer waits for is always handed out, whatever its size.
///
/// Batches exist for small files: one lock, one channel message and one
/// wake-up per file cost more than reading a 100-byte file. A batch takes up
/// to [`BATCH_JOBS`] jobs but stops after [`BATCH_BYTES`] bytes of files, so
/// big files still go one per batch and spread over the workers, and the
/// batch window bounds the files held open for streaming.
struct Scheduler {
    state: Mutex<SchedState>,
    changed: Condvar,
    jobs: usize,
    max_batches: usize,
    budget: u64,
}

struct SchedState {
    next_claim: usize,
    next_write: usize,
    in_flight: u64,
    batches: usize,
    aborted: bool,
}

/// Jobs `start..start + costs.len()`, claimed together; `costs[k]` is what
/// job `start + k` counts against the byte budget.
struct Claim {
    start: usize,
    costs: Vec<u64>,
}

impl Scheduler {
    fn new(jobs: usize, max_batches: usize, budget: u64) -> Scheduler {
        Scheduler {
            state: Mutex::new(SchedState { next_claim: 0, next_write: 0, in_flight: 0, batches: 0, aborted: false }),
            changed: Condvar::new(),
            jobs,
            max_batches: max_batches.max(1),
            budget,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SchedState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next batch (`size_of(i)` is job i's file size, `cost_of(i)` what
    /// it holds in memory), or `None` when all are claimed or the run aborted.
    fn claim(&self, size_of: impl Fn(usize) -> u64, cost_of: impl Fn(usize) -> u64) -> Option<Claim> {
        let mut s = self.lock();
        loop {
            if s.aborted || s.next_claim >= self.jobs {
                return None;
            }
            let first = s.next_claim;
            let cost = cost_of(first);
            let fits = first == s.next_write || (s.batches < self.max_batches && s.in_flight + cost <= self.budget);
            if fits {
                let mut costs = vec![cost];
                let (mut bytes, mut in_flight) = (size_of(first), s.in_flight + cost);
                let mut i = first + 1;
                while i < self.jobs && costs.len() < BATCH_JOBS && bytes < BATCH_BYTES {
                    let c = cost_of(i);
                    if in_flight + c > self.budget {
                        break;
                    }
                    costs.push(c);
                    in_flight += c;
                    bytes = bytes.saturating_add(size_of(i));
                    i += 1;
                }
                s.next_claim = i;
                s.in_flight = in_flight;
                s.batches += 1;
                return Some(Claim { start: first, costs });
            }
            s = self.changed.wait(s).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// The writer has appended a whole batch of `jobs` jobs, which held `cost` bytes.
    fn written(&self, jobs: usize, cost: u64) {
        let mut s = self.lock();
        s.next_write += jobs;
        s.in_flight = s.in_flight.saturating_sub(cost);
        s.batches = s.batches.saturating_sub(1);
        self.changed.notify_all();
    }

    fn abort(&self) {
        self.lock().aborted = true;
        self.changed.notify_all();
    }
}

/// Aborts the schedule if a worker panics, so that no thread waits forever.
struct AbortOnPanic<'a>(&'a Scheduler);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abort();
        }
    }
}

/// The output directory of a run: refuses an existing dataset, and removes
/// everything this run wrote unless [`commit`](OutputDir::commit) is called.
struct OutputDir {
    dir: PathBuf,
    created: bool,
    written: Vec<PathBuf>,
    committed: bool,
}

fn is_partition_file_name(name: &[u8]) -> bool {
    name.starts_with(b"part-") && name.ends_with(b".fsp")
}

impl OutputDir {
    fn prepare(dir: &Path) -> Result<OutputDir, PackError> {
        let io_err = |source| PackError::OutputDir { path: dir.into(), source };
        match std::fs::read_dir(dir) {
            Ok(listing) => {
                let mut partitions = Vec::new();
                for entry in listing {
                    let name = entry.map_err(io_err)?.file_name();
                    let name = name.as_bytes();
                    if name == manifest::FILE_NAME.as_bytes() {
                        return Err(PackError::OutputHoldsDataset { dir: dir.into(), found: manifest::FILE_NAME.into() });
                    }
                    if is_partition_file_name(name) {
                        partitions.push(String::from_utf8_lossy(name).into_owned());
                    }
                }
                if let Some(first) = partitions.iter().min() {
                    return Err(PackError::OutputHoldsDataset {
                        dir: dir.into(),
                        found: format!("{} partition files such as {first}, from an earlier or unfinished pack", partitions.len()),
                    });
                }
                Ok(OutputDir { dir: dir.into(), created: false, written: Vec::new(), committed: false })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(io_err)?;
                Ok(OutputDir { dir: dir.into(), created: true, written: Vec::new(), committed: false })
            }
            Err(e) => Err(io_err(e)),
        }
    }

    fn track(&mut self, path: PathBuf) {
        self.written.push(path);
    }

    /// Writes the manifest durably under a temporary name, then renames it into place.
    fn write_manifest(&mut self, manifest: &ManifestLayout) -> Result<(), PackError> {
        let tmp = self.dir.join(MANIFEST_TMP);
        let fin = self.dir.join(manifest::FILE_NAME);
        self.track(tmp.clone());
        let fail = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PackError::WriteManifest { path, source }
        };
        let mut f = File::create(&tmp).map_err(fail(&tmp))?;
        manifest.write_to(&mut f).map_err(fail(&tmp))?;
        f.sync_all().map_err(fail(&tmp))?;
        drop(f);
        self.track(fin.clone());
        std::fs::rename(&tmp, &fin).map_err(fail(&fin))?;
        sys::sync_dir(&self.dir).map_err(fail(&self.dir))?;
        Ok(())
    }

    fn commit(&mut self) {
        self.committed = true;
    }
}

impl Drop for OutputDir {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // The manifest first: without it no partition can pass verify.
        for p in self.written.iter().rev() {
            let _ = std::fs::remove_file(p);
        }
        if self.created {
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread::JoinHandle;

    /// Runs `claim` on another thread and checks that it is still waiting
    /// 50 ms later; the caller then frees room and joins it.
    fn waiting_claim<T: Send + 'static>(
        s: &Arc<Scheduler>,
        claim: impl FnOnce(&Scheduler) -> T + Send + 'static,
    ) -> JoinHandle<T> {
        let t = {
            let s = s.clone();
            std::thread::spawn(move || claim(&s))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished());
        t
    }

    #[test]
    fn scheduler_keeps_the_window_and_always_serves_the_writer() {
        let s = Scheduler::new(10, 3, 100);
        let costs = [60u64, 60, 10, 0, 0, 0, 0, 0, 0, 0];
        let claim = move |s: &Scheduler| s.claim(|i| costs[i], |i| costs[i]).map(|c| (c.start, c.costs));
        // Job 1 would exceed the byte budget while job 0 is not written: the batch stops.
        assert_eq!(claim(&s), Some((0, vec![60])));
        let s = Arc::new(s);
        let t = waiting_claim(&s, claim);
        s.written(1, 60);
        // Now the writer waits for job 1: it is handed out, with the jobs that fit after it.
        assert_eq!(t.join().unwrap(), Some((1, vec![60, 10, 0, 0, 0, 0, 0, 0, 0])));
        s.abort();
        assert_eq!(claim(&s), None);
    }

    #[test]
    fn batches_take_many_small_files_but_one_big_file() {
        let big = BATCH_BYTES * 2;
        let sizes = [big, big, 10, 10, 10];
        let s = Scheduler::new(sizes.len(), 2, u64::MAX);
        let claim = move |s: &Scheduler| s.claim(|i| sizes[i], |i| sizes[i]).map(|c| (c.start, c.costs.len()));
        assert_eq!(claim(&s), Some((0, 1)));
        assert_eq!(claim(&s), Some((1, 1)));
        // Two batches are out: the third waits until the writer is done with one.
        let s = Arc::new(s);
        let t = waiting_claim(&s, claim);
        s.written(1, big);
        assert_eq!(t.join().unwrap(), Some((2, 3)));
        assert_eq!(claim(&s), None);
    }

    #[test]
    fn files_are_read_to_a_64_byte_boundary_whatever_the_buffer_held() {
        let d = std::env::temp_dir().join(format!("fanstore-read-aligned-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let mut buf = vec![9u8; 77]; // leftover bytes of an earlier file
        for len in [0usize, 1, 100, 131_072, 300_001] {
            let data: Vec<u8> = (0..len).map(|k| (k * 31 + 7) as u8).collect();
            let p = d.join(format!("f{len}"));
            std::fs::write(&p, &data).unwrap();
            let mut f = File::open(&p).unwrap();
            let start = read_aligned(&mut f, len as u64, &mut buf).unwrap();
            assert_eq!((buf.as_ptr() as usize + start) % align::READ_ALIGN, 0, "{len} bytes start at {start}");
            assert!(buf[..start].iter().all(|&b| b == 0), "{len}: padding");
            assert_eq!(&buf[start..], &data[..], "{len}: bytes");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn buffer_pool_reuses_big_buffers_and_keeps_its_budget() {
        let pool = BufferPool::new(3 * MIN_POOLED);
        pool.give(vec![0u8; 10]); // too small to keep
        assert_eq!(pool.free.lock().unwrap().kept, 0);
        let b = pool.take(MIN_POOLED);
        let ptr = b.as_ptr();
        pool.give(b);
        let again = pool.take(MIN_POOLED - 1);
        assert_eq!(again.as_ptr(), ptr, "the buffer given back is reused");
        assert!(again.capacity() >= MIN_POOLED - 1 && again.is_empty());
        for _ in 0..5 {
            pool.give(Vec::with_capacity(MIN_POOLED));
        }
        let st = pool.free.lock().unwrap();
        assert!(st.kept <= 3 * MIN_POOLED, "kept {} bytes", st.kept);
        assert_eq!(st.kept, st.classes.iter().flatten().map(Vec::capacity).sum::<usize>());
    }

    #[test]
    fn replicate_paths_match_whole_components() {
        assert!(is_under(b"val/x", b"val"));
        assert!(!is_under(b"validation/x", b"val"));
        assert!(!is_under(b"val", b"val"));
        assert!(is_under(b"anything", b""));
    }
}
