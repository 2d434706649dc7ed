//! The files that hold an output's bytes on the client side: a new
//! output's file (an O_TMPFILE on the local disk, else a memfd), the
//! writable copy of a committed one, and the copy of its bytes. Below
//! [`super::out`] (which opens and creates outputs) and
//! [`super::lazy_copy`] (which copies an O_RDWR output at its first write).

use crate::errno::errno;
use crate::state::State;
use libc::c_int;

/// A new file for the bytes of an output: an unnamed file (O_TMPFILE) in
/// the rank's local directory, so the program writes straight into the page
/// cache of the disk the daemon keeps outputs on. At commit the daemon links
/// it (--dedup off), or the checkpoint store keeps it as the hot copy it
/// serves reads from (reads of a checkpoint right after its write then run
/// as from a native file: measured 38-42 ms per 200 MiB against 62-66 ms
/// from a memfd, whose pages come without huge folios here). A memfd where
/// that file system has no O_TMPFILE.
pub(super) fn new_output_file(st: &State, flags: c_int) -> c_int {
    let cloexec = flags & libc::O_CLOEXEC;
    // SAFETY: tmp_dir is a NUL-terminated path; the result is checked.
    let fd = unsafe { crate::real::open(st.tmp_dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | cloexec, 0o600) };
    if fd >= 0 {
        return fd;
    }
    // Sealable: at commit the daemon seals it against writes when nothing
    // maps it writable any more, and may then keep it as the store's hot
    // copy of the checkpoint (reads served from it, no rebuild).
    new_memory_file(flags)
}

/// Largest committed output whose O_RDWR copy is made in memory.
pub(super) const COPY_IN_MEMORY_MAX: i64 = 1 << 20;

/// A new file for a writable copy of `size` committed bytes (close-on-exec):
/// in memory up to [`COPY_IN_MEMORY_MAX`], as an O_RDWR copy at the open
/// is (`super::out`'s `small_copy`).
pub(super) fn new_copy_file(size: i64) -> c_int {
    match crate::state::current() {
        Some(st) if size > COPY_IN_MEMORY_MAX => new_output_file(st, libc::O_CLOEXEC),
        _ => new_memory_file(libc::O_CLOEXEC),
    }
}

/// Copies every byte of `src` (about `size` of them: read to its end) into
/// `dst` at the same offsets, with pread and pwrite (no offset moves).
pub(super) fn copy_bytes(src: c_int, dst: c_int, size: i64) -> Result<(), c_int> {
    let mut buf = vec![0u8; crate::outputs::copy_buffer_len(size)];
    let mut off: i64 = 0;
    loop {
        // SAFETY: buf is a live buffer of its length.
        let n = unsafe { libc::pread(src, buf.as_mut_ptr().cast(), buf.len(), off) };
        if n < 0 {
            return Err(errno());
        }
        if n == 0 {
            return Ok(());
        }
        // SAFETY: writing the n bytes just read.
        if unsafe { crate::real::pwrite(dst, buf.as_ptr().cast(), n as usize, off) } != n {
            return Err(libc::EIO);
        }
        off += n as i64;
    }
}

/// A memfd for an output's bytes (sealable, as [`new_output_file`]'s fallback).
pub(super) fn new_memory_file(flags: c_int) -> c_int {
    let mfd_flags = libc::MFD_ALLOW_SEALING | if flags & libc::O_CLOEXEC != 0 { libc::MFD_CLOEXEC } else { 0 };
    // SAFETY: the name is a NUL-terminated literal.
    unsafe { libc::memfd_create(c"fanstore-output".as_ptr(), mfd_flags) }
}
