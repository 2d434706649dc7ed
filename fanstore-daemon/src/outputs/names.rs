//! What the output side's modules share about names: the time stamp of a
//! new record, a path's parent, and where a lookup leads ([`Looked`]).

use fanstore_core::wire::OutRecord;

pub use fanstore_core::path::split_parent as parent;

/// Now, in ns since the epoch (a new record's mtime).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// Where a path leads.
#[derive(Debug)]
pub enum Looked {
    /// An output record at `path` (a symlink's target in `target`).
    Output { path: Vec<u8>, rec: OutRecord, target: Vec<u8> },
    /// An input node of the dataset at `path`.
    Input { path: Vec<u8>, node: u32 },
    /// An absolute path outside the mount (a symlink's target led there).
    Outside(Vec<u8>),
}
