//! Outputs held by another rank, read here: one copy per node.
//!
//! The first open of a remote output (a checkpoint a consumer reads as soon
//! as its event arrived) fetches its bytes from the holder over MPI (the
//! holder sends them from its page cache or checkpoint store, see
//! [`crate::node::LocalStore`]) into a sealed memfd; every later open on this
//! node, by any process, while the entry is cached, gets a new description
//! of that same memfd: no second transfer, one copy of the pages, and the
//! same inode for the same version (a program comparing inodes, as `tail
//! -F` does, sees a new file only when there is a new version). Concurrent
//! first opens wait for one fetch. A new version is a new output id, hence a
//! new entry; entries are evicted least recently used within a quarter of
//! `--cache-mem` (an fd a program holds stays valid).

use crate::inputs::cache::Cache;
use crate::comm::{Fetch, RecvBuf, OUT_BIT};
use crate::memfd::MemfdBuilder;
use crate::node::Node;
use fanstore_core::wire::OutRecord;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

/// A cached copy: the memfd and which output (holder, id) it holds: the key
/// is a 32-bit hash of both, and a collision is served uncached, never
/// with another output's bytes.
#[derive(Clone)]
pub struct Copy {
    fd: Arc<OwnedFd>,
    holder: u32,
    id: u64,
}

pub struct RemoteOutputs {
    cache: Cache<Copy, i32>,
    budget: u64,
}

impl RemoteOutputs {
    /// At most a quarter of `cache_mem` bytes and `max_entries` memfds.
    pub fn new(cache_mem: u64, max_entries: usize) -> RemoteOutputs {
        RemoteOutputs { cache: Cache::with_limits(cache_mem / 4, max_entries, None), budget: cache_mem / 4 }
    }

    /// Evicts the older half (out of fds; open fds of programs stay valid).
    pub fn shed(&self) -> usize {
        self.cache.shed()
    }

    /// Would a copy of `size` bytes be kept?
    pub fn keeps(&self, size: u64) -> bool {
        size <= self.budget
    }

    pub fn stats(&self) -> &crate::inputs::cache::CacheStats {
        &self.cache.stats
    }
}

fn key(rec: &OutRecord) -> u32 {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&rec.holder.to_le_bytes());
    b[4..].copy_from_slice(&rec.id.to_le_bytes());
    fanstore_core::checksum::xxh3(&b) as u32
}

impl Node {
    /// A new read-only description of the node's copy of remote output `rec`.
    pub(crate) fn open_remote_output(&self, path: &[u8], rec: &OutRecord) -> Result<OwnedFd, i32> {
        match self.load_remote_output(path, rec)? {
            Some(c) => crate::fdlimit::retry(|| self.relieve_fds(), || crate::fdio::reopen(&c.fd)),
            None => self.fetch_output(path, rec, self.output_fetch_timeout(rec)), // a key collision: not shared
        }
    }

    fn output_fetch_timeout(&self, rec: &OutRecord) -> Duration {
        self.remote_timeout + Duration::from_secs(rec.size / (64 << 20))
    }

    /// The node's copy of remote output `rec`, fetched if it is not there
    /// (None: its cache slot holds another output).
    pub(crate) fn load_remote_output(&self, path: &[u8], rec: &OutRecord) -> Result<Option<Copy>, i32> {
        let timeout = self.output_fetch_timeout(rec);
        let load = || self.fetch_output(path, rec, timeout).map(|fd| (Copy { fd: Arc::new(fd), holder: rec.holder, id: rec.id }, rec.size));
        let c = self.outputs.remote_outs.cache.get_or_load(key(rec), timeout + Duration::from_secs(3), libc::EIO, load)?;
        Ok(((c.holder, c.id) == (rec.holder, rec.id)).then_some(c))
    }

    /// The bytes of remote output `rec` from its holder, in a sealed memfd.
    fn fetch_output(&self, path: &[u8], rec: &OutRecord, timeout: Duration) -> Result<OwnedFd, i32> {
        let name = format!("fanstore:out:{}:{}", rec.holder, rec.id);
        let target = crate::fdlimit::retry(
            || self.relieve_fds(),
            || MemfdBuilder::unmapped(&name, rec.size).map_err(|e| match e {
                crate::memfd::MemfdError::Create(e) => crate::fdlimit::errno_of(&e),
                _ => libc::ENOMEM,
            }),
        )?;
        if rec.size > 0 {
            let len = usize::try_from(rec.size).map_err(|_| libc::EFBIG)?;
            let node_id = u32::try_from(rec.id).ok().filter(|&i| i & OUT_BIT == 0).ok_or(libc::EIO)?;
            let buf = RecvBuf::heap(vec![0u8; len], len);
            let (tx, rx) = crossbeam::channel::bounded(1);
            let f = Fetch { node_id: OUT_BIT | node_id, holder: rec.holder, stored_len: rec.size, offset: 0, buf, reply: tx, timeout, direct: None };
            self.comm.fetch(f).map_err(|_| libc::EIO)?;
            match rx.recv_timeout(timeout + Duration::from_secs(2)) {
                Ok(Ok((b, sum))) if sum == rec.sum => target.write_at(b.bytes(), 0).map_err(|_| libc::EIO)?,
                Ok(Ok(_)) => {
                    log::warn!("rank {}: output '{}' fails its checksum", self.id.rank, String::from_utf8_lossy(path));
                    return Err(libc::EIO);
                }
                _ => return Err(libc::EIO),
            }
        }
        target.seal().map_err(|_| libc::EIO)
    }
}
