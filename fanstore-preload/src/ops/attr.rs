//! What inputs and outputs share in their attributes, below both the
//! dispatchers (`open`, `stat`, `write`) and the output modules (`out`,
//! `namespace`): FanStore's device number, the statx that says what a stat
//! says, and what chmod, utime and chown change ([`Attr`]).

/// FanStore's device number (major 0, an anonymous-device minor no kernel hands out this early).
pub const DEV_MAJOR: u32 = 0;
pub const DEV_MINOR: u32 = 0xf5f5;

/// ns since the epoch as (seconds, nanoseconds).
pub fn split_ns(ns: i64) -> (i64, i64) {
    (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

fn ts(ns: i64) -> libc::statx_timestamp {
    let (sec, nsec) = split_ns(ns);
    // SAFETY: plain data, zero is valid.
    let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
    t.tv_sec = sec;
    t.tv_nsec = nsec as u32;
    t
}

/// The statx (basic stats, no birth time) that says what stat `s` says:
/// for inputs and outputs alike.
pub fn statx_from(s: &libc::stat) -> libc::statx {
    // SAFETY: plain data, zero is valid.
    let mut x: libc::statx = unsafe { std::mem::zeroed() };
    x.stx_mask = libc::STATX_BASIC_STATS;
    x.stx_blksize = s.st_blksize as u32;
    x.stx_nlink = s.st_nlink as u32;
    x.stx_uid = s.st_uid;
    x.stx_gid = s.st_gid;
    x.stx_mode = s.st_mode as u16;
    x.stx_ino = s.st_ino;
    x.stx_size = s.st_size as u64;
    x.stx_blocks = s.st_blocks as u64;
    x.stx_atime = ts(s.st_atime * 1_000_000_000 + s.st_atime_nsec);
    x.stx_mtime = ts(s.st_mtime * 1_000_000_000 + s.st_mtime_nsec);
    x.stx_ctime = ts(s.st_ctime * 1_000_000_000 + s.st_ctime_nsec);
    x.stx_dev_major = DEV_MAJOR;
    x.stx_dev_minor = DEV_MINOR;
    x.stx_rdev_major = libc::major(s.st_rdev);
    x.stx_rdev_minor = libc::minor(s.st_rdev);
    x
}

pub use crate::lookup::may_access;

/// What chmod, utime and chown change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attr {
    /// chmod: the permission bits.
    Mode(u32),
    /// utime family: the access and modification times, ns since the
    /// epoch (None: unchanged, UTIME_OMIT); `now`: each is "now" (a null
    /// argument, UTIME_NOW), which a caller with write permission may set
    /// on a file it does not own.
    Times { atime: Option<i64>, mtime: Option<i64>, now: (bool, bool) },
    /// chown family (`u32::MAX`: unchanged).
    Owner { uid: u32, gid: u32 },
    /// A call that changes nothing (utimensat with UTIME_OMIT): only checks the name.
    Nothing,
}

/// The process's umask as the library last knew it (the low 9 bits), or
/// [`UMASK_UNKNOWN`] before its first use. Read at the first creation under
/// the mount from /proc/self/status, then kept by the `umask` hook: reading
/// it with umask(2) twice (set, then restore) would let another thread
/// create a file under the wrong mask in between. Plain memory: a forked
/// child inherits it, an exec'ed image starts again from the kernel's value
/// (which the hook always sets too).
static UMASK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(UMASK_UNKNOWN);
const UMASK_UNKNOWN: u32 = u32::MAX;

/// The umask to apply to a new output's mode (what the kernel applies to a
/// file or directory created natively; symlinks take none, as on Linux).
pub fn umask() -> u32 {
    use std::sync::atomic::Ordering::Relaxed;
    match UMASK.load(Relaxed) {
        UMASK_UNKNOWN => {
            let m = kernel_umask();
            // A umask() call of another thread meanwhile is newer: keep it.
            match UMASK.compare_exchange(UMASK_UNKNOWN, m, Relaxed, Relaxed) {
                Ok(_) => m,
                Err(now) => now,
            }
        }
        m => m,
    }
}

/// After umask(2) set `mask` (the umask hook, a raw umask system call).
/// Not in a vfork child (Python's subprocess with `umask=`): its memory is
/// its parent's, whose umask does not change.
pub fn umask_set(mask: u32) {
    if crate::fd_table::borrowed() {
        return;
    }
    UMASK.store(mask & 0o777, std::sync::atomic::Ordering::Relaxed);
}

/// The kernel's umask of this process: the "Umask:" line of
/// /proc/self/status (Linux >= 4.7), else umask(2) twice (racy, the only
/// way left). No hook sees these calls.
#[cold]
fn kernel_umask() -> u32 {
    use crate::unhooked::syscall_unhooked as sys;
    let path = c"/proc/self/status";
    let fd = sys(libc::SYS_open, [path.as_ptr() as u64, (libc::O_RDONLY | libc::O_CLOEXEC) as u64, 0, 0, 0, 0]);
    if fd >= 0 {
        let mut buf = [0u8; 4096];
        let mut len = 0;
        while len < buf.len() {
            let n = sys(libc::SYS_read, [fd as u64, buf[len..].as_mut_ptr() as u64, (buf.len() - len) as u64, 0, 0, 0]);
            if n <= 0 {
                break;
            }
            len += n as usize;
        }
        sys(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]);
        if let Some(m) = umask_of_status(&buf[..len]) {
            return m;
        }
    }
    let old = sys(libc::SYS_umask, [0o022, 0, 0, 0, 0, 0]);
    sys(libc::SYS_umask, [old as u64, 0, 0, 0, 0, 0]);
    old as u32 & 0o777
}

/// The value of the "Umask:" line (octal) of a /proc/PID/status text.
fn umask_of_status(status: &[u8]) -> Option<u32> {
    let line = status.split(|&b| b == b'\n').find_map(|l| l.strip_prefix(b"Umask:"))?;
    let digits = line.trim_ascii();
    if digits.is_empty() || digits.len() > 4 || !digits.iter().all(|b| (b'0'..=b'7').contains(b)) {
        return None;
    }
    Some(digits.iter().fold(0, |m, &d| m * 8 + u32::from(d - b'0')) & 0o777)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_by_class_as_the_kernel_decides() {
        use fanstore_core::wire::OutRecord;
        let f = OutRecord { mode: libc::S_IFREG | 0o460, uid: 10, gid: 20, ..Default::default() };
        let none = |_| false;
        assert!(crate::lookup::may_access_as(&f, 4, 10, 1, none) && !crate::lookup::may_access_as(&f, 2, 10, 20, none), "the owner's bits only");
        assert!(crate::lookup::may_access_as(&f, 6, 11, 20, none) && crate::lookup::may_access_as(&f, 6, 11, 1, |g| g == 20));
        assert!(!crate::lookup::may_access_as(&f, 4, 12, 1, none));
        assert!(crate::lookup::may_access_as(&f, 6, 0, 0, none) && !crate::lookup::may_access_as(&f, 1, 0, 0, none), "root: no x bit, no exec");
        let d = OutRecord { mode: libc::S_IFDIR, uid: 10, gid: 20, ..Default::default() };
        assert!(crate::lookup::may_access_as(&d, 1, 0, 0, none) && !crate::lookup::may_access_as(&d, 1, 10, 20, none));
    }

    #[test]
    fn umask_line_of_proc_status() {
        assert_eq!(umask_of_status(b"Name:\tx\nUmask:\t0077\nState:\tR\n"), Some(0o77));
        assert_eq!(umask_of_status(b"Name:\tx\nUmask:\t0022"), Some(0o22));
        assert_eq!(umask_of_status(b"Name:\tx\nState:\tR\n"), None);
        assert_eq!(umask_of_status(b"Umask:\t09\n"), None);
        assert_eq!(umask_of_status(b"Umask:\t\n"), None);
    }

    #[test]
    fn kernel_umask_is_the_process_one() {
        // SAFETY: umask(2) has no pointer argument (this test binary has no hook).
        let old = unsafe { libc::umask(0o027) };
        let got = kernel_umask();
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        assert_eq!(got, 0o027);
    }
}
