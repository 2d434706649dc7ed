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

use crate::rank::Rank;
use crate::status::LoadReport;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};


/// The dataset side of one rank, owned by [`crate::node::Node`]: what it
/// holds, what it copied, what it fetches.
pub struct Inputs {
    /// The context shared with the rank's other service.
    pub rank: Arc<Rank>,
    /// Copies of dataset files in shared memory ([`crate::inputs::copies`]), set at start.
    pub copies: OnceLock<crate::inputs::copies::Copies>,
    /// Where each file's bytes can be opened directly, set at start.
    pub tiers: OnceLock<Arc<crate::inputs::copies::TierMap>>,
    /// `parts[p]`: the mapped local copy of partition p, set once loaded.
    pub parts: OnceLock<Vec<Option<crate::inputs::load::PartMap>>>,
    /// `replicas[p]`: the mapped copy of remote partition p, once fetched
    /// from a holder in the background ([`crate::inputs::replicate`]).
    pub replicas: Box<[OnceLock<crate::inputs::load::PartMap>]>,
    /// `replica_claims[p]`: a replication thread took partition p (it is
    /// being fetched, was fetched, or failed); no other thread fetches it.
    pub replica_claims: Box<[AtomicBool]>,
    /// `replica_asked[p]`: a remote read of one of p's files already asked
    /// the read-driven replication thread for the whole partition.
    pub replica_asked: Box<[AtomicBool]>,
    /// `replica_pending[p]`: while a replication thread fetches partition
    /// p, the bytes it has still to fetch plus one (0: no fetch in flight).
    pub replica_pending: Box<[std::sync::atomic::AtomicU64]>,
    /// Notified whenever a fetch of a partition ends, published or not.
    pub replica_ended: (Mutex<()>, Condvar),
    /// The read-driven replication thread's queue (`--replicate-on-read`),
    /// set once ready when it runs.
    pub replicate_on_read: OnceLock<ReplicationQueue>,
    /// `remote_rent[p]`: what this node's remote reads of partition p's
    /// files cost, in bytes the bulk transfer moves in as much time
    /// ([`crate::inputs::Inputs::read_remotely`]; `--replicate-on-read auto` asks for p once
    /// it reaches p's size).
    pub remote_rent: Box<[std::sync::atomic::AtomicU64]>,
    /// The rate of the last whole-partition fetch, bytes/s (0: none yet:
    /// [`BULK_RATE_DEFAULT`]).
    pub bulk_rate: std::sync::atomic::AtomicU64,
    /// Files clients decoded themselves, to copy in the background
    /// ([`crate::inputs::Inputs::warm_copies`]); set once ready.
    pub warm: OnceLock<crossbeam::channel::Sender<u32>>,
    /// Read-ahead of remote files read in order ([`crate::inputs::read_ahead`]);
    /// set once ready when `--read-ahead` is on.
    pub read_ahead: OnceLock<crate::inputs::read_ahead::streams::ReadAhead>,
    /// Set once loading succeeded: `local[p]` when partition p is extracted here.
    pub local: OnceLock<Vec<bool>>,
    pub load: OnceLock<LoadReport>,
}

/// Where remote reads ask for their partition to be fetched whole.
pub struct ReplicationQueue {
    pub tx: crossbeam::channel::Sender<u32>,
    /// Only once the remote reads of its files cost as much time as
    /// fetching it whole (`auto`); otherwise on the first read.
    pub after_its_size: bool,
}

/// The bulk rate assumed before this node fetched a partition whole
/// (bytes/s): about what this machine's whole-partition fetches reach
/// (verified and written: 0.25-1 GB/s per rank with 4 ranks on 2 cores).
pub const BULK_RATE_DEFAULT: u64 = 1 << 30;
/// Bounds on a measured bulk rate (bytes/s): one slow fetch (a busy disk)
/// or a tiny fast one must not make the rule fetch nothing or everything.
pub const BULK_RATE_RANGE: (u64, u64) = (64 << 20, 16 << 30);

/// An open waits for a partition being fetched whole only when at most this
/// many of its bytes are still to come (~10-20 ms at the bulk rate here).
pub const REPLICA_WAIT_BYTES: u64 = 16 << 20;
/// The longest such a wait lasts (then the file is fetched alone).
pub const REPLICA_WAIT: Duration = Duration::from_millis(500);

impl Inputs {
    pub fn new(rank: Arc<Rank>) -> Inputs {
        let parts = rank.view.partition_count();
        Inputs {
            rank,
            copies: OnceLock::new(),
            tiers: OnceLock::new(),
            parts: OnceLock::new(),
            replicas: (0..parts).map(|_| OnceLock::new()).collect(),
            replica_claims: (0..parts).map(|_| AtomicBool::new(false)).collect(),
            replica_asked: (0..parts).map(|_| AtomicBool::new(false)).collect(),
            replica_pending: (0..parts).map(|_| AtomicU64::new(0)).collect(),
            replica_ended: (Mutex::new(()), Condvar::new()),
            replicate_on_read: OnceLock::new(),
            remote_rent: (0..parts).map(|_| AtomicU64::new(0)).collect(),
            bulk_rate: AtomicU64::new(0),
            warm: OnceLock::new(),
            read_ahead: OnceLock::new(),
            local: OnceLock::new(),
            load: OnceLock::new(),
        }
    }

    /// The mapped local copy of partition `p`: loaded at start, or
    /// replicated since.
    pub fn part_map(&self, p: u32) -> Option<&crate::inputs::load::PartMap> {
        self.parts.get().and_then(|v| v.get(p as usize)).and_then(Option::as_ref).or_else(|| self.replicas.get(p as usize)?.get())
    }

    /// A file of remote partition `p`, `bytes` stored, was just read from
    /// its holder in `took`: ask the read-driven replication thread (if it
    /// runs) for the whole partition, once: at once, or (`auto`) once the
    /// remote reads of its files have cost as much as fetching it whole.
    ///
    /// That is the ski-rental rule in time: a read costs its round trip
    /// (request, reply, the bytes landing), buying costs the partition's
    /// bytes at the bulk rate. Counted in bytes, a read's rent is what the
    /// bulk transfer moves in its round trip, and never less than its own
    /// bytes: `max(bytes, took x bulk rate)`. A small file's read is nearly
    /// all round trip: 100-byte files read remotely in 255 µs (p50, 4
    /// readers, 4 ranks here) cost as much as 267 KB of bulk transfer;
    /// counting their bytes alone, a node read every file of a partition of
    /// them remotely, more than once, before fetching it. Costs two atomic
    /// loads when already asked, one more add before.
    pub fn read_remotely(&self, p: u32, bytes: u64, took: Duration) {
        let Some(queue) = self.replicate_on_read.get() else { return };
        let Some(asked) = self.replica_asked.get(p as usize) else { return };
        if asked.load(Relaxed) {
            return;
        }
        if queue.after_its_size {
            let Some(rent) = self.remote_rent.get(p as usize) else { return };
            let add = bytes.max(self.bulk_bytes_in(took));
            let total = rent.fetch_add(add, Relaxed).saturating_add(add);
            let size = self.rank.view.partition(p).map_or(u64::MAX, |i| i.file_len);
            if total < size {
                return;
            }
            log::info!(
                "rank {}: partition {p} ({size} B) asked for whole: its remote reads cost as much ({total} B at {} MB/s)",
                self.rank.id.rank,
                self.bulk_rate() / 1_000_000
            );
        }
        if asked.swap(true, Relaxed) {
            return;
        }
        if queue.tx.try_send(p).is_err() {
            // The queue is full (the thread is behind): a later read asks again.
            asked.store(false, Relaxed);
        }
    }

    /// The bulk rate, bytes/s: of the last whole-partition fetch, within
    /// [`BULK_RATE_RANGE`], else [`BULK_RATE_DEFAULT`].
    pub fn bulk_rate(&self) -> u64 {
        match self.bulk_rate.load(Relaxed) {
            0 => BULK_RATE_DEFAULT,
            r => r.clamp(BULK_RATE_RANGE.0, BULK_RATE_RANGE.1),
        }
    }

    /// Bytes the bulk transfer moves in `d`.
    fn bulk_bytes_in(&self, d: Duration) -> u64 {
        u64::try_from(d.as_nanos().saturating_mul(u128::from(self.bulk_rate())) / 1_000_000_000).unwrap_or(u64::MAX)
    }

    /// When partition `p` is being fetched whole and at most
    /// [`REPLICA_WAIT_BYTES`] of it are still to come, waits for it (at most
    /// [`REPLICA_WAIT`]) rather than fetch one of its files alone: the
    /// replica brings those bytes anyway, in large messages, and a file
    /// fetched alone now would cross twice. True when the replica is here.
    pub fn await_replica(&self, p: u32) -> bool {
        let Some(pending) = self.replica_pending.get(p as usize) else { return false };
        let left = pending.load(Relaxed);
        if left == 0 || left > REPLICA_WAIT_BYTES {
            return false;
        }
        let deadline = Instant::now() + REPLICA_WAIT;
        let (lock, cv) = &self.replica_ended;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        while pending.load(Relaxed) != 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = cv.wait_timeout(g, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        drop(g);
        self.part_map(p).is_some()
    }

    /// A fetch of partition `p` ended (published or given up): wakes the
    /// opens waiting for it.
    pub fn replica_fetch_ended(&self, p: u32) {
        if let Some(pending) = self.replica_pending.get(p as usize) {
            pending.store(0, Relaxed);
        }
        let (lock, cv) = &self.replica_ended;
        let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
        cv.notify_all();
    }
}
