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

use crate::comm::{Fetch, RecvBuf, OUT_BIT};
use crate::memfd::MemfdBuilder;
use crate::outputs::remote_cache::Copy;
use crate::outputs::Outputs;
use fanstore_core::wire::OutRecord;
use std::os::fd::OwnedFd;
use std::time::Duration;

impl Outputs {
    /// A new read-only description of the node's copy of remote output `rec`.
    pub(crate) fn open_remote_output(&self, path: &[u8], rec: &OutRecord) -> Result<OwnedFd, i32> {
        match self.load_remote_output(path, rec)? {
            Some(c) => crate::fdlimit::retry(|| self.rank.relieve_fds(), || crate::fdio::reopen(&c.fd)),
            None => self.fetch_output(path, rec, self.output_fetch_timeout(rec)), // a key collision: not shared
        }
    }

    fn output_fetch_timeout(&self, rec: &OutRecord) -> Duration {
        self.rank.remote_timeout + Duration::from_secs(rec.size / (64 << 20))
    }

    /// The node's copy of remote output `rec`, fetched if it is not there
    /// (None: its cache slot holds another output).
    pub(crate) fn load_remote_output(&self, path: &[u8], rec: &OutRecord) -> Result<Option<Copy>, i32> {
        let timeout = self.output_fetch_timeout(rec);
        self.remote_outs.get_or_fetch(rec, timeout + Duration::from_secs(3), || self.fetch_output(path, rec, timeout))
    }

    /// The bytes of remote output `rec` from its holder, in a sealed memfd.
    fn fetch_output(&self, path: &[u8], rec: &OutRecord, timeout: Duration) -> Result<OwnedFd, i32> {
        let name = format!("fanstore:out:{}:{}", rec.holder, rec.id);
        let target = crate::fdlimit::retry(
            || self.rank.relieve_fds(),
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
            self.rank.comm.fetch(f).map_err(|_| libc::EIO)?;
            match rx.recv_timeout(timeout + Duration::from_secs(2)) {
                // (A sum still pending at the holder: nothing to check against yet.)
                Ok(Ok((b, sum))) if sum == rec.sum || rec.sum == fanstore_core::wire::SUM_PENDING => target.write_at(b.bytes(), 0).map_err(|_| libc::EIO)?,
                Ok(Ok(_)) => {
                    log::warn!("rank {}: output '{}' fails its checksum", self.rank.id.rank, String::from_utf8_lossy(path));
                    return Err(libc::EIO);
                }
                _ => return Err(libc::EIO),
            }
        }
        target.seal().map_err(|_| libc::EIO)
    }
}
