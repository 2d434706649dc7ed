//! The output side of a rank: what training programs write under the mount.
//!
//! - [`namespace`]: the names (records, directories, symlinks, listings,
//!   renames) kept at their owner rank, hash(path) mod N.
//! - [`held`]: the bytes of outputs this rank holds (COMMIT, OUT_OPEN, held
//!   files and sidecars, kill -9 recovery).
//! - [`dedup`]: the checkpoint store that commits split into tensors.
//! - [`ckpt_put`]: checkpoints committed from parts (CKPT_PUT).
//! - [`persist`] and [`persist_lease`]: the drain to `--persist` and the one
//!   job per persist directory.
//! - [`remote_out`]: this node's copies of outputs held by other ranks.
//! - [`watch`]: namespace events pushed to watchers.
//! - [`special`]: FIFOs and unix sockets (MKNOD), real objects on their node.
pub mod ckpt_put;
pub mod dedup;
pub mod held;
pub mod held_files;
pub mod held_journal;
pub mod names;
pub mod new_files;
pub mod namespace;
pub mod persist;
pub mod persist_lease;
pub mod remote_cache;
pub mod remote_out;
pub mod shared_commits;
pub mod special;
pub mod watch;

use crate::inputs::cache::Cache;
use crate::inputs::Inputs;
use crate::rank::Rank;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

/// The output side of one rank, owned by [`crate::node::Node`].
pub struct Outputs {
    /// The context shared with the rank's other service.
    pub rank: Arc<Rank>,
    /// The dataset side (input directories an output directory shares a
    /// name with, copies the store reuses).
    pub inputs: Arc<Inputs>,
    /// Read-back outputs (sealed memfds), bounded by bytes and by count
    /// ([`crate::fdlimit::memfd_cache_entries`]).
    pub cache: Cache<Arc<OwnedFd>, i32>,
    /// Output records and listings this rank owns ([`crate::outputs::namespace::owner`]).
    pub meta: Mutex<crate::outputs::namespace::owner::MetaStore>,
    /// Next output id (`out/<id>` in the local directory).
    pub out_seq: std::sync::atomic::AtomicU64,
    /// Which output each file of `out/` is, for recovery after a kill
    /// ([`held_journal`]).
    pub held: Arc<held_journal::HeldJournal>,
    /// Files made ahead for new outputs ([`new_files`]), set at start.
    pub new_files: OnceLock<Arc<new_files::NewFiles>>,
    /// Outputs committed while another process still wrote them, for that
    /// process's late commit ([`crate::outputs::shared_commits::SharedCommits`]).
    pub shared_commits: Mutex<crate::outputs::shared_commits::SharedCommits>,
    /// `--persist` directory, if any ([`crate::outputs::persist`]).
    pub persist: OnceLock<PathBuf>,
    /// The checkpoint store ([`crate::outputs::dedup`]), set at start.
    pub dedup: OnceLock<Arc<crate::outputs::dedup::Dedup>>,
    /// `--fsync-outputs`: fsync each output (and its sidecar) before close returns.
    pub fsync_outputs: AtomicBool,
    /// The service itself, for the threads that prefetch the files events
    /// announce (set by [`Outputs::attach_watch`] once the node is shared).
    pub watch_prefetch: OnceLock<std::sync::Weak<Outputs>>,
    /// Watchers and event routes ([`crate::outputs::watch`]).
    pub watch: crate::outputs::watch::sessions::WatchState,
    /// This node's copies of outputs held by other ranks ([`crate::outputs::remote_out`]).
    pub remote_outs: crate::outputs::remote_cache::RemoteOutputs,
}

impl Outputs {
    pub fn new(rank: Arc<Rank>, inputs: Arc<Inputs>, cache_mem: u64) -> Outputs {
        let nofile = crate::fdlimit::nofile();
        let held = Arc::new(held_journal::HeldJournal::new(rank.id.local_dir.join("out")));
        Outputs {
            held,
            new_files: OnceLock::new(),
            rank,
            inputs,
            cache: Cache::with_limits(cache_mem, crate::fdlimit::memfd_cache_entries(nofile), None),
            meta: Mutex::new(namespace::owner::MetaStore::default()),
            out_seq: std::sync::atomic::AtomicU64::new(1),
            shared_commits: Mutex::new(shared_commits::SharedCommits::default()),
            persist: OnceLock::new(),
            dedup: OnceLock::new(),
            fsync_outputs: AtomicBool::new(false),
            watch_prefetch: OnceLock::new(),
            watch: Default::default(),
            remote_outs: remote_cache::RemoteOutputs::new(cache_mem, crate::fdlimit::remote_output_entries(nofile)),
        }
    }
}
