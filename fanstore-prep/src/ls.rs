//! `ls`: lists a dataset's namespace like `ls -l` (mode, links, size,
//! modification time in UTC, name; symlinks as `name -> target`), from the
//! manifest alone. Names are written as raw bytes.

use fanstore_core::manifest::{self, Manifest, NodeKind, NodeRef};
use fanstore_core::FormatError;
use std::io::{self, Write};
use std::path::Path;

/// Why a listing failed.
#[derive(Debug, thiserror::Error)]
pub enum LsError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{}: no such path in the dataset", String::from_utf8_lossy(.0))]
    NotFound(Vec<u8>),
    #[error("'..' is not allowed in a dataset path")]
    DotDot,
    #[error(transparent)]
    Output(#[from] io::Error),
}

/// Lists `path` (relative to the dataset root; empty, `/` or `.` for the
/// root) of the dataset in `dataset`: a directory's entries, or the one entry.
pub fn ls(dataset: &Path, path: &[u8], out: &mut impl Write) -> Result<(), LsError> {
    let m = Manifest::open(&dataset.join(manifest::FILE_NAME))?;
    let view = m.view();
    let comps: Vec<&[u8]> = path.split(|&b| b == b'/').filter(|c| !c.is_empty() && *c != b".").collect();
    if comps.iter().any(|c| *c == b"..") {
        return Err(LsError::DotDot);
    }
    let rel = comps.join(&b'/');
    let node = view.lookup(&rel).ok_or_else(|| LsError::NotFound(path.to_vec()))?;
    if node.is_dir() {
        for child in view.children(node) {
            line(out, &child, child.name())?;
        }
    } else {
        line(out, &node, &rel)?;
    }
    out.flush()?;
    Ok(())
}

fn line(out: &mut impl Write, n: &NodeRef<'_>, name: &[u8]) -> io::Result<()> {
    let size = if n.is_dir() { 0 } else { n.size() };
    write!(out, "{} {:>3} {:>12} {} ", mode_string(n.mode()), n.nlink(), size, format_time_utc(n.mtime_ns()))?;
    out.write_all(name)?;
    if n.kind() == Some(NodeKind::Symlink) {
        out.write_all(b" -> ")?;
        out.write_all(n.symlink_target())?;
    }
    out.write_all(b"\n")
}

/// `drwxr-xr-x`-style mode string, with setuid/setgid/sticky letters.
pub fn mode_string(mode: u32) -> String {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFREG => '-',
        _ => '?',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    let special = [(libc::S_ISUID, 's'), (libc::S_ISGID, 's'), (libc::S_ISVTX, 't')];
    for (i, (bit, letter)) in special.iter().enumerate() {
        let shift = 6 - 3 * i as u32;
        let rwx = (mode >> shift) & 7;
        s.push(if rwx & 4 != 0 { 'r' } else { '-' });
        s.push(if rwx & 2 != 0 { 'w' } else { '-' });
        let exec = rwx & 1 != 0;
        s.push(match (mode & bit != 0, exec) {
            (true, true) => *letter,
            (true, false) => letter.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// `YYYY-MM-DD HH:MM:SS` in UTC for nanoseconds since the epoch.
pub fn format_time_utc(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", sod / 3600, sod % 3600 / 60, sod % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_strings() {
        assert_eq!(mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(libc::S_IFREG | 0o640), "-rw-r-----");
        assert_eq!(mode_string(libc::S_IFLNK | 0o777), "lrwxrwxrwx");
        assert_eq!(mode_string(libc::S_IFREG | 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_string(libc::S_IFDIR | 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(libc::S_IFREG | 0o2644), "-rw-r-Sr--");
    }

    #[test]
    fn utc_times() {
        assert_eq!(format_time_utc(0), "1970-01-01 00:00:00");
        assert_eq!(format_time_utc(1_700_000_000_999_999_999), "2023-11-14 22:13:20");
        assert_eq!(format_time_utc(951_782_400 * 1_000_000_000), "2000-02-29 00:00:00");
        assert_eq!(format_time_utc(-1), "1969-12-31 23:59:59");
    }
}
