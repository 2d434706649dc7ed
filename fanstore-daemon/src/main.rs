//! `fanstore-daemon`: one per node. See the crate documentation (lib.rs).

use anyhow::Context;
use clap::Parser;
use fanstore_daemon::args::{DaemonArgs, ReplicateOnRead};
use fanstore_daemon::comm::raw::Comm;
use fanstore_daemon::comm::{Engine, StopCause};
use fanstore_daemon::index_shm::IndexShm;
use fanstore_daemon::node::{self, Identity, LocalStore, Node, Phase};
use fanstore_daemon::placement::Placement;
use fanstore_daemon::server::{self, Listener};
use fanstore_daemon::inputs::load;
use fanstore_daemon::runtime_dir;
use fanstore_core::manifest::{IndexView, Manifest, Verify};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Set by SIGTERM / SIGINT; the communication loop turns it into a job-wide stop.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALLED.store(true, Relaxed);
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: sigaction is plain data; the handler only stores to an
        // atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// What a rank removes when it ends.
#[derive(Default)]
struct Cleanup {
    socket: Option<PathBuf>,
    shm: Option<IndexShm>,
    /// The tier map and the copy directory (shared memory, removed whatever `--keep-local` says).
    tiers: Option<PathBuf>,
    /// The record table (shared memory): removed with the tier map.
    records: Option<PathBuf>,
    copies: Option<PathBuf>,
    local: Option<PathBuf>,
    state: Option<PathBuf>,
    runtime: Option<PathBuf>,
    /// This rank's hold on its files (fanstore_daemon::rank_lock): None
    /// until taken, and where another job's daemon holds them.
    lock: Option<fanstore_daemon::rank_lock::RankLock>,
    /// Rank 0's lease on `--persist` (fanstore_daemon::outputs::persist_lease),
    /// released once its drain is done.
    lease: Option<fanstore_daemon::outputs::persist_lease::PersistLease>,
}

impl Cleanup {
    /// Removes the small things at once (socket, state, index, tier map) and
    /// renames the trees (the copy directory, the local directory) aside,
    /// so that every rank reaches MPI_Finalize at about the same time
    /// however much it holds; [`Tombs::remove`] removes them afterwards.
    fn set_aside(&mut self) -> Tombs {
        // Before the state goes: `fanstore stop` returns once no rank's state
        // is left, and a job started right after must find the lease free.
        if let Some(l) = self.lease.take() {
            l.release();
        }
        for p in [self.socket.take(), self.state.take()].into_iter().flatten() {
            let _ = std::fs::remove_file(&p);
        }
        if let Some(s) = self.shm.take() {
            s.remove();
        }
        for t in [self.tiers.take(), self.records.take()].into_iter().flatten() {
            let _ = std::fs::remove_file(t);
        }
        let mut tombs = Tombs::default();
        if let Some(root) = self.local.as_ref().and_then(|l| l.parent()) {
            // The shared --local root goes when its last rank directory has gone.
            tombs.roots.push(root.to_path_buf());
        }
        for dir in [self.copies.take(), self.local.take()].into_iter().flatten() {
            let tomb = tomb_of(&dir);
            tombs.trees.push(if std::fs::rename(&dir, &tomb).is_ok() { tomb } else { dir });
        }
        if let Some(l) = self.lock.take() {
            l.release();
        }
        if let Some(rt) = self.runtime.take() {
            let _ = std::fs::remove_dir(&rt); // only once empty: the last rank removes it
            tombs.roots.push(rt);
        }
        tombs
    }
}

/// Where [`Cleanup::set_aside`] renames `dir`.
fn tomb_of(dir: &Path) -> PathBuf {
    let mut name = dir.as_os_str().to_os_string();
    name.push(".removing");
    PathBuf::from(name)
}

/// Removes what a rank killed while removing its trees after MPI_Finalize
/// left of `dir`.
fn remove_stale_tomb(dir: &Path, rank: u32) {
    let tomb = tomb_of(dir);
    if tomb.exists() {
        log::warn!("rank {rank}: removing stale {}", tomb.display());
        remove_tree(&tomb);
    }
}

/// Trees a stopping rank renamed aside, removed after MPI_Finalize (or by
/// its watchdog), and the directories to remove once empty.
#[derive(Default)]
struct Tombs {
    trees: Vec<PathBuf>,
    roots: Vec<PathBuf>,
}

impl Tombs {
    fn remove(self) {
        for t in &self.trees {
            remove_tree(t);
        }
        for r in &self.roots {
            let _ = std::fs::remove_dir(r);
        }
    }
}

/// Removes `dir` and everything below it; a failure (out of fds, say) is
/// retried a few times before it is logged.
fn remove_tree(dir: &Path) {
    for attempt in 0..4 {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if attempt == 3 => log::warn!("removing {}: {e}", dir.display()),
            Err(_) => std::thread::sleep(Duration::from_millis(50 << attempt)),
        }
    }
}

/// A rank that is serving (or failed while getting there).
struct Prepared {
    node: Arc<Node>,
    server: std::thread::JoinHandle<()>,
    rx: crossbeam::channel::Receiver<fanstore_daemon::comm::Command>,
    bell: Option<std::sync::Arc<fanstore_daemon::comm::wake::Doorbell>>,
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).format_timestamp_millis().init();
    let args = DaemonArgs::parse();
    let code = match run(&args) {
        Ok(code) => code,
        Err(e) => {
            log::error!("{e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn run(args: &DaemonArgs) -> anyhow::Result<i32> {
    install_signal_handlers();
    // Before MPI opens anything: the daemon's fds are bounded (no fd per
    // file), but connections and requests in flight want room.
    let (soft, hard, nofile) = fanstore_daemon::fdlimit::raise_nofile();
    let eager = fanstore_daemon::comm::raw::set_ucx_eager_max(args.ucx_eager_max);
    let epoll = fanstore_daemon::comm::raw::set_openmpi_event_epoll();
    let (universe, granted) =
        mpi::initialize_with_threading(mpi::Threading::Multiple).context("MPI was already initialised")?;
    let comm = Comm::dup_world().map_err(|e| anyhow::anyhow!("duplicating MPI_COMM_WORLD: {e}"))?;
    let (rank, nranks) = (comm.rank, comm.size);
    // Now, before the daemon opens descriptors of its own: MPI's epoll sets.
    let transport_fds = fanstore_daemon::comm::wake::transport_fds();
    let version = mpi::environment::library_version().unwrap_or_default();
    log::info!(
        "rank {rank}/{nranks}: {} ; asked MPI_THREAD_MULTIPLE, granted {granted:?}",
        version.lines().next().unwrap_or("MPI").trim()
    );
    match &eager {
        Some(thresh) => log::info!("rank {rank}: UCX_RNDV_THRESH={thresh} (--ucx-eager-max)"),
        None => log::debug!("rank {rank}: UCX_RNDV_THRESH left to the environment or UCX"),
    }
    if epoll && version.contains("Open MPI") {
        log::info!("rank {rank}: OMPI_MCA_opal_event_include=epoll (the communication thread sleeps on its connections)");
    }
    // The CPUs the launcher left this daemon.
    let (usable, online) = fanstore_daemon::wake_cost::cpu_counts();
    if let Some(why) = fanstore_daemon::wake_cost::binding_advice(usable, online) {
        log::info!("rank {rank}: {why}");
    }
    // Before the daemon spawns a thread of its own (they inherit the binding).
    if args.share_cpus == "auto" && nranks > 1 {
        share_host_cpus(&universe, rank, online);
    }
    // Before loading, while the node is as idle as between reads, on the
    // CPUs this daemon keeps to.
    let wake = fanstore_daemon::wake_cost::measure_once(200);
    let (usable, _) = fanstore_daemon::wake_cost::cpu_counts();
    let us = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1} µs"));
    match wake.across_us {
        Some(_) => log::info!(
            "rank {rank}: waking a sleeping thread costs {} across CPUs, {} on one CPU (measured at start; STATUS wake_across_us)",
            us(wake.across_us),
            us(wake.same_us)
        ),
        None => log::info!(
            "rank {rank}: waking a sleeping thread costs {} on one CPU (measured at start; across CPUs not measured: {usable} of {online} CPUs usable here, or pinning refused)",
            us(wake.same_us)
        ),
    }
    // (A job of one rank reads nothing remotely.)
    if let Some(why) = fanstore_daemon::wake_cost::advice(&wake, &fanstore_daemon::wake_cost::IdlePolicy::read()).filter(|_| nranks > 1) {
        log::info!("rank {rank}: {why}");
    }
    if nofile > soft {
        log::info!("rank {rank}: RLIMIT_NOFILE soft {soft} hard {hard}: raised the soft limit to {nofile}");
    } else {
        log::info!("rank {rank}: RLIMIT_NOFILE soft {soft} hard {hard}");
    }
    let runtime = args.runtime_dir.clone().unwrap_or_else(runtime_dir);
    let id = Identity {
        rank,
        nranks,
        host: String::from_utf8_lossy(&fanstore_core::runtime::hostname()).into_owned(),
        threading: format!("{granted:?}").to_lowercase(),
        runtime: runtime.clone(),
        local_dir: args.local.join(format!("rank-{rank}")),
        index_path: fanstore_core::runtime::index_shm_path(&runtime, rank),
        mount: args.mount.clone(),
    };
    let mut cleanup = Cleanup::default();
    let prepared = prepare(args, &id, &mut cleanup);
    let any_failed = comm
        .allreduce_max(i32::from(prepared.is_err()), Duration::from_secs_f64(args.load_timeout), || {})
        .unwrap_or(1);
    let p = match prepared {
        Err(e) => {
            log::error!("rank {rank}: {e:#}");
            log::error!("rank {rank}: load failed; the whole job stops (no rank runs with missing partitions)");
            if cleanup.lock.is_some() {
                // (A rank refused because another job's daemon holds its
                // files leaves that job's state alone.)
                publish_failed(&id, &runtime);
            }
            cleanup.state = None; // leave the Failed state for `fanstore wait`
            drop(comm);
            finalize(universe, false, Duration::ZERO, &mut cleanup);
            return Ok(1);
        }
        Ok(p) if any_failed != 0 => {
            log::error!("rank {rank}: another rank failed to load; the whole job stops");
            p.node.set_phase(Phase::Failed);
            p.node.rank.stopping.store(true, Relaxed);
            let _ = p.server.join();
            cleanup.state = None;
            drop(comm);
            finalize(universe, false, Duration::ZERO, &mut cleanup);
            return Ok(1);
        }
        Ok(p) => p,
    };
    let node = p.node.clone();
    node.outputs.attach_watch();
    node.set_phase(Phase::Ready);
    log::info!("rank {rank}: ready ({} ranks loaded)", nranks);
    let store = LocalStore {
        view: node.rank.view,
        local_dir: node.rank.id.local_dir.clone(),
        parts: node.inputs.parts.get().cloned().unwrap_or_default(),
        dedup: node.outputs.dedup.get().cloned(),
    };
    let aside = args.local.join(format!("recovered-rank-{rank}"));
    if aside.is_dir() {
        let node = node.clone();
        let spawned = std::thread::Builder::new().name("fanstore-recover".into()).spawn(move || {
            let n = node.outputs.recover(&aside);
            log::info!("rank {}: recovered {n} outputs of a killed run", node.rank.id.rank);
        });
        if let Err(e) = spawned {
            log::error!("rank {rank}: spawning the recovery thread: {e}");
        }
    }
    let prefill = args.prefill_mem.unwrap_or(args.cache_mem / 2).min(args.cache_mem);
    if prefill > 0 {
        let node = node.clone();
        let spawned = std::thread::Builder::new().name("fanstore-prefill".into()).spawn(move || {
            let t = std::time::Instant::now();
            let n = node.inputs.prefill(prefill);
            log::info!("rank {}: prefilled {n} small files into the copy directory in {:.2} s", node.rank.id.rank, t.elapsed().as_secs_f64());
        });
        if let Err(e) = spawned {
            log::error!("rank {rank}: spawning the prefill thread: {e}");
        }
    }
    let free = fanstore_daemon::inputs::copies::space(&node.rank.id.local_dir).map_or(0, |(free, _)| free);
    let extract = args.extract_ahead.budget(free, fanstore_daemon::inputs::copies::in_memory(&node.rank.id.local_dir));
    if extract > 0 {
        let node = node.clone();
        let spawned = std::thread::Builder::new().name("fanstore-extract".into()).spawn(move || {
            let t = std::time::Instant::now();
            let (files, bytes) = node.inputs.extract_ahead(extract);
            log::info!(
                "rank {}: extracted {files} large local files ({bytes} B) ahead of their first open in {:.2} s",
                node.rank.id.rank,
                t.elapsed().as_secs_f64()
            );
        });
        if let Err(e) = spawned {
            log::error!("rank {rank}: spawning the extraction thread: {e}");
        }
    }
    {
        // WARM hints from clients: a bounded queue (a hint is dropped when
        // the copier is behind) and one low-priority copier thread.
        let (tx, rx) = crossbeam::channel::bounded(4096);
        let _ = node.inputs.warm.set(tx);
        let node = node.clone();
        let spawned = std::thread::Builder::new().name("fanstore-warm".into()).spawn(move || node.inputs.warm_copies(rx));
        if let Err(e) = spawned {
            log::error!("rank {rank}: spawning the copier thread: {e}");
        }
    }
    if args.read_ahead > 0 && args.cache_mem > 0 && nranks > 1 {
        // A bounded queue: a run that does not fit is asked for again by
        // the stream's next open.
        let (tx, rx) = crossbeam::channel::bounded(64);
        let _ = node.inputs.read_ahead.set(fanstore_daemon::inputs::read_ahead::streams::ReadAhead::new(args.read_ahead, tx));
        for k in 0..fanstore_daemon::inputs::read_ahead::streams::THREADS {
            let (node, rx) = (node.clone(), rx.clone());
            let spawned = std::thread::Builder::new().name(format!("fanstore-ahead-{k}")).spawn(move || node.inputs.read_ahead_loop(rx));
            if let Err(e) = spawned {
                log::error!("rank {rank}: spawning read-ahead thread {k}: {e}");
            }
        }
    }
    if args.prefetch_remote > 0 && nranks > 1 {
        let node = node.clone();
        let budget = args.prefetch_remote;
        let spawned = std::thread::Builder::new().name("fanstore-prefetch".into()).spawn(move || {
            let t = std::time::Instant::now();
            let r = fanstore_daemon::inputs::replicate::run(&node.inputs, budget);
            log::info!(
                "rank {}: prefetched {} remote partitions ({} B) in {:.2} s ({} failed)",
                node.rank.id.rank,
                r.partitions,
                r.bytes,
                t.elapsed().as_secs_f64(),
                r.failed
            );
        });
        if let Err(e) = spawned {
            log::error!("rank {rank}: spawning the prefetch thread: {e}");
        }
    }
    let on_read = match args.replicate_on_read {
        ReplicateOnRead::Off => None,
        ReplicateOnRead::FirstRead(budget) => Some((budget, false)),
        ReplicateOnRead::Auto => {
            let free = fanstore_daemon::inputs::copies::space(&node.rank.id.local_dir).map_or(0, |(free, _)| free);
            Some((free / 2, true))
        }
    };
    if let Some((budget, after_its_size)) = on_read.filter(|_| nranks > 1) {
        // A bounded queue: a partition asked for while it is full is asked
        // again by a later read of one of its files.
        let (tx, rx) = crossbeam::channel::bounded(4096);
        let _ = node.inputs.replicate_on_read.set(fanstore_daemon::inputs::ReplicationQueue { tx, after_its_size });
        let node = node.clone();
        let spawned = std::thread::Builder::new().name("fanstore-replicate".into()).spawn(move || {
            let r = fanstore_daemon::inputs::replicate::on_read(&node.inputs, budget, &rx);
            log::info!(
                "rank {}: replicated {} remote partitions ({} B) as their files were read ({} failed)",
                node.rank.id.rank,
                r.partitions,
                r.bytes,
                r.failed
            );
        });
        if let Err(e) = spawned {
            log::error!("rank {rank}: spawning the replication thread: {e}");
        }
    }
    let board_path = fanstore_core::runtime::polling_board_path(&runtime);
    // Polling after a message watches the CPUs (comm/spin.rs); where it
    // cannot see them, the thread does not poll.
    let (spin_us, spin_check) = if args.comm_spin_us > 0 && args.comm_spin_while == "free-cpu" {
        let board = fanstore_daemon::comm::spin::PollingBoard::open(&board_path)
            .map_err(|e| log::warn!("rank {rank}: the polling board {}: {e}", board_path.display()))
            .ok();
        match fanstore_daemon::comm::spin::RunQueue::open(board) {
            Some(q) => (args.comm_spin_us, Some(q)),
            None => {
                log::warn!("rank {rank}: /proc/loadavg cannot be read: the communication thread sleeps right after each message");
                (0, None)
            }
        }
    } else {
        (args.comm_spin_us, None)
    };
    let mut engine = Engine::new(&comm, &store, &node.rank.counters, args.mpi_piece, args.mpi_pipeline)
        .with_spin(Duration::from_micros(spin_us))
        .with_spin_check(spin_check)
        .with_meta(&*node.outputs);
    if let Some(bell) = p.bell.clone().filter(|_| args.comm_sleep == "fds") {
        let waiter = fanstore_daemon::comm::wake::Waiter::new(bell, transport_fds)
            .with_fd_bound(Duration::from_micros(args.comm_fd_bound_us));
        log::info!("rank {rank}: the communication thread sleeps on its doorbell and {} MPI epoll fds", waiter.transport_count());
        engine = engine.with_waiter(waiter);
    }
    // SAFETY: the engine closes the poster in `shutdown` (waiting for posts
    // in progress) before `comm` is dropped at the end of this function.
    let shared = unsafe { comm.share(granted == mpi::Threading::Multiple && args.fetch_post == "server") };
    if let Some(h) = shared {
        let poster = Arc::new(fanstore_daemon::comm::post::Poster::new(h, args.mpi_piece, args.mpi_pipeline));
        node.rank.comm.enable_posting(poster.clone());
        engine = engine.with_poster(poster);
        log::info!("rank {rank}: server threads post their remote reads (MPI_THREAD_MULTIPLE)");
    }
    let cause = engine.run(&p.rx, &SIGNALLED);
    let _ = std::fs::remove_file(&board_path);
    log::info!("rank {rank}: stopping ({cause:?})");
    node.set_phase(Phase::Stopping);
    node.rank.stopping.store(true, Relaxed);
    // What this rank will drain to --persist, as seconds at a pessimistic
    // rate: the ranks agree on the longest at the shutdown barrier, and each
    // lets MPI_Finalize wait that much more for the others (below).
    let drain_secs = node.outputs.persist.get().map_or(0, |_| node.outputs.drain_estimate_secs());
    // A drain waits for the checkpoint store's sums, some of which go to
    // records on other ranks: those must arrive while the ranks still
    // answer each other.
    let outputs = node.outputs.clone();
    let settled = move || outputs.dedup.get().is_none_or(|d| d.sums_settled());
    let settle: Option<&dyn Fn() -> bool> = node.outputs.persist.get().map(|_| &settled as &dyn Fn() -> bool);
    let cause = if cause == StopCause::Orphaned { StopCause::Local } else { cause };
    let (clean, slowest_drain) = engine.shutdown(cause, &p.rx, drain_secs, settle);
    // A rank that finished its stop early waits in MPI_Finalize for the
    // others; its watchdog (10 s, for MPICH 4.0's finalize hang) must not end
    // it while a peer still drains: its launcher would then kill the peer
    // mid-drain (measured, 2 ranks, one draining 100,000 outputs: most never
    // reached --persist). A barrier after the drains instead made MPICH's
    // finalize hang on every rank (4 ranks, 5 runs of 5).
    let drain_allowance = Duration::from_secs(u64::try_from(slowest_drain).unwrap_or(0));
    drop(engine);
    let _ = p.server.join();
    if let Some(dir) = node.outputs.persist.get() {
        match node.outputs.drain(dir) {
            Ok((files, recs)) => log::info!("rank {rank}: drained {files} output files and {recs} records to {}", dir.display()),
            Err(e) => log::error!("rank {rank}: draining outputs to {}: {e}", dir.display()),
        }
    }
    if let Some(d) = node.outputs.dedup.get() {
        d.cancel_queued(); // before the local directory goes: no commit writes into it
    }
    let s = node.snapshot();
    log::info!(
        "rank {rank}: served {} opens ({} local), remote sent {} served {} failed {}, cache hits {} misses {} evictions {}",
        s.opens,
        s.opens_local,
        s.remote_sent,
        s.remote_served,
        s.remote_failed,
        s.cache_hits,
        s.cache_misses,
        s.cache_evictions
    );
    node.outputs.cache.clear(); // closes the cached memfds: removing the tree needs fds too
    drop(comm);
    finalize(universe, clean, drain_allowance, &mut cleanup);
    log::info!("rank {rank}: stopped");
    Ok(0)
}

/// Opens the rank's checkpoint store at `rank-<r>/out/ckpt`: the store of a
/// killed run (kept aside with its outputs), else the one an earlier job
/// drained to `--persist`, else a new one (none with `--dedup off` and
/// nothing to serve). Returns true when a killed run's store was taken
/// back (its outputs are registered again by the recovery thread).
fn open_checkpoint_store(args: &DaemonArgs, id: &Identity, node: &Node) -> anyhow::Result<bool> {
    use fanstore_daemon::outputs::dedup::{self, Dedup};
    let dir = id.local_dir.join("out").join(dedup::STORE_DIR);
    let kept = args.local.join(format!("recovered-rank-{}", id.rank)).join(dedup::STORE_DIR);
    let mut recovering = false;
    let mut exists = false;
    if kept.is_dir() {
        std::fs::create_dir_all(id.local_dir.join("out")).with_context(|| format!("creating {}", id.local_dir.display()))?;
        std::fs::rename(&kept, &dir).with_context(|| format!("taking back the checkpoint store {}", kept.display()))?;
        (recovering, exists) = (true, true);
    } else if let Some(p) = &args.persist {
        let src = dedup::drained_dir(p, id.rank);
        exists = dedup::adopt_drained(&src, &dir).with_context(|| format!("copying the checkpoint store {}", src.display()))?;
    }
    let on = args.dedup == "on";
    if on || exists {
        let min = if on { args.dedup_min } else { u64::MAX };
        let mut hot = if args.ckpt_hot_size == 0 { 0 } else { args.ckpt_hot };
        if hot > 1 && fanstore_daemon::inputs::copies::in_memory(&id.local_dir) {
            log::info!(
                "rank {}: the local dir {} is in memory (tmpfs): the checkpoint store keeps only its newest commit as a hot copy",
                id.rank,
                id.local_dir.display()
            );
            hot = 1;
        }
        let d = Dedup::open(&dir, min, args.fsync_outputs, hot, args.ckpt_hot_size).with_context(|| format!("opening the checkpoint store {}", dir.display()))?;
        let outputs = Arc::downgrade(&node.outputs);
        d.on_sum(Box::new(move |id, sum| {
            if let Some(o) = outputs.upgrade() {
                o.settle_sum(id, sum);
            }
        }));
        let _ = node.outputs.dedup.set(Arc::new(d));
    }
    Ok(recovering)
}

/// Daemons of this job on this host keep to their own shares of its CPUs
/// (fanstore_daemon::cpu_share). Collective: every rank calls it.
fn share_host_cpus(universe: &mpi::environment::Universe, rank: u32, online: usize) {
    use mpi::topology::Communicator;
    // Ordered by world rank (equal keys).
    let host = universe.world().split_shared(0);
    let (index, count) = (host.rank() as usize, host.size() as usize);
    if count < 2 {
        return;
    }
    let usable = fanstore_daemon::wake_cost::usable_cpus();
    let job = fanstore_daemon::comm::spin::job_cpus().unwrap_or(online);
    if usable.len() < job {
        log::info!("rank {rank}: {count} daemons of this job on this host; the launcher bound this one already (CPUs {})", fanstore_daemon::cpu_share::describe(&usable));
        return;
    }
    let Some(mine) = fanstore_daemon::cpu_share::share(&usable, index, count) else { return };
    match fanstore_daemon::cpu_share::bind_process(&mine) {
        Ok(threads) => log::info!(
            "rank {rank}: {count} daemons of this job share this host: this one keeps its threads ({threads} now, and those it starts) on CPUs {} of {}, as a node's daemon keeps to its node (--share-cpus off leaves them free)",
            fanstore_daemon::cpu_share::describe(&mine),
            fanstore_daemon::cpu_share::describe(&usable)
        ),
        Err(e) => log::warn!("rank {rank}: binding to CPUs {}: {e}; left to the scheduler", fanstore_daemon::cpu_share::describe(&mine)),
    }
}

/// Finalises MPI under a watchdog: a peer that vanished, or a finalize
/// hang, must not keep the rank alive.
fn finalize(universe: mpi::environment::Universe, clean: bool, allowance: Duration, cleanup: &mut Cleanup) {
    let code = if clean { 0 } else { 1 };
    let mut aside = Some(cleanup.set_aside());
    if !clean {
        // A rank exiting non-zero makes the launcher kill the others: they
        // must have removed their trees before any of them can exit.
        if let Some(t) = aside.take() {
            t.remove();
        }
    }
    let tombs = Arc::new(Mutex::new(aside));
    let by_watchdog = tombs.clone();
    let remove = |t: &Mutex<Option<Tombs>>| {
        if let Some(t) = t.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.remove();
        }
    };
    fanstore_daemon::comm::raw::finalize(universe, Duration::from_secs(10) + allowance, code, move || remove(&by_watchdog));
    remove(&tombs);
}

fn publish_failed(id: &Identity, runtime: &Path) {
    let st = node::state_for(id, 0, Phase::Failed, Vec::new());
    let _ = st.publish(&fanstore_core::runtime::state_path(runtime, id.rank));
}

/// Everything up to a loaded, serving rank.
fn prepare(args: &DaemonArgs, id: &Identity, cleanup: &mut Cleanup) -> anyhow::Result<Prepared> {
    let rank = id.rank;
    fanstore_daemon::prepare_runtime_dir(&id.runtime)?;
    cleanup.runtime = Some(id.runtime.clone()); // (removed at the end only if empty)
    // Before anything of this rank is touched: a running job's files are
    // not a killed one's. Once the runtime directory's is held, a failure
    // (the --local one held) is reported there.
    let lock = cleanup.lock.insert(fanstore_daemon::rank_lock::RankLock::claim_runtime(&id.runtime, rank)?);
    lock.claim_local(&args.local, rank)?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let swept = fanstore_daemon::sweep_abandoned_tombs(Path::new("/dev/shm"), &format!("fanstore-{uid}-"), fanstore_daemon::TOMB_ABANDONED);
    if swept > 0 {
        log::warn!("rank {rank}: removed {swept} copy directories in /dev/shm that ranks of earlier jobs were killed while removing");
    }
    let state_path = fanstore_core::runtime::state_path(&id.runtime, rank);
    node::state_for(id, 0, Phase::Loading, Vec::new())
        .publish(&state_path)
        .with_context(|| format!("publishing {}", state_path.display()))?;
    cleanup.state = Some(state_path);
    if rank == 0 {
        fanstore_daemon::remove_stale_ranks(&id.runtime, id.nranks);
    }
    let mpath = args.data.join(fanstore_core::manifest::FILE_NAME);
    let manifest = Manifest::open(&mpath).context("loading the manifest")?;
    // The daemon keeps its own copy for the life of the process.
    let bytes: &'static [u8] = Box::leak(manifest.bytes().to_vec().into_boxed_slice());
    drop(manifest);
    let view = IndexView::parse(&mpath, bytes, Verify::Header)?;
    load::check_partition_table(&view)?;
    cleanup.shm = Some(IndexShm::publish(&id.index_path, bytes, fanstore_daemon::caller::shared_mode(0o644, 0o600))?);
    let replicated: Vec<bool> = view.partitions().map(|p| p.replicated()).collect();
    let placement = Placement::new(id.nranks, args.replication, replicated);
    let listener = Listener::bind(&fanstore_core::runtime::socket_path(&id.runtime, rank))?;
    cleanup.socket = Some(listener.path().to_path_buf());
    // A stale local dir of a killed run is ours (rank-<r> under --local):
    // keep its outputs aside (registered again once every rank is ready),
    // replace the rest.
    let recovered = id.local_dir.join("out");
    if recovered.is_dir() {
        let aside = args.local.join(format!("recovered-rank-{rank}"));
        let _ = std::fs::remove_dir_all(&aside);
        match std::fs::rename(&recovered, &aside) {
            Ok(()) => log::warn!("rank {rank}: outputs of a killed run kept at {}", aside.display()),
            Err(e) => log::error!("rank {rank}: keeping the outputs of a killed run: {e}"),
        }
    }
    if id.local_dir.exists() {
        log::warn!("rank {rank}: removing stale {}", id.local_dir.display());
        let _ = std::fs::remove_dir_all(&id.local_dir);
    }
    remove_stale_tomb(&id.local_dir, rank);
    let local_dir = id.local_dir.clone();
    fanstore_daemon::prepare_client_dir(&local_dir).with_context(|| format!("preparing {}/.client for the clients of every user", local_dir.display()))?;
    let in_memory = fanstore_daemon::inputs::copies::in_memory(&local_dir);
    if in_memory && args.cache_disk > 0 {
        log::info!("rank {}: the local dir {} is in memory (tmpfs): no node copies on it (--cache-disk ignored)", id.rank, local_dir.display());
    }
    let (tx, rx, bell) = fanstore_daemon::comm::wake::channel();
    let remote_timeout = Duration::from_secs_f64(args.remote_timeout.max(0.1));
    let node = Node::new(id.clone(), view, placement, args.cache_mem, tx, remote_timeout);
    node.outputs.fsync_outputs.store(args.fsync_outputs, Relaxed);
    // Unnamed files for new outputs, made ahead off the programs' path.
    // Each file ready is an fd of the daemon: at most 1/64 of its limit.
    let files_ahead = args.files_ahead.min(fanstore_daemon::fdlimit::nofile() as usize / 64);
    if files_ahead > 0 {
        let tmp = local_dir.join(".client").join("tmp");
        let made = std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700).create(&tmp);
        match made.and_then(|()| fanstore_daemon::outputs::new_files::NewFiles::start(tmp.clone(), files_ahead)) {
            Ok(p) => {
                let _ = node.outputs.new_files.set(p);
            }
            Err(e) => log::warn!("rank {rank}: no files made ahead in {}: {e}; clients make their own", tmp.display()),
        }
    }
    let ipath = id.index_path.as_os_str().as_bytes();
    let tiers_path = PathBuf::from(std::ffi::OsStr::from_bytes(&fanstore_core::tiers::tier_map_path(ipath)));
    let tiers = fanstore_daemon::inputs::copies::TierMap::create(&tiers_path, view.dataset_id(), u64::from(view.node_count()))
        .with_context(|| format!("creating the tier map {}", tiers_path.display()))?;
    cleanup.tiers = Some(tiers_path);
    // The records this rank owns, for its node's clients to read (a stat
    // or an open of an output held here with no message). Without it every
    // output lookup asks the daemon, as before: worth a warning, not a stop.
    let records_path = PathBuf::from(std::ffi::OsStr::from_bytes(&fanstore_core::record_table::table_path(ipath)));
    let mode = fanstore_daemon::caller::shared_mode(0o644, 0o600);
    match fanstore_core::record_table::RecordTable::create(&records_path, fanstore_core::record_table::DEFAULT_SLOTS, rank, mode) {
        Ok(t) => {
            node.outputs.meta.lock().unwrap_or_else(|p| p.into_inner()).publish_to(Arc::new(t));
            cleanup.records = Some(records_path);
        }
        Err(e) => log::warn!("rank {rank}: no record table at {}: {e}; every output lookup asks the daemon", records_path.display()),
    }
    let tiers = Arc::new(tiers);
    let copies_dir = PathBuf::from(std::ffi::OsStr::from_bytes(&fanstore_core::tiers::copy_dir(ipath)));
    remove_stale_tomb(&copies_dir, id.rank);
    let copies = fanstore_daemon::inputs::copies::Copies::create(&copies_dir, tiers.clone(), args.cache_mem)
        .with_context(|| format!("creating the copy directory {}", copies_dir.display()))?
        .with_disk(&local_dir, if in_memory { 0 } else { args.cache_disk })
        .with_spares(args.copy_spares);
    cleanup.copies = Some(copies_dir);
    let _ = node.inputs.tiers.set(tiers);
    let _ = node.inputs.copies.set(copies);
    if let Some(dir) = args.persist.as_ref().filter(|_| rank == 0) {
        // Before this job reads it: one running job per --persist directory.
        cleanup.lease = Some(fanstore_daemon::outputs::persist_lease::PersistLease::acquire(dir)?);
    }
    let recovering = open_checkpoint_store(args, id, &node)?;
    if let Some(dir) = &args.persist {
        let n = node.outputs.load_persisted(dir).with_context(|| format!("loading the outputs kept in {}", dir.display()))?;
        log::info!("rank {rank}: {n} persisted output records from {}", dir.display());
        let _ = node.outputs.persist.set(dir.clone());
    }
    if let Some(d) = node.outputs.dedup.get().filter(|_| !recovering) {
        let n = d.sweep_unclaimed();
        if n > 0 {
            log::info!("rank {rank}: released {n} drained checkpoints that no output record names");
        }
    }
    node.set_phase(Phase::Loading);
    let server = {
        let node = node.clone();
        std::thread::Builder::new().name("fanstore-accept".into()).spawn(move || server::serve(listener, node))
    };
    let server = server.context("spawning the accept thread")?;
    if !args.keep_local {
        cleanup.local = Some(local_dir.clone());
    }
    let threads = args.load_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    log::info!(
        "rank {rank}: loading partitions {:?} of {} (replication {}) into {} with {threads} threads",
        node.rank.placement.partitions_of(rank),
        node.rank.view.partition_count(),
        node.rank.placement.replication(),
        local_dir.display()
    );
    match load::load(&args.data, &node.rank.view, &node.rank.placement, rank, &local_dir, threads) {
        Ok(l) => {
            let r = l.report;
            log::info!(
                "rank {rank}: loaded {} partitions, {} files, {:.1} MB read in {:.3} s ({:.1} MB/s), {:.1} MB local",
                r.partitions,
                r.files,
                r.bytes_read as f64 / 1e6,
                r.seconds,
                r.mbps(),
                r.bytes_local as f64 / 1e6
            );
            let _ = node.inputs.local.set(l.local);
            let _ = node.inputs.parts.set(l.parts);
            let _ = node.inputs.load.set(r);
            Ok(Prepared { node, server, rx, bell })
        }
        Err(e) => {
            node.rank.stopping.store(true, Relaxed);
            let _ = server.join();
            Err(anyhow::Error::from(e).context("loading"))
        }
    }
}
