//! The dataset side of a rank: everything that turns a dataset node id into
//! bytes a client can open.
//!
//! - [`load`]: this rank's partitions, copied whole and verified to the
//!   local directory at start, and mapped.
//! - [`open`]: OPEN, a node id to an fd whose bytes are exactly the file's
//!   (local, decoded, or fetched from its holder).
//! - [`copies`] and [`cache`]: the tier map and the node copies in shared
//!   memory that clients open with no message; [`recycle`] reuses the pages
//!   of evicted copies.
//! - [`replicate`] and [`replica_writer`]: remote partitions fetched whole in
//!   the background (`--prefetch-remote`, `--replicate-on-read`).
//! - [`read_ahead`]: remote files read in order, fetched ahead.
//! - [`client_reply`]: answering a remote OPEN from the communication thread.
//! - [`bufpool`]: the bounded pool of receive and decode buffers.
pub mod bufpool;
pub mod cache;
pub mod client_reply;
pub mod copies;
pub mod load;
pub mod open;
pub mod read_ahead;
pub mod recycle;
pub mod replica_writer;
pub mod replicate;
