//! Counters of one daemon rank and the STATUS text that reports them.
//!
//! The STATUS reply payload is UTF-8 text, one `key=value` per line, in a
//! fixed order (see [`Snapshot::render`]); unknown keys are ignored by
//! readers. Reading it back, and the table `fanstore status` prints from the
//! texts of every rank, are in [`fanstore_core::status`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Event counters, updated lock-free by every thread of the daemon.
#[derive(Debug, Default)]
pub struct Counters {
    /// OPEN requests answered with an fd.
    pub opens: AtomicU64,
    /// ... of which were local uncompressed files (the extracted file itself).
    pub opens_local: AtomicU64,
    /// Remote reads this rank asked another rank for.
    pub remote_sent: AtomicU64,
    /// Remote reads that failed (timeout, holder error, checksum).
    pub remote_failed: AtomicU64,
    /// Remote reads this rank answered for others.
    pub remote_served: AtomicU64,
    pub remote_bytes_in: AtomicU64,
    pub remote_bytes_out: AtomicU64,
    /// Remote payloads received straight into the pages of the copy a
    /// client reads (a spare lent to the receive), with no copy on arrival.
    pub remote_in_place: AtomicU64,
    /// Remote OPENs the communication thread answered itself, the payload
    /// verified in the copy's file ([`crate::inputs::client_reply`]).
    pub remote_direct: AtomicU64,
    /// Remote reads whose receives and request the server thread that
    /// needed them posted itself ([`crate::comm::post`]).
    pub remote_posted: AtomicU64,
    /// Requests answered with an error other than ENOENT/ESTALE, and refused peers.
    pub errors: AtomicU64,
    /// Outputs committed through this rank.
    pub outputs: AtomicU64,
    /// Client connections accepted.
    pub clients: AtomicU64,
    /// Times the rank ran out of file descriptors (EMFILE/ENFILE) and shed cached fds.
    pub fd_pressure: AtomicU64,
    /// WARM hints received: clients that decoded a local file themselves
    /// asking for its node copy.
    pub warm_hints: AtomicU64,
    /// ... of which declined for want of free room in the copy directory
    /// (`tiers::TIER_DECLINED`).
    pub copies_declined: AtomicU64,
    /// Clients' OUT_STAT and OUT_LIST requests: lookups and listings of
    /// names the shared index could not answer.
    pub names_asked: AtomicU64,
    /// Input directories marked in this rank's tier map as ones in which
    /// outputs may be listed (`crate::outputs::Outputs::mark_input_dir`).
    pub dirs_with_outputs: AtomicU64,
    /// Metadata requests of the output namespace this rank sent to another
    /// rank: each one MPI round trip (request, reply).
    pub meta_sent: AtomicU64,
    /// ... and those whose owner is this rank: answered here, no message.
    pub meta_local: AtomicU64,
    /// Requests clients sent to this daemon (any op but STATUS): what the
    /// clients' shared-memory paths (index, tier map, record table) did
    /// not answer themselves.
    pub client_requests: AtomicU64,
    /// Files made ahead handed to clients for new outputs
    /// ([`crate::outputs::new_files`]).
    pub files_ahead: AtomicU64,
    /// Round trips of this rank's remote reads (request sent -> payload verified).
    pub remote_latency: LatencyHistogram,
    /// Remote partitions fetched, verified and mapped in the background
    /// (`--prefetch-remote`), and their bytes.
    pub replicated_parts: AtomicU64,
    pub replicated_bytes: AtomicU64,
    /// Large local files extracted in the background after ready
    /// (`--extract-ahead`), before any OPEN asked for them.
    pub extracted_ahead: AtomicU64,
    /// Remote files fetched ahead of a reader reading in order
    /// ([`crate::inputs::read_ahead`]).
    pub read_ahead: AtomicU64,
    /// How the communication thread's sleeps ended (see `comm::wake`): by a
    /// command, by the MPI library's fds, by the timeout; fd wake-ups after
    /// which it found nothing to do; and timeouts that found work no fd had
    /// announced. Set by the communication thread after every sleep.
    pub comm_wakes: [AtomicU64; 5],
    /// Polling periods after activity (`--comm-spin-us`) the communication
    /// thread cut short because a runnable thread waited for a CPU.
    pub comm_spins_stopped: AtomicU64,
}

/// Quarter-octave buckets of microseconds: bucket i < 4 holds i µs; above,
/// bucket 4*(k-1) + j holds values whose top bit is k and next two bits are
/// j (within 25% of each other). Lock-free; percentiles are bucket upper bounds.
pub struct LatencyHistogram {
    buckets: [AtomicU64; 256],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram { buckets: [const { AtomicU64::new(0) }; 256] }
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LatencyHistogram(p50 {} us)", self.percentile(0.5))
    }
}

fn bucket_of(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let top = 63 - us.leading_zeros() as u64; // >= 2
    ((top - 1) * 4 + ((us >> (top - 2)) & 3)) as usize
}

fn bucket_upper(i: usize) -> u64 {
    if i < 4 {
        return i as u64;
    }
    let (top, sub) = ((i / 4) as u64 + 1, (i % 4) as u64);
    ((5 + sub) << (top - 2)) - 1
}

impl LatencyHistogram {
    pub fn record(&self, d: std::time::Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(us).min(255)].fetch_add(1, Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// The upper bound (µs) of the bucket holding the `q` quantile; 0 when empty.
    pub fn percentile(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let want = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return bucket_upper(i);
            }
        }
        bucket_upper(255)
    }
}

/// What loading this rank's partitions did.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct LoadReport {
    pub partitions: u64,
    pub files: u64,
    /// Partition bytes read from the shared file system.
    pub bytes_read: u64,
    /// Bytes written to the local directory (stored sizes).
    pub bytes_local: u64,
    pub seconds: f64,
}

impl LoadReport {
    pub fn mbps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes_read as f64 / self.seconds / 1e6
        } else {
            0.0
        }
    }
}

/// Everything a STATUS reply carries.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub rank: u32,
    pub nranks: u32,
    pub host: String,
    pub pid: u32,
    pub status: String,
    pub threading: String,
    pub load: LoadReport,
    pub opens: u64,
    pub opens_local: u64,
    pub remote_sent: u64,
    pub remote_failed: u64,
    pub remote_served: u64,
    pub remote_bytes_in: u64,
    pub remote_bytes_out: u64,
    pub remote_in_place: u64,
    pub remote_direct: u64,
    pub remote_posted: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    pub cache_bytes: u64,
    pub cache_entries: u64,
    /// Of `cache_bytes`, the node copies on the local disk (`--cache-disk`).
    pub cache_disk_bytes: u64,
    /// Copies written into a spare's pages ([`crate::inputs::recycle`]), and the bytes of spares kept.
    pub copies_reused: u64,
    pub copy_spares_bytes: u64,
    pub errors: u64,
    pub clients: u64,
    pub fd_pressure: u64,
    /// [`Counters::warm_hints`], [`Counters::copies_declined`].
    pub warm_hints: u64,
    pub copies_declined: u64,
    pub names_asked: u64,
    pub dirs_with_outputs: u64,
    /// [`Counters::meta_sent`], [`Counters::meta_local`].
    pub meta_sent: u64,
    pub meta_local: u64,
    /// [`Counters::client_requests`], [`Counters::files_ahead`].
    pub client_requests: u64,
    pub files_ahead: u64,
    /// Remote read round trips: p50 / p99 in µs (bucket upper bounds).
    pub remote_p50_us: u64,
    pub remote_p99_us: u64,
    /// Remote bytes received per second since the rank became ready.
    pub remote_mbps: f64,
    pub replicated_parts: u64,
    pub replicated_bytes: u64,
    pub extracted_ahead: u64,
    pub read_ahead: u64,
    /// [`Counters::comm_wakes`].
    pub comm_wakes: [u64; 5],
    /// [`Counters::comm_spins_stopped`].
    pub comm_spins_stopped: u64,
    /// CPU time of the whole daemon process (every thread, those that
    /// ended too), user and system, in µs: [`process_usage`].
    pub cpu_user_us: u64,
    pub cpu_sys_us: u64,
    /// Context switches of the whole process: voluntary (a thread blocked:
    /// each is followed by a wake-up) and involuntary (preempted).
    pub ctx_voluntary: u64,
    pub ctx_involuntary: u64,
    /// One wake-up of a sleeping thread on this node, measured at start:
    /// [`crate::wake_cost`].
    pub wake: crate::wake_cost::WakeCost,
    /// CPUs this process may run on (its affinity) and CPUs online:
    /// [`crate::wake_cost::cpu_counts`].
    pub cpus_usable: usize,
    pub cpus_online: usize,
    /// Those usable CPUs as a list (`0-3,6`, as `taskset -c` takes it): a
    /// program meant to run as on this daemon's node, where several daemons
    /// share a host and each keeps to its share ([`crate::cpu_share`]), can
    /// be started on them.
    pub cpus: String,
}

/// What this process has used, every thread, including threads that have
/// exited (getrusage(RUSAGE_SELF); /proc's ticks are 10 ms coarse).
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessUsage {
    pub user_us: u64,
    pub sys_us: u64,
    pub ctx_voluntary: u64,
    pub ctx_involuntary: u64,
}

pub fn process_usage() -> ProcessUsage {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the buffer it is given.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } != 0 {
        return ProcessUsage::default();
    }
    // SAFETY: getrusage succeeded, so it filled `ru` (zeroed before anyway).
    let ru = unsafe { ru.assume_init() };
    let us = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
    ProcessUsage {
        user_us: us(ru.ru_utime),
        sys_us: us(ru.ru_stime),
        ctx_voluntary: ru.ru_nvcsw.max(0) as u64,
        ctx_involuntary: ru.ru_nivcsw.max(0) as u64,
    }
}

impl Counters {
    pub fn fill(&self, s: &mut Snapshot) {
        s.opens = self.opens.load(Relaxed);
        s.opens_local = self.opens_local.load(Relaxed);
        s.remote_sent = self.remote_sent.load(Relaxed);
        s.remote_failed = self.remote_failed.load(Relaxed);
        s.remote_served = self.remote_served.load(Relaxed);
        s.remote_bytes_in = self.remote_bytes_in.load(Relaxed);
        s.remote_bytes_out = self.remote_bytes_out.load(Relaxed);
        s.remote_in_place = self.remote_in_place.load(Relaxed);
        s.remote_direct = self.remote_direct.load(Relaxed);
        s.remote_posted = self.remote_posted.load(Relaxed);
        s.errors = self.errors.load(Relaxed);
        s.clients = self.clients.load(Relaxed);
        s.fd_pressure = self.fd_pressure.load(Relaxed);
        s.warm_hints = self.warm_hints.load(Relaxed);
        s.copies_declined = self.copies_declined.load(Relaxed);
        s.names_asked = self.names_asked.load(Relaxed);
        s.dirs_with_outputs = self.dirs_with_outputs.load(Relaxed);
        s.meta_sent = self.meta_sent.load(Relaxed);
        s.meta_local = self.meta_local.load(Relaxed);
        s.client_requests = self.client_requests.load(Relaxed);
        s.files_ahead = self.files_ahead.load(Relaxed);
        s.remote_p50_us = self.remote_latency.percentile(0.5);
        s.remote_p99_us = self.remote_latency.percentile(0.99);
        s.replicated_parts = self.replicated_parts.load(Relaxed);
        s.replicated_bytes = self.replicated_bytes.load(Relaxed);
        s.extracted_ahead = self.extracted_ahead.load(Relaxed);
        s.read_ahead = self.read_ahead.load(Relaxed);
        s.comm_wakes = std::array::from_fn(|i| self.comm_wakes[i].load(Relaxed));
        s.comm_spins_stopped = self.comm_spins_stopped.load(Relaxed);
        let u = process_usage();
        (s.cpu_user_us, s.cpu_sys_us, s.ctx_voluntary, s.ctx_involuntary) = (u.user_us, u.sys_us, u.ctx_voluntary, u.ctx_involuntary);
    }
}

impl Snapshot {
    /// The STATUS text.
    pub fn render(&self) -> String {
        let l = &self.load;
        format!(
            "rank={}\nnranks={}\nhost={}\npid={}\nstatus={}\nmpi_threading={}\npartitions={}\nfiles={}\n\
             bytes_local={}\nbytes_read={}\nload_seconds={:.3}\nload_mbps={:.1}\nopens={}\nopens_local={}\n\
             remote_sent={}\nremote_failed={}\nremote_served={}\nremote_bytes_in={}\nremote_bytes_out={}\nremote_in_place={}\nremote_direct={}\nremote_posted={}\n\
             cache_hits={}\ncache_misses={}\ncache_evictions={}\ncache_bytes={}\ncache_entries={}\ncache_disk_bytes={}\ncopies_reused={}\ncopy_spares_bytes={}\nerrors={}\nclients={}\nfd_pressure={}\nwarm_hints={}\ncopies_declined={}\nnames_asked={}\ndirs_with_outputs={}\nmeta_sent={}\nmeta_local={}\nclient_requests={}\nfiles_ahead={}\n\
             remote_p50_us={}\nremote_p99_us={}\nremote_mbps={:.3}\nreplicated_parts={}\nreplicated_bytes={}\nextracted_ahead={}\nread_ahead={}\n\
             comm_woken_by_command={}\ncomm_woken_by_fd={}\ncomm_woken_by_timeout={}\ncomm_fd_wakes_idle={}\ncomm_missed_wakes={}\ncomm_spins_stopped={}\n\
             cpu_user_us={}\ncpu_sys_us={}\ncpu_seconds={:.2}\nctx_voluntary={}\nctx_involuntary={}\n\
             wake_across_us={}\nwake_same_us={}\ncpus_usable={}\ncpus_online={}\ncpus={}\n",
            self.rank,
            self.nranks,
            self.host,
            self.pid,
            self.status,
            self.threading,
            l.partitions,
            l.files,
            l.bytes_local,
            l.bytes_read,
            l.seconds,
            l.mbps(),
            self.opens,
            self.opens_local,
            self.remote_sent,
            self.remote_failed,
            self.remote_served,
            self.remote_bytes_in,
            self.remote_bytes_out,
            self.remote_in_place,
            self.remote_direct,
            self.remote_posted,
            self.cache_hits,
            self.cache_misses,
            self.cache_evictions,
            self.cache_bytes,
            self.cache_entries,
            self.cache_disk_bytes,
            self.copies_reused,
            self.copy_spares_bytes,
            self.errors,
            self.clients,
            self.fd_pressure,
            self.warm_hints,
            self.copies_declined,
            self.names_asked,
            self.dirs_with_outputs,
            self.meta_sent,
            self.meta_local,
            self.client_requests,
            self.files_ahead,
            self.remote_p50_us,
            self.remote_p99_us,
            self.remote_mbps,
            self.replicated_parts,
            self.replicated_bytes,
            self.extracted_ahead,
            self.read_ahead,
            self.comm_wakes[0],
            self.comm_wakes[1],
            self.comm_wakes[2],
            self.comm_wakes[3],
            self.comm_wakes[4],
            self.comm_spins_stopped,
            self.cpu_user_us,
            self.cpu_sys_us,
            (self.cpu_user_us + self.cpu_sys_us) as f64 / 1e6,
            self.ctx_voluntary,
            self.ctx_involuntary,
            us_or_dash(self.wake.across_us),
            us_or_dash(self.wake.same_us),
            self.cpus_usable,
            self.cpus_online,
            self.cpus,
        )
    }
}

/// A measured µs figure with one decimal, or `-` when it was not measured.
fn us_or_dash(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanstore_core::status::parse;

    #[test]
    fn render_then_parse() {
        let s = Snapshot {
            rank: 2,
            nranks: 4,
            host: "n1".into(),
            status: "ready".into(),
            load: LoadReport { partitions: 3, files: 10, bytes_read: 2_000_000, bytes_local: 3 << 20, seconds: 0.5 },
            cache_hits: 7,
            wake: crate::wake_cost::WakeCost { across_us: Some(43.96), same_us: None },
            cpus: "2-3".into(),
            ..Default::default()
        };
        let kv = parse(&s.render());
        let get = |k: &str| kv.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone()).unwrap();
        assert_eq!(get("rank"), "2");
        assert_eq!(get("load_mbps"), "4.0");
        assert_eq!(get("cache_hits"), "7");
        assert_eq!((get("wake_across_us").as_str(), get("wake_same_us").as_str()), ("44.0", "-"));
        assert_eq!(get("cpus"), "2-3");
        // The CLI's table of these keys is tested in fanstore_core::status.
    }

    #[test]
    fn latency_buckets_and_percentiles() {
        for us in [0u64, 1, 3, 4, 5, 7, 8, 100, 1000, 123_456, 10_000_000] {
            let b = bucket_of(us);
            assert!(bucket_upper(b) >= us, "{us} in bucket {b} ending {}", bucket_upper(b));
            assert!(b == 0 || bucket_upper(b - 1) < us, "{us}: bucket {b} is not the first that holds it");
            assert!(bucket_upper(b) as f64 <= (us as f64 * 1.25).max(3.0), "{us}: bucket too wide");
        }
        let h = LatencyHistogram::default();
        assert_eq!(h.percentile(0.5), 0);
        for _ in 0..98 {
            h.record(std::time::Duration::from_micros(100));
        }
        h.record(std::time::Duration::from_millis(5));
        h.record(std::time::Duration::from_millis(5));
        assert_eq!(h.count(), 100);
        let (p50, p99) = (h.percentile(0.5), h.percentile(0.99));
        assert!((100..=111).contains(&p50), "{p50}");
        assert!((5000..=6143).contains(&p99), "{p99}");
    }

    #[test]
    fn process_usage_counts_this_process() {
        let u = process_usage();
        let (u0, s0) = (u.user_us, u.sys_us);
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let u = process_usage();
        let (u1, s1) = (u.user_us, u.sys_us);
        assert!(u1 + s1 >= u0 + s0 + 10_000, "{u0}+{s0} -> {u1}+{s1} after 30 ms of spinning");
        // A thread that sleeps 5 times blocks 5 times at least (the
        // process's count includes threads that ended).
        let v0 = u.ctx_voluntary;
        std::thread::spawn(|| (0..5).for_each(|_| std::thread::sleep(std::time::Duration::from_millis(1))))
            .join()
            .expect("the sleeping thread");
        let v1 = process_usage().ctx_voluntary;
        assert!(v1 >= v0 + 5, "voluntary switches {v0} -> {v1} around 5 sleeps");
        let kv = parse(&Snapshot { cpu_user_us: 1_500_000, cpu_sys_us: 250_000, ..Default::default() }.render());
        assert!(kv.contains(&("cpu_seconds".into(), "1.75".into())), "{kv:?}");
    }
}
