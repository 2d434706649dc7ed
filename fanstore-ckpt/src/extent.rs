//! Extent files: a committed file adopted whole by the store, so that
//! the payloads of its new raw units are not copied into a pack.
//!
//! A checkpoint of fresh, incompressible tensors (or a large file of an
//! unknown format) is almost all new units that stay raw. Copying them into
//! a pack was most of such a commit's time (the copy into fresh page-cache
//! pages: 16.5% of all samples against 2.1% for blake3). When a file the
//! caller hands over for good is at least [`ADOPT_PERCENT`] % new raw
//! units, the store hard-links that file into its `units` directory as an
//! extent and appends, for each of those units, a 128-byte *external*
//! record to a pack (see [`mod@crate::unit`], encoding 3). The record holds
//! the unit's identity and checksums like any other; only the payload is
//! elsewhere.
//!
//! ```text
//! units/<seq:016x>-<nonce:016x>.fsx
//!   the committed file's bytes exactly as the program wrote them, no
//!   header: every unit in it is checked against its record (payload xxh3
//!   on every read, blake3 on verify), so a damaged extent is an error
//!   naming the extent and the unit, never wrong bytes.
//!   seq:   from the packs' sequence numbers (a pack and an extent never
//!          share one within a store's life)
//!   nonce: random; the name is unique even if a later store life reuses a
//!          sequence number, so a drained copy of an older extent is never
//!          taken for a newer one (a drain copies an extent once, by name)
//! external record (in a pack), header bytes 64..96:
//!   64..72 extent seq, 72..80 extent nonce, 80..88 payload offset, 88..96 zero
//! ```
//!
//! **Life.** The link is made before any record refers to it and the
//! catalog is written last, so a crash before the commit point leaves an
//! extent no live record refers to, which open deletes. The store counts
//! each extent's live payload bytes; when none are left the extent is
//! deleted, and when fewer than the compaction threshold are live its live
//! units are copied into packs as raw records (synced) before it is
//! deleted. An extent is never written: the caller promises that nothing
//! writes the file it hands over, and the store only reads, links and
//! unlinks it.

use crate::error::{CkptError, Result};
use crate::unit::{self, UnitHeader};
use fanstore_core::format::read_full_at;
use fanstore_core::FormatError;
use std::fs::File;
use std::path::{Path, PathBuf};

/// A file is adopted when at least this percentage of its bytes are new
/// units that stay raw; below it, the extent's dead bytes would cost more
/// disk than the copy costs time.
pub const ADOPT_PERCENT: u64 = 90;

/// Files smaller than this are not adopted: an extent costs a link and a
/// file of its own (0.3-1 ms on ext4 here), about what copying 1 MiB costs.
pub const ADOPT_MIN: u64 = 8 << 20;

/// The file name of extent `seq` with `nonce`.
pub fn file_name(seq: u64, nonce: u64) -> String {
    format!("{seq:016x}-{nonce:016x}.fsx")
}

/// The (sequence number, nonce) an extent file name stands for.
pub fn parse_name(name: &str) -> Option<(u64, u64)> {
    let s = name.strip_suffix(".fsx")?;
    let (a, b) = s.split_once('-')?;
    if a.len() != 16 || b.len() != 16 {
        return None;
    }
    Some((u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?))
}

/// The path of extent `seq` under the store's `units` directory.
pub fn path(units_dir: &Path, seq: u64, nonce: u64) -> PathBuf {
    units_dir.join(file_name(seq, nonce))
}

/// Hard-links the open file `f` at `dest` (no copy). Fails with EXDEV when
/// `dest` is on another file system, and for a file that has no name and
/// was opened with O_EXCL (Linux does not let such a file be linked).
pub fn link(f: &File, dest: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let from = std::ffi::CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).map_err(std::io::Error::other)?;
    let to = std::ffi::CString::new(dest.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: two NUL-terminated paths that live across the call; linkat
    // only reads them. AT_SYMLINK_FOLLOW makes /proc/self/fd/N name the
    // open file itself (it works for unnamed O_TMPFILE files as well).
    let r = unsafe { libc::linkat(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Reads the payload of external unit `head` from the extent file `f`
/// (named `file` in errors) into `dst` and checks it against the record's
/// xxh3 (and blake3 when `full`).
pub fn read_checked(file: &Path, f: &File, head: &UnitHeader, dst: &mut [u8], full: bool) -> Result<()> {
    let Some(x) = head.extent else {
        return Err(CkptError::Invalid(format!("unit {} is not external", unit::hex(&head.blake3))));
    };
    read_into(file, f, x.off, dst)?;
    // The store adds "of <unit>" (as for every record's errors).
    let entry = || "external payload".to_string();
    FormatError::check_xxh3(file, entry, x.off, dst, head.xxh3)?;
    if full {
        let b = unit::hash(dst);
        if b != head.blake3 {
            return Err(FormatError::Corrupt {
                file: file.into(),
                entry: entry(),
                offset: x.off,
                problem: format!("blake3 is {}", unit::hex(&b)),
            }
            .into());
        }
    }
    Ok(())
}

/// Reads `dst.len()` payload bytes at `off` of the extent file `f` (named
/// `file` in errors), unchecked.
pub fn read_into(file: &Path, f: &File, off: u64, dst: &mut [u8]) -> Result<()> {
    let n = read_full_at(f, dst, off).map_err(|e| CkptError::io(file, e))?;
    if n < dst.len() {
        return Err(FormatError::Truncated {
            file: file.into(),
            entry: "extent".into(),
            offset: off,
            needed: dst.len() as u64,
            len: n as u64,
        }
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_strays_are_not_extents() {
        assert_eq!(parse_name(&file_name(7, 0xdead_beef)), Some((7, 0xdead_beef)));
        assert_eq!(parse_name("0000000000000007.fsk"), None);
        assert_eq!(parse_name("7-9.fsx"), None);
        assert_eq!(parse_name("000000000000000g-0000000000000001.fsx"), None);
    }

    #[test]
    fn an_unnamed_file_is_linked_without_a_copy_and_a_short_read_is_named() {
        use std::io::Write;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let d = tempfile::tempdir().unwrap();
        let mut f = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).open(d.path()).unwrap();
        f.write_all(b"0123456789").unwrap();
        let dest = path(d.path(), 1, 2);
        link(&f, &dest).unwrap();
        assert_eq!(std::fs::metadata(&dest).unwrap().ino(), f.metadata().unwrap().ino());
        let mut b = [0u8; 4];
        read_into(&dest, &f, 3, &mut b).unwrap();
        assert_eq!(&b, b"3456");
        let e = read_into(&dest, &f, 8, &mut b).unwrap_err().to_string();
        assert!(e.contains(".fsx") && e.contains("extent"), "{e}");
    }
}
