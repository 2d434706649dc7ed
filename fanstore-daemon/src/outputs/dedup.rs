//! Checkpoint dedup on the holder side: the node's [`CheckpointStore`].
//!
//! With `--dedup on` (the default) every output of at least `--dedup-min`
//! bytes is committed into the store at `rank-<r>/out/ckpt/` instead of a
//! plain file `out/<id>`: safetensors, torch.save zips, .npy and .npz are
//! split into tensors, anything else into content-defined chunks, and each
//! unit is stored once on the node (see `fanstore-ckpt`). Readers get the
//! exact bytes back: from the file the program wrote while the store keeps
//! it as a hot copy, else decoded into a sealed memfd; a damaged unit is
//! EIO.
//!
//! ## Store keys
//!
//! ```text
//! stage   commit under  <dir>/.fanstore-pending-<id>   (same directory: the
//!                                                        engine's parent choice
//!                                                        sees the siblings)
//! put     the record at the metadata owner (O_EXCL checked there)
//! settle  rename the key to <path>           (what `fanstore ckpt` shows)
//! ```
//!
//! Staging under a pending key means an O_EXCL refused at the owner, or a
//! commit that loses a race, never replaced what the store held at that
//! path. [`Dedup`] maps every output id this rank holds to its current key
//! and reads go by id, so a rename done on another node (forwarded here as
//! `HOLDER_RENAME`, applied in the background) only changes what the
//! queries show. Unlinks and replacements anywhere reach the holder as
//! `HOLDER_DROP` and release the checkpoint's units.
//!
//! ## Commits behind the close
//!
//! A client's unnamed local file that nothing can write any more (the
//! common case: COMMIT_SOLE) is not split while its writer waits. The
//! close links it as a plain output `out/<id>`, as `--dedup off` does, puts
//! its record and returns; [`Dedup::enqueue`] hands it to the commit
//! worker, which stores it (under its pending key, renamed once settled),
//! keeps it as the hot copy and only then unlinks `out/<id>`, all under
//! the store's lock: every reader finds either the plain file or the
//! stored checkpoint. Until then it is a plain output in every respect
//! (opens, remote reads, drains and a restart after a kill serve or keep
//! the file), and a commit that fails leaves it one for good (nothing is
//! lost; it is only not deduplicated). An unlink or replacement before the
//! worker reaches it cancels it. The queue holds at most
//! `min(--ckpt-hot-size, 4 GiB)` bytes (at least one file): a close past
//! that waits for the oldest commits, so a program that writes checkpoints
//! faster than they are stored is slowed to the store's pace. Queries,
//! drains and stops wait for the queue first ([`Dedup::wait_committed`]).
//!
//! ## Persistence
//!
//! [`Dedup::drain_to`] copies the store to `--persist`/`ckpt/rank-<r>/`
//! (units and recipes first, content-named and immutable, then the catalog
//! atomically; files the local store no longer has are deleted after).
//! A later job's rank r copies that directory back to its local disk at
//! start; the output records that name a path of that catalog are held by
//! rank r again ([`persisted_catalogs`]), and new checkpoints deduplicate
//! against the old ones.

use fanstore_ckpt::catalog;
use fanstore_ckpt::pack;
use fanstore_ckpt::store::{RECIPES_DIR, UNITS_DIR};
use fanstore_ckpt::{CheckpointStore, CkptError, CommitInfo, StoreOptions};
use fanstore_core::checksum::StreamingChecksum;
use fanstore_core::FormatError;
use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The store's directory under the rank's `out/`.
pub use fanstore_core::persisted::STORE_DIR;
/// Name prefix of a staged (not yet registered) output's key.
const PENDING: &[u8] = b".fanstore-pending-";

/// The key an output is staged under before its record is registered.
pub fn pending_key(path: &[u8], id: u64) -> Vec<u8> {
    let (dir, _) = fanstore_core::path::split_parent(path);
    let mut k = Vec::with_capacity(dir.len() + PENDING.len() + 21);
    if !dir.is_empty() {
        k.extend_from_slice(dir);
        k.push(b'/');
    }
    k.extend_from_slice(PENDING);
    k.extend_from_slice(id.to_string().as_bytes());
    k
}

/// True for a staged key (hidden from the queries).
pub fn is_pending(key: &[u8]) -> bool {
    fanstore_core::path::split_parent(key).1.starts_with(PENDING)
}

/// The errno a store failure gives the client.
pub fn errno_of(e: &CkptError) -> i32 {
    match e {
        CkptError::Format(FormatError::Io { source, .. }) => match source.raw_os_error() {
            Some(libc::ENOSPC) => libc::ENOSPC,
            Some(libc::EDQUOT) => libc::EDQUOT,
            _ => libc::EIO,
        },
        CkptError::NotFound { .. } => libc::ENOENT,
        _ => libc::EIO,
    }
}

/// The unlinks deferred while commits from parts ran, once none runs.
fn take_deferred(q: &mut CommitQueue) -> Vec<u64> {
    if q.parts.is_empty() {
        std::mem::take(&mut q.deferred_drops)
    } else {
        Vec::new()
    }
}

/// Releases the outputs `ids` (deferred unlinks) from the store.
fn release_deferred(h: &mut Held, ids: Vec<u64>) {
    if ids.is_empty() {
        return;
    }
    for id in ids {
        let Some(key) = h.keys.remove(&id) else { continue };
        h.hot.remove(&id);
        if let Err(e) = h.store.unlink(&key) {
            log::warn!("checkpoint store: unlinking '{}': {e}", String::from_utf8_lossy(&key));
        }
    }
    h.trim_hot();
}

/// The errno a refused commit from parts gives its writer.
fn parts_errno(e: &CkptError) -> i32 {
    match e {
        CkptError::UnknownUnit { .. } => libc::ESTALE,
        CkptError::Invalid(_) => libc::EINVAL,
        e => errno_of(e),
    }
}

/// Output id -> current store key, with the same ids in a set readable
/// without the store's lock ([`Dedup::stored`]): the commit worker holds
/// that lock for a whole commit, and a rename or unlink of an output the
/// store does not hold (a small file beside a checkpoint being stored)
/// must not wait for it.
struct Keys {
    map: HashMap<u64, Vec<u8>>,
    ids: Arc<std::sync::Mutex<HashSet<u64>>>,
}

impl Keys {
    fn ids(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&mut self, id: u64, key: Vec<u8>) {
        self.ids().insert(id);
        self.map.insert(id, key);
    }

    fn remove(&mut self, id: &u64) -> Option<Vec<u8>> {
        self.ids().remove(id);
        self.map.remove(id)
    }

    fn retain(&mut self, f: impl FnMut(&u64, &mut Vec<u8>) -> bool) {
        self.map.retain(f);
        let map = &self.map;
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).retain(|id| map.contains_key(id));
    }

    fn get(&self, id: &u64) -> Option<&Vec<u8>> {
        self.map.get(id)
    }

    fn contains_key(&self, id: &u64) -> bool {
        self.map.contains_key(id)
    }

    fn values(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.map.values()
    }
}

struct Held {
    store: CheckpointStore,
    /// Output id -> current store key.
    keys: Keys,
    /// Output id -> the file it was committed from, while the store keeps
    /// that file's bytes as a hot copy: opens are served from it directly.
    /// Only files nothing can write any more: a memfd sealed against
    /// writes, a copy of our own, or a client's unnamed file that its
    /// writer found with no writer left at its close (COMMIT_SOLE).
    hot: HashMap<u64, Arc<OwnedFd>>,
}

/// The outputs closed as plain files and not stored yet, under a lock of
/// their own: the commit worker holds the store's lock for a whole commit,
/// and a close (its enqueue and settle), an unlink or a rename of a queued
/// output must not wait for that.
#[derive(Default)]
struct CommitQueue {
    jobs: HashMap<u64, Queued>,
    /// Bytes of `jobs`.
    bytes: u64,
    /// The output being stored now.
    running: Option<Running>,
    /// Outputs committed from parts (CKPT_PUT) whose record is registered
    /// and whose store commit runs now, behind the writer's reply: readers
    /// of these wait for them, unlinks of others are deferred (see
    /// [`Dedup::check_and_begin_parts`]).
    parts: HashMap<u64, Running>,
    /// Outputs of the store unlinked or replaced while commits from parts
    /// ran: released once none runs (one may refer to units only these hold;
    /// the common case: a new version of the same path, saved from parts,
    /// refers to the unchanged tensors of the version it replaces).
    deferred_drops: Vec<u64>,
    /// Outputs queued without their whole-file sum ([`Dedup::enqueue`]
    /// with None): the sink gets a sum once the worker found it *and* the
    /// close registered the output ([`Dedup::settle`]), whichever comes
    /// last, so that the holder's entry and the owner's record it sets
    /// exist by then.
    sums_due: HashMap<u64, SumDue>,
    /// Sums taken off `sums_due` whose sink call has not returned yet
    /// (counted under the lock that takes them off: see [`Dedup::sums_settled`]).
    sinking: usize,
}

enum SumDue {
    /// Neither yet.
    Waiting,
    /// Registered; the sum is not found yet.
    Settled,
    /// Found; the output is not registered yet.
    Found(u64),
}

/// What happened to the output being stored while the worker stored it.
struct Running {
    id: u64,
    /// The path it was registered (or renamed) as.
    settled: Option<Vec<u8>>,
    /// Unlinked or replaced meanwhile: the checkpoint is released once stored.
    dropped: bool,
}

/// An output closed as the plain file `plain` (`out/<id>`) and not stored yet.
struct Queued {
    /// Its pending key: the key it is committed under.
    key: Vec<u8>,
    /// The path it was registered (or renamed) as meanwhile.
    settled: Option<Vec<u8>>,
    file: OwnedFd,
    /// Its size.
    len: u64,
    /// Its whole-file xxh3, as the close computed it (None: the store computes it).
    sum: Option<u64>,
    plain: PathBuf,
    /// When the close queued it.
    since: std::time::Instant,
}

impl Held {
    /// Serves output `id`, just stored, from `file` while it stays hot
    /// (within the budget; only the newest when the disk of `dir` has less
    /// than a twentieth free), and maps every hot copy afresh.
    fn keep_hot(&mut self, id: u64, file: Arc<OwnedFd>, dir: &Path) {
        if !crate::inputs::copies::room_for(dir, 0) {
            self.store.limit_hot(1, u64::MAX);
        }
        self.hot.insert(id, file);
        self.trim_hot();
        self.unmap_hot();
    }

    /// Forgets the files of outputs whose checkpoint is no longer hot.
    fn trim_hot(&mut self) {
        let (store, keys) = (&self.store, &self.keys);
        self.hot.retain(|id, _| keys.get(id).is_some_and(|k| store.is_hot(k)));
    }

    /// Maps every hot copy afresh, unpopulated: the pages the commit read
    /// (the new file, its delta bases) leave the daemon's mappings, so its
    /// resident size does not grow by the checkpoints it keeps (their pages
    /// stay in the page cache, as a native file's would), and readers of
    /// those files find no mapped pages. A copy that cannot be mapped keeps
    /// its mapping.
    fn unmap_hot(&mut self) {
        for (id, f) in &self.hot {
            let Some(key) = self.keys.get(id) else { continue };
            // SAFETY: read-only mapping of the file the store already maps,
            // which nothing can write any more (see Held::hot).
            match unsafe { memmap2::Mmap::map(&**f) } {
                Ok(m) => {
                    self.store.replace_hot(key, Arc::new(m));
                }
                Err(e) => log::debug!("checkpoint store: remapping the hot copy of output {id}: {e}"),
            }
        }
    }

    fn rename_key(&mut self, id: u64, to: &[u8]) {
        let Some(from) = self.keys.get(&id).cloned() else { return }; // dropped meanwhile
        if from == to {
            return;
        }
        // Another output settled at `to` was replaced at the owner; the
        // store's rename replaces (releases) it too.
        self.keys.retain(|&other, k| other == id || k != to);
        match self.store.rename(&from, to) {
            Ok(_) => {
                self.keys.insert(id, to.to_vec());
            }
            Err(e) => log::warn!("checkpoint store: renaming '{}': {e}", String::from_utf8_lossy(&from)),
        }
    }
}

/// The node's checkpoint store and the outputs it holds.
pub struct Dedup {
    /// Outputs of at least this many bytes are committed here (u64::MAX:
    /// dedup off, the store only serves what an earlier run put in it).
    pub min: u64,
    dir: PathBuf,
    held: Arc<RwLock<Held>>,
    /// Hot copies in memfds waiting to move to the local disk.
    demote: std::sync::Mutex<std::sync::mpsc::Sender<Demote>>,
    /// Queued outputs (their ids) for the commit worker.
    commits: std::sync::Mutex<std::sync::mpsc::Sender<u64>>,
    queue: Arc<std::sync::Mutex<CommitQueue>>,
    /// The most bytes the commit queue holds (see the module doc).
    queue_limit: u64,
    /// Held by the commit worker while it stores one output, to its last
    /// step ([`Self::wait_committed`] takes it; tests hold it to keep
    /// outputs queued).
    commit_gate: Arc<std::sync::Mutex<()>>,
    /// The ids of the outputs the store holds ([`Keys`]).
    stored: Arc<std::sync::Mutex<HashSet<u64>>>,
    /// Told each whole-file xxh3 the commit worker found for an output
    /// queued without it ([`Self::on_sum`]).
    sums: Arc<OnceLock<SumSink>>,
}

/// Receives (output id, whole-file xxh3) from the commit worker.
pub type SumSink = Box<dyn Fn(u64, u64) + Send + Sync>;

/// The most bytes of closed outputs waiting for their commit.
const QUEUE_MAX: u64 = 4 << 30;
/// The commit worker's nice value.
const COMMIT_NICE: libc::c_int = 10;

/// Lowers the calling thread to the commit worker's nice value (Linux:
/// per thread; a thread it starts inherits it).
pub(crate) fn lower_this_thread() {
    // SAFETY: lowers this thread's own scheduling priority.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, COMMIT_NICE) };
}

/// The commit worker: stores each queued output (see the module doc).
fn commit_worker(
    dir: PathBuf,
    held: std::sync::Weak<RwLock<Held>>,
    queue: Arc<std::sync::Mutex<CommitQueue>>,
    gate: Arc<std::sync::Mutex<()>>,
    sums: Arc<OnceLock<SumSink>>,
    rx: std::sync::mpsc::Receiver<u64>,
) {
    // Below the program's own threads (nice 10; the store's encode threads
    // inherit it): a commit behind the close takes the cores the program
    // leaves, and a close waits for it only when the queue is full.
    lower_this_thread();
    for id in rx {
        let _running = gate.lock().unwrap_or_else(|p| p.into_inner());
        let Some(held) = held.upgrade() else { return };
        let job = {
            let mut q = lock_queue(&queue);
            let Some(mut job) = q.jobs.remove(&id) else { continue }; // unlinked or replaced meanwhile
            q.bytes = q.bytes.saturating_sub(job.len);
            q.running = Some(Running { id, settled: job.settled.take(), dropped: false });
            job
        };
        let (started, len) = (std::time::Instant::now(), job.len);
        let file = std::fs::File::from(job.file);
        // Mapped here, not while queued: queued checkpoints do not sit in the
        // daemon's page tables. Populated: the commit reads every byte.
        // SAFETY: a file handed over for good, which nothing writes any more
        // (see Dedup::enqueue); read-only mapping.
        let map = unsafe { memmap2::MmapOptions::new().populate().map(&file) }
            .map_err(|e| CkptError::io(&job.plain, e))
            .and_then(|m| if m.len() as u64 == len { Ok(Arc::new(m)) } else { Err(CkptError::io(&job.plain, io::Error::other("its size changed"))) });
        let mut h = write_held(&held);
        // Adopting: a file of new incompressible tensors is linked into the
        // store as an extent instead of copied (it is already on this disk).
        let res = map.and_then(|m| h.store.commit_adopting(&job.key, m, &file, job.sum));
        // Lock order: the store's, then the queue's.
        let run = {
            let mut q = lock_queue(&queue);
            let Some(run) = q.running.take() else { continue };
            // Stored in the same step as it leaves the queue (see Dedup::rename_output).
            if res.is_ok() && !run.dropped {
                h.keys.insert(id, job.key.clone());
            }
            run
        };
        // The whole-file xxh3 of a file closed without it (SUM_PENDING in its record).
        let mut sum_found = None;
        match res {
            Ok(_) if run.dropped => {
                if let Err(e) = h.store.unlink(&job.key) {
                    log::warn!("checkpoint store: unlinking '{}': {e}", String::from_utf8_lossy(&job.key));
                }
                log_repairs(&mut h.store);
            }
            Ok(info) => {
                sum_found = job.sum.is_none().then_some(info.file_xxh3);
                if let Some(to) = &run.settled {
                    h.rename_key(id, to);
                }
                h.keep_hot(id, Arc::new(OwnedFd::from(file)), &dir);
                log_repairs(&mut h.store);
                // Under the store's lock: readers that miss the plain file find the checkpoint.
                if let Err(e) = std::fs::remove_file(&job.plain) {
                    log::warn!("checkpoint store: removing the plain copy {} of a stored output: {e}", job.plain.display());
                }
                log::info!(
                    "checkpoint store: output {id} ({len} B) stored {:.1} ms after its close ({:.1} ms committing)",
                    job.since.elapsed().as_secs_f64() * 1e3,
                    started.elapsed().as_secs_f64() * 1e3
                );
            }
            Err(e) => {
                log::warn!(
                    "checkpoint store: committing '{}': {e}; it stays a plain output at {}",
                    String::from_utf8_lossy(run.settled.as_deref().unwrap_or(&job.key)),
                    job.plain.display()
                );
                if job.sum.is_none() && !run.dropped {
                    sum_found = file_xxh3(&file, len);
                }
            }
        }
        drop(h);
        let due = {
            let mut q = lock_queue(&queue);
            match (q.sums_due.remove(&id), sum_found) {
                (Some(SumDue::Settled), Some(sum)) => {
                    q.sinking += 1;
                    Some(sum)
                }
                (Some(_), Some(sum)) => {
                    q.sums_due.insert(id, SumDue::Found(sum));
                    None
                }
                _ => None, // dropped, or none to report
            }
        };
        if let Some(sum) = due {
            if let Some(sink) = sums.get() {
                sink(id, sum);
            }
            lock_queue(&queue).sinking -= 1;
        }
    }
}

/// The whole-file xxh3 of `file` (`len` bytes), read with pread.
fn file_xxh3(file: &std::fs::File, len: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mut h = StreamingChecksum::new();
    let mut buf = vec![0u8; (len.clamp(1, 1 << 20) as usize).next_multiple_of(4096)];
    let mut off = 0u64;
    while off < len {
        let n = file.read_at(&mut buf, off).ok().filter(|&n| n > 0)?;
        h.update(&buf[..n]);
        off += n as u64;
    }
    Some(h.digest())
}

fn lock_queue(q: &std::sync::Mutex<CommitQueue>) -> std::sync::MutexGuard<'_, CommitQueue> {
    q.lock().unwrap_or_else(|p| p.into_inner())
}

/// A hot copy held in a memfd, to be moved to an unnamed local file.
struct Demote {
    id: u64,
    memfd: Arc<OwnedFd>,
    /// When the commit queued it.
    queued: std::time::Instant,
}

fn write_held(held: &RwLock<Held>) -> RwLockWriteGuard<'_, Held> {
    held.write().unwrap_or_else(|p| p.into_inner())
}

/// The background worker: copies each hot memfd into an unnamed file in
/// `dir` (same disk as the store) and, if that checkpoint is still hot and
/// still served from that memfd, swaps the file in (store and opens) and
/// lets the memfd go: the memory is returned, and page-cache reads of a
/// disk file run faster here than reads of a memfd (no huge pages for shmem).
fn demote_worker(dir: PathBuf, held: std::sync::Weak<RwLock<Held>>, rx: std::sync::mpsc::Receiver<Demote>) {
    use std::os::unix::fs::OpenOptionsExt;
    for job in rx {
        let Some(held) = held.upgrade() else { return };
        let still = |h: &Held| h.hot.get(&job.id).is_some_and(|f| Arc::ptr_eq(f, &job.memfd));
        if !still(&held.read().unwrap_or_else(|p| p.into_inner())) {
            continue;
        }
        let started = std::time::Instant::now();
        let copied = (|| -> io::Result<(std::fs::File, memmap2::Mmap)> {
            let mut to = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).mode(0o600).open(&dir)?;
            let from = std::fs::File::from(crate::fdio::reopen(&job.memfd).map_err(io::Error::from_raw_os_error)?);
            // SAFETY: the memfd is sealed against writes and shrinking (the
            // commit sealed it before keeping it hot); read-only mapping.
            let orig = unsafe { memmap2::Mmap::map(&from) }?;
            // One large write (not a splice/sendfile copy), as a program
            // writes its file: the page cache then holds it in large folios.
            io::Write::write_all(&mut to, &orig)?;
            // Checked with reads, not through the mapping: pages of a file
            // that a process has faulted into its mappings are read back
            // slower here (measured: 3.8 vs 4.5 GB/s), so the store's mapping
            // stays untouched until a commit needs a delta base from it.
            let mut buf = vec![0u8; 8 << 20];
            for (i, chunk) in orig.chunks(8 << 20).enumerate() {
                let b = &mut buf[..chunk.len()];
                std::os::unix::fs::FileExt::read_exact_at(&to, b, (i * (8 << 20)) as u64)?;
                if b != chunk {
                    return Err(io::Error::other("the copy differs from the memfd"));
                }
            }
            // SAFETY: an unnamed file only this process can reach, written
            // above and never again; the mapping is read-only.
            let map = unsafe { memmap2::Mmap::map(&to) }?;
            Ok((to, map))
        })();
        match copied {
            Ok((file, map)) => {
                let mut h = write_held(&held);
                if still(&h) {
                    let key = h.keys.get(&job.id).cloned().unwrap_or_default();
                    if h.store.replace_hot(&key, Arc::new(map)) {
                        h.hot.insert(job.id, Arc::new(OwnedFd::from(file)));
                        log::debug!("checkpoint store: hot copy of output {} on the local disk {:.1} ms after its commit ({:.1} ms copying)",
                            job.id, job.queued.elapsed().as_secs_f64() * 1e3, started.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
            Err(e) => {
                // Not kept in memory instead: the store reads it from its units.
                log::warn!("checkpoint store: moving a hot copy to {}: {e}", dir.display());
                let mut h = write_held(&held);
                if still(&h) {
                    let key = h.keys.get(&job.id).cloned().unwrap_or_default();
                    h.store.forget_hot(&key);
                    h.trim_hot();
                }
            }
        }
    }
}

impl Dedup {
    /// Opens (creating) the store in `dir`, keeping at most `hot` hot
    /// copies of at most `hot_bytes` bytes in all (the newest always).
    pub fn open(dir: &Path, min: u64, fsync: bool, hot: usize, hot_bytes: u64) -> Result<Dedup, CkptError> {
        let mut store = CheckpointStore::open_with(dir, StoreOptions { fsync, hot, hot_bytes, ..StoreOptions::default() })?;
        log_repairs(&mut store);
        let stored = Arc::new(std::sync::Mutex::new(HashSet::new()));
        let keys = Keys { map: HashMap::new(), ids: stored.clone() };
        let held = Arc::new(RwLock::new(Held { store, keys, hot: HashMap::new() }));
        let (tx, rx) = std::sync::mpsc::channel();
        let (d, weak) = (dir.to_path_buf(), Arc::downgrade(&held));
        std::thread::Builder::new()
            .name("ckpt-demote".into())
            .spawn(move || demote_worker(d, weak, rx))
            .map_err(|e| CkptError::io(dir, e))?;
        let (ctx, crx) = std::sync::mpsc::channel();
        let gate = Arc::new(std::sync::Mutex::new(()));
        let queue = Arc::new(std::sync::Mutex::new(CommitQueue::default()));
        let sums = Arc::new(OnceLock::new());
        let (d, weak, q, g, s) = (dir.to_path_buf(), Arc::downgrade(&held), queue.clone(), gate.clone(), sums.clone());
        std::thread::Builder::new()
            .name("ckpt-commit".into())
            .spawn(move || commit_worker(d, weak, q, g, s, crx))
            .map_err(|e| CkptError::io(dir, e))?;
        Ok(Dedup {
            min,
            dir: dir.to_path_buf(),
            held,
            demote: std::sync::Mutex::new(tx),
            commits: std::sync::Mutex::new(ctx),
            queue,
            queue_limit: hot_bytes.min(QUEUE_MAX),
            commit_gate: gate,
            stored,
            sums,
        })
    }

    /// Where the commit worker sends the whole-file xxh3 of each output
    /// queued without one ([`Self::enqueue`] with `sum` None), once it has
    /// read the file (stored or not), before [`Self::wait_committed`]
    /// returns. Set once; later calls are ignored.
    pub fn on_sum(&self, sink: SumSink) {
        let _ = self.sums.set(sink);
    }

    fn write(&self) -> RwLockWriteGuard<'_, Held> {
        write_held(&self.held)
    }

    fn read(&self) -> RwLockReadGuard<'_, Held> {
        self.held.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `bytes` as output `id` of `path`, under its pending key.
    pub fn stage(&self, path: &[u8], id: u64, bytes: &[u8]) -> Result<CommitInfo, i32> {
        let key = pending_key(path, id);
        let mut h = self.write();
        let info = h.store.commit(&key, bytes).map_err(|e| {
            log::warn!("checkpoint store: committing '{}': {e}", String::from_utf8_lossy(path));
            errno_of(&e)
        })?;
        h.keys.insert(id, key);
        Ok(info)
    }

    /// Checks a commit from parts (`CKPT_PUT`, see `fanstore_ckpt::parts`)
    /// before its record is registered: the blake3 of every unit. ESTALE:
    /// a reference names no unit of this store; EINVAL: parts that are not
    /// the file's units.
    ///
    /// Once checked, output `id` is about to be registered: until
    /// [`Self::finish_parts`] stores it, its readers wait ([`Self::holds`]),
    /// and unlinks of other outputs of the store are deferred (one could
    /// free a unit it refers to; checked and begun under the store's lock,
    /// so no unlink comes in between). Renames and unlinks of it are noted
    /// and applied once it is stored, as for the commit worker's output.
    pub fn check_and_begin_parts(&self, path: &[u8], id: u64, parts: &fanstore_ckpt::parts_file::Parts, payload: &[u8]) -> Result<Vec<[u8; 32]>, i32> {
        let h = self.read();
        let hashes = h.store.check_parts(&parts.skeleton[..], &parts.units, payload).map_err(|e| {
            log::info!("checkpoint store: refusing '{}' from parts: {e}", String::from_utf8_lossy(path));
            parts_errno(&e)
        })?;
        lock_queue(&self.queue).parts.insert(id, Running { id, settled: None, dropped: false });
        Ok(hashes)
    }

    /// Output `id`'s record could not be registered: nothing will be stored.
    pub fn cancel_parts(&self, id: u64) {
        let mut h = self.write();
        let deferred = {
            let mut q = lock_queue(&self.queue);
            q.parts.remove(&id);
            take_deferred(&mut q)
        };
        release_deferred(&mut h, deferred);
    }

    /// Stores output `id` of `path` from parts (begun with
    /// [`Self::check_and_begin_parts`]), under its pending key, then under the path
    /// it was settled or renamed to (released if it was unlinked meanwhile).
    /// A failure here (a full disk) leaves a record without bytes: its
    /// reads are EIO, and it is logged.
    pub fn finish_parts(&self, path: &[u8], id: u64, parts: &fanstore_ckpt::parts_file::Parts, payload: &[u8]) {
        let key = pending_key(path, id);
        let started = std::time::Instant::now();
        let mut h = self.write();
        let res = h.store.commit_parts(&key, &parts.skeleton[..], &parts.units, payload, parts.file_xxh3);
        // Lock order: the store's, then the queue's.
        let (run, deferred) = {
            let mut q = lock_queue(&self.queue);
            let run = q.parts.remove(&id);
            // Stored in the same step as it leaves the queue (see Self::rename_output).
            if res.is_ok() && !run.as_ref().is_some_and(|r| r.dropped) {
                h.keys.insert(id, key.clone());
            }
            (run, take_deferred(&mut q))
        };
        match (res, run) {
            (Ok(_), Some(run)) if run.dropped => {
                if let Err(e) = h.store.unlink(&key) {
                    log::warn!("checkpoint store: unlinking '{}': {e}", String::from_utf8_lossy(&key));
                }
            }
            (Ok((info, _)), run) => {
                if let Some(to) = run.and_then(|r| r.settled) {
                    h.rename_key(id, &to);
                }
                log::debug!(
                    "checkpoint store: output {id} ({} B, {} new units) stored from parts in {:.1} ms",
                    info.logical,
                    info.units_new,
                    started.elapsed().as_secs_f64() * 1e3
                );
            }
            (Err(e), _) => log::error!(
                "checkpoint store: committing '{}' from parts: {e}; its record has no bytes (reads are EIO)",
                String::from_utf8_lossy(path)
            ),
        }
        release_deferred(&mut h, deferred);
        log_repairs(&mut h.store);
    }

    /// Waits while output `id` (or, with None, any output) committed from
    /// parts is still being stored.
    fn wait_parts(&self, id: Option<u64>) {
        while {
            let q = lock_queue(&self.queue);
            match id {
                Some(id) => q.parts.contains_key(&id),
                None => !q.parts.is_empty(),
            }
        } {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Stores output `id` of `path` like [`Self::stage`], from a file handed
    /// over for good, which nothing can write any more (the client's unnamed
    /// local file, opened read-only, that no process had open for writing at
    /// its close; or its memfd sealed against writes): its mapping becomes
    /// the store's hot copy, so the next checkpoint finds its delta bases
    /// there, and opens of this output are served from the file itself (no
    /// rebuild) while it stays hot.
    /// A memfd (`memfd`: true) is moved to an unnamed local file in the
    /// background, then served from there. Hot copies are dropped, oldest
    /// first, past the store's budget, and all but this one when the local
    /// disk has less than a twentieth free.
    pub fn stage_handed(&self, path: &[u8], id: u64, file: OwnedFd, map: Arc<memmap2::Mmap>, memfd: bool) -> Result<CommitInfo, i32> {
        let key = pending_key(path, id);
        let mut h = self.write();
        let info = h.store.commit_shared(&key, map).map_err(|e| {
            log::warn!("checkpoint store: committing '{}': {e}", String::from_utf8_lossy(path));
            errno_of(&e)
        })?;
        h.keys.insert(id, key);
        let file = Arc::new(file);
        h.keep_hot(id, file.clone(), &self.dir);
        if memfd && h.hot.contains_key(&id) {
            let _ = self.demote.lock().unwrap_or_else(|p| p.into_inner()).send(Demote { id, memfd: file, queued: std::time::Instant::now() });
        }
        Ok(info)
    }

    /// Queues output `id` of `path` for the commit worker: a file handed
    /// over for good (as for [`Self::stage_handed`]), already linked as the
    /// plain output `plain`, which serves it until it is stored; `sum`: its
    /// whole-file xxh3 if the close computed it. Waits first while the
    /// queue is full (see the module doc).
    pub fn enqueue(&self, path: &[u8], id: u64, file: OwnedFd, len: u64, sum: Option<u64>, plain: PathBuf) {
        let mut job = Some(Queued { key: pending_key(path, id), settled: None, file, len, sum, plain, since: std::time::Instant::now() });
        let mut waited = false;
        while let Some(j) = job.take() {
            let mut q = lock_queue(&self.queue);
            if q.jobs.is_empty() || q.bytes + len <= self.queue_limit {
                q.bytes += len;
                if j.sum.is_none() {
                    q.sums_due.insert(id, SumDue::Waiting);
                }
                q.jobs.insert(id, j);
                break;
            }
            drop(q);
            job = Some(j);
            if !waited {
                log::debug!("checkpoint store: the commit queue is full; output {id} waits");
                waited = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let _ = self.commits.lock().unwrap_or_else(|p| p.into_inner()).send(id);
    }

    /// Waits until every queued output is stored (or has failed and stayed plain).
    pub fn wait_committed(&self) {
        while {
            let q = lock_queue(&self.queue);
            !q.jobs.is_empty() || q.running.is_some() || !q.parts.is_empty()
        } {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        // The worker leaves `running` before its last steps (the hot copy,
        // the plain file's removal); it holds the gate until they are done.
        drop(self.commit_gate.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Whether every output queued so far is stored (or stayed plain) and
    /// every whole-file sum the worker found has gone to the sink, whose
    /// call has returned: at a stop with a drain, the ranks wait for this
    /// while they still answer each other, so that a sum the sink sends to
    /// another rank's record arrives before that rank drains it. An output
    /// stays due from its enqueue until its sum has gone to the sink (or it
    /// was dropped), whichever of the worker and its close comes last.
    pub fn sums_settled(&self) -> bool {
        let q = lock_queue(&self.queue);
        q.jobs.is_empty() && q.running.is_none() && q.parts.is_empty() && q.sums_due.is_empty() && q.sinking == 0
    }

    /// At stop: takes every output off the queue (each stays the plain
    /// output it is, which a restart with the same `--local` registers
    /// again) and waits for the one being stored. A drain to `--persist`
    /// runs before this and waits for the queue instead.
    pub fn cancel_queued(&self) {
        let n = {
            let mut q = lock_queue(&self.queue);
            q.bytes = 0;
            std::mem::take(&mut q.jobs).len()
        };
        if n > 0 {
            log::info!("checkpoint store: {n} outputs closed at stop stay plain outputs (not stored)");
        }
        self.wait_committed();
    }

    /// Output `id` is registered as `path`: its key becomes the path
    /// (unless it was dropped meanwhile).
    /// Its whole-file sum, if the commit worker found it already, goes to
    /// the sink now ([`Self::on_sum`]).
    pub fn settle(&self, id: u64, path: &[u8]) {
        self.rename_output(id, path);
        let due = {
            let mut q = lock_queue(&self.queue);
            match q.sums_due.remove(&id) {
                Some(SumDue::Found(sum)) => {
                    q.sinking += 1;
                    Some(sum)
                }
                Some(_) => {
                    q.sums_due.insert(id, SumDue::Settled);
                    None
                }
                None => None,
            }
        };
        if let Some(sum) = due {
            if let Some(sink) = self.sums.get() {
                sink(id, sum);
            }
            lock_queue(&self.queue).sinking -= 1;
        }
    }

    /// Output `id` was renamed to `to` (on this node or another).
    pub fn rename_output(&self, id: u64, to: &[u8]) {
        {
            let mut q = lock_queue(&self.queue);
            if let Some(j) = q.jobs.get_mut(&id) {
                j.settled = Some(to.to_vec());
                return;
            }
            if let Some(r) = q.running.as_mut().filter(|r| r.id == id) {
                r.settled = Some(to.to_vec());
                return;
            }
            if let Some(r) = q.parts.get_mut(&id) {
                r.settled = Some(to.to_vec());
                return;
            }
            // Not queued (nor being stored): the worker cannot take it any
            // more. Checked under the queue's lock, where a commit moves an
            // id from the queue into the store: one the store does not
            // hold returns at once, without waiting for a commit that runs.
            if !self.stored(id) {
                return;
            }
        }
        self.write().rename_key(id, to);
    }

    /// Output `id` is unlinked or replaced: releases its units. False if
    /// this store does not hold it (a queued output is taken off the queue,
    /// or released once stored if the worker has it: its plain file is the
    /// caller's to delete).
    pub fn drop_output(&self, id: u64) -> bool {
        {
            let mut q = lock_queue(&self.queue);
            q.sums_due.remove(&id);
            if let Some(j) = q.jobs.remove(&id) {
                q.bytes = q.bytes.saturating_sub(j.len);
                return false;
            }
            if let Some(r) = q.running.as_mut().filter(|r| r.id == id) {
                r.dropped = true;
                return false;
            }
            if let Some(r) = q.parts.get_mut(&id) {
                r.dropped = true; // released once stored; it has no plain file
                return true;
            }
            if !self.stored(id) {
                return false; // (as in rename_output)
            }
        }
        let mut h = self.write();
        if !h.keys.contains_key(&id) {
            return false;
        }
        // A commit from parts running now may refer to units only this
        // output holds: it is released after them. (Under the store's lock:
        // a commit from parts is checked and begun under it too.)
        {
            let mut q = lock_queue(&self.queue);
            if !q.parts.is_empty() {
                q.deferred_drops.push(id);
                return true;
            }
        }
        let Some(key) = h.keys.remove(&id) else { return false };
        if let Err(e) = h.store.unlink(&key) {
            log::warn!("checkpoint store: unlinking '{}': {e}", String::from_utf8_lossy(&key));
        }
        log_repairs(&mut h.store);
        h.trim_hot();
        true
    }

    /// Whether this store holds output `id` (waiting first while it is
    /// being stored from parts).
    pub fn holds(&self, id: u64) -> bool {
        self.wait_parts(Some(id));
        self.stored(id)
    }

    /// Does the store hold output `id`? Without the store's lock.
    fn stored(&self, id: u64) -> bool {
        self.stored.lock().unwrap_or_else(|p| p.into_inner()).contains(&id)
    }

    /// Output `id` is the store's checkpoint `key` (recovered or reloaded).
    /// False if the store has no such checkpoint or another id claimed it.
    pub fn claim(&self, id: u64, key: &[u8]) -> bool {
        let mut h = self.write();
        if h.store.id_of(key).is_none() || h.keys.values().any(|k| k == key) {
            return false;
        }
        h.keys.insert(id, key.to_vec());
        true
    }

    /// The store key of a recovered output: its pending key under its old
    /// id, else its path.
    pub fn find_recovered(&self, path: &[u8], old_id: u64) -> Option<Vec<u8>> {
        let h = self.read();
        [pending_key(path, old_id), path.to_vec()]
            .into_iter()
            .find(|k| h.store.id_of(k).is_some() && !h.keys.values().any(|v| v == k))
    }

    /// Unlinks every checkpoint no output id claims (staged commits of a
    /// killed run, entries of a drained store no record names).
    pub fn sweep_unclaimed(&self) -> usize {
        let mut h = self.write();
        let claimed: HashSet<Vec<u8>> = h.keys.values().cloned().collect();
        let stale: Vec<Vec<u8>> =
            h.store.entries().iter().filter(|e| e.live && !claimed.contains(&e.path)).map(|e| e.path.clone()).collect();
        for k in &stale {
            if let Err(e) = h.store.unlink(k) {
                log::warn!("checkpoint store: sweeping '{}': {e}", String::from_utf8_lossy(k));
            }
        }
        stale.len()
    }

    /// Writes the exact bytes of output `id` to `out`.
    pub fn read_output<W: Write + ?Sized>(&self, id: u64, out: &mut W) -> Result<u64, i32> {
        let h = self.read();
        let key = h.keys.get(&id).ok_or(libc::ENOENT)?;
        h.store.read_to(key, out).map_err(|e| {
            log::error!("checkpoint store: reading '{}': {e}", String::from_utf8_lossy(key));
            errno_of(&e)
        })
    }

    /// Output `id` from its hot copy (the file it was committed from), if
    /// the store still keeps one.
    pub fn open_hot(&self, id: u64) -> Option<Result<OwnedFd, i32>> {
        let h = self.read();
        let key = h.keys.get(&id)?;
        let f = h.hot.get(&id).filter(|_| h.store.is_hot(key))?;
        Some(crate::fdio::reopen(f))
    }

    /// Output `id` of `size` bytes and xxh3 `sum` (its record's): the file
    /// it was committed from while that is hot, else its bytes decoded (in
    /// parallel) into a new sealed memfd; EIO if the store's bytes are
    /// another version or damaged.
    pub fn open_output(&self, id: u64, size: u64, sum: u64) -> Result<OwnedFd, i32> {
        if let Some(r) = self.open_hot(id) {
            return r;
        }
        let h = self.read();
        let key = h.keys.get(&id).ok_or(libc::ENOENT)?;
        if size == 0 {
            drop(h);
            let m = crate::memfd::MemfdBuilder::unmapped(&format!("fanstore:ckpt:{id}"), 0).map_err(|_| libc::ENOMEM)?;
            let mut w = MemfdWriter { m: &m, off: 0, sum: StreamingChecksum::new() };
            let n = self.read_output(id, &mut w)?;
            if n != 0 || sum != fanstore_core::wire::SUM_PENDING && w.sum.digest() != sum {
                return Err(libc::EIO);
            }
            return m.seal().map_err(|_| libc::EIO);
        }
        let mut m = crate::memfd::MemfdBuilder::new(&format!("fanstore:ckpt:{id}"), size).map_err(|_| libc::ENOMEM)?;
        h.store.read_into(key, m.bytes_mut()).map_err(|e| {
            log::error!("checkpoint store: reading '{}': {e}", String::from_utf8_lossy(key));
            errno_of(&e)
        })?;
        // (A sum still pending: the store's own recipe sum was checked by read_into.)
        if sum != fanstore_core::wire::SUM_PENDING && fanstore_core::checksum::xxh3(m.bytes()) != sum {
            log::error!("checkpoint store: output {id} differs from its record ({size} bytes)");
            return Err(libc::EIO);
        }
        m.seal().map_err(|_| libc::EIO)
    }

    /// Runs a query (`fanstore ckpt ...`) against this store.
    pub fn query(&self, q: &Query) -> Result<Answer, i32> {
        self.wait_committed();
        let h = self.read();
        let s = &h.store;
        let nf = |e: CkptError| errno_of(&e);
        let (text, ok) = match q {
            Query::Ls { dir, json } => {
                let mut r = s.ls(dir);
                r.rows.retain(|row| !is_pending(&row.ckpt.path));
                (if *json { r.to_json() } else { r.to_table() }, true)
            }
            Query::Log { path, json } => {
                let r = s.log(path).map_err(nf)?;
                (if *json { r.to_json() } else { r.to_table() }, true)
            }
            Query::Owners { path, json } => {
                let r = s.owners(path).map_err(nf)?;
                (if *json { r.to_json() } else { r.to_table() }, true)
            }
            Query::Diff { a, b, json } => {
                let r = s.diff(a, b).map_err(nf)?;
                (if *json { r.to_json() } else { r.to_table() }, true)
            }
            Query::Du => (s.du().to_json(), true),
            Query::Match { exclude, keys } => {
                let keys = fanstore_ckpt::matching::decode_keys(keys).map_err(|_| libc::EINVAL)?;
                let mut r = s.best_match(&keys, (!exclude.is_empty()).then_some(&exclude[..]));
                r.rows.retain(|row| !is_pending(&row.ckpt.path));
                (r.to_json(), true)
            }
            Query::Verify { path, json } => {
                let r = s.verify(path.as_deref()).map_err(nf)?;
                (if *json { r.to_json() } else { r.to_table() }, r.ok())
            }
        };
        Ok(Answer { text, ok })
    }

    /// Copies the store to `dst` (`--persist/ckpt/rank-<r>`), pausing
    /// commits and unlinks meanwhile: recipes and unit files not there yet
    /// (content-named, immutable), packs that are new or grew (see
    /// `copy_pack`), one syncfs, then the catalog (fsynced, renamed into
    /// place: the commit point), then what the store no longer has (packs
    /// compaction deleted, released recipes). Returns the checkpoints it holds.
    pub fn drain_to(&self, dst: &Path) -> io::Result<usize> {
        self.wait_committed();
        let h = self.write();
        h.store.sync().map_err(|e| io::Error::other(e.to_string()))?;
        for sub in [UNITS_DIR, RECIPES_DIR] {
            let (from, to) = (self.dir.join(sub), dst.join(sub));
            std::fs::create_dir_all(&to)?;
            for e in std::fs::read_dir(&from)? {
                let e = e?;
                let target = to.join(e.file_name());
                if e.file_name().to_str().and_then(pack::parse_name).is_some() {
                    copy_pack(&e.path(), &target)?;
                } else if !target.exists() {
                    let tmp = to.join(format!(".tmp.{}", std::process::id()));
                    std::fs::copy(e.path(), &tmp).and_then(|_| std::fs::rename(&tmp, &target)).inspect_err(|_| {
                        let _ = std::fs::remove_file(&tmp);
                    })?;
                }
            }
        }
        crate::outputs::persist::flush(dst).map_err(|e| io::Error::other(e.to_string()))?;
        // The catalog is the commit point; what the store released since the
        // last drain goes once the new catalog is in place.
        copy_synced(&self.dir.join(catalog::FILE_NAME), &dst.join(catalog::FILE_NAME))?;
        for sub in [UNITS_DIR, RECIPES_DIR] {
            let local = self.dir.join(sub);
            for e in std::fs::read_dir(dst.join(sub))?.flatten() {
                if !local.join(e.file_name()).exists() {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(h.store.entries().iter().filter(|e| e.live).count())
    }
}

/// Brings the drained copy `to` of pack `from` up to date. Packs only grow
/// at their end, so a copy with the same header (sequence number and
/// nonce) and a shorter length is the start of the pack: only the tail is
/// appended. Anything else (no copy, another pack of that name, a longer
/// copy) is replaced whole through a temp file renamed into place. A drain
/// that stops while appending leaves a torn tail past every record the
/// drained catalog refers to, which open truncates.
fn copy_pack(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let (src, head) = pack::open(from).map_err(|e| io::Error::other(e.to_string()))?;
    let len = src.metadata()?.len();
    if let Ok((dst, dhead)) = pack::open(to) {
        let have = dst.metadata()?.len();
        if dhead == head && have <= len {
            let mut buf = vec![0u8; (len - have).min(8 << 20) as usize];
            let mut at = have;
            while at < len {
                let n = (len - at).min(buf.len() as u64) as usize;
                src.read_exact_at(&mut buf[..n], at)?;
                dst.write_all_at(&buf[..n], at)?;
                at += n as u64;
            }
            return Ok(());
        }
    }
    let tmp = to.with_file_name(format!(".tmp.{}", std::process::id()));
    std::fs::copy(from, &tmp).and_then(|_| std::fs::rename(&tmp, to)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(())
}

/// Logs what the store repaired at open or reported since (torn packs,
/// compaction faults).
fn log_repairs(store: &mut CheckpointStore) {
    for r in store.take_repairs() {
        log::warn!("checkpoint store: {r}");
    }
}

/// Copies `from` to `to` through a temp file, fsynced, renamed into place.
fn copy_synced(from: &Path, to: &Path) -> io::Result<()> {
    let tmp = to.with_extension(format!("tmp.{}", std::process::id()));
    let res = (|| {
        std::fs::copy(from, &tmp)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, to)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Copies a drained store (`--persist/ckpt/rank-<r>`) to the local `dst`
/// (a later job adopting it). Returns false when there is none.
pub fn adopt_drained(src: &Path, dst: &Path) -> io::Result<bool> {
    if !src.join(catalog::FILE_NAME).is_file() {
        return Ok(false);
    }
    for sub in [UNITS_DIR, RECIPES_DIR] {
        std::fs::create_dir_all(dst.join(sub))?;
        if let Ok(rd) = std::fs::read_dir(src.join(sub)) {
            for e in rd {
                let e = e?;
                let name = e.file_name();
                if name.to_string_lossy().contains(".tmp.") {
                    continue;
                }
                std::fs::copy(e.path(), dst.join(sub).join(name))?;
            }
        }
    }
    std::fs::copy(src.join(catalog::FILE_NAME), dst.join(catalog::FILE_NAME))?;
    Ok(true)
}

pub use fanstore_ckpt::drained::{open_drained, persisted_catalogs};
pub use fanstore_core::persisted::drained_dir;

/// Writes into a memfd at increasing offsets.
struct MemfdWriter<'a> {
    m: &'a crate::memfd::MemfdBuilder,
    off: u64,
    sum: StreamingChecksum,
}

impl Write for MemfdWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.m.write_at(buf, self.off)?;
        self.sum.update(buf);
        self.off += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A `fanstore ckpt` query (wire op CKPT): its codec is shared with the CLI.
pub use fanstore_core::wire::ckpt::Query;

/// A query's answer: the report, and false when verify found damage.
pub struct Answer {
    pub text: String,
    pub ok: bool,
}

#[cfg(test)]
mod tests {
    use super::*;


    /// Output `id` reads back from the store as `expected`.
    fn assert_reads(dd: &Dedup, id: u64, expected: &[u8]) {
        let mut out = Vec::new();
        dd.read_output(id, &mut out).unwrap();
        assert_eq!(out, expected, "output {id}");
    }
    #[test]
    fn pending_keys_stay_in_the_directory_and_are_hidden() {
        assert_eq!(pending_key(b"run/a/ck.pt", 7), b"run/a/.fanstore-pending-7".to_vec());
        assert_eq!(pending_key(b"ck.pt", 12), b".fanstore-pending-12".to_vec());
        assert!(is_pending(&pending_key(b"x/y", 3)));
        assert!(!is_pending(b"x/y"));
    }

    #[test]
    fn staged_outputs_settle_rename_drop_and_read_back() {
        let d = tempfile::tempdir().unwrap();
        let dd = Dedup::open(&d.path().join("ckpt"), 0, false, 2, u64::MAX).unwrap();
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let info = dd.stage(b"run/ck1", 1, &bytes).unwrap();
        assert_eq!(info.file_xxh3, fanstore_core::checksum::xxh3(&bytes));
        // Staged: hidden from ls, readable by id.
        let ls = dd.query(&Query::Ls { dir: Vec::new(), json: true }).unwrap();
        assert_eq!(ls.text, "[]");
        let mut out = Vec::new();
        assert_eq!(dd.read_output(1, &mut out), Ok(bytes.len() as u64));
        assert_eq!(out, bytes);
        dd.settle(1, b"run/ck1");
        assert!(dd.query(&Query::Ls { dir: b"run".to_vec(), json: true }).unwrap().text.contains("run/ck1"));
        // A second version staged, then settled at the same path, replaces the first.
        dd.stage(b"run/ck1", 2, &bytes[..100_000]).unwrap();
        dd.settle(2, b"run/ck1");
        assert!(!dd.holds(1));
        assert_eq!(dd.read_output(1, &mut Vec::new()), Err(libc::ENOENT));
        dd.rename_output(2, b"run/final");
        let ls = dd.query(&Query::Ls { dir: Vec::new(), json: true }).unwrap().text;
        assert!(ls.contains("run/final") && !ls.contains("run/ck1"), "{ls}");
        assert!(dd.drop_output(2));
        assert!(!dd.drop_output(2));
        assert_eq!(dd.query(&Query::Log { path: b"run/final".to_vec(), json: true }).err(), Some(libc::ENOENT));
    }

    /// The whole-file xxh3 the close computed for the plain output at `p`.
    fn sum_of(p: &Path) -> u64 {
        fanstore_core::checksum::xxh3(&std::fs::read(p).unwrap())
    }

    /// A plain output file of `len` bytes at `dir/name`, handed over as the
    /// commit does: a read-only description.
    fn plain_output(dir: &Path, name: &str, len: u32, seed: u32) -> (Vec<u8>, OwnedFd, PathBuf) {
        let bytes: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(seed) % 251) as u8).collect();
        let p = dir.join(name);
        std::fs::write(&p, &bytes).unwrap();
        (bytes, OwnedFd::from(std::fs::File::open(&p).unwrap()), p)
    }

    #[test]
    fn queued_outputs_are_stored_behind_the_close_renamed_or_cancelled() {
        let d = tempfile::tempdir().unwrap();
        let dd = Dedup::open(&d.path().join("ckpt"), 0, false, 8, u64::MAX).unwrap();
        let (b1, f1, p1) = plain_output(d.path(), "1", 300_000, 7);
        let (_, f2, p2) = plain_output(d.path(), "2", 200_000, 11);
        let paused = dd.commit_gate.lock().unwrap();
        dd.enqueue(b"run/a", 1, f1, 300_000, Some(sum_of(&p1)), p1.clone());
        dd.settle(1, b"run/a");
        dd.rename_output(1, b"run/b");
        dd.enqueue(b"run/c", 2, f2, 200_000, Some(sum_of(&p2)), p2.clone());
        // Queued: plain outputs, not the store's; an unlink cancels one.
        assert!(!dd.holds(1) && !dd.holds(2));
        assert!(!dd.drop_output(2));
        assert!(p1.exists());
        drop(paused);
        dd.wait_committed();
        assert!(dd.holds(1) && !dd.holds(2));
        assert!(!p1.exists(), "the plain copy of a stored output is removed");
        assert!(p2.exists(), "a cancelled output's plain file is the caller's to delete");
        assert_reads(&dd, 1, &b1);
        let ls = dd.query(&Query::Ls { dir: Vec::new(), json: true }).unwrap().text;
        assert!(ls.contains("run/b") && !ls.contains("run/a") && !ls.contains("run/c"), "{ls}");
        assert!(dd.drop_output(1));
    }

    #[test]
    fn the_worker_reports_the_sum_of_an_output_queued_without_one() {
        let d = tempfile::tempdir().unwrap();
        let dd = Dedup::open(&d.path().join("ckpt"), 0, false, 8, u64::MAX).unwrap();
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let g = got.clone();
        dd.on_sum(Box::new(move |id, sum| g.lock().unwrap().push((id, sum))));
        let (b1, f1, p1) = plain_output(d.path(), "1", 300_000, 7);
        let (_, f2, p2) = plain_output(d.path(), "2", 200_000, 11);
        let (b3, f3, p3) = plain_output(d.path(), "3", 100_000, 13);
        dd.enqueue(b"run/a", 1, f1, 300_000, None, p1);
        // With its sum (computed at the close): nothing to report.
        dd.enqueue(b"run/b", 2, f2, 200_000, Some(sum_of(&p2)), p2);
        dd.settle(2, b"run/b");
        dd.wait_committed();
        // Stored, but its close has not registered it yet: held back until then.
        assert!(got.lock().unwrap().is_empty());
        assert!(!dd.sums_settled(), "a stop would drain before this sum reached its record");
        dd.settle(1, b"run/a");
        assert_eq!(*got.lock().unwrap(), vec![(1, fanstore_core::checksum::xxh3(&b1))]);
        assert!(dd.sums_settled());
        // Registered before the worker gets to it: the worker reports it.
        let paused = dd.commit_gate.lock().unwrap();
        dd.enqueue(b"run/c", 3, f3, 100_000, None, p3);
        dd.settle(3, b"run/c");
        assert_eq!(got.lock().unwrap().len(), 1);
        assert!(!dd.sums_settled());
        drop(paused);
        dd.wait_committed();
        assert_eq!(got.lock().unwrap()[1], (3, fanstore_core::checksum::xxh3(&b3)));
        assert!(dd.sums_settled());
        assert_reads(&dd, 1, &b1);
    }

    #[test]
    fn closes_renames_and_unlinks_do_not_wait_for_a_running_commit() {
        let d = tempfile::tempdir().unwrap();
        let dd = Dedup::open(&d.path().join("ckpt"), 0, false, 8, u64::MAX).unwrap();
        let (_, f1, p1) = plain_output(d.path(), "1", 300_000, 7);
        let (b2, f2, p2) = plain_output(d.path(), "2", 300_000, 13);
        // The worker takes output 1, then waits for the store (held here).
        let store = dd.write();
        dd.enqueue(b"run/a", 1, f1, 300_000, Some(sum_of(&p1)), p1.clone());
        let t0 = std::time::Instant::now();
        while lock_queue(&dd.queue).running.is_none() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the worker never took the output");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // None of these needs the store's lock.
        dd.settle(1, b"run/a");
        assert!(!dd.drop_output(1));
        dd.enqueue(b"run/b", 2, f2, 300_000, Some(sum_of(&p2)), p2.clone());
        dd.settle(2, b"run/b");
        dd.rename_output(2, b"run/c");
        // Outputs the store does not hold (a small file beside the
        // checkpoint: DCP's `.metadata.tmp` renamed into place), from
        // another thread: it must not wait for the store held here.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                dd.rename_output(77, b"run/.metadata");
                tx.send(dd.drop_output(78)).unwrap();
            });
            let got = rx.recv_timeout(std::time::Duration::from_secs(5));
            drop(store);
            assert_eq!(got, Ok(false), "a rename or unlink of an output the store does not hold waited for its lock");
        });
        dd.wait_committed();
        assert!(!dd.holds(1), "an output unlinked while it was being stored stays released");
        assert!(p1.exists(), "its plain file is the caller's to delete");
        assert!(dd.holds(2) && !p2.exists());
        assert_reads(&dd, 2, &b2);
        let ls = dd.query(&Query::Ls { dir: Vec::new(), json: true }).unwrap().text;
        assert!(ls.contains("run/c") && !ls.contains("run/a") && !ls.contains("\"run/b\""), "{ls}");
        let du = dd.query(&Query::Du).unwrap().text;
        assert!(du.contains("\"checkpoints\":1"), "{du}");
    }

    #[test]
    fn a_full_commit_queue_holds_the_close_back() {
        let d = tempfile::tempdir().unwrap();
        // 100 kB of queue: one 300 kB file at a time.
        let dd = Arc::new(Dedup::open(&d.path().join("ckpt"), 0, false, 8, 100_000).unwrap());
        let (_, f1, p1) = plain_output(d.path(), "1", 300_000, 7);
        let (b2, f2, p2) = plain_output(d.path(), "2", 300_000, 13);
        let paused = dd.commit_gate.lock().unwrap();
        dd.enqueue(b"run/a", 1, f1, 300_000, Some(sum_of(&p1)), p1);
        let (tx, rx) = std::sync::mpsc::channel();
        let dd2 = dd.clone();
        let t = std::thread::spawn(move || {
            dd2.enqueue(b"run/b", 2, f2, 300_000, Some(sum_of(&p2)), p2);
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err(), "the second close waited for no commit");
        drop(paused);
        rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap();
        t.join().unwrap();
        dd.wait_committed();
        assert_reads(&dd, 2, &b2);
    }

    #[test]
    fn handed_over_files_serve_opens_while_hot() {
        use std::io::Write as _;
        use std::os::fd::AsRawFd;
        let d = tempfile::tempdir().unwrap();
        let dd = Dedup::open(&d.path().join("ckpt"), 0, false, 2, u64::MAX).unwrap();
        let target = |fd: &OwnedFd| std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        let mut sums = Vec::new();
        for id in 1..=3u64 {
            let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * id as u32 % 251) as u8).collect();
            let p = d.path().join(format!("client-{id}"));
            std::fs::File::create(&p).unwrap().write_all(&bytes).unwrap();
            // As the daemon's commit does: a read-only description, mapped.
            let ro = std::fs::File::open(&p).unwrap();
            // SAFETY: test file, written above and never again; read-only mapping.
            let map = Arc::new(unsafe { memmap2::Mmap::map(&ro) }.unwrap());
            let info = dd.stage_handed(b"run/x", id, OwnedFd::from(ro), map, false).unwrap();
            dd.settle(id, format!("run/c{id}").as_bytes());
            sums.push((bytes, info.file_xxh3, p));
        }
        // The last two (hot: 2) come from their files; the first is rebuilt.
        for (i, (bytes, sum, p)) in sums.iter().enumerate() {
            let fd = dd.open_output(i as u64 + 1, bytes.len() as u64, *sum).unwrap();
            let t = target(&fd);
            if i == 0 {
                assert!(t.to_string_lossy().starts_with("/memfd:fanstore:ckpt"), "{t:?}");
            } else {
                assert_eq!(&t, p);
            }
            assert_eq!(&std::fs::read(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap(), bytes);
        }
        assert!(dd.drop_output(3));
        assert_eq!(dd.open_output(3, 300_000, sums[2].1).err(), Some(libc::ENOENT));
    }

    #[test]
    fn hot_memfds_move_to_the_local_disk() {
        use std::os::fd::{AsRawFd, FromRawFd};
        let d = tempfile::tempdir().unwrap();
        let dd = Dedup::open(&d.path().join("ckpt"), 0, false, 2, u64::MAX).unwrap();
        let bytes: Vec<u8> = (0..500_000u32).map(|i| (i % 241) as u8).collect();
        // SAFETY: memfd_create with a literal name; the fd is checked and owned below.
        let raw = unsafe { libc::memfd_create(c"client".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(raw >= 0);
        // SAFETY: raw is a fresh fd we own.
        let mut f = unsafe { std::fs::File::from_raw_fd(raw) };
        std::io::Write::write_all(&mut f, &bytes).unwrap();
        // SAFETY: fcntl on our memfd.
        assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) }, 0);
        // SAFETY: sealed above; read-only mapping.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&f) }.unwrap());
        let info = dd.stage_handed(b"run/m", 7, OwnedFd::from(f), map, true).unwrap();
        dd.settle(7, b"run/m");
        let target = |fd: &OwnedFd| std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        // The move happens in the background: poll until it is done (bounded).
        let mut moved = None;
        for _ in 0..1000 {
            let fd = dd.open_output(7, bytes.len() as u64, info.file_xxh3).unwrap();
            assert_eq!(std::fs::read(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap(), bytes);
            let t = target(&fd);
            if !t.to_string_lossy().starts_with("/memfd:") {
                moved = Some(t);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let t = moved.expect("the hot memfd was never moved to the local disk");
        assert!(t.starts_with(d.path().join("ckpt")), "{t:?}");
        assert_reads(&dd, 7, &bytes);
    }

    #[test]
    fn a_drain_appends_what_a_pack_grew_and_replaces_another_pack_of_that_name() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let d = tempfile::tempdir().unwrap();
        let (src, dst) = (d.path().join("src.fsk"), d.path().join("dst.fsk"));
        let f = pack::create(&src, &pack::PackHeader { seq: 1, nonce: 5 }).unwrap();
        f.write_all_at(&[1u8; 1000], pack::HEADER_LEN as u64).unwrap();
        copy_pack(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), std::fs::read(&src).unwrap());
        let ino = std::fs::metadata(&dst).unwrap().ino();
        // The pack grew: only the tail is appended, in place.
        f.write_all_at(&[2u8; 700], pack::HEADER_LEN as u64 + 1000).unwrap();
        copy_pack(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), std::fs::read(&src).unwrap());
        assert_eq!(std::fs::metadata(&dst).unwrap().ino(), ino, "appended, not rewritten");
        // A pack of the same name from another store (other nonce), shorter: replaced whole.
        std::fs::remove_file(&src).unwrap();
        let g = pack::create(&src, &pack::PackHeader { seq: 1, nonce: 6 }).unwrap();
        g.write_all_at(&[3u8; 10], pack::HEADER_LEN as u64).unwrap();
        copy_pack(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), std::fs::read(&src).unwrap());
        // Unchanged: nothing to do.
        let ino = std::fs::metadata(&dst).unwrap().ino();
        copy_pack(&src, &dst).unwrap();
        assert_eq!(std::fs::metadata(&dst).unwrap().ino(), ino);
    }

    #[test]
    fn drain_adopt_and_sweep() {
        let d = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let more: Vec<u8> = (0..200_000u32).map(|i| (i * 13 % 251) as u8).collect();
        let persist = d.path().join("persist");
        {
            let dd = Dedup::open(&d.path().join("a"), 0, false, 2, u64::MAX).unwrap();
            dd.stage(b"c/1", 5, &bytes).unwrap();
            dd.settle(5, b"c/1");
            dd.stage(b"c/2", 6, &bytes[..1000]).unwrap(); // staged only: swept after adoption
            dd.drain_to(&drained_dir(&persist, 3)).unwrap();
            // The pack grows after the first drain: the second one appends its tail.
            dd.stage(b"c/3", 7, &more).unwrap();
            dd.settle(7, b"c/3");
            dd.drain_to(&drained_dir(&persist, 3)).unwrap();
            let local_units = d.path().join("a").join(UNITS_DIR);
            for e in std::fs::read_dir(&local_units).unwrap().flatten() {
                let there = drained_dir(&persist, 3).join(UNITS_DIR).join(e.file_name());
                assert_eq!(std::fs::read(e.path()).unwrap(), std::fs::read(there).unwrap(), "{:?}", e.file_name());
            }
        }
        let cats = persisted_catalogs(&persist).unwrap();
        assert_eq!(cats.get(&b"c/1"[..]), Some(&3));
        let local = d.path().join("b");
        assert!(adopt_drained(&drained_dir(&persist, 3), &local).unwrap());
        assert!(!adopt_drained(&drained_dir(&persist, 4), &d.path().join("x")).unwrap());
        let dd = Dedup::open(&local, 0, false, 2, u64::MAX).unwrap();
        assert!(dd.claim(9, b"c/1"));
        assert!(!dd.claim(10, b"c/1"), "one id per checkpoint");
        assert!(!dd.claim(10, b"c/nope"));
        assert!(dd.claim(11, b"c/3"));
        assert_eq!(dd.sweep_unclaimed(), 1);
        assert_reads(&dd, 9, &bytes);
        assert_reads(&dd, 11, &more);
        // A damaged unit is EIO, never wrong bytes: the last byte of every record.
        let packs: Vec<_> = std::fs::read_dir(local.join(UNITS_DIR)).unwrap().flatten().map(|e| e.path()).collect();
        assert!(!packs.is_empty());
        for p in &packs {
            let records = pack::scan(p).unwrap().records;
            let mut b = std::fs::read(p).unwrap();
            for r in records {
                b[(r.end() - 1) as usize] ^= 0xff;
            }
            std::fs::write(p, b).unwrap();
        }
        assert_eq!(dd.read_output(9, &mut Vec::new()), Err(libc::EIO));
        let v = dd.query(&Query::Verify { path: None, json: false }).unwrap();
        assert!(!v.ok);
    }
}
