//! Read-ahead of remote files that a node reads in order.
//!
//! Only a node's remote opens reach its daemon: clients open local files
//! and node copies themselves. A remote open continues a stream when it is
//! the next file of the manifest's order after the stream's last open (or
//! after what was read ahead for it). Node ids follow the manifest's
//! depth-first order, the order of a directory listed and read (`cp -r`,
//! `tar`, an evaluation pass that does not shuffle).
//!
//! Then the daemon fetches the next remote files of that order into the
//! copy directory, `--read-ahead` bytes ahead of the reader, on [`THREADS`]
//! threads (several requests in flight). Consecutive files of one partition
//! lie side by side in it: a run of them (up to [`RUN_BYTES`]) crosses as
//! one partition range, one MPI message. Each file is checked against its
//! own checksum before it becomes a copy; a damaged one is not kept (its own
//! OPEN fetches it again, and gets EIO). The reader opens each copy with no
//! message; an OPEN of a file still queued or in flight waits for it. A run
//! or a file that no holder gives pauses read-ahead until a remote read of
//! the node succeeds again: meanwhile the reader's own OPENs fail over, or
//! fail alone, without first waiting for a read-ahead of the same file.
//!
//! A shuffled reader starts no stream: two remote opens in a row seldom
//! follow each other. The copies count against `--cache-mem` like any other
//! (with `--cache-mem 0` there is nowhere to keep them, and nothing is read
//! ahead).
//!
//! ```text
//! opens seen:   17 ............ 18            (stream: last 18)
//! read ahead:                   [19 .. 26] [27 .. 34] .. 48 (runs, one message each)
//! reader:       19 20 .. 48 open copies directly, unseen
//! opens seen:   49            (the next after the read-ahead: the stream goes on)
//! ```

use crate::comm::{Fetch, RecvBuf, RecvMem, PART_BIT};
use crate::node::Node;
use crate::inputs::open::{give_back, scratch};
use fanstore_core::checksum::xxh3;
use fanstore_core::manifest::{NodeKind, NodeRef};
use fanstore_core::tiers::{TIER_COPY, TIER_EXTRACTED};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Streams followed at once per node (the least recently continued one is
/// replaced by a new one).
const STREAMS: usize = 16;
/// Most files read ahead of one stream's reader.
const MAX_FILES: u32 = 64;
/// Most node ids one scan looks at (local files and directories are passed over).
const MAX_SCAN: u32 = 4096;
/// Node ids an open may skip past what was read ahead for a stream and
/// still continue it (directory entries between two directories' files).
const GAP: u32 = 8;
/// The same for a stream with nothing read ahead yet: only the next node.
/// Kept tight, as a shuffled reader's open lands this close after one of
/// [`STREAMS`] others STREAMS times in N (a stream that starts at a
/// directory's end starts again at its next two files).
const NEAR: u32 = 1;
/// Threads that fetch ahead: as many requests in flight per node.
pub const THREADS: usize = 4;
/// Most stored bytes of one run of files fetched in one MPI message.
pub const RUN_BYTES: u64 = 1 << 20;

/// One reader's progress through the manifest's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stream {
    /// The stream's last open this daemon saw.
    last: u32,
    /// The last node id read ahead for it (`last` when none).
    ahead_to: u32,
    /// Opens that continued it: the read-ahead doubles with each, from 2
    /// files up to the window (a chance continuation reads little).
    hits: u32,
    /// When it was last continued (for replacement).
    used: u64,
}

/// The streams of one node: which remote opens continue which stream.
#[derive(Debug, Default)]
pub struct Streams {
    slots: Vec<Stream>,
    tick: u64,
}

impl Streams {
    /// Records a remote open of node `id`. Returns what the stream it
    /// continues may read ahead (`Some((ahead_to, files))`: up to `files`
    /// files ahead of the reader, after node `ahead_to`), or `None` when it
    /// starts a new one (nothing to read ahead yet).
    pub fn observe(&mut self, id: u32) -> Option<(u32, u32)> {
        self.tick += 1;
        let tick = self.tick;
        let reach = |s: &Stream| if s.ahead_to > s.last { s.ahead_to.saturating_add(GAP) } else { s.last.saturating_add(NEAR) };
        if let Some(s) = self.slots.iter_mut().find(|s| s.last < id && id <= reach(s)) {
            s.last = id;
            s.ahead_to = s.ahead_to.max(id);
            s.used = tick;
            s.hits += 1;
            return Some((s.ahead_to, (1u32 << s.hits.min(16)).min(MAX_FILES)));
        }
        if let Some(s) = self.slots.iter_mut().find(|s| s.last == id) {
            // The same file opened again through the daemon: no progress.
            s.used = tick;
            return None;
        }
        let fresh = Stream { last: id, ahead_to: id, hits: 0, used: tick };
        if self.slots.len() < STREAMS {
            self.slots.push(fresh);
        } else if let Some(s) = self.slots.iter_mut().min_by_key(|s| s.used) {
            *s = fresh;
        }
        None
    }

    /// Records that the stream whose last open is `last` was read ahead up to `to`.
    pub fn advanced(&mut self, last: u32, to: u32) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.last == last) {
            s.ahead_to = s.ahead_to.max(to);
        }
    }
}

/// A node's read-ahead: its streams, the files queued or in flight, and the
/// queue of its fetching threads.
pub struct ReadAhead {
    streams: Mutex<Streams>,
    tx: crossbeam::channel::Sender<Vec<u32>>,
    window: u64,
    /// Files queued or being fetched ahead; an OPEN of one waits for it.
    in_flight: Mutex<HashSet<u32>>,
    /// Notified whenever files leave `in_flight`.
    landed: Condvar,
    /// No read-ahead: a fetch ahead found no holder answering, and no
    /// remote read of this node succeeded since (the reader's own OPENs
    /// fail over or fail alone, never after waiting for a read-ahead too).
    paused: AtomicBool,
}

/// What asking for a run of files in one message gave.
enum RunFetch {
    /// (The range's offset in the partition, its bytes.)
    Got(u64, Vec<u8>),
    /// The files do not lie side by side: fetch them one by one.
    Scattered,
    /// No holder answered (logged).
    Failed,
}

impl ReadAhead {
    /// Read-ahead of `window` bytes per stream, fetched by whoever receives
    /// from `tx` (runs of files of one partition, in order).
    pub fn new(window: u64, tx: crossbeam::channel::Sender<Vec<u32>>) -> ReadAhead {
        ReadAhead {
            streams: Mutex::new(Streams::default()),
            tx,
            window,
            in_flight: Mutex::default(),
            landed: Condvar::new(),
            paused: AtomicBool::new(false),
        }
    }

    /// Stops reading ahead until a remote read succeeds ([`ReadAhead::resume`]).
    pub fn pause(&self) {
        self.paused.store(true, Relaxed);
    }

    /// A remote read of this node succeeded: holders answer (again).
    pub fn resume(&self) {
        if self.paused.load(Relaxed) {
            self.paused.store(false, Relaxed);
        }
    }

    fn paused(&self) -> bool {
        self.paused.load(Relaxed)
    }

    /// Sends one run to the fetching threads, marking its files in flight.
    fn send(&self, run: Vec<u32>) -> bool {
        let mut f = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        f.extend(run.iter().copied());
        match self.tx.try_send(run) {
            Ok(()) => true,
            Err(e) => {
                for id in e.into_inner() {
                    f.remove(&id);
                }
                false
            }
        }
    }

    /// Files `ids` are copies now, or will not be: wake their waiters.
    fn landed(&self, ids: &[u32]) {
        let mut f = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            f.remove(id);
        }
        drop(f);
        self.landed.notify_all();
    }

    /// Waits (at most `limit`) while node `id` is queued or being fetched ahead.
    pub fn wait_for(&self, id: u32, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut f = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        while f.contains(&id) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return };
            f = self.landed.wait_timeout(f, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Node {
    /// A remote open of node `id` reached this daemon: if it continues a
    /// stream, queue the next remote files of the manifest's order until
    /// the reader has `--read-ahead` bytes ahead of it (at most 2, 4, 8 ..
    /// [`MAX_FILES`] files as the stream goes on), in runs of consecutive
    /// files of one partition (each run at most [`RUN_BYTES`] of stored
    /// bytes: one MPI message).
    pub(crate) fn read_ahead_after(&self, id: u32) {
        let (Some(ra), Some(tiers)) = (self.inputs.read_ahead.get(), self.inputs.tiers.get()) else { return };
        if ra.paused() {
            return;
        }
        let mut streams = ra.streams.lock().unwrap_or_else(|p| p.into_inner());
        let Some((ahead_to, max_files)) = streams.observe(id) else { return };
        let remote_file = |i: u32| {
            self.view
                .node(i)
                .filter(|n| n.kind() == Some(NodeKind::File) && n.size() > 0 && self.inputs.part_map(n.partition()).is_none())
                .filter(|n| !self.being_replicated(n.partition()))
        };
        // What is ahead of the reader already.
        let (mut bytes, mut files) = (0u64, 0u32);
        for i in id.saturating_add(1)..=ahead_to {
            if let Some(n) = remote_file(i) {
                bytes += n.size();
                files += 1;
            }
        }
        let (mut i, mut scanned) = (ahead_to, 0u32);
        let mut run: Vec<u32> = Vec::new();
        let (mut run_part, mut run_bytes) = (0u32, 0u64);
        let mut sent_to = ahead_to;
        while bytes < ra.window && files < max_files && scanned < MAX_SCAN {
            i = match i.checked_add(1) {
                Some(i) if i < self.view.node_count() => i,
                _ => break,
            };
            scanned += 1;
            let Some(n) = remote_file(i) else { continue };
            bytes += n.size();
            files += 1;
            let copied = matches!(tiers.get(i), TIER_COPY | TIER_EXTRACTED);
            if !run.is_empty() && (copied || n.partition() != run_part || run_bytes + n.stored_len() > RUN_BYTES) {
                if !ra.send(std::mem::take(&mut run)) {
                    // The fetching threads are behind: the stream's next open asks again.
                    streams.advanced(id, sent_to);
                    return;
                }
                sent_to = i - 1;
            }
            if copied {
                sent_to = i;
                continue;
            }
            if run.is_empty() {
                (run_part, run_bytes) = (n.partition(), 0);
            }
            run.push(i);
            run_bytes += n.stored_len();
        }
        if run.is_empty() || ra.send(run) {
            sent_to = i;
        }
        streams.advanced(id, sent_to);
    }

    /// The loop of one read-ahead thread: fetch each queued run of remote
    /// files into the copy directory (the files not there yet), until the
    /// rank stops.
    pub fn read_ahead_loop(&self, rx: crossbeam::channel::Receiver<Vec<u32>>) {
        let (Some(copies), Some(ra)) = (self.inputs.copies.get(), self.inputs.read_ahead.get()) else { return };
        while let Ok(run) = rx.recv() {
            if self.stopping.load(Relaxed) {
                ra.landed(&run);
                break;
            }
            if ra.paused() {
                ra.landed(&run);
                continue;
            }
            let todo: Vec<NodeRef<'_>> = run
                .iter()
                .filter_map(|&id| self.view.node(id))
                .filter(|n| self.inputs.part_map(n.partition()).is_none() && !self.being_replicated(n.partition()))
                .filter(|n| !matches!(self.inputs.tiers.get().map(|t| t.get(n.id())), Some(TIER_COPY | TIER_EXTRACTED)))
                .collect();
            let fetched = if todo.len() > 1 { self.fetch_run(&todo) } else { RunFetch::Scattered };
            match fetched {
                RunFetch::Got(off, bytes) => {
                    for n in &todo {
                        // (Inside the range by its making; a payload that fails
                        // its checksum is logged, and the file's own OPEN fetches it again.)
                        let at = (n.payload_offset() - off) as usize;
                        let made = bytes.get(at..at + n.stored_len() as usize).is_some_and(|stored| {
                            self.check_sum(*n, xxh3(stored)).is_ok()
                                && copies.keep(n.id(), n.size(), &|| self.relieve_fds(), &|d| self.decode_into(*n, stored, d)) == Some(true)
                        });
                        if made {
                            self.counters.read_ahead.fetch_add(1, Relaxed);
                        }
                        ra.landed(&[n.id()]);
                    }
                    give_back(bytes);
                }
                RunFetch::Failed => ra.pause(),
                RunFetch::Scattered => {
                    // One file (or files apart): each alone, from the first
                    // holder that answers (a file no holder gave pauses
                    // read-ahead there, in `fill_remote`).
                    for n in todo.iter().filter(|n| copies.fits(n.size())) {
                        match copies.keep(n.id(), n.size(), &|| self.relieve_fds(), &|d| self.fill_remote(*n, d, None)) {
                            Some(true) => {
                                self.counters.read_ahead.fetch_add(1, Relaxed);
                            }
                            Some(false) => {}
                            None => break,
                        }
                        ra.landed(&[n.id()]);
                    }
                }
            }
            ra.landed(&run);
        }
    }

    /// Whether partition `p` is being fetched whole ([`crate::inputs::replicate`]):
    /// its files arrive with it (an OPEN waits for it), not read ahead too.
    fn being_replicated(&self, p: u32) -> bool {
        self.inputs.replica_pending.get(p as usize).is_some_and(|left| left.load(Relaxed) != 0)
    }

    /// The stored bytes of `run` (files of one partition, in payload order)
    /// in one MPI message from the first holder that answers.
    fn fetch_run(&self, run: &[NodeRef<'_>]) -> RunFetch {
        let Some(first) = run.first() else { return RunFetch::Scattered };
        let p = first.partition();
        let off = run.iter().map(|n| n.payload_offset()).min().unwrap_or(0);
        let end = run.iter().map(|n| n.payload_offset() + n.stored_len()).max().unwrap_or(0);
        let len = end - off;
        // Files of one partition in order lie side by side; anything else is
        // fetched file by file.
        let stored: u64 = run.iter().map(|n| n.stored_len()).sum();
        if len > stored + run.len() as u64 * 4096 || run.iter().any(|n| n.partition() != p) {
            return RunFetch::Scattered;
        }
        let me = self.id.rank;
        let t = Instant::now();
        for holder in self.placement.holders_for(p, first.id()).into_iter().filter(|&h| h != me) {
            let (tx, rx) = crossbeam::channel::bounded(1);
            let timeout = self.fetch_timeout(len);
            let f = Fetch {
                node_id: PART_BIT | p,
                holder,
                stored_len: len,
                offset: off,
                buf: RecvBuf::heap(scratch(len as usize), len as usize),
                reply: tx,
                timeout,
                direct: None,
            };
            if self.comm.fetch(f).is_err() {
                return RunFetch::Failed; // the rank is stopping
            }
            match rx.recv_timeout(timeout + Duration::from_secs(2)) {
                Ok(Ok((buf, _))) if buf.len() as u64 == len => {
                    self.counters.remote_latency.record(t.elapsed());
                    self.inputs.read_remotely(p, len, t.elapsed());
                    return match buf.into_mem() {
                        RecvMem::Heap(v) => RunFetch::Got(off, v),
                        RecvMem::Spare(_) => RunFetch::Scattered, // (never: the buffer was a heap one)
                    };
                }
                other => {
                    self.counters.remote_failed.fetch_add(1, Relaxed);
                    let why = match other {
                        Ok(Err(e)) => e.to_string(),
                        Ok(Ok(_)) => "a short answer".into(),
                        Err(_) => "no answer".into(),
                    };
                    log::warn!("rank {me}: read-ahead of partition {p} bytes {off}..{end} from rank {holder}: {why}");
                }
            }
            if self.stopping.load(Relaxed) {
                break;
            }
        }
        RunFetch::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_in_order_continues_the_stream_and_each_one_after_reads_twice_as_far() {
        let mut s = Streams::default();
        assert_eq!(s.observe(10), None, "a first open only starts a stream");
        assert_eq!(s.observe(11), Some((11, 2)));
        s.advanced(11, 13);
        // The reader opened 12 and 13 as copies, unseen; 14 continues the stream.
        assert_eq!(s.observe(14), Some((14, 4)));
        s.advanced(14, 18);
        // Within the read-ahead (a file still in flight) too.
        assert_eq!(s.observe(16), Some((18, 8)));
        for want in [16, 32, 64, 64] {
            let (to, files) = s.observe(s.slots[0].ahead_to + 1).expect("the stream goes on");
            assert_eq!(files, want);
            s.advanced(to, to + files);
        }
    }

    #[test]
    fn shuffled_opens_start_no_stream() {
        let mut s = Streams::default();
        let order = [500u32, 17, 903, 44, 260, 781, 3, 612, 95, 330];
        assert!(order.iter().all(|&id| s.observe(id).is_none()));
        // Backwards is no stream either.
        assert_eq!(s.observe(2), None);
    }

    #[test]
    fn a_shuffled_epoch_over_few_files_reads_little_ahead() {
        // Every id of 0..1000 once, shuffled (Fisher-Yates, xorshift64).
        let n = 1000u32;
        let mut order: Vec<u32> = (0..n).collect();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in (1..order.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let mut s = Streams::default();
        let mut ahead = 0u32;
        for id in order {
            if let Some((to, files)) = s.observe(id) {
                ahead += files;
                s.advanced(id, to + files);
            }
        }
        // (Every stream reaching GAP past its last open and reading 64
        // files at once, as a first version did: 24000 files for this order.)
        assert!(ahead * 20 < n, "{ahead} files read ahead for {n} shuffled opens");
    }

    #[test]
    fn once_read_ahead_a_stream_passes_over_directory_entries_but_not_a_jump() {
        let mut s = Streams::default();
        s.observe(100);
        s.observe(200);
        assert_eq!(s.observe(202), None, "a stream with nothing read ahead goes on with the next node only");
        assert_eq!(s.observe(101), Some((101, 2)));
        s.advanced(101, 110);
        assert_eq!(s.observe(110 + GAP), Some((110 + GAP, 4)));
        assert_eq!(s.observe(110 + 3 * GAP), None);
    }

    #[test]
    fn the_same_file_again_is_no_progress() {
        let mut s = Streams::default();
        s.observe(5);
        assert_eq!(s.observe(5), None);
        assert_eq!(s.observe(6), Some((6, 2)));
    }

    #[test]
    fn many_readers_keep_their_streams_and_the_oldest_gives_way() {
        let mut s = Streams::default();
        for r in 0..STREAMS as u32 {
            s.observe(r * 1000);
        }
        for r in 0..STREAMS as u32 {
            assert_eq!(s.observe(r * 1000 + 1), Some((r * 1000 + 1, 2)), "reader {r}");
        }
        // A new reader replaces the least recently continued stream (reader 0's).
        s.observe(99_000);
        for r in 1..STREAMS as u32 {
            assert_eq!(s.observe(r * 1000 + 2), Some((r * 1000 + 2, 4)), "reader {r}");
        }
        assert_eq!(s.observe(2), None, "reader 0's stream gave way");
    }
}
