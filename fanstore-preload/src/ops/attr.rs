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
    x
}

/// What chmod, utime and chown change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attr {
    /// chmod: the permission bits.
    Mode(u32),
    /// utime family: the access and modification times, ns since the
    /// epoch (None: unchanged, UTIME_OMIT).
    Times { atime: Option<i64>, mtime: Option<i64> },
    /// chown family (`u32::MAX`: unchanged).
    Owner { uid: u32, gid: u32 },
    /// A call that changes nothing (utimensat with UTIME_OMIT): only checks the name.
    Nothing,
}
