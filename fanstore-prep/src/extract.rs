//! `extract`: restores a dataset as a directory tree, exactly: bytes,
//! permission bits, access and modification times (ns), symlinks, empty
//! files and empty directories. (Change times cannot be set by anyone.)
//!
//! Order of work:
//! 1. directories, created 0700 so that they can be filled;
//! 2. files, partition by partition in payload order (one sequential read
//!    of each partition), each checked against its entry header and
//!    checksum; all-zero 64 KiB blocks become holes ([`SparseWriter`]), so a
//!    sparse multi-GiB file extracts quickly and stays sparse;
//! 3. symlinks, with their times;
//! 4. directory modes and times, deepest first, so that writing a directory's
//!    contents does not change its restored mtime.

use crate::sys;
use crate::walk::display_path;
use fanstore_core::checksum::{xxh3, StreamingChecksum};
use fanstore_core::codec::{self, Codec};
use fanstore_core::manifest::{self, IndexView, Manifest, NodeKind, NodeRef};
use fanstore_core::partition::{self, EntryHeader, ENTRY_HEADER_LEN};
use fanstore_core::FormatError;
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Holes are made of all-zero blocks of this size, aligned in the file.
pub const SPARSE_BLOCK: usize = 64 << 10;

/// Why an extraction failed.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error("{}: exists and is not an empty directory; extract into a new or empty directory", .0.display())]
    DestinationNotEmpty(PathBuf),
    #[error("{}: {source}", .path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{}: entry at offset {offset} does not match the manifest's file '{file}': {problem}", .partition.display())]
    Mismatch { partition: PathBuf, offset: u64, file: String, problem: String },
}

/// What an extraction restored.
#[derive(Debug, Default, Clone)]
pub struct ExtractSummary {
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub bytes: u64,
    pub seconds: f64,
}

impl std::fmt::Display for ExtractSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "extracted {} files, {} directories, {} symlinks: {:.1} MB in {:.2} s",
            self.files,
            self.directories,
            self.symlinks,
            self.bytes as f64 / 1e6,
            self.seconds
        )
    }
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> ExtractError + '_ {
    move |source| ExtractError::Io { path: path.into(), source }
}

/// Extracts the dataset in `dataset` into `to` (created if missing; if it
/// exists it must be an empty directory).
pub fn extract(dataset: &Path, to: &Path) -> Result<ExtractSummary, ExtractError> {
    let start = Instant::now();
    let m = Manifest::open(&dataset.join(manifest::FILE_NAME))?;
    let view = m.view();
    prepare_destination(to)?;
    let dest: OwnedFd = File::open(to).map_err(io_at(to))?.into();
    let mut dirs = DirCache { root: dest.as_fd(), to, last: None };
    let mut summary = ExtractSummary::default();

    // 1. Directories, parents first (node order is depth-first).
    for n in view.nodes().skip(1).filter(|n| n.kind() == Some(NodeKind::Dir)) {
        let parent = dirs.get(&view, n.parent())?;
        sys::mkdir_at(parent, n.name(), 0o700).map_err(io_at(&display_path(to, n.path())))?;
        summary.directories += 1;
    }

    // 2. Files, one partition at a time in payload order.
    let mut by_partition: Vec<Vec<NodeRef<'_>>> = vec![Vec::new(); view.partition_count() as usize];
    for n in view.nodes().filter(|n| n.kind() == Some(NodeKind::File)) {
        if let Some(list) = by_partition.get_mut(n.partition() as usize) {
            list.push(n);
        }
    }
    let mut buf = vec![0u8; 1 << 20];
    for (p, nodes) in by_partition.iter_mut().enumerate() {
        if nodes.is_empty() {
            continue;
        }
        nodes.sort_by_key(|n| n.payload_offset());
        let part_path = dataset.join(partition::file_name(p as u32));
        let part = File::open(&part_path).map_err(|e| FormatError::io(&part_path, e))?;
        for n in nodes.iter() {
            let shown = display_path(to, n.path());
            let parent = dirs.get(&view, n.parent())?;
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
            let out = File::from(sys::open_beneath(parent, n.name(), flags, 0o600).map_err(io_at(&shown))?);
            let out = restore_file(&part_path, &part, n, out, &shown, &mut buf)?;
            sys::chmod_fd(out.as_fd(), n.mode() & 0o7777).map_err(io_at(&shown))?;
            sys::set_times_fd(out.as_fd(), n.atime_ns(), n.mtime_ns()).map_err(io_at(&shown))?;
            summary.files += 1;
            summary.bytes += n.size();
        }
    }

    // 3. Symlinks.
    for n in view.nodes().filter(|n| n.kind() == Some(NodeKind::Symlink)) {
        let shown = display_path(to, n.path());
        let parent = dirs.get(&view, n.parent())?;
        sys::symlink_at(n.symlink_target(), parent, n.name()).map_err(io_at(&shown))?;
        sys::set_times_at(parent, n.name(), n.atime_ns(), n.mtime_ns()).map_err(io_at(&shown))?;
        summary.symlinks += 1;
    }

    // 4. Directory modes and times, children before parents.
    let dir_nodes: Vec<NodeRef<'_>> = view.nodes().filter(|n| n.kind() == Some(NodeKind::Dir)).collect();
    for n in dir_nodes.iter().rev() {
        let shown = display_path(to, n.path());
        let (parent, name): (BorrowedFd<'_>, &[u8]) = if n.id() == 0 { (dest.as_fd(), b"") } else { (dirs.get(&view, n.parent())?, n.name()) };
        sys::chmod_at(parent, name, n.mode() & 0o7777).map_err(io_at(&shown))?;
        sys::set_times_at(parent, name, n.atime_ns(), n.mtime_ns()).map_err(io_at(&shown))?;
    }
    summary.seconds = start.elapsed().as_secs_f64();
    Ok(summary)
}

fn prepare_destination(to: &Path) -> Result<(), ExtractError> {
    match std::fs::read_dir(to) {
        Ok(mut listing) => {
            if listing.next().is_some() {
                return Err(ExtractError::DestinationNotEmpty(to.into()));
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::create_dir_all(to).map_err(io_at(to)),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Err(ExtractError::DestinationNotEmpty(to.into())),
        Err(e) => Err(io_at(to)(e)),
    }
}

/// The open parent directory of the node being restored, reused while
/// consecutive nodes share a parent.
struct DirCache<'a> {
    root: BorrowedFd<'a>,
    to: &'a Path,
    last: Option<(u32, OwnedFd)>,
}

impl DirCache<'_> {
    fn get(&mut self, view: &IndexView<'_>, dir_id: u32) -> Result<BorrowedFd<'_>, ExtractError> {
        if dir_id == 0 {
            return Ok(self.root);
        }
        if self.last.as_ref().map(|(id, _)| *id) != Some(dir_id) {
            let path = view.node(dir_id).map(|n| n.path()).unwrap_or_default();
            let fd = sys::open_beneath(self.root, path, libc::O_RDONLY | libc::O_DIRECTORY, 0)
                .map_err(io_at(&display_path(self.to, path)))?;
            self.last = Some((dir_id, fd));
        }
        match &self.last {
            Some((_, fd)) => Ok(fd.as_fd()),
            None => Ok(self.root),
        }
    }
}

/// Writes the bytes of file node `n` from partition `part` into `out`,
/// checking the entry header and checksum on the way.
fn restore_file(part_path: &Path, part: &File, n: &NodeRef<'_>, out: File, shown: &Path, buf: &mut [u8]) -> Result<File, ExtractError> {
    let payload_off = n.payload_offset();
    let mismatch = |offset: u64, problem: String| ExtractError::Mismatch {
        partition: part_path.into(),
        offset,
        file: String::from_utf8_lossy(n.path()).into_owned(),
        problem,
    };
    let header_off = payload_off
        .checked_sub(ENTRY_HEADER_LEN as u64)
        .ok_or_else(|| mismatch(payload_off, "payload offset inside the partition header".into()))?;
    let mut hb = [0u8; ENTRY_HEADER_LEN];
    part.read_exact_at(&mut hb, header_off).map_err(|e| FormatError::io(part_path, e))?;
    let eh = EntryHeader::decode(part_path, header_off, &hb)?;
    let expected = (xxh3(n.path()), n.size(), n.stored_len(), n.codec(), n.checksum());
    let found = (eh.path_hash, eh.raw_len, eh.stored_len, eh.codec, eh.payload_checksum);
    if expected != found {
        return Err(mismatch(header_off, format!("manifest says (path hash, size, stored, codec, checksum) = {expected:x?}, entry says {found:x?}")));
    }
    let mut w = SparseWriter::new(out);
    let checksum_fault = |computed: u64| {
        ExtractError::Format(FormatError::Checksum {
            file: part_path.into(),
            entry: format!("payload of '{}'", String::from_utf8_lossy(n.path())),
            offset: payload_off,
            stored: eh.payload_checksum,
            computed,
        })
    };
    if eh.codec == Codec::None {
        let mut sum = StreamingChecksum::new();
        let mut done = 0u64;
        while done < eh.stored_len {
            let k = buf.len().min((eh.stored_len - done) as usize);
            part.read_exact_at(&mut buf[..k], payload_off + done).map_err(|e| FormatError::io(part_path, e))?;
            sum.update(&buf[..k]);
            w.write_all(&buf[..k]).map_err(io_at(shown))?;
            done += k as u64;
        }
        let computed = sum.digest();
        if computed != eh.payload_checksum {
            return Err(checksum_fault(computed));
        }
    } else {
        let mut stored = vec![0u8; eh.stored_len as usize];
        part.read_exact_at(&mut stored, payload_off).map_err(|e| FormatError::io(part_path, e))?;
        let computed = xxh3(&stored);
        if computed != eh.payload_checksum {
            return Err(checksum_fault(computed));
        }
        codec::decompress_to(eh.codec, &stored, eh.raw_len, &mut w).map_err(io_at(shown))?;
    }
    w.finish(eh.raw_len).map_err(io_at(shown))
}

/// A writer that turns aligned all-zero blocks of [`SPARSE_BLOCK`] bytes
/// into holes (by seeking past them) and sets the final length at the end.
pub struct SparseWriter {
    file: File,
    block: Vec<u8>,
}

fn is_zero(b: &[u8]) -> bool {
    let mut chunks = b.chunks_exact(64);
    chunks.all(|c| c.iter().fold(0u8, |acc, &x| acc | x) == 0) && chunks.remainder().iter().all(|&x| x == 0)
}

impl SparseWriter {
    /// `file` must be empty and positioned at 0.
    pub fn new(file: File) -> SparseWriter {
        SparseWriter { file, block: Vec::with_capacity(SPARSE_BLOCK) }
    }

    fn put_block(&mut self, block: &[u8]) -> io::Result<()> {
        if is_zero(block) {
            self.file.seek(SeekFrom::Current(block.len() as i64))?;
            Ok(())
        } else {
            self.file.write_all(block)
        }
    }

    /// Writes what is buffered and sets the file's length to `len`.
    pub fn finish(mut self, len: u64) -> io::Result<File> {
        let block = std::mem::take(&mut self.block);
        self.put_block(&block)?;
        self.file.set_len(len)?;
        Ok(self.file)
    }
}

impl Write for SparseWriter {
    fn write(&mut self, mut data: &[u8]) -> io::Result<usize> {
        let n = data.len();
        while !data.is_empty() {
            if self.block.is_empty() && data.len() >= SPARSE_BLOCK {
                let (head, rest) = data.split_at(SPARSE_BLOCK);
                self.put_block(head)?;
                data = rest;
                continue;
            }
            let take = (SPARSE_BLOCK - self.block.len()).min(data.len());
            self.block.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.block.len() == SPARSE_BLOCK {
                let block = std::mem::take(&mut self.block);
                self.put_block(&block)?;
                self.block = block;
                self.block.clear();
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn zero_blocks_become_holes_and_bytes_survive() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let mut data = vec![0u8; 10 * SPARSE_BLOCK + 123];
        data[3 * SPARSE_BLOCK + 7] = 1;
        data[10 * SPARSE_BLOCK + 5] = 9;
        let mut w = SparseWriter::new(File::create(&p).unwrap());
        for piece in data.chunks(50_000) {
            w.write_all(piece).unwrap();
        }
        w.finish(data.len() as u64).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), data);
        let blocks_bytes = std::fs::metadata(&p).unwrap().blocks() * 512;
        assert!(blocks_bytes <= 3 * SPARSE_BLOCK as u64, "{blocks_bytes} bytes allocated");
    }

    #[test]
    fn trailing_hole_keeps_the_length() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let mut w = SparseWriter::new(File::create(&p).unwrap());
        w.write_all(b"abc").unwrap();
        w.write_all(&vec![0u8; 3 * SPARSE_BLOCK]).unwrap();
        w.finish(3 + 3 * SPARSE_BLOCK as u64).unwrap();
        let got = std::fs::read(&p).unwrap();
        assert_eq!(got.len(), 3 + 3 * SPARSE_BLOCK);
        assert_eq!(&got[..3], b"abc");
        assert!(is_zero(&got[3..]));
    }
}
