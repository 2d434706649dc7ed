//! Polling after activity only while a CPU is free.
//!
//! A communication thread that keeps polling MPI for a while after its last
//! message (`--comm-spin-us`) sees the next request or reply at once instead
//! of being woken for it, and each wake-up of a sleeping thread costs
//! ~40 µs on a VM whose idle vCPUs halt. But the polling thread occupies a
//! CPU, and where every CPU is wanted (readers decoding, a holder hashing a
//! payload, the training program itself) it takes that CPU from them: 4
//! daemons and 4 readers on 2 CPUs read 2 MiB files ~5-9% slower with
//! polling for 200 µs than with none.
//!
//! The polling thread cannot tell by its own yields: a yield hands the CPU
//! to a thread queued on the same CPU, and a CPU that never idles takes no
//! thread from the other CPUs' queues, so threads waiting on the other CPU
//! are not seen. The kernel's count of runnable threads does
//! (`/proc/loadavg`, the 4th field's numerator, summed over every CPU): one
//! `pread` of an open fd, ~0.5-1 µs here (the communication thread looks
//! again only 20 µs after a look that found a CPU idle). Of those, the polling threads of this
//! job's daemons on the host yield their CPU to any thread queued there;
//! they count themselves on a [`PollingBoard`] in shared memory. While the
//! other runnable threads are at most the job's CPUs (its cpuset cgroup,
//! else the node's online CPUs: not the daemon's affinity, which a launcher
//! that binds ranks narrows to one core), no thread waits behind one that
//! does not yield, and polling takes nothing from anyone; above, the thread
//! stops polling until its next message.
//!
//! ```no_run
//! # use std::path::Path;
//! use fanstore_daemon::comm::spin::{PollingBoard, RunQueue};
//! let board = PollingBoard::open(Path::new("/dev/shm/fanstore-example.polling")).ok();
//! let q = RunQueue::open(board);
//! if q.as_ref().is_some_and(|q| !q.crowded()) {
//!     // poll on
//! }
//! ```

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

const LOADAVG: &str = "/proc/loadavg";

/// The node's count of runnable threads against the CPUs this daemon may use.
#[derive(Debug)]
pub struct RunQueue {
    loadavg: File,
    cpus: usize,
    board: Option<PollingBoard>,
}

impl RunQueue {
    /// None where /proc/loadavg cannot be read (the daemon then does not
    /// poll after activity: the sleep is the safe side).
    ///
    /// `board`: where the host's polling threads count themselves (None:
    /// every runnable thread counts as one that may wait).
    pub fn open(board: Option<PollingBoard>) -> Option<RunQueue> {
        let (_, online) = crate::wake_cost::cpu_counts();
        Self::with_cpus(job_cpus().unwrap_or(online), board)
    }

    fn with_cpus(cpus: usize, board: Option<PollingBoard>) -> Option<RunQueue> {
        let loadavg = File::open(LOADAVG).ok()?;
        let q = RunQueue { loadavg, cpus: cpus.max(1), board };
        q.runnable()?;
        Some(q)
    }

    /// The calling thread starts polling: counted on the board until [`leave`](Self::leave).
    pub fn enter(&self) {
        if let Some(b) = &self.board {
            b.counter().fetch_add(1, Relaxed);
        }
    }

    /// The calling thread, counted by [`enter`](Self::enter), stops polling.
    pub fn leave(&self) {
        if let Some(b) = &self.board {
            let _ = b.counter().fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
        }
    }

    /// Runnable threads on the node now (the caller included).
    pub fn runnable(&self) -> Option<usize> {
        let mut buf = [0u8; 128];
        let n = self.loadavg.read_at(&mut buf, 0).ok()?;
        parse_runnable(buf.get(..n)?)
    }

    /// True when more runnable threads than CPUs are not polling threads
    /// of the board: one of them waits behind a thread that does not yield
    /// (also when the count cannot be read).
    pub fn crowded(&self) -> bool {
        self.spare().is_none_or(|spare| spare < 0)
    }

    /// CPUs left over by the runnable threads that are not polling ones
    /// (negative: that many wait for a CPU; None: the count cannot be read).
    pub fn spare(&self) -> Option<isize> {
        let (runnable, polling) = self.waiting()?;
        Some(self.cpus as isize - runnable.saturating_sub(polling) as isize)
    }

    /// (runnable threads, polling threads of the board) now.
    pub fn waiting(&self) -> Option<(usize, usize)> {
        let polling = self.board.as_ref().map_or(0, |b| b.counter().load(Relaxed) as usize);
        Some((self.runnable()?, polling))
    }

    /// The CPUs this daemon may run on.
    pub fn cpus(&self) -> usize {
        self.cpus
    }
}

/// A count in shared memory of the communication threads that poll now,
/// shared by this job's daemons on one host (`/dev/shm`, mode 0600). A
/// daemon killed while counted leaves the count high until the job ends:
/// the others then see fewer threads waiting, and poll as they would with
/// a CPU to spare.
#[derive(Debug)]
pub struct PollingBoard {
    map: memmap2::MmapMut,
    path: PathBuf,
}

impl PollingBoard {
    /// Opens (or creates) the board at `path`.
    pub fn open(path: &Path) -> std::io::Result<PollingBoard> {
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(path)?;
        if f.metadata()?.len() < 64 {
            // Growing a file never changes its first bytes: a rank that
            // counted already keeps its count.
            f.set_len(64)?;
        }
        // SAFETY: the file is 64 bytes long and only ever grows; the map is
        // shared with the other ranks, which touch it only through the
        // atomic in `counter`.
        let map = unsafe { memmap2::MmapOptions::new().len(64).map_mut(&f)? };
        Ok(PollingBoard { map, path: path.to_path_buf() })
    }

    fn counter(&self) -> &AtomicU32 {
        // SAFETY: the map is 64 bytes, page-aligned (so aligned for u32), and
        // lives as long as `self`; every process accesses these 4 bytes
        // atomically only.
        unsafe { &*self.map.as_ptr().cast::<AtomicU32>() }
    }

    /// Removes the board's file (the maps of the other ranks stay valid).
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The CPUs of this job: those of its cpuset cgroup (what a batch system
/// gives the job), not this process's affinity, which a launcher that binds
/// ranks narrows to one core while the job's other threads (the training
/// program, the other ranks' daemons) run on the rest. The runnable count
/// is the node's: compared against one core it would stop every polling
/// period of a bound daemon (OpenMPI binds 2 ranks or fewer).
pub fn job_cpus() -> Option<usize> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cpuset_files(&groups).iter().find_map(|f| std::fs::read_to_string(f).ok().and_then(|t| count_cpu_list(t.trim())))
}

/// The files that may list the CPUs of the cpuset cgroup named in
/// /proc/self/cgroup's text: the unified hierarchy's, then cgroup v1's.
fn cpuset_files(groups: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for line in groups.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else { continue };
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            files.insert(0, Path::new("/sys/fs/cgroup").join(path).join("cpuset.cpus.effective"));
        } else if controllers.split(',').any(|c| c == "cpuset") {
            let dir = Path::new("/sys/fs/cgroup/cpuset").join(path);
            files.push(dir.join("cpuset.effective_cpus"));
            files.push(dir.join("cpuset.cpus"));
        }
    }
    files
}

/// How many CPUs a list such as "0-3,8,10-11" names (None: empty or malformed).
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse::<usize>().ok()?)? + 1,
            None => part.parse::<usize>().map(|_| 1).ok()?,
        };
    }
    (n > 0).then_some(n)
}

/// The numerator of the 4th field of /proc/loadavg ("0.50 0.40 0.30 2/345 678").
fn parse_runnable(text: &[u8]) -> Option<usize> {
    let field = text.split(|&b| b == b' ').nth(3)?;
    let running = field.split(|&b| b == b'/').next()?;
    std::str::from_utf8(running).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runnable_count_is_the_numerator_of_the_fourth_field() {
        assert_eq!(parse_runnable(b"0.50 0.40 0.30 2/345 678\n"), Some(2));
        assert_eq!(parse_runnable(b"12.00 9.10 3.30 17/2048 99999\n"), Some(17));
        assert_eq!(parse_runnable(b"0.50 0.40 0.30\n"), None);
        assert_eq!(parse_runnable(b"0.50 0.40 0.30 x/345 678\n"), None);
        assert_eq!(parse_runnable(b""), None);
    }

    #[test]
    fn cpu_lists_count_their_cpus() {
        assert_eq!(count_cpu_list("0-1"), Some(2));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("5"), Some(1));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("0-x"), None);
    }

    #[test]
    fn the_cpuset_is_looked_up_in_the_unified_hierarchy_first() {
        let v1 = "9:name=systemd:/\n3:cpuset:/slurm/uid_0/job_7\n1:cpu,cpuacct:/\n0::/\n";
        let files = cpuset_files(v1);
        assert_eq!(files[0], Path::new("/sys/fs/cgroup/cpuset.cpus.effective"));
        assert_eq!(files[1], Path::new("/sys/fs/cgroup/cpuset/slurm/uid_0/job_7/cpuset.effective_cpus"));
        assert_eq!(files[2], Path::new("/sys/fs/cgroup/cpuset/slurm/uid_0/job_7/cpuset.cpus"));
        let v2 = "0::/system.slice/slurmstepd.scope/job_7/step_0\n";
        assert_eq!(cpuset_files(v2), vec![PathBuf::from("/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_0/cpuset.cpus.effective")]);
        assert!(cpuset_files("garbage").is_empty());
    }

    #[test]
    fn a_node_busier_than_its_cpus_is_crowded() {
        // This test thread is runnable: with 0 CPUs clamped to 1, the count
        // is at least 1, so a thousand CPUs are never crowded by it alone,
        // while a node of 1 CPU is crowded once another thread runs.
        let many = RunQueue::with_cpus(1000, None).expect("/proc/loadavg");
        assert!(many.runnable().is_some_and(|r| r >= 1));
        assert!(!many.crowded());
        // This thread takes one of them, at least.
        assert!(many.spare().is_some_and(|s| (0..1000).contains(&s)), "{:?}", many.spare());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinners: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let one = RunQueue::with_cpus(1, None).expect("/proc/loadavg");
        let seen = (0..1000).any(|_| one.crowded());
        // The same threads counted as polling ones on a board: not crowded
        // by them (a thousand polling threads cover any count).
        let dir = std::env::temp_dir().join(format!("fanstore-board-test-{}", std::process::id()));
        let board = PollingBoard::open(&dir).expect("board");
        let counted = RunQueue::with_cpus(1, Some(board)).expect("/proc/loadavg");
        for _ in 0..1000 {
            counted.enter();
        }
        let crowded_counted = counted.crowded();
        for _ in 0..1001 {
            counted.leave();
        }
        let after = counted.board.as_ref().map(|b| b.counter().load(Relaxed));
        counted.board.as_ref().map(PollingBoard::remove);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in spinners {
            let _ = s.join();
        }
        assert!(seen, "two spinning threads and this one never counted more than 1 runnable");
        assert!(!crowded_counted, "threads counted on the board made the node crowded");
        assert_eq!(after, Some(0), "a leave without an enter must not wrap the count");
    }

    #[test]
    fn two_boards_on_one_file_share_the_count() {
        let path = std::env::temp_dir().join(format!("fanstore-board-share-{}", std::process::id()));
        let a = PollingBoard::open(&path).expect("board");
        a.counter().fetch_add(3, Relaxed);
        let b = PollingBoard::open(&path).expect("board again");
        assert_eq!(b.counter().load(Relaxed), 3, "opening again must not reset the count");
        b.counter().fetch_sub(1, Relaxed);
        assert_eq!(a.counter().load(Relaxed), 2);
        a.remove();
        assert!(!path.exists());
    }
}
