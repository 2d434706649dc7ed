//! Unnamed files made ahead for new outputs: a background thread keeps a
//! few O_TMPFILE files in `<local>/.client/tmp`, and the daemon hands one
//! to a client with the answer to the lookup that precedes a creation
//! (OUT_STAT with `wire::STAT_NEW_FILE`, when the name is free and its
//! directory can hold it). The client writes its new output into it as
//! into the file it would have made itself, so the inode a creation costs
//! (30-400 µs on this disk, by the directory's block group) is paid off
//! the program's path, on another CPU, instead of in its `open`.
//!
//! Only for callers with the daemon's own effective uid and gid (the file
//! is the daemon's: a daemon run by the job's user serves that user's
//! processes; a root daemon, root's): another user's output must be a file
//! of that user, which it makes itself, as before.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};

/// Files kept ready by default (`--files-ahead`); the thread makes more
/// when fewer than half are left.
pub const READY: usize = 32;

#[derive(Default)]
struct Ready {
    /// The files kept ready, each with its inode number.
    files: Vec<(OwnedFd, u64)>,
    stop: bool,
    /// Inode numbers of files taken whose fd this daemon still holds (sent
    /// with a reply, not yet closed: [`NewFiles::handed_over`]).
    in_flight: Vec<u64>,
}

pub struct NewFiles {
    /// Files kept ready.
    target: usize,
    ready: Mutex<Ready>,
    low: Condvar,
    /// Signalled when a taken file's fd is closed here.
    closed: Condvar,
    /// The daemon's effective ids: the callers served.
    ids: (u32, u32),
}

impl NewFiles {
    /// Starts the thread that keeps `target` files made in `dir`.
    pub fn start(dir: std::path::PathBuf, target: usize) -> std::io::Result<Arc<NewFiles>> {
        // SAFETY: geteuid/getegid have no preconditions and cannot fail.
        let ids = unsafe { (libc::geteuid(), libc::getegid()) };
        let pool = Arc::new(NewFiles { target: target.max(1), ready: Mutex::new(Ready::default()), low: Condvar::new(), closed: Condvar::new(), ids });
        let c_dir = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
            .map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let p = pool.clone();
        std::thread::Builder::new().name("fanstore-newfiles".into()).spawn(move || p.fill(&c_dir))?;
        Ok(pool)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fill(&self, dir: &std::ffi::CStr) {
        loop {
            {
                let mut r = self.lock();
                while !r.stop && r.files.len() >= self.target.div_ceil(2) {
                    r = self.low.wait(r).unwrap_or_else(|p| p.into_inner());
                }
                if r.stop {
                    return;
                }
            }
            while self.lock().files.len() < self.target {
                // SAFETY: dir is NUL-terminated; the result is checked.
                let fd = unsafe { libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o600) };
                if fd < 0 {
                    log::debug!("making a file ahead in {}: {}", dir.to_string_lossy(), std::io::Error::last_os_error());
                    std::thread::sleep(std::time::Duration::from_secs(1));
                    break;
                }
                // SAFETY: a fresh fd we own.
                let f = unsafe { OwnedFd::from_raw_fd(fd) };
                let ino = inode(&f); // (off the creations' path)
                self.lock().files.push((f, ino));
            }
        }
    }

    /// A file made ahead for a new output of a caller with effective ids
    /// `caller` (None: another user's, or none ready), with its inode
    /// number for [`handed_over`](Self::handed_over).
    pub fn take(&self, caller: (u32, u32)) -> Option<(OwnedFd, u64)> {
        if caller != self.ids {
            return None;
        }
        let mut r = self.lock();
        let (f, ino) = r.files.pop()?;
        if r.files.len() < self.target.div_ceil(2) {
            self.low.notify_one();
        }
        r.in_flight.push(ino);
        Some((f, ino))
    }

    /// Closes this daemon's fd of a file [`take`](Self::take) gave, once
    /// its reply has carried it to the client.
    pub fn handed_over(&self, f: OwnedFd, ino: u64) {
        drop(f);
        let mut r = self.lock();
        if let Some(i) = r.in_flight.iter().position(|&x| x == ino) {
            r.in_flight.swap_remove(i);
        }
        self.closed.notify_all();
    }

    /// Waits (at most `limit`) until this daemon holds no fd of the file
    /// made ahead with inode `ino`: its own fd, closed just after the reply
    /// that sent it, must not count as another writer at the client's
    /// commit. False if it is still held after `limit`.
    pub fn wait_handed_over(&self, ino: u64, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let mut r = self.lock();
        while r.in_flight.contains(&ino) {
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            r = self.closed.wait_timeout(r, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }

    /// Ends the thread (the files ready are closed).
    pub fn stop(&self) {
        let mut r = self.lock();
        r.stop = true;
        r.files.clear();
        self.low.notify_one();
    }
}

/// The inode number of `f`'s file (0 if fstat fails).
fn inode(f: &OwnedFd) -> u64 {
    use std::os::fd::AsRawFd;
    // SAFETY: plain data, zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer and f a live fd.
    if unsafe { libc::fstat(f.as_raw_fd(), &mut st) } == 0 { st.st_ino } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_unnamed_files_and_makes_more() {
        let d = tempfile::tempdir().unwrap();
        let pool = NewFiles::start(d.path().to_path_buf(), READY).unwrap();
        let me = pool.ids;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < READY * 2 && std::time::Instant::now() < deadline {
            match pool.take(me) {
                Some((f, _)) => got.push(f),
                None => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        assert_eq!(got.len(), READY * 2, "the pool was not refilled");
        use std::io::Write;
        let mut f = std::fs::File::from(got.pop().unwrap());
        f.write_all(b"abc").unwrap();
        assert_eq!(f.metadata().unwrap().len(), 3);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "the files have no name");
        assert!(pool.take((me.0.wrapping_add(1), me.1)).is_none(), "another user's caller got the daemon's file");
        pool.stop();
    }
}
