//! The state of a node's read-ahead: the streams of in-order remote opens
//! it follows, the files queued or in flight, and the queue of its fetching
//! threads ([`super`] is what the threads do).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Streams followed at once per node (the least recently continued one is
/// replaced by a new one).
const STREAMS: usize = 16;
/// Most files read ahead of one stream's reader.
pub(super) const MAX_FILES: u32 = 64;
/// Most node ids one scan looks at (local files and directories are passed over).
pub(super) const MAX_SCAN: u32 = 4096;
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
    pub(super) streams: Mutex<Streams>,
    pub(super) tx: crossbeam::channel::Sender<Vec<u32>>,
    pub(super) window: u64,
    /// Files queued or being fetched ahead; an OPEN of one waits for it.
    pub(super) in_flight: Mutex<HashSet<u32>>,
    /// Notified whenever files leave `in_flight`.
    pub(super) landed: Condvar,
    /// No read-ahead: a fetch ahead found no holder answering, and no
    /// remote read of this node succeeded since (the reader's own OPENs
    /// fail over or fail alone, never after waiting for a read-ahead too).
    pub(super) paused: AtomicBool,
}

/// What asking for a run of files in one message gave.
pub(super) enum RunFetch {
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

    pub(super) fn paused(&self) -> bool {
        self.paused.load(Relaxed)
    }

    /// Sends one run to the fetching threads, marking its files in flight.
    pub(super) fn send(&self, run: Vec<u32>) -> bool {
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
    pub(super) fn landed(&self, ids: &[u32]) {
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
