//! Read-ahead of remote files that a node reads in order.
//!
//! Only a node's remote opens reach its daemon: clients open local files
//! and node copies themselves. When a remote open continues a stream, the
//! next file of the manifest's order after the stream's last open (or after
//! what was read ahead for it), the daemon fetches the next remote files
//! of that order into the copy directory, `--read-ahead` bytes ahead of the
//! reader, on [`THREADS`] threads (several requests in flight). Node ids
//! follow the manifest's depth-first order, which is the order of a
//! directory listed and read (`cp -r`, `tar`, an evaluation pass that does
//! not shuffle). The reader then opens each file as a node copy, with no
//! message; an open of a file still in flight waits for that fetch, as any
//! second opener of a copy does ([`crate::copies`]).
//!
//! A shuffled reader starts no stream: two remote opens in a row seldom
//! follow each other. The copies count against `--cache-mem` like any other
//! (with `--cache-mem 0` there is nowhere to keep them, and nothing is read
//! ahead).
//!
//! ```text
//! opens seen:   17 ............ 18            (stream: last 18)
//! read ahead:                   19 20 21 .. 48 (window bytes of remote files)
//! reader:       19 20 .. 48 open copies directly, unseen
//! opens seen:   49            (the next after the read-ahead: the stream goes on)
//! ```

use crate::node::Node;
use fanstore_core::manifest::NodeKind;
use fanstore_core::tiers::{TIER_COPY, TIER_EXTRACTED};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

/// Streams followed at once per node (the least recently continued one is
/// replaced by a new one).
const STREAMS: usize = 16;
/// Most files read ahead of one stream's reader.
const MAX_FILES: u32 = 64;
/// Most node ids one scan looks at (local files and directories are passed over).
const MAX_SCAN: u32 = 4096;
/// Node ids an open may skip past a stream's end and still continue it
/// (directory entries between two directories' files).
const GAP: u32 = 8;
/// Threads that fetch ahead: as many requests in flight per node.
pub const THREADS: usize = 4;

/// One reader's progress through the manifest's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stream {
    /// The stream's last open this daemon saw.
    last: u32,
    /// The last node id read ahead for it (`last` when none).
    ahead_to: u32,
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
    /// Records a remote open of node `id`. Returns the stream it continues
    /// (`Some(ahead_to)`: read ahead after that id), or `None` when it
    /// starts a new one (nothing to read ahead yet).
    pub fn observe(&mut self, id: u32) -> Option<u32> {
        self.tick += 1;
        let tick = self.tick;
        if let Some(s) = self.slots.iter_mut().find(|s| s.last < id && id <= s.ahead_to.max(s.last).saturating_add(GAP)) {
            s.last = id;
            s.ahead_to = s.ahead_to.max(id);
            s.used = tick;
            return Some(s.ahead_to);
        }
        if let Some(s) = self.slots.iter_mut().find(|s| s.last == id) {
            // The same file opened again through the daemon: no progress.
            s.used = tick;
            return None;
        }
        let fresh = Stream { last: id, ahead_to: id, used: tick };
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

/// A node's read-ahead: its streams and the queue of its fetching threads.
pub struct ReadAhead {
    streams: Mutex<Streams>,
    tx: crossbeam::channel::Sender<u32>,
    window: u64,
}

impl ReadAhead {
    /// Read-ahead of `window` bytes per stream, fetched by whoever receives from `tx`.
    pub fn new(window: u64, tx: crossbeam::channel::Sender<u32>) -> ReadAhead {
        ReadAhead { streams: Mutex::new(Streams::default()), tx, window }
    }
}

impl Node {
    /// A remote open of node `id` reached this daemon: if it continues a
    /// stream, queue the next remote files of the manifest's order until
    /// the reader has `--read-ahead` bytes (at most [`MAX_FILES`] files)
    /// ahead of it.
    pub(crate) fn read_ahead_after(&self, id: u32) {
        let (Some(ra), Some(tiers)) = (self.read_ahead.get(), self.tiers.get()) else { return };
        let mut streams = ra.streams.lock().unwrap_or_else(|p| p.into_inner());
        let Some(ahead_to) = streams.observe(id) else { return };
        let remote_file = |i: u32| {
            self.view
                .node(i)
                .filter(|n| n.kind() == Some(NodeKind::File) && n.size() > 0 && self.part_map(n.partition()).is_none())
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
        while bytes < ra.window && files < MAX_FILES && scanned < MAX_SCAN {
            i = match i.checked_add(1) {
                Some(i) if i < self.view.node_count() => i,
                _ => break,
            };
            scanned += 1;
            let Some(n) = remote_file(i) else { continue };
            bytes += n.size();
            files += 1;
            if matches!(tiers.get(i), TIER_COPY | TIER_EXTRACTED) {
                continue;
            }
            if ra.tx.try_send(i).is_err() {
                // The fetching threads are behind: the stream's next open asks again.
                i -= 1;
                break;
            }
        }
        streams.advanced(id, i);
    }

    /// The loop of one read-ahead thread: fetch each queued remote file
    /// into the copy directory unless it is there, until the rank stops.
    pub fn read_ahead_loop(&self, rx: crossbeam::channel::Receiver<u32>) {
        let Some(copies) = self.copies.get() else { return };
        while let Ok(id) = rx.recv() {
            if self.stopping.load(Relaxed) {
                break;
            }
            let Some(n) = self.view.node(id) else { continue };
            if self.part_map(n.partition()).is_some() {
                continue; // replicated since it was queued
            }
            if copies.keep(id, n.size(), &|| self.relieve_fds(), &|d| self.fill_remote(n, d, None)) == Some(true) {
                self.counters.read_ahead.fetch_add(1, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_in_order_continues_the_stream() {
        let mut s = Streams::default();
        assert_eq!(s.observe(10), None, "a first open only starts a stream");
        assert_eq!(s.observe(11), Some(11));
        s.advanced(11, 40);
        // The reader opened 12..=40 as copies, unseen; 41 continues the stream.
        assert_eq!(s.observe(41), Some(41));
        // Within the read-ahead (a file still in flight) too.
        s.advanced(41, 70);
        assert_eq!(s.observe(50), Some(70));
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
    fn a_gap_of_directory_entries_is_passed_over_but_not_a_jump() {
        let mut s = Streams::default();
        s.observe(100);
        assert_eq!(s.observe(100 + GAP), Some(100 + GAP));
        assert_eq!(s.observe(100 + 3 * GAP), None);
    }

    #[test]
    fn the_same_file_again_is_no_progress() {
        let mut s = Streams::default();
        s.observe(5);
        assert_eq!(s.observe(5), None);
        assert_eq!(s.observe(6), Some(6));
    }

    #[test]
    fn many_readers_keep_their_streams_and_the_oldest_gives_way() {
        let mut s = Streams::default();
        for r in 0..STREAMS as u32 {
            s.observe(r * 1000);
        }
        for r in 0..STREAMS as u32 {
            assert_eq!(s.observe(r * 1000 + 1), Some(r * 1000 + 1), "reader {r}");
        }
        // A new reader replaces the least recently continued stream (reader 0's).
        s.observe(99_000);
        for r in 1..STREAMS as u32 {
            assert_eq!(s.observe(r * 1000 + 2), Some(r * 1000 + 2), "reader {r}");
        }
        assert_eq!(s.observe(2), None, "reader 0's stream gave way");
    }
}
