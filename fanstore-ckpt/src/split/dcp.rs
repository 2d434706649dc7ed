//! PyTorch Distributed Checkpoint shards (`torch.distributed.checkpoint`,
//! DCP): the `__<rank>_<n>.distcp` files of `FileSystemWriter` in its default
//! serialization. DCP writes every item of a rank's share of the state dict
//! with its own `torch.save` into one stream, so a shard is torch.save zip
//! archives back to back, each with offsets relative to its own start:
//!
//! ```text
//! 0          archive 0: local entries ... central directory ... [ZIP64 EOCD + locator] EOCD
//! end(0)     archive 1: PK\3\4 ...                                                        EOCD
//! ...
//! end(n-1) = file length
//! ```
//!
//! The local headers carry no sizes (torch sets the data-descriptor flag),
//! so an archive's end is found from its end record: each `PK\5\6` after the
//! archive's start is tried in file order, and the first one whose archive
//! (start .. record end) [`zip::split`] accepts as a torch.save archive ends
//! it. A signature that happens to sit inside a payload fails that check and
//! the search goes on. Every archive must be accepted and the last one must
//! end at the end of the file; anything else means "not recognised".
//!
//! Units are each archive's storages, named `item<k>` (k: the archive's
//! place in the shard, stable between checkpoints of the same state dict:
//! DCP orders its write items deterministically) when the archive is one
//! tensor, else `item<k>/` and the storage's name in its archive. The dtype
//! and shape come from each archive's data.pkl. The tensors' fully
//! qualified names live in the checkpoint's `.metadata`, a file DCP writes
//! after the shards; they are not looked up.

use super::{fill_glue, sort_disjoint, zip, Format, Piece, Split, UnitMeta};
use std::ops::Range;

const EOCD_SIG: &[u8; 4] = b"PK\x05\x06";
const EOCD_LEN: usize = 22;
const LOCAL_SIG: &[u8; 4] = b"PK\x03\x04";
/// End-record signatures inside payloads tried before giving up on a file:
/// a bound on the work a crafted file can cause (random tensor bytes hold
/// one about every 4 GiB).
const MAX_FALSE_ENDS: usize = 64;

/// Splits a shard of concatenated torch.save archives; `None` unless the
/// whole of `b` is two or more of them.
pub(super) fn split(b: &[u8]) -> Option<Split> {
    split_skipping(b, &[])
}

/// [`split`] of a shard whose ranges `zeros` (sorted, disjoint) the caller
/// knows hold only zero bytes: the search for end records does not read
/// them. The result is the same, since a signature holds no zero byte.
pub(super) fn split_skipping(b: &[u8], zeros: &[Range<usize>]) -> Option<Split> {
    let mut units: Vec<(Range<usize>, UnitMeta)> = Vec::new();
    let mut start = 0;
    let mut items = 0usize;
    let mut false_ends = 0;
    let finder = memchr::memmem::Finder::new(EOCD_SIG);
    while start < b.len() {
        if !b[start..].starts_with(LOCAL_SIG) {
            return None;
        }
        let (end, archive) = next_archive(b, start, &finder, zeros, &mut false_ends)?;
        let alone = archive.unit_count() == 1;
        for p in archive.pieces {
            if let Piece::Unit(r, m) = p {
                let mut name = format!("item{items}").into_bytes();
                if !(alone && m.name.starts_with(b"data/")) {
                    name.push(b'/');
                    name.extend_from_slice(&m.name);
                }
                units.push((r.start + start..r.end + start, UnitMeta { name, ..m }));
            }
        }
        items += 1;
        start = end;
    }
    if items < 2 || !sort_disjoint(&mut units) {
        return None;
    }
    Some(Split { format: Format::TorchDcp, pieces: fill_glue(b.len(), units) })
}

/// The first torch.save archive starting at `start`: its end and its split
/// (offsets relative to `start`). Counts the end records it passes over.
fn next_archive(b: &[u8], start: usize, finder: &memchr::memmem::Finder, zeros: &[Range<usize>], false_ends: &mut usize) -> Option<(usize, Split)> {
    let mut from = start;
    while let Some(eocd) = find_outside(b, from, finder, zeros) {
        from = eocd + 1;
        if *false_ends > MAX_FALSE_ENDS {
            return None;
        }
        *false_ends += 1;
        let Some(comment) = b.get(eocd + 20..eocd + 22) else { continue };
        let end = eocd + EOCD_LEN + u16::from_le_bytes([comment[0], comment[1]]) as usize;
        if end > b.len() {
            continue;
        }
        if let Some(s) = zip::split(&b[start..end]).filter(|s| s.format == Format::TorchZip) {
            *false_ends -= 1;
            return Some((end, s));
        }
    }
    None
}

/// The first match of `finder` at or after `from` in `b`, searched
/// between the ranges `zeros` (sorted, disjoint; bytes the caller knows are
/// zero, where no signature can start or end: it holds no zero byte).
fn find_outside(b: &[u8], from: usize, finder: &memchr::memmem::Finder, zeros: &[Range<usize>]) -> Option<usize> {
    let mut at = from;
    let mut k = zeros.partition_point(|z| z.end <= at);
    while at < b.len() {
        let stop = zeros.get(k).map_or(b.len(), |z| z.start.clamp(at, b.len()));
        if let Some(i) = finder.find(&b[at..stop]) {
            return Some(at + i);
        }
        at = zeros.get(k)?.end.max(at);
        k += 1;
    }
    None
}
