//! The output side of a rank: what training programs write under the mount.
//!
//! - [`namespace`]: the names (records, directories, symlinks, listings,
//!   renames) kept at their owner rank, hash(path) mod N.
//! - [`held`]: the bytes of outputs this rank holds (COMMIT, OUT_OPEN, held
//!   files and sidecars, kill -9 recovery).
//! - [`dedup`]: the checkpoint store that commits split into tensors.
//! - [`persist`] and [`persist_lease`]: the drain to `--persist` and the one
//!   job per persist directory.
//! - [`remote_out`]: this node's copies of outputs held by other ranks.
//! - [`watch`]: namespace events pushed to watchers.
pub mod dedup;
pub mod held;
pub mod namespace;
pub mod persist;
pub mod persist_lease;
pub mod remote_out;
pub mod watch;

use crate::inputs::cache::Cache;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

/// The output side of one rank, owned by [`crate::node::Node`].
pub struct Outputs {
    /// Read-back outputs (sealed memfds), bounded by bytes and by count
    /// ([`crate::fdlimit::memfd_cache_entries`]).
    pub cache: Cache<Arc<OwnedFd>, i32>,
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
    /// Watchers and event routes ([`crate::outputs::watch`]).
    pub watch: crate::outputs::watch::WatchState,
    /// This node's copies of outputs held by other ranks ([`crate::outputs::remote_out`]).
    pub remote_outs: crate::outputs::remote_out::RemoteOutputs,
}
