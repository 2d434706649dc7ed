//! The cache of this node's copies of outputs held by other ranks (one
//! sealed memfd per output version; [`crate::outputs::remote_out`] fetches
//! them).

use crate::inputs::cache::Cache;
use fanstore_core::wire::OutRecord;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

/// A cached copy: the memfd and which output (holder, id) it holds: the key
/// is a 32-bit hash of both, and a collision is served uncached, never
/// with another output's bytes.
#[derive(Clone)]
pub struct Copy {
    pub fd: Arc<OwnedFd>,
    holder: u32,
    id: u64,
}

/// The node's copies of remote outputs, bounded by bytes and by count.
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

    /// The node's copy of remote output `rec`, made by `fetch` if it is not
    /// cached (None: its cache slot holds another output); `timeout` bounds
    /// the wait for another thread's fetch of it.
    pub fn get_or_fetch(
        &self,
        rec: &OutRecord,
        timeout: Duration,
        fetch: impl FnOnce() -> Result<OwnedFd, i32>,
    ) -> Result<Option<Copy>, i32> {
        let load = || fetch().map(|fd| (Copy { fd: Arc::new(fd), holder: rec.holder, id: rec.id }, rec.size));
        let c = self.cache.get_or_load(key(rec), timeout, libc::EIO, load)?;
        Ok(((c.holder, c.id) == (rec.holder, rec.id)).then_some(c))
    }
}

fn key(rec: &OutRecord) -> u32 {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&rec.holder.to_le_bytes());
    b[4..].copy_from_slice(&rec.id.to_le_bytes());
    fanstore_core::checksum::xxh3(&b) as u32
}
