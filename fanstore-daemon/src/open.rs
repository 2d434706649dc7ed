//! OPEN: turning a node id into an fd whose bytes are exactly the file's.
//!
//! - a local uncompressed file: the extracted file, opened O_RDONLY;
//! - a local compressed file: its payload is read from the local directory,
//!   verified, decompressed into a sealed memfd (cached);
//! - a remote file: fetched over MPI from a holder (spread over replicas,
//!   failing over to the next holder), verified, decompressed if needed,
//!   in a sealed memfd (cached: every client of the node shares one copy).
//!
//! Memory: payloads are received / read into buffers of a bounded pool
//! ([`crate::bufpool`]) that stay allocated (warm), and each memfd's pages are allocated with
//! fallocate while the payload travels, then filled with one pwrite. On
//! machines where fresh pages are expensive (VMs with free page reporting)
//! this keeps page allocation off the transfer's critical path.
//!
//! Every reply carries a new open file description: cached memfds are
//! reopened through `/proc/self/fd` for each OPEN, so two opens of one file
//! never share a file offset (the pages are shared).

use crate::bufpool::BufPool;
use crate::comm::{Command, Fetch, RecvBuf};
use crate::memfd::MemfdBuilder;
use crate::node::{Node, Phase};
use fanstore_core::checksum::xxh3;
use fanstore_core::codec::{self, Codec};
use fanstore_core::manifest::{NodeKind, NodeRef};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Opens a new description of a cached memfd (through /proc/self/fd), so
/// every OPEN gets its own file offset while sharing the same pages.
pub(crate) fn reopen(fd: &OwnedFd) -> Result<OwnedFd, i32> {
    use std::os::fd::AsRawFd;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(OwnedFd::from)
        .map_err(|e| {
            log::error!("reopening a cached memfd: {e}");
            libc::EIO
        })
}

/// How long an OPEN that arrives while loading waits for the load.
const LOAD_WAIT: Duration = Duration::from_secs(600);

impl Node {
    /// Resolves OPEN(node id, dataset id) to an fd, or an errno. The fd is
    /// always a new open file description (its own offset): the extracted
    /// file opened O_RDONLY, or a reopened cached memfd.
    pub fn open(&self, node_id: u64, dataset_id: u64) -> Result<OwnedFd, i32> {
        if dataset_id != self.view.dataset_id() {
            return Err(libc::ESTALE);
        }
        let n = u32::try_from(node_id).ok().and_then(|id| self.view.node(id)).ok_or(libc::ENOENT)?;
        if n.kind() != Some(NodeKind::File) {
            return Err(libc::ENOENT);
        }
        match self.wait_loaded(LOAD_WAIT) {
            Phase::Ready => {}
            Phase::Loading => return Err(libc::EAGAIN),
            Phase::Stopping | Phase::Failed => return Err(libc::EIO),
        }
        let p = n.partition();
        let local = self.local.get().and_then(|l| l.get(p as usize).copied()).unwrap_or(false);
        let raw_local = local && n.codec() == Codec::None;
        let res = if raw_local {
            self.open_local_raw(n)
        } else {
            let wait = self.fetch_budget(n);
            self.cache
                .get_or_load(n.id(), wait, libc::EIO, || {
                    let fd = if local { self.load_local_compressed(n) } else { self.fetch_remote(n) }?;
                    Ok((Arc::new(fd), n.size()))
                })
                .and_then(|shared| reopen(&shared))
        };
        match &res {
            Ok(_) => {
                self.counters.opens.fetch_add(1, Relaxed);
                if raw_local {
                    self.counters.opens_local.fetch_add(1, Relaxed);
                }
            }
            Err(e) if *e != libc::ENOENT && *e != libc::ESTALE => {
                self.counters.errors.fetch_add(1, Relaxed);
            }
            Err(_) => {}
        }
        res
    }

    /// The longest one fetch of `n` may take: every holder's deadline.
    fn fetch_budget(&self, n: NodeRef<'_>) -> Duration {
        let holders = self.placement.holders_for(n.partition(), n.id()).len() as u32;
        (self.fetch_timeout(n.stored_len()) + Duration::from_secs(2)) * holders.max(1)
    }

    /// The deadline of one remote request: `--remote-timeout` plus 1 s per 64 MiB.
    fn fetch_timeout(&self, stored_len: u64) -> Duration {
        self.remote_timeout + Duration::from_secs(stored_len / (64 << 20))
    }

    fn open_local_raw(&self, n: NodeRef<'_>) -> Result<OwnedFd, i32> {
        let path = fanstore_core::runtime::local_file_path(&self.id.local_dir, n.id());
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOATIME)
            .open(&path)
            .or_else(|_| std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open(&path))
            .map(OwnedFd::from)
            .map_err(|e| {
                log::error!("rank {}: opening {}: {e}", self.id.rank, path.display());
                libc::EIO
            })
    }

    fn load_local_compressed(&self, n: NodeRef<'_>) -> Result<OwnedFd, i32> {
        let path = fanstore_core::runtime::local_file_path(&self.id.local_dir, n.id());
        let target = self.target(n)?;
        if let Some(p) = target.preallocator() {
            p.run();
        }
        let mut stored = scratch(n.stored_len() as usize);
        let res = std::fs::File::open(&path)
            .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut stored, 0))
            .map_err(|e| {
                log::error!("rank {}: reading {}: {e}", self.id.rank, path.display());
                libc::EIO
            })
            .and_then(|()| self.check_sum(n, xxh3(&stored)))
            .and_then(|()| self.fill(n, &stored, target));
        give_back(stored);
        res
    }

    /// A memfd for `n`, not yet filled.
    fn target(&self, n: NodeRef<'_>) -> Result<MemfdBuilder, i32> {
        MemfdBuilder::unmapped(&memfd_name(n), n.size()).map_err(|e| {
            log::error!("rank {}: {e}", self.id.rank);
            libc::ENOMEM
        })
    }

    /// Fills `target` with the file's bytes from its verified stored payload
    /// (decompressing if needed) and seals it.
    fn fill(&self, n: NodeRef<'_>, stored: &[u8], target: MemfdBuilder) -> Result<OwnedFd, i32> {
        let eio = |what: &str, e: &dyn std::fmt::Display| {
            log::error!("rank {}: {what} '{}': {e}", self.id.rank, String::from_utf8_lossy(n.path()));
            libc::EIO
        };
        if n.codec() == Codec::None {
            if stored.len() as u64 != n.size() {
                return Err(eio("size of", &"stored length differs from the size"));
            }
            target.write_at(stored, 0).map_err(|e| eio("writing", &e))?;
        } else {
            let mut raw = scratch(n.size() as usize);
            let res = codec::decompress_to(n.codec(), stored, n.size(), &mut &mut raw[..])
                .map_err(|e| eio("decoding", &e))
                .and_then(|()| target.write_at(&raw, 0).map_err(|e| eio("writing", &e)));
            give_back(raw);
            res?;
        }
        target.seal().map_err(|e| eio("sealing", &e))
    }

    fn check_sum(&self, n: NodeRef<'_>, sum: u64) -> Result<(), i32> {
        if sum != n.checksum() {
            log::error!(
                "rank {}: '{}' fails its checksum (stored {:#018x}, computed {sum:#018x})",
                self.id.rank,
                String::from_utf8_lossy(n.path()),
                n.checksum()
            );
            return Err(libc::EIO);
        }
        Ok(())
    }

    fn fetch_remote(&self, n: NodeRef<'_>) -> Result<OwnedFd, i32> {
        if n.stored_len() == 0 {
            self.check_sum(n, xxh3(&[]))?;
            return self.fill(n, &[], self.target(n)?);
        }
        let me = self.id.rank;
        let mut last = libc::EIO;
        for holder in self.placement.holders_for(n.partition(), n.id()).into_iter().filter(|&h| h != me) {
            let res = self.fetch_from(n, holder);
            match res {
                Ok(fd) => return Ok(fd),
                Err(e) => {
                    self.counters.remote_failed.fetch_add(1, Relaxed);
                    last = e;
                }
            }
            if self.stopping.load(Relaxed) {
                break;
            }
        }
        Err(last)
    }

    /// One remote read of `n` from `holder`. The payload lands in a warm
    /// scratch buffer; the memfd's pages are allocated while it travels
    /// (page allocation costs as much as the transfer on some machines), then
    /// the bytes are copied in with one pwrite.
    fn fetch_from(&self, n: NodeRef<'_>, holder: u32) -> Result<OwnedFd, i32> {
        let me = self.id.rank;
        let t0 = Instant::now();
        let len = n.stored_len() as usize;
        let buf = RecvBuf { buf: scratch(len), len };
        let (tx, rx) = crossbeam::channel::bounded(1);
        let timeout = self.fetch_timeout(n.stored_len());
        let cmd = Command::Fetch(Fetch { node_id: n.id(), holder, stored_len: n.stored_len(), buf, reply: tx, timeout });
        if self.comm.send(cmd).is_err() {
            return Err(libc::EIO);
        }
        let target = self.target(n)?;
        if let Some(p) = target.preallocator() {
            p.run();
        }
        let t1 = Instant::now();
        let got = rx.recv_timeout(timeout + Duration::from_secs(2));
        let t2 = Instant::now();
        let res = match got {
            Ok(Ok((RecvBuf { buf, len }, sum))) => {
                let r = self.check_sum(n, sum).and_then(|()| self.fill(n, &buf[..len], target));
                give_back(buf);
                r
            }
            Ok(Err(e)) => {
                log::warn!("rank {me}: remote read of node {} from rank {holder}: {e}", n.id());
                Err(libc::EIO)
            }
            Err(_) => {
                log::warn!("rank {me}: remote read of node {} from rank {holder}: no answer", n.id());
                Err(libc::EIO)
            }
        };
        log::debug!(
            "rank {me}: fetch of node {} ({} B) from rank {holder}: memfd {:?}, wait {:?}, fill+seal {:?}",
            n.id(),
            n.stored_len(),
            t1 - t0,
            t2 - t1,
            t2.elapsed()
        );
        res
    }
}

/// Buffers for payloads and decoded bytes, shared by all connection threads.
static POOL: BufPool = BufPool::new(64 << 20);

fn scratch(len: usize) -> Vec<u8> {
    POOL.take(len)
}
fn give_back(v: Vec<u8>) {
    POOL.put(v)
}

fn memfd_name(n: NodeRef<'_>) -> String {
    format!("fanstore:{}", n.id())
}
