//! What a hand-off between two sleeping threads costs on this node, and why.
//!
//! Every remote read is a chain of hand-offs between threads that sleep
//! while nothing is in flight: a small remote OPEN wakes four (the client's
//! request wakes a connection thread, its MPI request the holder's
//! communication thread, the reply the requester's communication thread,
//! whose answer wakes the client). Where an idle CPU is slow to wake, those
//! wake-ups, not FanStore's work, set the latency of a remote read. On a
//! cloud VM whose guest kernel runs `cpuidle-haltpoll` with
//! `guest_halt_poll_ns` 0 an idle vCPU halts at once, and each wake-up of a
//! thread there costs an exit to the host: ~40 µs, against a few µs on
//! bare metal.
//!
//! The daemon measures it once at start, before it loads (the training
//! program has not started; the node is as idle as it will be between
//! reads): two threads of its own, pinned to two CPUs it may use, bounce a
//! byte over a pair of pipes, and the same two pinned to one CPU. Half a
//! round trip is one wake-up. STATUS shows both (`wake_across_us`,
//! `wake_same_us`), and the log says what it means for remote reads, with
//! the knob when the platform has one ([`advice`]).
//!
//! It also tells how many of the node's CPUs the daemon may run on
//! ([`cpu_counts`]): a launcher that binds ranks confines every thread of
//! the daemon to its cores, which keeps hand-offs cheap but caps the
//! daemon's work there ([`binding_advice`]).
//!
//! ```no_run
//! let cost = fanstore_daemon::wake_cost::measure(64);
//! if let Some(line) = fanstore_daemon::wake_cost::advice(&cost, &fanstore_daemon::wake_cost::IdlePolicy::read()) {
//!     println!("{line}");
//! }
//! ```

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Wake-ups across CPUs dearer than this make the log explain them: a few
/// of them per remote read then cost more than the transfer of a small file.
const SLOW_WAKE_US: f64 = 15.0;
/// The measurement stops after this long, whatever it has.
const BUDGET: Duration = Duration::from_millis(60);
/// The haltpoll cpuidle governor's knob (root only).
const HALT_POLL_NS: &str = "/sys/module/haltpoll/parameters/guest_halt_poll_ns";
const CPUIDLE_DRIVER: &str = "/sys/devices/system/cpu/cpuidle/current_driver";

/// One wake-up of a sleeping thread, in µs (median half round trip).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WakeCost {
    /// Woken on another CPU that was idle; None with one usable CPU.
    pub across_us: Option<f64>,
    /// Woken on the waker's CPU (a context switch only).
    pub same_us: Option<f64>,
}

/// The measurement of this process, once made ([`measure_once`]).
static MEASURED: OnceLock<WakeCost> = OnceLock::new();

/// The node's idle policy, as far as the kernel shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdlePolicy {
    /// `current_driver` of cpuidle (e.g. "haltpoll", "intel_idle", "acpi_idle").
    pub driver: Option<String>,
    /// `guest_halt_poll_ns` when the haltpoll module is loaded.
    pub halt_poll_ns: Option<u64>,
}

impl IdlePolicy {
    pub fn read() -> IdlePolicy {
        let text = |p: &str| std::fs::read_to_string(Path::new(p)).ok().map(|s| s.trim().to_string());
        IdlePolicy { driver: text(CPUIDLE_DRIVER), halt_poll_ns: text(HALT_POLL_NS).and_then(|s| s.parse().ok()) }
    }
}

/// Measures once per process and keeps the result for STATUS; later calls
/// return the first result.
pub fn measure_once(round_trips: usize) -> WakeCost {
    *MEASURED.get_or_init(|| measure(round_trips))
}

/// The measurement made by [`measure_once`], if any.
pub fn measured() -> Option<WakeCost> {
    MEASURED.get().copied()
}

/// Measures both costs with `round_trips` round trips each (fewer if the
/// time budget runs out first).
pub fn measure(round_trips: usize) -> WakeCost {
    let cpus = usable_cpus();
    let same = cpus.first().and_then(|&c| ping_pong(c, c, round_trips));
    let across = match cpus.as_slice() {
        [a, b, ..] => ping_pong(*a, *b, round_trips),
        _ => None,
    };
    WakeCost { across_us: across, same_us: same }
}

/// What the measured cost means for remote reads, when it matters: None
/// when wake-ups across CPUs are cheap (or were not measured).
pub fn advice(cost: &WakeCost, policy: &IdlePolicy) -> Option<String> {
    let across = cost.across_us.filter(|&a| a >= SLOW_WAKE_US)?;
    let per_read = 4.0 * across;
    let why = match (policy.driver.as_deref(), policy.halt_poll_ns) {
        (Some("haltpoll"), Some(0)) => format!(
            "idle vCPUs halt at once here (cpuidle-haltpoll, guest_halt_poll_ns 0): with polling allowed, \
             e.g. `echo 200000 > {HALT_POLL_NS}` as root, a woken vCPU answers in a few µs"
        ),
        (Some("haltpoll"), Some(ns)) => format!(
            "idle vCPUs poll {} µs before they halt (guest_halt_poll_ns {ns}); a read that waits longer pays the halt",
            ns / 1000
        ),
        (Some(d), _) => format!("idle CPUs are slow to wake here (cpuidle driver {d}: deep idle states, or a VM's halt)"),
        (None, _) => "idle CPUs are slow to wake here (deep idle states, or a VM's halt)".to_string(),
    };
    Some(format!(
        "a small remote read hands off between sleeping threads four times, about {per_read:.0} µs of wake-ups \
         before any work (two fewer while the communication threads poll after a message, which they do while \
         no thread waits for a CPU); {why}"
    ))
}

/// How many CPUs this process may run on (its affinity, which a launcher
/// that binds ranks narrows), and how many the node has online.
pub fn cpu_counts() -> (usize, usize) {
    (usable_cpus().len(), online_cpus())
}

/// How many CPUs the node has online.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no memory effects.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(online).unwrap_or(0)
}

/// What a daemon confined to fewer CPUs than its node has should know:
/// None when it may use them all.
pub fn binding_advice(usable: usize, online: usize) -> Option<String> {
    (usable > 0 && usable < online).then(|| {
        format!(
            "this daemon may run on {usable} of the node's {online} CPUs (its affinity, set by the launcher: OpenMPI \
             binds each rank to a core when it starts 2 or fewer, srun binds tasks where its task/affinity plugin \
             runs); all its threads (connections, MPI, decoding, prefetch) share them: hand-offs between them stay \
             cheap, but their work is capped there, and a training task bound there by its own launcher competes \
             for them; `mpiexec --bind-to none` (OpenMPI) or `srun --cpu-bind=none` leaves the daemon free"
        )
    })
}

/// The CPUs this process may run on (its affinity mask), lowest first.
pub fn usable_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; zeroed is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most size_of(set) bytes into `set`.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: CPU_ISSET reads the set filled above; i is below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize).filter(|&i| unsafe { libc::CPU_ISSET(i, &set) }).collect()
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> bool {
    crate::cpu_share::bind_this_thread(&[cpu]).is_ok()
}

fn pipe() -> Option<(File, File)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    use std::os::fd::FromRawFd;
    // SAFETY: two fresh fds that nothing else owns.
    Some(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// Median half round trip in µs between a thread pinned to `a` and one
/// pinned to `b`, both blocked in read(2) while the other runs.
fn ping_pong(a: usize, b: usize, round_trips: usize) -> Option<f64> {
    let (ping_rx, mut ping_tx) = pipe()?;
    let (mut pong_rx, pong_tx) = pipe()?;
    let echo = std::thread::Builder::new()
        .name("fanstore-wakeprobe".into())
        .spawn(move || {
            let (mut rx, mut tx) = (ping_rx, pong_tx);
            // First byte: whether this side is pinned (it echoes either way,
            // so the other side never writes into a closed pipe).
            if tx.write(&[u8::from(pin(b))]).is_err() {
                return;
            }
            let mut x = [0u8; 1];
            // Ends when the other side closes its end of the ping pipe.
            while rx.read(&mut x).ok() == Some(1) {
                if tx.write(&x).is_err() {
                    return;
                }
            }
        })
        .ok()?;
    // Pinned on a thread of our own: the caller's affinity is not touched.
    let timed = std::thread::scope(|s| {
        s.spawn(|| {
            let mut x = [0u8; 1];
            if pong_rx.read(&mut x).ok() != Some(1) || x[0] != 1 || !pin(a) {
                return None;
            }
            let start = Instant::now();
            let mut times = Vec::with_capacity(round_trips);
            for i in 0..round_trips + 8 {
                let t = Instant::now();
                if ping_tx.write(&x).ok() != Some(1) || pong_rx.read(&mut x).ok() != Some(1) {
                    return None;
                }
                // The first round trips warm up (page faults, migration).
                if i >= 8 {
                    times.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
                if start.elapsed() > BUDGET && times.len() >= 8 {
                    break;
                }
            }
            Some(times)
        })
        .join()
        .ok()
        .flatten()
    });
    drop(ping_tx);
    let _ = echo.join();
    let mut times = timed?;
    if times.is_empty() {
        return None;
    }
    times.sort_by(f64::total_cmp);
    Some(times[times.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(driver: &str, ns: Option<u64>) -> IdlePolicy {
        IdlePolicy { driver: Some(driver.into()), halt_poll_ns: ns }
    }

    #[test]
    fn both_costs_are_measured_where_two_cpus_are_usable() {
        let before = usable_cpus();
        let c = measure(32);
        let same = c.same_us.expect("one CPU is always usable");
        assert!(same > 0.0 && same.is_finite());
        if usable_cpus().len() >= 2 {
            let across = c.across_us.expect("two CPUs usable: measured across them");
            assert!(across > 0.0 && across.is_finite());
        } else {
            assert_eq!(c.across_us, None);
        }
        // The probe pins threads of its own: the caller's affinity is left alone.
        assert_eq!(usable_cpus(), before);
    }

    #[test]
    fn measure_once_keeps_the_first_result() {
        let first = measure_once(16);
        assert_eq!(measured(), Some(first));
        assert_eq!(measure_once(16), first);
    }

    #[test]
    fn a_daemon_bound_to_fewer_cpus_than_its_node_is_told_how_to_unbind() {
        assert_eq!(binding_advice(4, 4), None);
        assert_eq!(binding_advice(0, 4), None, "affinity unknown: nothing said");
        let a = binding_advice(1, 2).unwrap();
        assert!(a.contains("1 of the node's 2 CPUs") && a.contains("--bind-to none") && a.contains("--cpu-bind=none"), "{a}");
        assert!(a.contains("hand-offs between them stay cheap") && a.contains("competes"), "both sides of binding: {a}");
        let (usable, online) = cpu_counts();
        assert!(usable >= 1 && online >= usable, "{usable} usable of {online}");
    }

    #[test]
    fn cheap_wake_ups_need_no_advice() {
        let cheap = WakeCost { across_us: Some(4.0), same_us: Some(1.5) };
        assert_eq!(advice(&cheap, &policy("haltpoll", Some(0))), None);
        assert_eq!(advice(&WakeCost { across_us: None, same_us: Some(2.0) }, &policy("haltpoll", Some(0))), None);
    }

    #[test]
    fn a_halting_guest_is_told_its_knob() {
        let dear = WakeCost { across_us: Some(44.0), same_us: Some(1.4) };
        let a = advice(&dear, &policy("haltpoll", Some(0))).unwrap();
        assert!(a.contains("176 µs"), "{a}");
        assert!(a.contains("guest_halt_poll_ns 0") && a.contains(HALT_POLL_NS), "{a}");
        let polling = advice(&dear, &policy("haltpoll", Some(200_000))).unwrap();
        assert!(polling.contains("poll 200 µs"), "{polling}");
        let other = advice(&dear, &policy("intel_idle", None)).unwrap();
        assert!(other.contains("cpuidle driver intel_idle") && !other.contains(HALT_POLL_NS), "{other}");
        let unknown = advice(&dear, &IdlePolicy::default()).unwrap();
        assert!(unknown.contains("slow to wake"), "{unknown}");
    }
}
