//! The state one daemon rank shares between its threads, and the NodeState
//! file it publishes for clients and the control CLI.

use crate::inputs::cache::Cache;
use crate::comm::{PeerSource, SendBuf};
use crate::placement::Placement;
use crate::status::{Counters, LoadReport, Snapshot};
use fanstore_core::manifest::{IndexView, NodeKind};
use fanstore_core::runtime::{NodeState, Status};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Where the rank is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Loading,
    Ready,
    Stopping,
    Failed,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Loading => "loading",
            Phase::Ready => "ready",
            Phase::Stopping => "stopping",
            Phase::Failed => "failed",
        }
    }
    fn status(self) -> Status {
        match self {
            Phase::Loading => Status::Loading,
            Phase::Ready => Status::Ready,
            Phase::Stopping => Status::Stopping,
            Phase::Failed => Status::Failed,
        }
    }
}

/// Fixed facts about this rank, set at start.
#[derive(Debug, Clone)]
pub struct Identity {
    pub rank: u32,
    pub nranks: u32,
    pub host: String,
    pub threading: String,
    pub runtime: PathBuf,
    pub local_dir: PathBuf,
    pub index_path: PathBuf,
    pub mount: String,
}

/// Everything the threads of one rank share.
pub struct Node {
    pub id: Identity,
    pub view: IndexView<'static>,
    pub placement: Placement,
    /// Read-back outputs (sealed memfds), bounded by bytes and by count
    /// ([`crate::fdlimit::memfd_cache_entries`]).
    pub cache: Cache<Arc<OwnedFd>, i32>,
    /// Copies of dataset files in shared memory ([`crate::inputs::copies`]), set at start.
    pub copies: OnceLock<crate::inputs::copies::Copies>,
    /// Where each file's bytes can be opened directly, set at start.
    pub tiers: OnceLock<Arc<crate::inputs::copies::TierMap>>,
    /// `parts[p]`: the mapped local copy of partition p, set once loaded.
    pub parts: OnceLock<Vec<Option<crate::inputs::load::PartMap>>>,
    /// `replicas[p]`: the mapped copy of remote partition p, once fetched
    /// from a holder in the background ([`crate::inputs::replicate`]).
    pub replicas: Box<[OnceLock<crate::inputs::load::PartMap>]>,
    /// `replica_claims[p]`: a replication thread took partition p (it is
    /// being fetched, was fetched, or failed); no other thread fetches it.
    pub replica_claims: Box<[AtomicBool]>,
    /// `replica_asked[p]`: a remote read of one of p's files already asked
    /// the read-driven replication thread for the whole partition.
    pub replica_asked: Box<[AtomicBool]>,
    /// `replica_pending[p]`: while a replication thread fetches partition
    /// p, the bytes it has still to fetch plus one (0: no fetch in flight).
    pub replica_pending: Box<[std::sync::atomic::AtomicU64]>,
    /// Notified whenever a fetch of a partition ends, published or not.
    pub replica_ended: (Mutex<()>, Condvar),
    /// The read-driven replication thread's queue (`--replicate-on-read`),
    /// set once ready when it runs.
    pub replicate_on_read: OnceLock<ReplicationQueue>,
    /// `remote_rent[p]`: what this node's remote reads of partition p's
    /// files cost, in bytes the bulk transfer moves in as much time
    /// ([`Node::read_remotely`]; `--replicate-on-read auto` asks for p once
    /// it reaches p's size).
    pub remote_rent: Box<[std::sync::atomic::AtomicU64]>,
    /// The rate of the last whole-partition fetch, bytes/s (0: none yet:
    /// [`BULK_RATE_DEFAULT`]).
    pub bulk_rate: std::sync::atomic::AtomicU64,
    /// Files clients decoded themselves, to copy in the background
    /// ([`Node::warm_copies`]); set once ready.
    pub warm: OnceLock<crossbeam::channel::Sender<u32>>,
    /// Read-ahead of remote files read in order ([`crate::inputs::read_ahead`]);
    /// set once ready when `--read-ahead` is on.
    pub read_ahead: OnceLock<crate::inputs::read_ahead::ReadAhead>,
    pub counters: Counters,
    pub comm: crate::comm::wake::CommTx,
    pub remote_timeout: Duration,
    /// Set once loading succeeded: `local[p]` when partition p is extracted here.
    pub local: OnceLock<Vec<bool>>,
    pub load: OnceLock<LoadReport>,
    /// Set when the rank stops: the server stops accepting and serving.
    pub stopping: AtomicBool,
    /// Output records and listings this rank owns ([`crate::outputs::namespace::owner`]).
    pub meta: Mutex<crate::outputs::namespace::owner::MetaStore>,
    /// Next output id (`out/<id>` in the local directory).
    pub out_seq: std::sync::atomic::AtomicU64,
    /// Outputs committed while another process still wrote them, for that
    /// process's late commit ([`crate::outputs::held::SharedCommits`]).
    pub shared_commits: Mutex<crate::outputs::held::SharedCommits>,
    /// `--persist` directory, if any ([`crate::outputs::persist`]).
    pub persist: OnceLock<PathBuf>,
    /// The checkpoint store ([`crate::outputs::dedup`]), set at start.
    pub dedup: OnceLock<Arc<crate::outputs::dedup::Dedup>>,
    /// `--fsync-outputs`: fsync each output (and its sidecar) before close returns.
    pub fsync_outputs: AtomicBool,
    /// When the rank became ready (remote MB/s in STATUS is since then).
    pub ready_at: OnceLock<Instant>,
    /// Watchers and event routes ([`crate::outputs::watch`]).
    pub watch: crate::outputs::watch::WatchState,
    /// This node's copies of outputs held by other ranks ([`crate::outputs::remote_out`]).
    pub remote_outs: crate::outputs::remote_out::RemoteOutputs,
    phase: Mutex<Phase>,
    phase_cv: Condvar,
}

/// Where remote reads ask for their partition to be fetched whole.
pub struct ReplicationQueue {
    pub tx: crossbeam::channel::Sender<u32>,
    /// Only once the remote reads of its files cost as much time as
    /// fetching it whole (`auto`); otherwise on the first read.
    pub after_its_size: bool,
}

/// The bulk rate assumed before this node fetched a partition whole
/// (bytes/s): about what this machine's whole-partition fetches reach
/// (verified and written: 0.25-1 GB/s per rank with 4 ranks on 2 cores).
pub const BULK_RATE_DEFAULT: u64 = 1 << 30;
/// Bounds on a measured bulk rate (bytes/s): one slow fetch (a busy disk)
/// or a tiny fast one must not make the rule fetch nothing or everything.
pub const BULK_RATE_RANGE: (u64, u64) = (64 << 20, 16 << 30);

/// An open waits for a partition being fetched whole only when at most this
/// many of its bytes are still to come (~10-20 ms at the bulk rate here).
pub const REPLICA_WAIT_BYTES: u64 = 16 << 20;
/// The longest such a wait lasts (then the file is fetched alone).
pub const REPLICA_WAIT: Duration = Duration::from_millis(500);

impl Node {
    /// The mapped local copy of partition `p`: loaded at start, or
    /// replicated since.
    pub fn part_map(&self, p: u32) -> Option<&crate::inputs::load::PartMap> {
        self.parts.get().and_then(|v| v.get(p as usize)).and_then(Option::as_ref).or_else(|| self.replicas.get(p as usize)?.get())
    }

    /// A file of remote partition `p`, `bytes` stored, was just read from
    /// its holder in `took`: ask the read-driven replication thread (if it
    /// runs) for the whole partition, once: at once, or (`auto`) once the
    /// remote reads of its files have cost as much as fetching it whole.
    ///
    /// That is the ski-rental rule in time: a read costs its round trip
    /// (request, reply, the bytes landing), buying costs the partition's
    /// bytes at the bulk rate. Counted in bytes, a read's rent is what the
    /// bulk transfer moves in its round trip, and never less than its own
    /// bytes: `max(bytes, took x bulk rate)`. A small file's read is nearly
    /// all round trip: 100-byte files read remotely in 255 µs (p50, 4
    /// readers, 4 ranks here) cost as much as 267 KB of bulk transfer;
    /// counting their bytes alone, a node read every file of a partition of
    /// them remotely, more than once, before fetching it. Costs two atomic
    /// loads when already asked, one more add before.
    pub fn read_remotely(&self, p: u32, bytes: u64, took: Duration) {
        let Some(queue) = self.replicate_on_read.get() else { return };
        let Some(asked) = self.replica_asked.get(p as usize) else { return };
        if asked.load(Relaxed) {
            return;
        }
        if queue.after_its_size {
            let Some(rent) = self.remote_rent.get(p as usize) else { return };
            let add = bytes.max(self.bulk_bytes_in(took));
            let total = rent.fetch_add(add, Relaxed).saturating_add(add);
            let size = self.view.partition(p).map_or(u64::MAX, |i| i.file_len);
            if total < size {
                return;
            }
            log::info!(
                "rank {}: partition {p} ({size} B) asked for whole: its remote reads cost as much ({total} B at {} MB/s)",
                self.id.rank,
                self.bulk_rate() / 1_000_000
            );
        }
        if asked.swap(true, Relaxed) {
            return;
        }
        if queue.tx.try_send(p).is_err() {
            // The queue is full (the thread is behind): a later read asks again.
            asked.store(false, Relaxed);
        }
    }

    /// The bulk rate, bytes/s: of the last whole-partition fetch, within
    /// [`BULK_RATE_RANGE`], else [`BULK_RATE_DEFAULT`].
    pub fn bulk_rate(&self) -> u64 {
        match self.bulk_rate.load(Relaxed) {
            0 => BULK_RATE_DEFAULT,
            r => r.clamp(BULK_RATE_RANGE.0, BULK_RATE_RANGE.1),
        }
    }

    /// Bytes the bulk transfer moves in `d`.
    fn bulk_bytes_in(&self, d: Duration) -> u64 {
        u64::try_from(d.as_nanos().saturating_mul(u128::from(self.bulk_rate())) / 1_000_000_000).unwrap_or(u64::MAX)
    }

    /// When partition `p` is being fetched whole and at most
    /// [`REPLICA_WAIT_BYTES`] of it are still to come, waits for it (at most
    /// [`REPLICA_WAIT`]) rather than fetch one of its files alone: the
    /// replica brings those bytes anyway, in large messages, and a file
    /// fetched alone now would cross twice. True when the replica is here.
    pub fn await_replica(&self, p: u32) -> bool {
        let Some(pending) = self.replica_pending.get(p as usize) else { return false };
        let left = pending.load(Relaxed);
        if left == 0 || left > REPLICA_WAIT_BYTES {
            return false;
        }
        let deadline = Instant::now() + REPLICA_WAIT;
        let (lock, cv) = &self.replica_ended;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        while pending.load(Relaxed) != 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = cv.wait_timeout(g, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        drop(g);
        self.part_map(p).is_some()
    }

    /// A fetch of partition `p` ended (published or given up): wakes the
    /// opens waiting for it.
    pub fn replica_fetch_ended(&self, p: u32) {
        if let Some(pending) = self.replica_pending.get(p as usize) {
            pending.store(0, Relaxed);
        }
        let (lock, cv) = &self.replica_ended;
        let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
        cv.notify_all();
    }

    pub fn new(
        id: Identity,
        view: IndexView<'static>,
        placement: Placement,
        cache_mem: u64,
        comm: crate::comm::wake::CommTx,
        remote_timeout: Duration,
    ) -> Node {
        Node {
            id,
            view,
            placement,
            cache: Cache::with_limits(cache_mem, crate::fdlimit::memfd_cache_entries(crate::fdlimit::nofile()), None),
            copies: OnceLock::new(),
            tiers: OnceLock::new(),
            parts: OnceLock::new(),
            replicas: (0..view.partition_count()).map(|_| OnceLock::new()).collect(),
            replica_claims: (0..view.partition_count()).map(|_| AtomicBool::new(false)).collect(),
            replica_asked: (0..view.partition_count()).map(|_| AtomicBool::new(false)).collect(),
            replica_pending: (0..view.partition_count()).map(|_| std::sync::atomic::AtomicU64::new(0)).collect(),
            replica_ended: (Mutex::new(()), Condvar::new()),
            replicate_on_read: OnceLock::new(),
            remote_rent: (0..view.partition_count()).map(|_| std::sync::atomic::AtomicU64::new(0)).collect(),
            bulk_rate: std::sync::atomic::AtomicU64::new(0),
            warm: OnceLock::new(),
            read_ahead: OnceLock::new(),
            counters: Counters::default(),
            comm,
            remote_timeout,
            local: OnceLock::new(),
            load: OnceLock::new(),
            stopping: AtomicBool::new(false),
            meta: Mutex::new(crate::outputs::namespace::owner::MetaStore::default()),
            out_seq: std::sync::atomic::AtomicU64::new(1),
            shared_commits: Mutex::new(crate::outputs::held::SharedCommits::default()),
            persist: OnceLock::new(),
            dedup: OnceLock::new(),
            fsync_outputs: AtomicBool::new(false),
            ready_at: OnceLock::new(),
            watch: Default::default(),
            remote_outs: crate::outputs::remote_out::RemoteOutputs::new(cache_mem, crate::fdlimit::remote_output_entries(crate::fdlimit::nofile())),
            phase: Mutex::new(Phase::Loading),
            phase_cv: Condvar::new(),
        }
    }

    pub fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves to `phase` and publishes the state file.
    pub fn set_phase(&self, phase: Phase) {
        if phase == Phase::Ready {
            let _ = self.ready_at.set(Instant::now());
        }
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = phase;
        self.phase_cv.notify_all();
        if let Err(e) = self.state(phase).publish(&self.state_path()) {
            log::error!("rank {}: publishing {}: {e}", self.id.rank, self.state_path().display());
        }
    }

    /// Waits until the rank is no longer loading (at most `timeout`).
    pub fn wait_loaded(&self, timeout: Duration) -> Phase {
        let deadline = Instant::now() + timeout;
        let mut g = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        while *g == Phase::Loading {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = self.phase_cv.wait_timeout(g, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        *g
    }

    pub fn state_path(&self) -> PathBuf {
        fanstore_core::runtime::state_path(&self.id.runtime, self.id.rank)
    }

    pub fn socket_path(&self) -> PathBuf {
        fanstore_core::runtime::socket_path(&self.id.runtime, self.id.rank)
    }

    /// The NodeState this rank publishes in `phase`.
    pub fn state(&self, phase: Phase) -> NodeState {
        let mut st = state_for(&self.id, self.view.dataset_id(), phase, self.local.get().cloned().unwrap_or_else(|| {
            vec![false; self.view.partition_count() as usize]
        }));
        if self.dedup.get().is_some_and(|d| d.min != u64::MAX) {
            st.flags |= fanstore_core::runtime::FLAG_DEDUP;
        }
        if self.copies.get().is_some_and(|c| c.fits(1) || c.disk().is_some()) {
            st.flags |= fanstore_core::runtime::FLAG_COPIES;
        }
        st
    }

    /// Frees what fds the rank can spare (the output cache's memfds); called
    /// when a call fails with EMFILE/ENFILE, before it is tried again.
    pub fn relieve_fds(&self) {
        let n = self.cache.shed() + self.remote_outs.shed();
        let spares = self.copies.get().map_or(0, |c| c.spares.shed());
        self.counters.fd_pressure.fetch_add(1, Relaxed);
        log::debug!("rank {}: out of file descriptors: released {n} cached memfds and {spares} spare copies", self.id.rank);
    }

    /// This rank's counters, for STATUS.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot {
            rank: self.id.rank,
            nranks: self.id.nranks,
            host: self.id.host.clone(),
            pid: std::process::id(),
            status: self.phase().name().to_string(),
            threading: self.id.threading.clone(),
            load: self.load.get().copied().unwrap_or_default(),
            ..Default::default()
        };
        self.counters.fill(&mut s);
        s.wake = crate::wake_cost::measured().unwrap_or_default();
        let usable = crate::wake_cost::usable_cpus();
        (s.cpus_usable, s.cpus_online, s.cpus) = (usable.len(), crate::wake_cost::online_cpus(), crate::cpu_share::describe(&usable));
        if let Some(t) = self.ready_at.get() {
            let secs = t.elapsed().as_secs_f64();
            if secs > 0.0 {
                s.remote_mbps = s.remote_bytes_in as f64 / secs / 1e6;
            }
        }
        let caches = std::iter::once(&self.cache.stats)
            .chain(self.copies.get().map(|c| &c.cache.stats))
            .chain(self.copies.get().and_then(|c| c.disk()).map(|d| &d.cache.stats))
            .chain(std::iter::once(self.remote_outs.stats()));
        for st in caches {
            s.cache_hits += st.hits.load(Relaxed);
            s.cache_misses += st.misses.load(Relaxed);
            s.cache_evictions += st.evictions.load(Relaxed);
        }
        let (bytes, entries) = self.cache.usage();
        let (cbytes, centries) = self.copies.get().map(|c| c.usage()).unwrap_or_default();
        let (dbytes, dentries) = self.copies.get().map(|c| c.disk_usage()).unwrap_or_default();
        s.cache_bytes = bytes + cbytes + dbytes;
        s.cache_entries = (entries + centries + dentries) as u64;
        s.cache_disk_bytes = dbytes;
        if let Some(c) = self.copies.get() {
            s.copies_reused = c.spares.reused.load(Relaxed) + c.evicted.reused.load(Relaxed);
            s.copy_spares_bytes = c.spares.usage().0 + c.evicted.usage().0;
        }
        s
    }
}

/// A NodeState from its parts (also used before a [`Node`] exists, to report a failure).
pub fn state_for(id: &Identity, dataset_id: u64, phase: Phase, local: Vec<bool>) -> NodeState {
    NodeState {
        rank: id.rank,
        nranks: id.nranks,
        status: phase.status(),
        dataset_id,
        pid: std::process::id() as u64,
        flags: 0,
        local_dir: id.local_dir.as_os_str().as_bytes().to_vec(),
        index_path: id.index_path.as_os_str().as_bytes().to_vec(),
        hostname: id.host.as_bytes().to_vec(),
        mount: id.mount.as_bytes().to_vec(),
        local_partitions: local,
    }
}

/// Serves peers from the local directory: the owner side of a remote read.
pub struct LocalStore<'a> {
    pub view: IndexView<'a>,
    pub local_dir: PathBuf,
    /// `parts[p]`: the mapped local copy of partition p, if held here.
    pub parts: Vec<Option<crate::inputs::load::PartMap>>,
    /// Outputs held in the checkpoint store are served from it.
    pub dedup: Option<Arc<crate::outputs::dedup::Dedup>>,
}

/// Output payloads from this size up are sent from a mapping of their file
/// (no copy); smaller ones are read into a (reused) buffer.
const MAP_FROM: u64 = 1 << 20;

impl PeerSource for LocalStore<'_> {
    fn payload(&self, node_id: u32, stored_len: u64, mut spare: Option<Vec<u8>>) -> Option<SendBuf> {
        if node_id & crate::comm::OUT_BIT != 0 {
            let id = u64::from(node_id & !crate::comm::OUT_BIT);
            let path = self.local_dir.join("out").join(id.to_string());
            // The plain file first: a checkpoint stored behind its close is
            // one until the store has it (then the store holds it before the
            // file goes, so a miss here finds it there).
            if path.exists() {
                if let Some(b) = read_payload(&path, stored_len, spare.take()) {
                    return Some(b);
                }
            }
            let d = self.dedup.as_ref().filter(|d| d.holds(id))?;
            let mut v = spare.unwrap_or_default();
            v.clear();
            return match d.read_output(id, &mut v) {
                Ok(n) if n == stored_len => Some(SendBuf::Heap(v)),
                _ => None,
            };
        }
        let n = self.view.node(node_id)?;
        if n.kind() != Some(NodeKind::File) || n.stored_len() != stored_len {
            return None;
        }
        let map = self.parts.get(n.partition() as usize)?.as_ref()?;
        let start = usize::try_from(n.payload_offset()).ok()?;
        let end = start.checked_add(usize::try_from(stored_len).ok()?)?;
        if end > map.len() {
            log::error!("node {node_id}: payload past the end of its local partition copy");
            return None;
        }
        // Sent straight from the mapping, whatever the size: no copy.
        Some(SendBuf::Part(map.clone(), start..end))
    }

    fn partition_range(&self, p: u32, offset: u64, len: u64) -> Option<SendBuf> {
        let map = self.parts.get(p as usize)?.as_ref()?;
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        if end > map.len() {
            log::warn!("partition {p}: range {start}..{end} asked past the end of the local copy ({} B)", map.len());
            return None;
        }
        Some(SendBuf::Part(map.clone(), start..end))
    }
}

/// The bytes of a local file of `stored_len` bytes: mapped when large, else
/// read into `spare`.
fn read_payload(path: &std::path::Path, stored_len: u64, spare: Option<Vec<u8>>) -> Option<SendBuf> {
    let f = std::fs::File::open(path).ok()?;
    if f.metadata().ok()?.len() != stored_len {
        log::error!("{}: local copy has the wrong length", path.display());
        return None;
    }
    if stored_len >= MAP_FROM {
        // SAFETY: the daemon wrote this file once (an output at its commit)
        // and never changes it; the mapping is read-only and private.
        let m = unsafe { memmap2::MmapOptions::new().populate().map(&f) }.ok()?;
        Some(SendBuf::Map(m))
    } else {
        use std::os::unix::fs::FileExt;
        let mut v = spare.unwrap_or_default();
        v.resize(stored_len as usize, 0);
        f.read_exact_at(&mut v, 0).ok()?;
        Some(SendBuf::Heap(v))
    }
}
