//! Daemons of one job that share a host share its CPUs out, as nodes would.
//!
//! A job runs one daemon per node; on a cluster no two share a host. Where
//! several do (a job tried on one machine, the quickstart, these tests and
//! benchmarks, a launcher that placed two ranks on one node), the kernel
//! spreads every thread of every daemon over every CPU. A remote read then
//! hands off between the threads of two daemons and the reader (the reader
//! wakes its daemon's server thread, which asks the holder's communication
//! thread, whose reply wakes the requester's communication thread, which
//! wakes the server thread, which wakes the reader), and the scheduler's
//! placement decides what each hand-off costs: a wake-up on a CPU that a
//! polling thread keeps busy costs ~5 µs here, one on an idle vCPU, which
//! halts, 40-60 µs. Left to the scheduler, both daemons' polling threads
//! often end up on one CPU while the other idles (a chain of wake-ups pulls
//! each woken thread to its waker's CPU): on 2 vCPUs, 2 daemons and one
//! reader read a remote 128 KiB file in 124-182 µs (medians of 10 fresh
//! jobs, right after ready and 3 s after) against 90 µs kept to shares;
//! 4 daemons (2 per vCPU) served 4 readers 1025 against 1208 MB/s at
//! 128 KiB and the training reader 1934 against 2182 files/s.
//!
//! So when `count` daemons of the job run on one host and no launcher
//! narrowed the CPUs this daemon may use (a launcher that binds ranks has
//! placed them already), daemon `index` keeps every thread on its own
//! contiguous share of them, as a node's daemon keeps to its node; with
//! more daemons than CPUs, on one CPU, the daemons spread evenly over them
//! (4 daemons on 2 CPUs: 2 on each), so that each daemon's hand-offs stay
//! on one CPU. Its threads (MPI's included) are bound when it starts,
//! before it spawns any of its own, which inherit the binding. The reading
//! programs are not bound. One daemon per host, which is every cluster
//! job, is left as it is. `--share-cpus off` turns it off.
//!
//! ```
//! use fanstore_daemon::cpu_share::share;
//! // Two daemons on a host of 4 CPUs: the second keeps to CPUs 2 and 3.
//! assert_eq!(share(&[0, 1, 2, 3], 1, 2), Some(vec![2, 3]));
//! // One daemon on the host: left alone.
//! assert_eq!(share(&[0, 1, 2, 3], 0, 1), None);
//! ```

use std::io;

/// The CPUs daemon `index` of `count` on one host keeps to, out of `cpus`
/// (the CPUs each of them may use). With at least as many CPUs as
/// daemons, a contiguous share, the shares of all `count` together
/// covering `cpus` with no overlap; with fewer, one CPU, consecutive
/// daemons together, as many on each CPU as can be (give or take one).
/// None when there is nothing to share (one daemon, no CPU) or `index` is
/// not below `count`.
pub fn share(cpus: &[usize], index: usize, count: usize) -> Option<Vec<usize>> {
    let n = cpus.len();
    if count < 2 || n == 0 || index >= count {
        return None;
    }
    if n < count {
        return Some(vec![cpus[index * n / count]]);
    }
    Some(cpus[index * n / count..(index + 1) * n / count].to_vec())
}

/// Binds every thread of this process to `cpus`; threads spawned later
/// inherit it from their creator. Returns how many threads were bound.
/// Err if `cpus` is empty or any thread refused (the first error; threads
/// that exited meanwhile are skipped).
pub fn bind_process(cpus: &[usize]) -> io::Result<usize> {
    let set = cpu_set(cpus)?;
    let mut bound = 0;
    for entry in std::fs::read_dir("/proc/self/task")? {
        let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse::<libc::pid_t>().ok()) else { continue };
        match set_affinity(tid, &set) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
            r => r?,
        }
        bound += 1;
    }
    Ok(bound)
}

/// Binds the calling thread to `cpus`.
pub fn bind_this_thread(cpus: &[usize]) -> io::Result<()> {
    set_affinity(0, &cpu_set(cpus)?)
}

/// The kernel's CPU set of `cpus` (Err: none, or one beyond its size).
fn cpu_set(cpus: &[usize]) -> io::Result<libc::cpu_set_t> {
    if cpus.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no CPU to bind to"));
    }
    // SAFETY: cpu_set_t is plain data; zeroed is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("CPU {c} is beyond the CPU set's size")));
        }
        // SAFETY: CPU_SET writes one bit of `set`; c is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    Ok(set)
}

/// sched_setaffinity of thread `tid` (0: the calling thread).
fn set_affinity(tid: libc::pid_t, set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: sched_setaffinity reads size_of(set) bytes of a live `set`;
    // tid is 0 or a thread of this process (one that exited: ESRCH).
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How a list of CPUs reads in a log line: "2-3", "0,2,5".
pub fn describe(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if j > i { format!("{}-{}", cpus[i], cpus[j]) } else { cpus[i].to_string() });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_cpus_without_overlap() {
        for n in 1..=9usize {
            let cpus: Vec<usize> = (0..n).map(|c| c * 2).collect();
            for count in 2..=n {
                let mut all: Vec<usize> = Vec::new();
                for index in 0..count {
                    let s = share(&cpus, index, count).expect("a share");
                    assert!(!s.is_empty(), "{n} CPUs, {count} daemons: daemon {index} got none");
                    all.extend(s);
                }
                assert_eq!(all, cpus, "{n} CPUs, {count} daemons");
            }
        }
    }

    #[test]
    fn more_daemons_than_cpus_spread_evenly_one_cpu_each() {
        for n in 1..=5usize {
            let cpus: Vec<usize> = (10..10 + n).collect();
            for count in n + 1..=3 * n + 1 {
                let mut per_cpu = vec![0usize; n];
                let mut last = 0;
                for index in 0..count {
                    let s = share(&cpus, index, count).expect("a share");
                    assert_eq!(s.len(), 1, "{n} CPUs, {count} daemons: daemon {index} got {s:?}");
                    assert!(s[0] >= last, "{n} CPUs, {count} daemons: not consecutive");
                    last = s[0];
                    per_cpu[s[0] - 10] += 1;
                }
                let (lo, hi) = (per_cpu.iter().min().copied(), per_cpu.iter().max().copied());
                assert!(lo.zip(hi).is_some_and(|(lo, hi)| lo >= 1 && hi - lo <= 1), "{n} CPUs, {count} daemons: {per_cpu:?}");
            }
        }
        assert_eq!(share(&[0, 1], 0, 4), Some(vec![0]));
        assert_eq!(share(&[0, 1], 1, 4), Some(vec![0]));
        assert_eq!(share(&[0, 1], 2, 4), Some(vec![1]));
        assert_eq!(share(&[0, 1], 3, 4), Some(vec![1]));
    }

    #[test]
    fn nothing_is_shared_by_one_daemon() {
        assert_eq!(share(&[0, 1], 0, 1), None);
        assert_eq!(share(&[0, 1], 2, 2), None);
        assert_eq!(share(&[], 0, 2), None);
        assert_eq!(share(&[0, 1], 0, 2), Some(vec![0]));
        assert_eq!(share(&[0, 1], 1, 2), Some(vec![1]));
        assert_eq!(share(&[4, 5, 6, 7, 8], 0, 2), Some(vec![4, 5]));
        assert_eq!(share(&[4, 5, 6, 7, 8], 1, 2), Some(vec![6, 7, 8]));
    }

    #[test]
    fn cpu_lists_read_as_ranges() {
        assert_eq!(describe(&[2, 3]), "2-3");
        assert_eq!(describe(&[0, 2, 5]), "0,2,5");
        assert_eq!(describe(&[0, 1, 2, 4, 6, 7]), "0-2,4,6-7");
        assert_eq!(describe(&[]), "");
    }

    #[test]
    fn binding_to_no_cpu_is_refused() {
        assert!(bind_process(&[]).is_err());
        assert!(bind_process(&[libc::CPU_SETSIZE as usize]).is_err());
        assert!(bind_this_thread(&[]).is_err());
    }
}
