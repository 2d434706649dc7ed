//! open/openat/creat/fopen of paths under the mount: every fd returned is a
//! real kernel fd whose bytes are the file's.
//!
//! - a file the tier map says this node holds as a named file (extracted
//!   to the local disk, or a copy in the daemon's copy directory): a plain
//!   open of that file, no message;
//! - a small (under 64 KiB) or a compressed file of a partition this node
//!   holds (loaded at start, or replicated from a peer since: the tier map
//!   says so): read from the mapped partition copy, verified, decompressed
//!   into a memfd, here in the process, no message (a round trip to the
//!   daemon, its decode and its copy cost more); the daemon makes a named
//!   copy of such a file in the background for later opens (its prefill,
//!   or the one-way WARM hint sent after decoding it, unless the tier map
//!   says the daemon declined that copy);
//! - anything else: the daemon makes it a named file and sends an fd, reopened
//!   through /proc/self/fd so that this open has its own offset, and moved
//!   onto the received fd's number (the lowest free one, as open(2) promises);
//! - directory: an fd on a real empty read-only directory, tracked as the
//!   virtual directory (for fdopendir, fstat, fchdir, openat, getdents64).

use super::open_base::{open_dir, wants_write};
use super::{is_symlink, resolve, Node, Outcome, VPath};
use crate::client;
use crate::errno::errno;
use crate::fd_table::{self, Tracked};
use crate::state::State;
use fanstore_core::codec::Codec;
use fanstore_core::tiers::{self, EXTRACT_MIN, TIER_COPY, TIER_EXTRACTED};
use libc::c_int;

/// Flags of the caller's open we carry over to the real open.
const KEEP: c_int = libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_LARGEFILE;

/// open(2) of a path under the mount.
///
/// Names that are not inputs are outputs ([`super::out::open`]): O_CREAT of
/// a new name, or writing an existing output, gives a memfd committed on the
/// last close; reading an output gives an fd with its bytes.
pub fn open(vp: &VPath, flags: c_int, mode: u32) -> Outcome<c_int> {
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return Outcome::Errno(match resolve(vp.st, vp.rel, true, true) {
            Ok(_) => libc::EROFS,
            Err(e) => e,
        });
    }
    let creat = flags & libc::O_CREAT != 0;
    let excl = creat && flags & libc::O_EXCL != 0;
    let follow = flags & libc::O_NOFOLLOW == 0 && !excl;
    let n = match resolve(vp.st, vp.rel, vp.must_be_dir && !creat, follow) {
        Ok(n) => n,
        Err(libc::ENOENT) => return super::out::open(vp, flags, mode),
        Err(e) => return Outcome::Errno(e),
    };
    if excl {
        return Outcome::Errno(libc::EEXIST);
    }
    if is_symlink(&n) {
        // O_PATH|O_NOFOLLOW opens the link itself (fstat shows the link), as natively.
        if flags & libc::O_PATH != 0 && !follow {
            return open_link_path(vp.st, &n, flags).into();
        }
        // (O_DIRECTORY is checked before the type of the file: ENOTDIR.)
        return Outcome::Errno(if flags & libc::O_DIRECTORY != 0 { libc::ENOTDIR } else { libc::ELOOP });
    }
    // On an existing node O_CREAT alone asks for no write (open(2) on a
    // read-only mount succeeds), except that directories refuse it.
    if n.is_dir() {
        if wants_write(flags) {
            return Outcome::Errno(libc::EISDIR);
        }
        return open_dir(vp.st, &n, flags).into();
    }
    if flags & libc::O_DIRECTORY != 0 || vp.must_be_dir {
        return Outcome::Errno(libc::ENOTDIR);
    }
    if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
        return Outcome::Errno(libc::EROFS);
    }
    open_file(vp.st, &n, flags).into()
}

/// An `O_PATH` fd standing for symlink node `n`: a real O_PATH fd (reads
/// fail with EBADF in the kernel) tracked as the link, so fstat reports it.
fn open_link_path(st: &State, n: &Node, flags: c_int) -> Result<c_int, c_int> {
    let f = libc::O_PATH | (flags & libc::O_CLOEXEC);
    // SAFETY: empty_dir is a NUL-terminated path; plain open.
    let fd = unsafe { crate::real::open(st.empty_dir.as_ptr(), f, 0) };
    if fd < 0 {
        return Err(errno());
    }
    if !fd_table::set(fd, Tracked::File(n.id())) {
        // SAFETY: closing the fd we just opened.
        unsafe { crate::real::close(fd) };
        return Err(libc::EMFILE);
    }
    Ok(fd)
}

/// A real fd holding the bytes of file node `n`, tracked.
pub fn open_file(st: &State, n: &Node, flags: c_int) -> Result<c_int, c_int> {
    // A named file may vanish between the map's answer and the open
    // (evicted copy, daemon cleaning up): then ask the daemon.
    let fd = match open_direct(st, n, flags) {
        Some(Ok(fd)) => fd,
        Some(Err(libc::EMFILE)) => return Err(libc::EMFILE),
        _ => match decode_local(st, n, flags) {
            Some(r) => {
                let (fd, ino) = r?;
                if st.flags & fanstore_core::runtime::FLAG_COPIES != 0
                    && st.tiers.is_none_or(|t| !tiers::copy_declined(t.get(n.id())))
                {
                    // A compressed file costs a decode per open until the
                    // node has a copy, a small one a memfd filled (five
                    // system calls more than a plain open): ask the daemon
                    // for a copy, not waiting.
                    crate::warm::hint(st, n.id());
                }
                if !fd_table::set(fd, Tracked::File(n.id())) {
                    // SAFETY: closing the fd we just opened.
                    unsafe { crate::real::close(fd) };
                    return Err(libc::EMFILE);
                }
                // Its pages serve a later decode once the program closed it.
                fd_table::mark_recyclable(fd, ino);
                return Ok(fd);
            }
            None => open_remote(st, n, flags)?,
        },
    };
    if !fd_table::set(fd, Tracked::File(n.id())) {
        // SAFETY: closing the fd we just opened.
        unsafe { crate::real::close(fd) };
        return Err(libc::EMFILE);
    }
    Ok(fd)
}

/// Opens the named file the tier map gives for `n`, if any.
fn open_direct(st: &State, n: &Node, flags: c_int) -> Option<Result<c_int, c_int>> {
    let mut buf = [0u8; 4200];
    let len = match st.tiers?.get(n.id()) {
        TIER_EXTRACTED => fanstore_core::runtime::local_file_path_into(&st.local_dir, n.id(), &mut buf),
        TIER_COPY => fanstore_core::tiers::copy_file_path_into(&st.copy_dir, n.id(), &mut buf),
        _ => return None,
    }?;
    debug_assert_eq!(buf[len], 0);
    let f = libc::O_RDONLY | (flags & (KEEP | libc::O_DIRECT | libc::O_PATH));
    // SAFETY: buf holds a NUL-terminated path (the *_path_into helpers write the NUL).
    let fd = unsafe { crate::real::open(buf.as_ptr().cast(), f, 0) };
    if fd < 0 {
        return Some(Err(errno()));
    }
    Some(Ok(fd))
}

/// A memfd with the bytes of `n` decoded from the mapped local partition
/// copy, if `n` is a small or a compressed file of a partition this node
/// holds (loaded at start, or replicated since: [`tiers::TIER_PART`]; None: ask the
/// daemon, which extracts large uncompressed files to the local disk once).
/// A payload that fails its checksum is EIO, never wrong bytes. With the fd,
/// the memfd's inode number ([`crate::memfd_pool`]).
fn decode_local(st: &State, n: &Node, flags: c_int) -> Option<Result<(c_int, u64), c_int>> {
    if n.size() >= EXTRACT_MIN && n.codec() == Codec::None {
        return None;
    }
    let held = st.local_parts.get(n.partition() as usize).copied().unwrap_or(false)
        || st.tiers.is_some_and(|t| tiers::part_replicated(t.get(n.id())));
    if !held {
        return None;
    }
    let len = st.view.partition(n.partition())?.file_len;
    let map = crate::parts::partition(st, n.partition(), len)?;
    let start = usize::try_from(n.payload_offset()).ok()?;
    let stored = map.get(start..start.checked_add(usize::try_from(n.stored_len()).ok()?)?)?;
    if fanstore_core::checksum::xxh3_cold(stored) != n.checksum() {
        crate::dlog!("node {}: payload fails its checksum in the partition copy: EIO", n.id());
        return Some(Err(libc::EIO));
    }
    let size = usize::try_from(n.size()).ok()?;
    let decode = |out: &mut [u8]| {
        if n.codec() == Codec::None {
            out.copy_from_slice(stored);
        } else if fanstore_core::codec::decompress_into(n.codec(), stored, out).is_err() {
            crate::dlog!("node {}: payload does not decode: EIO", n.id());
            return Err(libc::EIO);
        }
        Ok(())
    };
    if n.codec() == Codec::None && stored.len() != size {
        return Some(Err(libc::EIO));
    }
    // Straight into the pages of a pooled memfd, else into a buffer written
    // into a memfd of its own.
    if let Some(r) = crate::memfd_pool::fill(n.size(), flags, decode) {
        return Some(r);
    }
    let onto = |(fd, ino)| private_onto(fd, flags).map(|fd| (fd, ino));
    if n.codec() == Codec::None {
        return Some(crate::memfd_pool::written(stored).and_then(onto));
    }
    Some(with_scratch(size, |raw| decode(raw).and_then(|()| crate::memfd_pool::written(raw))).and_then(onto))
}

/// Decoded bytes up to this size reuse one buffer per thread (its pages stay
/// allocated: fresh pages cost as much as decoding on some machines).
const SCRATCH_MAX: usize = 16 << 20;

thread_local! {
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs `f` on a buffer of `len` bytes: this thread's reused one when `len`
/// is at most [`SCRATCH_MAX`] (taken out of its cell meanwhile, so a nested
/// call simply gets a new one), else a new one.
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let reuse = len <= SCRATCH_MAX;
    let mut buf = if reuse { SCRATCH.try_with(|c| c.take()).unwrap_or_default() } else { Vec::new() };
    buf.resize(len, 0);
    let r = f(&mut buf[..len]);
    if reuse {
        let _ = SCRATCH.try_with(|c| c.set(buf));
    }
    r
}

fn open_remote(st: &State, n: &Node, flags: c_int) -> Result<c_int, c_int> {
    let shared = client::fetch(st, n.id())?;
    private_onto(shared, flags)
}

/// A new read-only description of `shared` (our fd, possibly the daemon's
/// description), moved onto `shared`'s number: the fd an open(2) returns.
fn private_onto(shared: c_int, flags: c_int) -> Result<c_int, c_int> {
    let cloexec = flags & libc::O_CLOEXEC != 0;
    let private = match crate::memfd_pool::reopen_ro(shared, flags | libc::O_CLOEXEC) {
        Ok(fd) => fd,
        Err(e) => {
            // SAFETY: closing the fd the daemon sent us.
            unsafe { crate::real::close(shared) };
            crate::dlog!("reopen of the daemon's fd failed ({}): EIO", crate::debug::E(e));
            return Err(libc::EIO);
        }
    };
    // Move the private description onto the received number: dup3 replaces
    // it atomically, so no other thread can grab the number in between.
    // SAFETY: both fds are ours.
    let r = unsafe { crate::real::dup3(private, shared, if cloexec { libc::O_CLOEXEC } else { 0 }) };
    if r < 0 {
        // SAFETY: closing our own fd.
        unsafe { crate::real::close(shared) };
        if !cloexec {
            // SAFETY: fcntl on our own fd.
            unsafe { crate::real::fcntl(private, libc::F_SETFD, 0) };
        }
        return Ok(private);
    }
    // SAFETY: closing our own fd (its description lives on as `shared`).
    unsafe { crate::real::close(private) };
    Ok(shared)
}

/// fopen mode string -> open flags (None: invalid mode, EINVAL).
pub fn fopen_flags(mode: &[u8]) -> Option<c_int> {
    let mut f = match mode.first()? {
        b'r' => libc::O_RDONLY,
        b'w' => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        b'a' => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    for &c in &mode[1..] {
        match c {
            b'+' => f = (f & !libc::O_ACCMODE) | libc::O_RDWR,
            b'e' => f |= libc::O_CLOEXEC,
            b'x' => f |= libc::O_EXCL,
            b',' => break,
            _ => {}
        }
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fopen_modes() {
        assert_eq!(fopen_flags(b"r"), Some(libc::O_RDONLY));
        assert_eq!(fopen_flags(b"rbe"), Some(libc::O_RDONLY | libc::O_CLOEXEC));
        assert_eq!(fopen_flags(b"r+"), Some(libc::O_RDWR));
        assert!(wants_write(fopen_flags(b"a").unwrap()));
        assert!(wants_write(fopen_flags(b"wx").unwrap()));
        assert_eq!(fopen_flags(b"q"), None);
        assert_eq!(fopen_flags(b""), None);
    }
}
