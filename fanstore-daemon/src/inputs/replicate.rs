//! Background replication of remote partitions (`--prefetch-remote`).
//!
//! A dataset's partitions are spread over the nodes, so on the first epoch
//! (N-1)/N of a node's reads cross MPI one file at a time: a request, a
//! reply, and the file's bytes landing in fresh pages, for every file. When
//! the node's local disk can hold more of the dataset, this thread fetches
//! whole remote partitions after the job is ready, in large pieces (the
//! transport's best case), so those reads become local ones.
//!
//! For each remote partition, within `--prefetch-remote` bytes and while the
//! local file system keeps a twentieth of its space free:
//! 1. its bytes are fetched from a holder in [`CHUNK`]-byte ranges, two in
//!    flight ([`crate::ids::PART_BIT`] requests, served by the holder from
//!    its mapped copy with no copy), into `part-NNNNNN.fsp.fetch` in the
//!    local `parts/` directory, except the payloads of large uncompressed
//!    files, which go straight to their own files (what a local partition's
//!    file is extracted to on first open), so each byte lands once
//!    ([`crate::inputs::replica_writer`]); a failed range is asked of the next holder;
//! 2. the file is verified entry by entry against the manifest, with every
//!    checksum, exactly as a partition the loader reads from the dataset
//!    directory (`crate::inputs::load::verify_partition`), and each large file's
//!    length and checksum too: a peer's damaged copy is refused, never served;
//! 3. the large files are renamed to their extracted names and marked
//!    extracted in the tier map (clients open them directly); the partition
//!    is renamed to its local name, mapped read-only and published:
//!    [`crate::inputs::Inputs::part_map`] serves its files as local ones from
//!    then on, and each of its files not yet copied is marked [`TIER_PART`],
//!    so clients decode small files from it themselves (no message).
//!
//! Two threads use this: [`run`] (`--prefetch-remote`) fetches every
//! remote partition after ready; [`on_read`] (`--replicate-on-read`) fetches
//! a partition once its files were read from a holder
//! ([`crate::inputs::Inputs::read_remotely`]): by default (`auto`) once the node's remote
//! reads of its files have taken as long as fetching it whole would (each
//! read counted as the bytes the bulk transfer moves in its round trip, at
//! least its own). That is the ski-rental rule: a node that spends less
//! time reading a partition's files remotely than its fetch would take
//! never fetches it whole, and one that goes on reading them pays at most
//! twice what fetching it at once would have cost, then reads locally.
//! Both threads claim a partition before fetching it.
//!
//! Reads do not wait for either, except for the end of a fetch in flight
//! ([`crate::inputs::Inputs::await_replica`]: at most 16 MiB still to come, at most 500 ms);
//! a file whose partition is not here yet is fetched alone, as before. Both
//! threads run at the lowest CPU priority and stop at `fanstore stop`.
//! Nothing they fetched outlives the job (the local directory is removed at
//! stop).

use crate::comm::{Fetch, FetchReply, RecvBuf, RecvMem, PART_BIT};
use crate::inputs::copies::room_for;
use crate::inputs::load::{self, OffsetMap};
use crate::inputs::Inputs;
use crate::inputs::replica_writer::{large_payloads, Apart, ReplicaWriter};
use fanstore_core::tiers::{TIER_EXTRACTED, TIER_NONE, TIER_PART};
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes asked for in one request.
pub const CHUNK: u64 = 8 << 20;
/// Requests in flight per partition (one lands while the next travels).
const WINDOW: usize = 2;

/// What the thread did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub partitions: u32,
    pub bytes: u64,
    /// Partitions given up (no holder answered, or the copy was damaged).
    pub failed: u32,
}

/// Why a partition was not replicated.
#[derive(Debug)]
enum Skip {
    /// The rank is stopping.
    Stopping,
    /// Fetching or verifying failed; the message names the partition and the cause.
    Failed(String),
}

/// The remote partitions of `node` in the order this rank fetches them:
/// starting with the partitions of the next rank, so that the ranks of a
/// job spread their requests over all holders instead of all asking rank 0.
pub fn order(partition_count: u32, nranks: u32, rank: u32, local: &[bool]) -> Vec<u32> {
    let nranks = nranks.max(1);
    let mut ps: Vec<u32> = (0..partition_count).filter(|&p| !local.get(p as usize).copied().unwrap_or(false)).collect();
    ps.sort_by_key(|&p| ((p % nranks + nranks - rank % nranks - 1) % nranks, p));
    ps
}

/// Fetches remote partitions until `budget` bytes are replicated, the local
/// file system runs short, or the rank stops.
pub fn run(inputs: &Inputs, budget: u64) -> Report {
    lowest_priority();
    let mut report = Report::default();
    let local = inputs.local.get().cloned().unwrap_or_default();
    let wanted = order(inputs.rank.view.partition_count(), inputs.rank.id.nranks, inputs.rank.id.rank, &local);
    if wanted.is_empty() {
        return report;
    }
    let maps = load::offset_maps(&inputs.rank.view, &wanted);
    for p in wanted {
        if step(inputs, p, maps.get(&p), budget, &mut report) == Flow::Stop {
            break;
        }
    }
    report
}

/// Replicates the remote partitions whose files are read (`--replicate-on-read`):
/// [`crate::inputs::Inputs::read_remotely`] queues a partition after remote reads of its
/// files (the first, or enough to add up to its size); this thread fetches
/// the queued partitions one by one, within `budget` bytes, until the queue
/// closes, the disk runs short or the rank stops.
pub fn on_read(inputs: &Inputs, budget: u64, queue: &crossbeam::channel::Receiver<u32>) -> Report {
    lowest_priority();
    let mut report = Report::default();
    let local = inputs.local.get().cloned().unwrap_or_default();
    loop {
        let first = match queue.recv_timeout(Duration::from_millis(100)) {
            Ok(p) => p,
            Err(crossbeam::channel::RecvTimeoutError::Timeout) if !inputs.rank.stopping.load(Relaxed) => continue,
            Err(_) => return report,
        };
        // Everything asked for meanwhile: one pass over the index finds where
        // the files of all of them lie.
        let mut batch: Vec<u32> = std::iter::once(first).chain(queue.try_iter()).collect();
        batch.retain(|&p| !local.get(p as usize).copied().unwrap_or(false));
        batch.dedup();
        let maps = load::offset_maps(&inputs.rank.view, &batch);
        for p in batch {
            if step(inputs, p, maps.get(&p), budget, &mut report) == Flow::Stop {
                return report;
            }
        }
    }
}

/// Gives the calling thread the lowest scheduling priority (nice 19): the
/// daemon's background copiers (replication, prefill, WARM copies,
/// extraction ahead) yield the cores to the programs' reads.
pub(crate) fn lowest_priority() {
    // SAFETY: lowers this thread's own scheduling priority (Linux: per thread).
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
}

#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Next,
    Stop,
}

/// Replicates partition `p` unless another thread took it, it is over the
/// budget (skipped), or the disk is short or the rank stops (`Flow::Stop`).
fn step(inputs: &Inputs, p: u32, offsets: Option<&OffsetMap>, budget: u64, report: &mut Report) -> Flow {
    if inputs.rank.stopping.load(Relaxed) {
        return Flow::Stop;
    }
    let Some(info) = inputs.rank.view.partition(p) else {
        return Flow::Next;
    };
    if report.bytes.saturating_add(info.file_len) > budget {
        return Flow::Next;
    }
    let dir = inputs.rank.id.local_dir.join("parts");
    if !room_for(&dir, info.file_len) {
        log::info!("rank {}: replication stops: the local file system has no room for partition {p}", inputs.rank.id.rank);
        return Flow::Stop;
    }
    let Some(claim) = inputs.replica_claims.get(p as usize) else {
        return Flow::Next;
    };
    if claim.swap(true, Relaxed) {
        return Flow::Next;
    }
    let empty = OffsetMap::new();
    let t = Instant::now();
    if let Some(pending) = inputs.replica_pending.get(p as usize) {
        pending.store(info.file_len + 1, Relaxed);
    }
    let res = replicate_one(inputs, p, info.file_len, offsets.unwrap_or(&empty));
    inputs.replica_fetch_ended(p);
    match res {
        Ok(()) => {
            report.partitions += 1;
            report.bytes += info.file_len;
            inputs.rank.counters.replicated_parts.fetch_add(1, Relaxed);
            inputs.rank.counters.replicated_bytes.fetch_add(info.file_len, Relaxed);
            let took = t.elapsed();
            // Partitions under a chunk are mostly the round trip: not a rate.
            if info.file_len >= CHUNK {
                let rate = u128::from(info.file_len) * 1_000_000_000 / took.as_nanos().max(1);
                inputs.bulk_rate.store(u64::try_from(rate).unwrap_or(u64::MAX), Relaxed);
            }
            log::debug!("rank {}: partition {p} ({} B) replicated in {took:?}", inputs.rank.id.rank, info.file_len);
            Flow::Next
        }
        Err(Skip::Stopping) => Flow::Stop,
        Err(Skip::Failed(why)) => {
            report.failed += 1;
            log::warn!("rank {}: replication of partition {p}: {why}; its files are read remotely", inputs.rank.id.rank);
            Flow::Next
        }
    }
}

fn replicate_one(inputs: &Inputs, p: u32, len: u64, offsets: &OffsetMap) -> Result<(), Skip> {
    let dest = load::local_partition_path(&inputs.rank.id.local_dir, p);
    let mut tmp = dest.clone().into_os_string();
    tmp.push(".fetch");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let apart = large_payloads(&inputs.rank.view, offsets);
    let res = fetch_and_verify(inputs, p, len, offsets, &apart, &tmp);
    let writer = match res {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let failed = |what: &str, e: &dyn std::fmt::Display| Skip::Failed(format!("{what} {}: {e}", dest.display()));
    // The large files first: once the replica is published, an open of one
    // of them finds its extracted file.
    let extracted = writer.commit().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Skip::Failed(e)
    })?;
    std::fs::rename(&tmp, &dest).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        failed("renaming into", &e)
    })?;
    let f = File::open(&dest).map_err(|e| failed("opening", &e))?;
    // SAFETY: the daemon wrote and verified this file and never changes or
    // truncates it while the job runs; the mapping is read-only.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| failed("mapping", &e))?;
    let slot = inputs.replicas.get(p as usize).ok_or_else(|| Skip::Failed(format!("no partition {p}")))?;
    if let Some(tiers) = inputs.tiers.get() {
        for &id in &extracted {
            tiers.set_if(id, TIER_NONE, TIER_EXTRACTED);
        }
    }
    let _ = slot.set(Arc::new(map));
    if let Some(tiers) = inputs.tiers.get() {
        for &id in offsets.values() {
            tiers.set_if(id, TIER_NONE, TIER_PART);
        }
    }
    Ok(())
}

/// Fetches partition `p` (`len` bytes) into `tmp`, its large uncompressed
/// files (`apart`) straight into their own files ([`ReplicaWriter`]), and
/// verifies both.
fn fetch_and_verify<'a>(
    inputs: &Inputs,
    p: u32,
    len: u64,
    offsets: &OffsetMap,
    apart: &'a Apart,
    tmp: &Path,
) -> Result<ReplicaWriter<'a>, Skip> {
    let failed = |what: &str, e: &dyn std::fmt::Display| Skip::Failed(format!("{what} {}: {e}", tmp.display()));
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .custom_flags(libc::O_CLOEXEC)
        .open(tmp)
        .map_err(|e| failed("creating", &e))?;
    let mut out = ReplicaWriter::new(out, apart, &inputs.rank.id.local_dir);
    let holders: Vec<u32> = inputs.rank.placement.holders_for(p, 0).into_iter().filter(|&h| h != inputs.rank.id.rank).collect();
    if holders.is_empty() {
        return Err(Skip::Failed("no other rank holds it".into()));
    }
    let ranges: Vec<(u64, u64)> = (0..len.div_ceil(CHUNK)).map(|i| (i * CHUNK, CHUNK.min(len - i * CHUNK))).collect();
    // Warm buffers, reused for every range (fresh pages are costly).
    let mut spare: Vec<Vec<u8>> = Vec::new();
    let mut inflight: std::collections::VecDeque<(u64, u64, usize, crossbeam::channel::Receiver<FetchReply>)> = Default::default();
    let mut next = 0;
    let timeout = inputs.rank.remote_timeout + Duration::from_secs(CHUNK / (64 << 20) + 1);
    let ask = |off: u64, n: u64, holder_ix: usize, buf: Vec<u8>| -> Result<crossbeam::channel::Receiver<FetchReply>, Skip> {
        let (tx, rx) = crossbeam::channel::bounded(1);
        let holder = holders[holder_ix % holders.len()];
        let f = Fetch {
            node_id: PART_BIT | p,
            holder,
            stored_len: n,
            offset: off,
            buf: RecvBuf::heap(buf, n as usize),
            reply: tx,
            timeout,
            direct: None,
        };
        inputs.rank.comm.fetch(f).map_err(|_| Skip::Stopping)?;
        Ok(rx)
    };
    loop {
        while inflight.len() < WINDOW && next < ranges.len() {
            let (off, n) = ranges[next];
            let rx = ask(off, n, 0, spare.pop().unwrap_or_default())?;
            inflight.push_back((off, n, 0, rx));
            next += 1;
        }
        let Some((off, n, tries, rx)) = inflight.pop_front() else { break };
        if inputs.rank.stopping.load(Relaxed) {
            return Err(Skip::Stopping);
        }
        match rx.recv_timeout(timeout + Duration::from_secs(2)) {
            Ok(Ok((buf, _))) if buf.len() as u64 == n => {
                out.write(off, buf.bytes()).map_err(|e| failed("writing", &e))?;
                if let Some(pending) = inputs.replica_pending.get(p as usize) {
                    let _ = pending.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n).max(1)));
                }
                if let RecvMem::Heap(v) = buf.into_mem() {
                    spare.push(v);
                }
            }
            other => {
                let why = match other {
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(_)) => "a short answer".into(),
                    Err(_) => "no answer".into(),
                };
                if inputs.rank.stopping.load(Relaxed) {
                    return Err(Skip::Stopping);
                }
                if tries + 1 >= holders.len() {
                    return Err(Skip::Failed(format!("bytes {off}..{} from every holder: {why}", off + n)));
                }
                // Ask the next holder for this range, ahead of the others.
                let rx = ask(off, n, tries + 1, spare.pop().unwrap_or_default())?;
                inflight.push_front((off, n, tries + 1, rx));
            }
        }
    }
    out.finish(len).map_err(|e| failed("writing", &e))?;
    let got = load::verify_partition(tmp, &inputs.rank.view, p, offsets, &inputs.rank.stopping, &|off| apart.contains_key(&off))
        .map_err(|e| Skip::Failed(e.to_string()))?;
    out.verify_apart(&inputs.rank.view).map_err(Skip::Failed)?;
    if inputs.rank.stopping.load(Relaxed) {
        return Err(Skip::Stopping);
    }
    if got != len {
        return Err(Skip::Failed(format!("verified {got} bytes of {len}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_skips_local_partitions_and_starts_after_this_rank() {
        // 8 partitions on 4 ranks: rank 1 holds 1 and 5.
        let local: Vec<bool> = (0..8).map(|p| p % 4 == 1).collect();
        assert_eq!(order(8, 4, 1, &local), vec![2, 6, 3, 7, 0, 4]);
        // Every rank starts with a different holder.
        let firsts: Vec<u32> = (0..4).map(|r| order(8, 4, r, &vec![false; 8])[0] % 4).collect();
        assert_eq!(firsts, vec![1, 2, 3, 0]);
        assert!(order(3, 1, 0, &[true, true, true]).is_empty());
    }
}
