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
