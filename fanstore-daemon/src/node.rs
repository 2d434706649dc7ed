//! One daemon rank as its threads share it: the context ([`Rank`]) and the
//! two services that own everything else ([`Inputs`], [`Outputs`]); the
//! NodeState file it publishes for clients and the control CLI; and
//! [`LocalStore`], the owner side of a remote read.

use crate::comm::{PeerSource, SendBuf};
use crate::inputs::Inputs;
use crate::outputs::Outputs;
use crate::placement::Placement;
use crate::status::Snapshot;
use fanstore_core::manifest::{IndexView, NodeKind};
use fanstore_core::runtime::NodeState;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

pub use crate::rank::{FdRelief, Identity, Phase, Rank};

/// A rank: the context its services share ([`Rank`]) and the two services
/// ([`Inputs`], [`Outputs`]).
pub struct Node {
    pub rank: Arc<Rank>,
    /// The dataset side: partitions, copies, replication, read-ahead.
    pub inputs: Arc<Inputs>,
    /// The output side: namespace, held bytes, checkpoints, persist, watch.
    pub outputs: Arc<Outputs>,
}

impl Node {
    pub fn new(
        id: Identity,
        view: IndexView<'static>,
        placement: Placement,
        cache_mem: u64,
        comm: crate::comm::wake::CommTx,
        remote_timeout: Duration,
    ) -> Arc<Node> {
        Arc::new_cyclic(|me: &Weak<Node>| {
            let relief: Weak<dyn FdRelief> = me.clone();
            let rank = Arc::new(Rank::new(id, view, placement, comm, remote_timeout, relief));
            let inputs = Arc::new(Inputs::new(rank.clone()));
            let outputs = Arc::new(Outputs::new(rank.clone(), inputs.clone(), cache_mem));
            Node { rank, inputs, outputs }
        })
    }

    pub fn phase(&self) -> Phase {
        self.rank.phase()
    }

    /// Moves to `phase` and publishes the state file.
    pub fn set_phase(&self, phase: Phase) {
        self.rank.set_phase(phase);
        let path = self.rank.state_path();
        if let Err(e) = self.state(phase).publish(&path) {
            log::error!("rank {}: publishing {}: {e}", self.rank.id.rank, path.display());
        }
    }

    /// The NodeState this rank publishes in `phase`.
    pub fn state(&self, phase: Phase) -> NodeState {
        let mut st = state_for(&self.rank.id, self.rank.view.dataset_id(), phase, self.inputs.local.get().cloned().unwrap_or_else(|| {
            vec![false; self.rank.view.partition_count() as usize]
        }));
        if self.outputs.dedup.get().is_some_and(|d| d.min != u64::MAX) {
            st.flags |= fanstore_core::runtime::FLAG_DEDUP;
        }
        if self.inputs.copies.get().is_some_and(|c| c.fits(1) || c.disk().is_some()) {
            st.flags |= fanstore_core::runtime::FLAG_COPIES;
        }
        st
    }

    /// This rank's counters, for STATUS.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot {
            rank: self.rank.id.rank,
            nranks: self.rank.id.nranks,
            host: self.rank.id.host.clone(),
            pid: std::process::id(),
            status: self.phase().name().to_string(),
            threading: self.rank.id.threading.clone(),
            load: self.inputs.load.get().copied().unwrap_or_default(),
            ..Default::default()
        };
        self.rank.counters.fill(&mut s);
        s.wake = crate::wake_cost::measured().unwrap_or_default();
        let usable = crate::wake_cost::usable_cpus();
        (s.cpus_usable, s.cpus_online, s.cpus) = (usable.len(), crate::wake_cost::online_cpus(), crate::cpu_share::describe(&usable));
        if let Some(t) = self.rank.ready_at.get() {
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

impl FdRelief for Node {
    fn relieve(&self) -> String {
        let n = self.outputs.cache.shed() + self.outputs.remote_outs.shed();
        let spares = self.inputs.copies.get().map_or(0, |c| c.spares.shed());
        format!("released {n} cached memfds and {spares} spare copies")
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
            // (A regular file: never a FIFO's object, whose open would block.)
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
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
