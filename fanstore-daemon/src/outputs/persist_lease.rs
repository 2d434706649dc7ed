//! One running job per `--persist` directory.
//!
//! A job loads what the job before it drained to `--persist DIR` and
//! drains what it knows at its stop: the output index of each rank and the
//! rank's checkpoint store, whose units and recipes the drain also prunes
//! to its own. Two jobs that run at the same time on one DIR (an array
//! job's tasks sharing an output directory) would each drain over the
//! other: measured with two single-rank jobs of one output each, the second
//! drain dropped the first job's index entry, and `fanstore export` then
//! failed on the second's own checkpoint, whose unit the drains had mixed
//! up (sequence-numbered file names collide between stores).
//!
//! So rank 0 holds a lease on DIR from its start to the end of its drain:
//!
//! ```text
//! DIR/meta/lease   "<host> <pid> <token>\n", created O_EXCL;
//!                  its mtime is the holder's heartbeat, every HEARTBEAT
//! ```
//!
//! A job that finds a lease refuses DIR, naming the holder, unless the
//! lease is stale: its pid is gone on this host, or its heartbeat is older
//! than [`STALE`] (a job killed on another node). One from another node
//! that is still fresh is waited for up to [`STALE`] first: a job killed by
//! its time limit and resubmitted at once finds its predecessor's lease.
//! A shared file system's flock is not relied on (many mount without it).
//!
//! ```no_run
//! # use std::path::Path;
//! use fanstore_daemon::outputs::persist_lease::PersistLease;
//! let lease = PersistLease::acquire(Path::new("/scratch/run1"))?;
//! // ... the job runs, then drains ...
//! lease.release();
//! # Ok::<(), fanstore_daemon::outputs::persist_lease::LeaseError>(())
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How often the holder touches its lease.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// A lease not touched for this long belongs to a job that is gone.
pub const STALE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(
        "{path}: --persist directory in use by a running FanStore job (host {host}, pid {pid}, heartbeat {age_s} s ago); \
         give each job that runs at the same time its own --persist directory (if that job is gone, remove the file)"
    )]
    InUse { path: PathBuf, host: String, pid: u32, age_s: u64 },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The lease file of `dir`.
pub fn lease_path(dir: &Path) -> PathBuf {
    dir.join("meta").join("lease")
}

/// A held lease: its file and heartbeat thread.
#[derive(Debug)]
pub struct PersistLease {
    path: PathBuf,
    content: String,
    /// Dropped at release: ends the heartbeat thread's wait at once.
    _heartbeat: crossbeam::channel::Sender<()>,
}

/// Who holds a lease, as its file says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    host: String,
    pid: u32,
    content: String,
    age: Duration,
}

impl PersistLease {
    /// Takes `dir`'s lease, waiting up to [`STALE`] for a fresh one of
    /// another host to go stale or be released.
    pub fn acquire(dir: &Path) -> Result<PersistLease, LeaseError> {
        Self::acquire_with(dir, STALE, STALE, HEARTBEAT)
    }

    /// `stale`: the age of a gone job's lease; `wait`: how long a fresh one
    /// of another host is waited for.
    fn acquire_with(dir: &Path, stale: Duration, wait: Duration, heartbeat: Duration) -> Result<PersistLease, LeaseError> {
        let path = lease_path(dir);
        let io = |source| LeaseError::Io { path: path.clone(), source };
        std::fs::create_dir_all(path.parent().unwrap_or(dir)).map_err(io)?;
        let host = String::from_utf8_lossy(&fanstore_core::runtime::hostname()).into_owned();
        let token = format!("{:016x}", fanstore_core::checksum::xxh3(format!("{host} {} {:?}", std::process::id(), SystemTime::now()).as_bytes()));
        let content = format!("{host} {} {token}\n", std::process::id());
        let deadline = std::time::Instant::now() + wait;
        let mut waited = false;
        loop {
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    f.write_all(content.as_bytes()).and_then(|_| f.sync_all()).map_err(io)?;
                    let (tx, rx) = crossbeam::channel::bounded(0);
                    spawn_heartbeat(path.clone(), content.clone(), rx, heartbeat);
                    return Ok(PersistLease { path, content, _heartbeat: tx });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(e)),
            }
            let Some(h) = read_holder(&path) else { continue }; // released meanwhile: try again
            let gone = (h.host == host && !crate::pid_alive(u64::from(h.pid))) || h.age > stale;
            if gone {
                log::warn!("{}: taking over the lease of a job that is gone (host {}, pid {}, heartbeat {} s ago)", path.display(), h.host, h.pid, h.age.as_secs());
                // Only the lease judged stale goes (not one created since).
                if read_holder(&path).is_some_and(|now| now.content == h.content) {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            if h.host != host && std::time::Instant::now() < deadline {
                if !waited {
                    log::warn!("{}: held by a job on host {} (pid {}, heartbeat {} s ago): waiting up to {} s for it to end", path.display(), h.host, h.pid, h.age.as_secs(), stale.as_secs());
                    waited = true;
                }
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
            return Err(LeaseError::InUse { path: path.clone(), host: h.host, pid: h.pid, age_s: h.age.as_secs() });
        }
    }

    /// Stops the heartbeat and removes the lease (if it is still this one).
    pub fn release(self) {
        if read_holder(&self.path).is_some_and(|h| h.content == self.content) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn spawn_heartbeat(path: PathBuf, content: String, stop: crossbeam::channel::Receiver<()>, every: Duration) {
    let shown = path.display().to_string();
    // Wakes once per `every`, and at once when the lease (its sender) goes.
    let spawned = std::thread::Builder::new().name("fanstore-lease".into()).spawn(move || {
        while let Err(crossbeam::channel::RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
            match std::fs::File::options().write(true).open(&path) {
                Ok(f) if read_holder(&path).is_some_and(|h| h.content == content) => {
                    if let Err(e) = f.set_modified(SystemTime::now()) {
                        log::warn!("{}: heartbeat: {e}", path.display());
                    }
                }
                _ => {
                    log::error!("{}: the lease of this job is gone (removed by hand?): another job may now use the directory", path.display());
                    return;
                }
            }
        }
    });
    if let Err(e) = spawned {
        log::error!("{shown}: spawning the heartbeat thread: {e} (the lease goes stale after {} s)", STALE.as_secs());
    }
}

fn read_holder(path: &Path) -> Option<Holder> {
    let content = std::fs::read_to_string(path).ok()?;
    let age = std::fs::metadata(path).ok()?.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok()).unwrap_or_default();
    let mut it = content.split_whitespace();
    let host = it.next().unwrap_or("unknown").to_string();
    let pid = it.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some(Holder { host, pid, content, age })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lease_is_refused_and_a_released_one_taken() {
        let d = tempfile::tempdir().unwrap();
        let first = PersistLease::acquire(d.path()).unwrap();
        let text = std::fs::read_to_string(lease_path(d.path())).unwrap();
        assert!(text.contains(&format!(" {} ", std::process::id())), "{text}");
        // Same host, live pid: refused at once.
        let t = std::time::Instant::now();
        let err = PersistLease::acquire(d.path()).unwrap_err().to_string();
        assert!(t.elapsed() < Duration::from_secs(5), "waited for a lease of this host");
        assert!(err.contains(&lease_path(d.path()).display().to_string()) && err.contains(&format!("pid {}", std::process::id())), "{err}");
        first.release();
        assert!(!lease_path(d.path()).exists());
        PersistLease::acquire(d.path()).unwrap().release();
    }

    #[test]
    fn a_lease_of_a_dead_process_or_without_heartbeat_is_taken_over() {
        let d = tempfile::tempdir().unwrap();
        let path = lease_path(d.path());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let host = String::from_utf8_lossy(&fanstore_core::runtime::hostname()).into_owned();
        // This host, a pid that does not exist.
        std::fs::write(&path, format!("{host} 999999999 dead\n")).unwrap();
        PersistLease::acquire(d.path()).unwrap().release();
        // Another host, heartbeat older than the staleness bound.
        std::fs::write(&path, "elsewhere 1 old\n").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(120)).unwrap();
        PersistLease::acquire_with(d.path(), Duration::from_secs(60), Duration::from_secs(60), HEARTBEAT).unwrap().release();
        // Another host, fresh: waited for, then refused.
        std::fs::write(&path, "elsewhere 1 fresh\n").unwrap();
        let t = std::time::Instant::now();
        let err = PersistLease::acquire_with(d.path(), Duration::from_secs(60), Duration::from_millis(600), HEARTBEAT).unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(500), "did not wait");
        assert!(err.to_string().contains("host elsewhere, pid 1"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "elsewhere 1 fresh\n", "the other job's lease was touched");
    }

    #[test]
    fn the_holder_keeps_its_lease_fresh() {
        let d = tempfile::tempdir().unwrap();
        let lease = PersistLease::acquire_with(d.path(), STALE, STALE, Duration::from_millis(200)).unwrap();
        let path = lease_path(d.path());
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(300)).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        let age = read_holder(&path).unwrap().age;
        assert!(age < Duration::from_secs(5), "heartbeat did not touch the lease: {age:?}");
        lease.release();
    }
}
