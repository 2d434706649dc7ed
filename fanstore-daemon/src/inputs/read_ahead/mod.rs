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
//! copy directory, `--read-ahead` bytes ahead of the reader, on [`THREADS`](streams::THREADS)
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
use crate::inputs::Inputs;
use crate::inputs::open::{give_back, scratch};
use fanstore_core::checksum::xxh3;
use fanstore_core::manifest::{NodeKind, NodeRef};
use fanstore_core::tiers::{TIER_COPY, TIER_EXTRACTED};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use streams::{RunFetch, MAX_SCAN, RUN_BYTES};

pub mod streams;

impl Inputs {
    /// A remote open of node `id` reached this daemon: if it continues a
    /// stream, queue the next remote files of the manifest's order until
    /// the reader has `--read-ahead` bytes ahead of it (at most 2, 4, 8 ..
    /// [`streams::MAX_FILES`] files as the stream goes on), in runs of consecutive
    /// files of one partition (each run at most [`RUN_BYTES`] of stored
    /// bytes: one MPI message).
    pub(crate) fn read_ahead_after(&self, id: u32) {
        let (Some(ra), Some(tiers)) = (self.read_ahead.get(), self.tiers.get()) else { return };
        if ra.paused() {
            return;
        }
        let mut streams = ra.streams.lock().unwrap_or_else(|p| p.into_inner());
        let Some((ahead_to, max_files)) = streams.observe(id) else { return };
        let remote_file = |i: u32| {
            self.rank.view
                .node(i)
                .filter(|n| n.kind() == Some(NodeKind::File) && n.size() > 0 && self.part_map(n.partition()).is_none())
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
                Some(i) if i < self.rank.view.node_count() => i,
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
        let (Some(copies), Some(ra)) = (self.copies.get(), self.read_ahead.get()) else { return };
        while let Ok(run) = rx.recv() {
            if self.rank.stopping.load(Relaxed) {
                ra.landed(&run);
                break;
            }
            if ra.paused() {
                ra.landed(&run);
                continue;
            }
            let todo: Vec<NodeRef<'_>> = run
                .iter()
                .filter_map(|&id| self.rank.view.node(id))
                .filter(|n| self.part_map(n.partition()).is_none() && !self.being_replicated(n.partition()))
                .filter(|n| !matches!(self.tiers.get().map(|t| t.get(n.id())), Some(TIER_COPY | TIER_EXTRACTED)))
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
                                && copies.keep(n.id(), n.size(), &|| self.rank.relieve_fds(), &|d| self.decode_into(*n, stored, d)) == Some(true)
                        });
                        if made {
                            self.rank.counters.read_ahead.fetch_add(1, Relaxed);
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
                        match copies.keep(n.id(), n.size(), &|| self.rank.relieve_fds(), &|d| self.fill_remote(*n, d, None)) {
                            Some(true) => {
                                self.rank.counters.read_ahead.fetch_add(1, Relaxed);
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
        self.replica_pending.get(p as usize).is_some_and(|left| left.load(Relaxed) != 0)
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
        let me = self.rank.id.rank;
        let t = Instant::now();
        for holder in self.rank.placement.holders_for(p, first.id()).into_iter().filter(|&h| h != me) {
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
            if self.rank.comm.fetch(f).is_err() {
                return RunFetch::Failed; // the rank is stopping
            }
            match rx.recv_timeout(timeout + Duration::from_secs(2)) {
                Ok(Ok((buf, _))) if buf.len() as u64 == len => {
                    self.rank.counters.remote_latency.record(t.elapsed());
                    self.read_remotely(p, len, t.elapsed());
                    return match buf.into_mem() {
                        RecvMem::Heap(v) => RunFetch::Got(off, v),
                        RecvMem::Spare(_) => RunFetch::Scattered, // (never: the buffer was a heap one)
                    };
                }
                other => {
                    self.rank.counters.remote_failed.fetch_add(1, Relaxed);
                    let why = match other {
                        Ok(Err(e)) => e.to_string(),
                        Ok(Ok(_)) => "a short answer".into(),
                        Err(_) => "no answer".into(),
                    };
                    log::warn!("rank {me}: read-ahead of partition {p} bytes {off}..{end} from rank {holder}: {why}");
                }
            }
            if self.rank.stopping.load(Relaxed) {
                break;
            }
        }
        RunFetch::Failed
    }
}
