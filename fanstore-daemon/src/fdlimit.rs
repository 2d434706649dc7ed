//! Living within RLIMIT_NOFILE.
//!
//! The daemon holds no fd per dataset file: cached copies are named files
//! (see [`crate::inputs::copies`]), partition copies are mapped and closed. What it
//! does hold is bounded: one socket per client connection, a few fds per
//! request in flight, and the sealed memfds of read-back outputs in the node
//! cache and in the cache of remote outputs (bounded by count,
//! [`memfd_cache_entries`], [`remote_output_entries`]). At start it raises its
//! soft limit to the hard one; an fd-creating call that still fails with
//! EMFILE/ENFILE is retried after shedding cached memfds, and a client gets
//! EIO only when every retry failed.

use std::time::Duration;

/// Raises the soft RLIMIT_NOFILE to the hard limit. Returns (soft, hard, now).
pub fn raise_nofile() -> (u64, u64, u64) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: r is a valid out-pointer for getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return (0, 0, 0);
    }
    let (soft, hard) = (r.rlim_cur, r.rlim_max);
    if soft < hard {
        let want = libc::rlimit { rlim_cur: hard, rlim_max: hard };
        // SAFETY: want is a valid rlimit; raising the soft limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            return (soft, hard, hard);
        }
    }
    (soft, hard, soft)
}

/// The soft RLIMIT_NOFILE in force now.
pub fn nofile() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: r is a valid out-pointer for getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    r.rlim_cur
}

/// How many sealed memfds the output cache may hold under a soft limit of
/// `nofile` fds: a quarter of them, so that connections and requests in
/// flight always have room.
pub fn memfd_cache_entries(nofile: u64) -> usize {
    (nofile / 4).clamp(16, 1 << 20) as usize
}

/// How many sealed memfds the cache of remote outputs read on this node
/// ([`crate::outputs::remote_out`]) may hold under a soft limit of `nofile` fds: an
/// eighth of them, beside [`memfd_cache_entries`]' quarter. (It had 4096
/// whatever the limit: reading 1,000 small outputs of another node under
/// `ulimit -n 1024` took every fd, and the next open was EIO.)
pub fn remote_output_entries(nofile: u64) -> usize {
    (nofile / 8).clamp(8, 1 << 19) as usize
}

/// How many O_PATH fds of removed outputs may wait for the closer thread
/// ([`crate::outputs::held_files`]) under a soft limit of `nofile` fds: a
/// sixteenth of them. (It was 1024 whatever the limit: mdtest's remove
/// phase, 2 ranks x 20,000 files under `ulimit -n 1024` with the thread
/// behind on 2 busy cores, left the journal's compaction EMFILE.)
pub fn closer_entries(nofile: u64) -> usize {
    (nofile / 16).clamp(8, 1024) as usize
}

/// Whether `errno` says the process or the system is out of fds.
pub fn exhausted(errno: i32) -> bool {
    errno == libc::EMFILE || errno == libc::ENFILE
}

/// Runs `f`; while it fails for lack of fds, calls `relieve` and tries again
/// (5 tries, 1 to 16 ms apart). Other errors return at once.
pub fn retry<T>(relieve: impl Fn(), mut f: impl FnMut() -> Result<T, i32>) -> Result<T, i32> {
    let mut pause = Duration::from_millis(1);
    for _ in 0..4 {
        match f() {
            Err(e) if exhausted(e) => {
                relieve();
                std::thread::sleep(pause);
                pause *= 2;
            }
            other => return other,
        }
    }
    f()
}

/// The errno of an io::Error (EIO when it has none).
pub fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn retries_only_exhaustion_and_relieves_each_time() {
        let (calls, relieved) = (Cell::new(0), Cell::new(0));
        let r: Result<u8, i32> = retry(
            || relieved.set(relieved.get() + 1),
            || {
                calls.set(calls.get() + 1);
                if calls.get() < 3 { Err(libc::EMFILE) } else { Ok(7) }
            },
        );
        assert_eq!((r, calls.get(), relieved.get()), (Ok(7), 3, 2));
        calls.set(0);
        let r: Result<u8, i32> = retry(|| {}, || {
            calls.set(calls.get() + 1);
            Err(libc::ENOENT)
        });
        assert_eq!((r, calls.get()), (Err(libc::ENOENT), 1));
        calls.set(0);
        let r: Result<u8, i32> = retry(|| {}, || {
            calls.set(calls.get() + 1);
            Err(libc::ENFILE)
        });
        assert_eq!((r, calls.get()), (Err(libc::ENFILE), 5));
    }

    #[test]
    fn bounds() {
        assert_eq!(memfd_cache_entries(1024), 256);
        assert_eq!(memfd_cache_entries(20), 16);
        assert_eq!(remote_output_entries(1024), 128);
        assert_eq!(remote_output_entries(20), 8);
        assert!(nofile() > 0);
    }
}
