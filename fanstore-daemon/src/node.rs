//! The state one daemon rank shares between its threads, and the NodeState
//! file it publishes for clients and the control CLI.

use crate::inputs::cache::Cache;
use crate::comm::{PeerSource, SendBuf};
use crate::inputs::Inputs;
use crate::outputs::Outputs;
use crate::placement::Placement;
use crate::status::{Counters, Snapshot};
use fanstore_core::manifest::{IndexView, NodeKind};
use fanstore_core::runtime::{NodeState, Status};
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

/// Everything the threads of one rank share: who it is, the dataset's
/// index, and the two services it owns ([`Inputs`], [`Outputs`]).
pub struct Node {
    pub id: Identity,
    pub view: IndexView<'static>,
    pub placement: Placement,
    pub counters: Counters,
    pub comm: crate::comm::wake::CommTx,
    pub remote_timeout: Duration,
    /// Set when the rank stops: the server stops accepting and serving.
    pub stopping: AtomicBool,
    /// When the rank became ready (remote MB/s in STATUS is since then).
    pub ready_at: OnceLock<Instant>,
    phase: Mutex<Phase>,
    phase_cv: Condvar,
    /// The dataset side: partitions, copies, replication, read-ahead.
    pub inputs: Inputs,
    /// The output side: namespace, held bytes, checkpoints, persist, watch.
    pub outputs: Outputs,
}

impl Node {
    pub fn new(
        id: Identity,
        view: IndexView<'static>,
        placement: Placement,
        cache_mem: u64,
        comm: crate::comm::wake::CommTx,
        remote_timeout: Duration,
    ) -> Node {
        let rank = id.rank;
        Node {
            id,
            view,
            placement,
            counters: Counters::default(),
            comm,
            remote_timeout,
            stopping: AtomicBool::new(false),
            ready_at: OnceLock::new(),
            phase: Mutex::new(Phase::Loading),
            phase_cv: Condvar::new(),
            inputs: Inputs {
                rank,
                view,
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
                local: OnceLock::new(),
                load: OnceLock::new(),
            },
            outputs: Outputs {
                cache: Cache::with_limits(cache_mem, crate::fdlimit::memfd_cache_entries(crate::fdlimit::nofile()), None),
                meta: Mutex::new(crate::outputs::namespace::owner::MetaStore::default()),
                out_seq: std::sync::atomic::AtomicU64::new(1),
                shared_commits: Mutex::new(crate::outputs::held::SharedCommits::default()),
                persist: OnceLock::new(),
                dedup: OnceLock::new(),
                fsync_outputs: AtomicBool::new(false),
                watch: Default::default(),
                remote_outs: crate::outputs::remote_out::RemoteOutputs::new(cache_mem, crate::fdlimit::remote_output_entries(crate::fdlimit::nofile())),
            },
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
        let mut st = state_for(&self.id, self.view.dataset_id(), phase, self.inputs.local.get().cloned().unwrap_or_else(|| {
            vec![false; self.view.partition_count() as usize]
        }));
        if self.outputs.dedup.get().is_some_and(|d| d.min != u64::MAX) {
            st.flags |= fanstore_core::runtime::FLAG_DEDUP;
        }
        if self.inputs.copies.get().is_some_and(|c| c.fits(1) || c.disk().is_some()) {
            st.flags |= fanstore_core::runtime::FLAG_COPIES;
        }
        st
    }

    /// Frees what fds the rank can spare (the output cache's memfds); called
    /// when a call fails with EMFILE/ENFILE, before it is tried again.
    pub fn relieve_fds(&self) {
        let n = self.outputs.cache.shed() + self.outputs.remote_outs.shed();
        let spares = self.inputs.copies.get().map_or(0, |c| c.spares.shed());
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
            load: self.inputs.load.get().copied().unwrap_or_default(),
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
        let caches = std::iter::once(&self.outputs.cache.stats)
            .chain(self.inputs.copies.get().map(|c| &c.cache.stats))
            .chain(self.inputs.copies.get().and_then(|c| c.disk()).map(|d| &d.cache.stats))
            .chain(std::iter::once(self.outputs.remote_outs.stats()));
        for st in caches {
            s.cache_hits += st.hits.load(Relaxed);
            s.cache_misses += st.misses.load(Relaxed);
            s.cache_evictions += st.evictions.load(Relaxed);
        }
        let (bytes, entries) = self.outputs.cache.usage();
        let (cbytes, centries) = self.inputs.copies.get().map(|c| c.usage()).unwrap_or_default();
        let (dbytes, dentries) = self.inputs.copies.get().map(|c| c.disk_usage()).unwrap_or_default();
        s.cache_bytes = bytes + cbytes + dbytes;
        s.cache_entries = (entries + centries + dentries) as u64;
        s.cache_disk_bytes = dbytes;
        if let Some(c) = self.inputs.copies.get() {
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
        if node_id & crate::ids::OUT_BIT != 0 {
            let id = u64::from(node_id & !crate::ids::OUT_BIT);
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
