//! OPEN: turning a node id into an fd whose bytes are exactly the file's.
//!
//! Every local file is served from its partition's mapped local copy
//! ([`crate::inputs::load`]); its own bytes appear on the first open:
//! - a local uncompressed file of [`EXTRACT_MIN`] bytes or more: extracted
//!   to `local_file_path` (verified, written under a temporary name and
//!   renamed), kept until the job ends;
//! - anything else (a smaller or compressed local file, a remote file): a
//!   copy in the copy directory ([`crate::inputs::copies`]), verified and
//!   decompressed, within `--cache-mem`. Remote payloads come over MPI from a
//!   holder (spread over replicas, failing over to the next holder) into a
//!   warm buffer of a bounded pool ([`crate::inputs::bufpool`]), while the copy's
//!   pages are allocated.
//!
//! The tier map records both, so clients open these files directly next
//! time, with no message. Every reply carries a new read-only open file
//! description (its own offset). No fd is kept per file.

use crate::inputs::bufpool::BufPool;
use crate::inputs::client_reply::{ClientReply, Direct};
use crate::comm::{Fetch, RecvBuf, RecvMem};
use crate::fdio::open_ro;
use crate::inputs::copies::CopyDst;
use crate::fdlimit;
use crate::inputs::load::PartMap;
use crate::inputs::Inputs;
use crate::rank::Phase;
use fanstore_core::checksum::{xxh3, xxh3_cold};
use fanstore_core::codec::{self, Codec};
use fanstore_core::manifest::{NodeKind, NodeRef};
use fanstore_core::tiers::{EXTRACT_MIN, TIER_COPY, TIER_DECLINED, TIER_EXTRACTED, TIER_NONE, TIER_PART, TIER_PART_DECLINED};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an OPEN that arrives while loading waits for the load.
const LOAD_WAIT: Duration = Duration::from_secs(600);

/// Distinguishes the temporary names of concurrent extractions.
static EXTRACT_SEQ: AtomicU64 = AtomicU64::new(0);
/// Set once an extraction found the local directory full (logged once).
static EXTRACT_FULL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Inputs {
    /// Resolves OPEN(node id, dataset id) to a new read-only fd, or an errno.
    /// With `client`, the communication thread may answer the client of a
    /// remote file itself ([`crate::inputs::client_reply`]): the caller claims the
    /// answer before it sends one. No fd is made for a client answered so
    /// (`Ok(None)`; never without `client`).
    pub fn open(&self, node_id: u64, dataset_id: u64, client: Option<&Arc<ClientReply>>) -> Result<Option<OwnedFd>, i32> {
        if dataset_id != self.rank.view.dataset_id() {
            return Err(libc::ESTALE);
        }
        let n = u32::try_from(node_id).ok().and_then(|id| self.rank.view.node(id)).ok_or(libc::ENOENT)?;
        if n.kind() != Some(NodeKind::File) {
            return Err(libc::ENOENT);
        }
        match self.rank.wait_loaded(LOAD_WAIT) {
            Phase::Ready => {}
            Phase::Loading => return Err(libc::EAGAIN),
            Phase::Stopping | Phase::Failed => return Err(libc::EIO),
        }
        let mut local: Option<&PartMap> = self.part_map(n.partition());
        if local.is_none() && self.await_replica(n.partition()) {
            local = self.part_map(n.partition());
        }
        let extracted = local.is_some() && n.codec() == Codec::None && n.size() >= EXTRACT_MIN;
        let answered = || client.is_some_and(|c| c.sent());
        let res = match (local, self.copies.get()) {
            (Some(map), copies) if extracted => match (self.open_extracted(n, map), copies) {
                // The local directory is full: a copy in the copy directory
                // (within --cache-mem, or unnamed) serves the file instead.
                (Err(libc::ENOSPC), Some(copies)) => copies.open(
                    n.id(),
                    n.size(),
                    self.fetch_budget(n),
                    &|| self.rank.relieve_fds(),
                    &|d| self.fill_local(n, map, d),
                    &answered,
                ),
                (Err(libc::ENOSPC), None) => Err(libc::EIO),
                (r, _) => r.map(Some),
            },
            (_, Some(copies)) => {
                let wait = self.fetch_budget(n);
                if local.is_none() {
                    if let Some(ra) = self.read_ahead.get() {
                        self.read_ahead_after(n.id());
                        // A file queued or in flight ahead: its copy, not a fetch of its own.
                        ra.wait_for(n.id(), wait);
                    }
                }
                let fill = |d: &mut CopyDst<'_>| match local {
                    Some(map) => self.fill_local(n, map, d),
                    None => self.fill_remote(n, d, client),
                };
                copies.open(n.id(), n.size(), wait, &|| self.rank.relieve_fds(), &fill, &answered)
            }
            _ => Err(libc::EIO),
        };
        match &res {
            Ok(_) => {
                self.rank.counters.opens.fetch_add(1, Relaxed);
                if local.is_some() {
                    self.rank.counters.opens_local.fetch_add(1, Relaxed);
                }
            }
            Err(e) if *e != libc::ENOENT && *e != libc::ESTALE => {
                self.rank.counters.errors.fetch_add(1, Relaxed);
            }
            Err(_) => {}
        }
        res
    }

    /// Copies the small and the compressed local files of this rank (large
    /// compressed ones to the local disk, within `--cache-disk`, the others
    /// into the copy directory), in partition order, until `limit` bytes of
    /// copies are made or the rank stops. Runs on its own low-priority thread
    /// after ready. Returns the number of files copied.
    pub fn prefill(&self, limit: u64) -> u64 {
        crate::inputs::replicate::lowest_priority();
        let (Some(copies), Some(parts)) = (self.copies.get(), self.parts.get()) else { return 0 };
        let (mut done, mut bytes) = (0, 0u64);
        for n in self.rank.view.nodes() {
            if self.rank.stopping.load(Relaxed) || bytes >= limit || copies.usage().0 >= limit {
                break;
            }
            // Large uncompressed files are extracted to the local disk on
            // first open instead (a plain file, read faster than a copy).
            if n.kind() != Some(NodeKind::File) || (n.size() >= EXTRACT_MIN && n.codec() == Codec::None) {
                continue;
            }
            let Some(Some(map)) = parts.get(n.partition() as usize) else { continue };
            if copies.prefill(n.id(), n.size(), &|| self.rank.relieve_fds(), &|d| self.fill_local(n, map, d)) {
                done += 1;
                bytes += n.size();
            }
        }
        done
    }

    /// Makes the node copies of the files clients decoded themselves (WARM
    /// hints), one at a time at the lowest priority, within `--cache-mem`,
    /// until the rank stops: the first read of a compressed or small local
    /// file is decoded by the client (no round trip), later ones open this
    /// copy. A copy in the copy directory only takes its free room, else the
    /// file's byte says [`TIER_DECLINED`]: evicting another copy for it would
    /// cost a copy per epoch for no more hits (see there). Copies on the
    /// local disk evict as before.
    pub fn warm_copies(&self, rx: crossbeam::channel::Receiver<u32>) {
        crate::inputs::replicate::lowest_priority();
        let (Some(copies), Some(tiers)) = (self.copies.get(), self.tiers.get()) else { return };
        while let Ok(id) = rx.recv() {
            if self.rank.stopping.load(Relaxed) {
                break;
            }
            if matches!(tiers.get(id), TIER_COPY | TIER_EXTRACTED) {
                continue;
            }
            let Some(n) = self.rank.view.node(id).filter(|n| n.kind() == Some(NodeKind::File)) else { continue };
            if !copies.can_keep(n.size()) {
                continue; // could not be kept (no budget, or larger than it): decoding it would be wasted
            }
            if !copies.fits_disk(n.size()) && !copies.has_room(n.size()) {
                // Not worth an eviction (TIER_DECLINED); the clients stop asking.
                if tiers.set_if(id, TIER_NONE, TIER_DECLINED) || tiers.set_if(id, TIER_PART, TIER_PART_DECLINED) {
                    self.rank.counters.copies_declined.fetch_add(1, Relaxed);
                }
                continue;
            }
            let Some(map) = self.part_map(n.partition()) else { continue };
            copies.prefill(n.id(), n.size(), &|| self.rank.relieve_fds(), &|d| self.fill_local(n, map, d));
        }
    }

    /// The longest one fetch of `n` may take: every holder's deadline.
    fn fetch_budget(&self, n: NodeRef<'_>) -> Duration {
        let holders = self.rank.placement.holders_for(n.partition(), n.id()).len() as u32;
        (self.fetch_timeout(n.stored_len()) + Duration::from_secs(2)) * holders.max(1)
    }

    /// The deadline of one remote request: `--remote-timeout` plus 1 s per 64 MiB.
    pub(crate) fn fetch_timeout(&self, stored_len: u64) -> Duration {
        self.rank.remote_timeout + Duration::from_secs(stored_len / (64 << 20))
    }

    /// The stored payload of local file `n` in its partition's copy.
    fn stored<'m>(&self, n: NodeRef<'_>, map: &'m PartMap) -> Result<&'m [u8], i32> {
        let start = usize::try_from(n.payload_offset()).map_err(|_| libc::EIO)?;
        let end = start.checked_add(usize::try_from(n.stored_len()).map_err(|_| libc::EIO)?).ok_or(libc::EIO)?;
        map.get(start..end).ok_or_else(|| {
            log::error!("rank {}: '{}' lies past the end of its partition copy", self.rank.id.rank, String::from_utf8_lossy(n.path()));
            libc::EIO
        })
    }

    /// An fd on the extracted copy of the local uncompressed file `n`,
    /// extracting it first if needed (concurrent extractions write the same
    /// bytes under their own temporary names; the last rename wins).
    fn open_extracted(&self, n: NodeRef<'_>, map: &PartMap) -> Result<OwnedFd, i32> {
        let path = self.extract(n, map)?;
        fdlimit::retry(|| self.rank.relieve_fds(), || open_ro(&path)).map_err(|e| {
            log::error!("rank {}: opening {}: errno {e}", self.rank.id.rank, path.display());
            libc::EIO
        })
    }

    /// Extracts local uncompressed file `n` (verified, written under a
    /// temporary name and renamed) unless its tier byte says it is; returns
    /// its path. Two concurrent extractions of one file (an OPEN and the
    /// background extraction) each write their own temporary file and the
    /// second rename replaces the first with the same bytes.
    fn extract(&self, n: NodeRef<'_>, map: &PartMap) -> Result<std::path::PathBuf, i32> {
        let path = fanstore_core::runtime::local_file_path(&self.rank.id.local_dir, n.id());
        let tiers = self.tiers.get().ok_or(libc::EIO)?;
        if tiers.get(n.id()) != TIER_EXTRACTED && self.replica_extracted(n, &path) {
            // A replica wrote this file when it was fetched (and its tier
            // byte was cleared since, by a copy's eviction): the replica has
            // a hole where its bytes were.
            tiers.set(n.id(), TIER_EXTRACTED);
        }
        if tiers.get(n.id()) != TIER_EXTRACTED {
            let bytes = self.stored(n, map)?;
            self.check_sum(n, xxh3_cold(bytes))?;
            let mut tmp = path.clone().into_os_string();
            tmp.push(format!(".tmp{}", EXTRACT_SEQ.fetch_add(1, Relaxed)));
            let written = fdlimit::retry(
                || self.rank.relieve_fds(),
                || {
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o400)
                        .custom_flags(libc::O_CLOEXEC)
                        .open(&tmp)
                        .map_err(|e| fdlimit::errno_of(&e))?;
                    std::io::Write::write_all(&mut f, bytes).map_err(|e| fdlimit::errno_of(&e))
                },
            )
            .and_then(|()| std::fs::rename(&tmp, &path).map_err(|e| fdlimit::errno_of(&e)));
            if let Err(e) = written {
                let _ = std::fs::remove_file(&tmp);
                if e == libc::ENOSPC {
                    if !EXTRACT_FULL.swap(true, Relaxed) {
                        log::warn!(
                            "rank {}: the local directory is full (extracting {}): large files not yet extracted are served from copies",
                            self.rank.id.rank,
                            path.display()
                        );
                    }
                    return Err(libc::ENOSPC);
                }
                log::error!("rank {}: extracting {}: errno {e}", self.rank.id.rank, path.display());
                return Err(libc::EIO);
            }
            tiers.set(n.id(), TIER_EXTRACTED);
        }
        Ok(path)
    }

    /// Extracts the large uncompressed local files of this rank (those an
    /// OPEN extracts, [`EXTRACT_MIN`] bytes or more), in partition order, at
    /// the lowest priority, until `limit` bytes are extracted, the local file
    /// system is down to its last twentieth or the rank stops: a training
    /// job's first epoch then opens plain files, with no message and no
    /// extraction in its path (DLIO's resnet50 workload read its first
    /// epoch at a third of its later epochs' speed, each OPEN extracting).
    /// Returns (files, bytes) extracted here.
    pub fn extract_ahead(&self, limit: u64) -> (u64, u64) {
        crate::inputs::replicate::lowest_priority();
        let (Some(tiers), Some(parts)) = (self.tiers.get(), self.parts.get()) else { return (0, 0) };
        let (mut files, mut bytes) = (0u64, 0u64);
        for n in self.rank.view.nodes() {
            if self.rank.stopping.load(Relaxed) {
                break;
            }
            if n.kind() != Some(NodeKind::File) || n.codec() != Codec::None || n.size() < EXTRACT_MIN {
                continue;
            }
            let Some(Some(map)) = parts.get(n.partition() as usize) else { continue };
            if tiers.get(n.id()) == TIER_EXTRACTED {
                continue;
            }
            if bytes.saturating_add(n.size()) > limit || !crate::inputs::copies::room_for(&self.rank.id.local_dir, n.size()) {
                break;
            }
            match self.extract(n, map) {
                Ok(_) => {
                    files += 1;
                    bytes += n.size();
                    self.rank.counters.extracted_ahead.fetch_add(1, Relaxed);
                }
                Err(libc::ENOSPC) => break,
                // Logged by extract; an OPEN of this file reports it again.
                Err(_) => {}
            }
        }
        (files, bytes)
    }

    /// Writes local file `n`'s bytes (verified, decompressed) into `dst`.
    fn fill_local(&self, n: NodeRef<'_>, map: &PartMap, dst: &mut CopyDst<'_>) -> Result<(), i32> {
        let stored = self.stored(n, map)?;
        self.check_sum(n, xxh3_cold(stored))?;
        self.decode_into(n, stored, dst)
    }

    /// Writes the file's bytes from its verified stored payload
    /// (decompressing if needed) into `f`.
    pub(crate) fn decode_into(&self, n: NodeRef<'_>, stored: &[u8], dst: &mut CopyDst<'_>) -> Result<(), i32> {
        let eio = |what: &str, e: &dyn std::fmt::Display| {
            log::error!("rank {}: {what} '{}': {e}", self.rank.id.rank, String::from_utf8_lossy(n.path()));
            libc::EIO
        };
        let written = |r: Result<(), i32>| {
            r.map_err(|e| {
                if e == libc::ENOSPC {
                    return e; // the copy directory is full: the caller makes room
                }
                eio("writing the copy of", &format!("errno {e}"))
            })
        };
        if n.codec() == Codec::None {
            if stored.len() as u64 != n.size() {
                return Err(eio("size of", &"stored length differs from the size"));
            }
            written(dst.write_all(stored))
        } else {
            let mut decoded = Ok(());
            let mut raw = scratch(0);
            let res = dst.write_with(n.size() as usize, &mut raw, |out| {
                decoded = codec::decompress_into(n.codec(), stored, out).map_err(|e| eio("decoding", &e));
                decoded
            });
            give_back(raw);
            // A payload that does not decode was logged as such, not as a write.
            decoded.and_then(|()| written(res))
        }
    }

    /// Whether `n` belongs to a partition replicated in this job whose
    /// fetch wrote `n` straight to its extracted file `path`.
    fn replica_extracted(&self, n: NodeRef<'_>, path: &std::path::Path) -> bool {
        let loaded = self.local.get().and_then(|l| l.get(n.partition() as usize).copied()).unwrap_or(false);
        let replicated = self.replicas.get(n.partition() as usize).is_some_and(|r| r.get().is_some());
        !loaded && replicated && path.exists()
    }

    pub(crate) fn check_sum(&self, n: NodeRef<'_>, sum: u64) -> Result<(), i32> {
        if sum != n.checksum() {
            log::error!(
                "rank {}: '{}' fails its checksum (stored {:#018x}, computed {sum:#018x})",
                self.rank.id.rank,
                String::from_utf8_lossy(n.path()),
                n.checksum()
            );
            return Err(libc::EIO);
        }
        Ok(())
    }

    /// Writes remote file `n`'s bytes into `dst`, from the first holder that answers.
    pub(crate) fn fill_remote(&self, n: NodeRef<'_>, dst: &mut CopyDst<'_>, client: Option<&Arc<ClientReply>>) -> Result<(), i32> {
        if n.stored_len() == 0 {
            return self.check_sum(n, xxh3(&[]));
        }
        let me = self.rank.id.rank;
        let mut last = libc::EIO;
        for holder in self.rank.placement.holders_for(n.partition(), n.id()).into_iter().filter(|&h| h != me) {
            let t = Instant::now();
            match self.fetch_from(n, holder, dst, client) {
                Ok(()) => {
                    self.read_remotely(n.partition(), n.stored_len(), t.elapsed());
                    if let Some(ra) = self.read_ahead.get() {
                        ra.resume();
                    }
                    return Ok(());
                }
                Err(e) => {
                    self.rank.counters.remote_failed.fetch_add(1, Relaxed);
                    last = e;
                }
            }
            if self.rank.stopping.load(Relaxed) {
                break;
            }
        }
        // No holder gave the file: no read-ahead either until one answers
        // again (the next open would otherwise wait for a run first).
        if let Some(ra) = self.read_ahead.get() {
            ra.pause();
        }
        Err(last)
    }

    /// One remote read of `n` from `holder` into `dst`. A file stored
    /// uncompressed whose destination is a mapped spare is received
    /// straight into the spare's pages (lent to the communication thread,
    /// given back once verified). Otherwise the payload lands in a warm
    /// scratch buffer; a new file's pages are allocated while it travels
    /// (page allocation costs as much as the transfer on some machines),
    /// then the bytes are copied in (through a spare's kept mapping, or
    /// with one pwrite).
    ///
    /// With `client`, an uncompressed file of at most [`DIRECT_MAX`] bytes
    /// is answered by the communication thread as soon as it is verified in
    /// the copy's file ([`crate::inputs::client_reply`]); the bytes are then in
    /// `dst` already.
    fn fetch_from(&self, n: NodeRef<'_>, holder: u32, dst: &mut CopyDst<'_>, client: Option<&Arc<ClientReply>>) -> Result<(), i32> {
        let me = self.rank.id.rank;
        let t0 = Instant::now();
        let len = n.stored_len() as usize;
        let in_place = n.codec() == Codec::None && n.stored_len() == n.size();
        let lent = if in_place { dst.lend() } else { None };
        // (A lent spare is the file's size: `stored_len` bytes here.)
        let buf = match lent.map(RecvBuf::spare) {
            Some(Ok(b)) => b,
            Some(Err(s)) => {
                dst.restore(s);
                RecvBuf::heap(scratch(len), len)
            }
            None => RecvBuf::heap(scratch(len), len),
        };
        // (An answer already sent, by an earlier try of this OPEN, is not sent again.)
        let direct: Option<Direct> = client.filter(|c| in_place && n.size() <= DIRECT_MAX && !c.sent()).and_then(|c| {
            let dest = if buf.is_spare() { None } else { Some(dst.as_file()?.as_raw_fd()) };
            Some(Direct { client: c.clone(), expected: n.checksum(), dest })
        });
        let may_answer = direct.is_some();
        let (tx, rx) = crossbeam::channel::bounded(1);
        let timeout = self.fetch_timeout(n.stored_len());
        let f = Fetch {
            node_id: n.id(),
            holder,
            stored_len: n.stored_len(),
            offset: 0,
            buf,
            reply: tx,
            timeout,
            direct,
        };
        if self.rank.comm.fetch(f).is_err() {
            return Err(libc::EIO);
        }
        // (A spare's pages exist already.)
        if let (Some(size), Some(f)) = (libc::off_t::try_from(n.size()).ok().filter(|_| !dst.is_mapped()), dst.as_file()) {
            // SAFETY: fallocate on our own file; best effort (faults allocate what is left).
            unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, size) };
        }
        let t1 = Instant::now();
        let got = rx.recv_timeout(timeout + Duration::from_secs(2));
        let t2 = Instant::now();
        let res = match got {
            Ok(Ok((buf, sum))) => {
                self.rank.counters.remote_latency.record(t2 - t0);
                let verified = self.check_sum(n, sum);
                // The communication thread answered, for this fetch (an
                // answer sent for an earlier try left nothing in `dst`): the
                // bytes are in the copy's file.
                let answered = may_answer && client.is_some_and(|c| c.sent());
                if answered {
                    self.rank.counters.remote_direct.fetch_add(1, Relaxed);
                }
                match buf.into_mem() {
                    // The bytes are in the spare already.
                    RecvMem::Spare(s) => {
                        dst.restore(s);
                        if verified.is_ok() {
                            self.rank.counters.remote_in_place.fetch_add(1, Relaxed);
                        }
                        verified
                    }
                    RecvMem::Heap(v) => {
                        let r = verified.and_then(|()| if answered { Ok(()) } else { self.decode_into(n, &v[..len], dst) });
                        give_back(v);
                        r
                    }
                }
            }
            Ok(Err(e)) => {
                log::warn!("rank {me}: remote read of node {} from rank {holder}: {e}", n.id());
                Err(libc::EIO)
            }
            Err(_) => {
                log::warn!("rank {me}: remote read of node {} from rank {holder}: no answer", n.id());
                // A communication thread that stalled past its own deadline
                // may still complete this fetch: from now on it must not
                // touch the client's socket or `dst`'s fd (both may close
                // once this OPEN is given up). If it answered meanwhile,
                // the client has its file and nothing is sent again.
                if let Some(c) = client.filter(|_| may_answer) {
                    c.claim_for_conn();
                }
                Err(libc::EIO)
            }
        };
        log::debug!(
            "rank {me}: fetch of node {} ({} B) from rank {holder}: send+fallocate {:?}, wait {:?}, fill {:?}",
            n.id(),
            n.stored_len(),
            t1 - t0,
            t2 - t1,
            t2.elapsed()
        );
        res
    }
}

/// Largest remote file the communication thread answers the client of
/// itself (writing it into its copy with one pwrite when it was not received
/// there: in the MPI progress loop). A larger file's transfer dwarfs the
/// hand-off saved, and answering it here cost throughput: 4 daemons, 4
/// readers, 2 MiB files, 3/4 remote, 5 alternating rounds: 2415 MB/s with
/// them answered here, 2594 without, 2690 before any direct answer.
const DIRECT_MAX: u64 = 512 << 10;

/// Buffers for payloads and decoded bytes, shared by all connection threads.
static POOL: BufPool = BufPool::new(64 << 20);

pub(crate) fn scratch(len: usize) -> Vec<u8> {
    POOL.take(len)
}
pub(crate) fn give_back(v: Vec<u8>) {
    POOL.put(v)
}
