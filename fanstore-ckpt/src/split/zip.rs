//! Zip archives as torch.save (PyTorch's inline_container) and numpy's
//! savez write them. Entries are found through the central directory, never
//! by scanning local headers; CRCs are never checked (PyTorch may write zero).
//!
//! ```text
//! local header (30)        0 sig PK\3\4  6 flags  8 method  14 crc
//!                         18 csize u32  22 usize u32  26 name len  28 extra len
//!                         30 name, extra (ZIP64 0x0001, PyTorch's "FB" padding
//!                            that aligns the data, 64 bytes by default), data,
//!                            then an optional data descriptor (flag bit 3)
//! central header (46)      0 sig PK\1\2  8 flags  10 method  20 csize u32
//!                         24 usize u32  28 name len  30 extra len  32 comment len
//!                         34 disk u16  42 local header offset u32
//!                         46 name, extra (ZIP64 0x0001: usize, csize, offset,
//!                            disk, each present only if its 32-bit field is all ones)
//! ZIP64 EOCD record (56+)  0 sig PK\6\6  4 record size u64 (after this field)
//!                         24 entries u64  40 cd size  48 cd offset
//! ZIP64 EOCD locator (20)  0 sig PK\6\7  8 ZIP64 EOCD offset u64   (just before the EOCD)
//! EOCD (22 + comment)      0 sig PK\5\6  10 entries u16  12 cd size u32  16 cd offset u32
//!                         20 comment len
//! ```
//!
//! A unit is an entry's payload (`data start .. data start + csize`);
//! everything else (headers, padding, descriptors, the central directory,
//! non-tensor entries) is glue. A bad central directory (or one that does
//! not end where the end records begin), a local header that disagrees with
//! it, overlapping entries, encryption or multi-disk archives mean "not
//! recognised" (the caller falls back to chunking).

use super::npy::parse_npy_header;
use super::{fill_glue, sort_disjoint, Format, Split, UnitMeta};
use fanstore_core::le::{get_u16, get_u32, get_u64};
use std::ops::Range;

const LOCAL_SIG: u32 = 0x0403_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const EOCD_SIG: u32 = 0x0605_4b50;
const Z64_EOCD_SIG: u32 = 0x0606_4b50;
const Z64_LOC_SIG: u32 = 0x0706_4b50;
const LOCAL_LEN: usize = 30;
const CENTRAL_LEN: usize = 46;
const EOCD_LEN: usize = 22;
const Z64_LOC_LEN: usize = 20;
const Z64_EOCD_LEN: usize = 56;

/// One entry as the central directory describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipEntry {
    pub name: Vec<u8>,
    pub method: u16,
    pub local_header: usize,
    /// The stored (possibly compressed) payload.
    pub data: Range<usize>,
}

/// Reads the central directory of `b` and checks every entry against its
/// local header. `None` if anything is inconsistent.
pub fn parse_zip(b: &[u8]) -> Option<Vec<ZipEntry>> {
    let eocd = find_eocd(b)?;
    if get_u16(b, eocd + 4)? != 0 || get_u16(b, eocd + 6)? != 0 {
        return None; // multi-disk
    }
    let mut count = get_u16(b, eocd + 10)? as u64;
    let mut cd_size = get_u32(b, eocd + 12)? as u64;
    let mut cd_off = get_u32(b, eocd + 16)? as u64;
    let mut cd_limit = eocd; // the central directory ends before this
    if eocd >= Z64_LOC_LEN && get_u32(b, eocd - Z64_LOC_LEN)? == Z64_LOC_SIG {
        let loc = eocd - Z64_LOC_LEN;
        let rec = usize::try_from(get_u64(b, loc + 8)?).ok()?;
        // The record (12 bytes + its size field) ends where the locator begins.
        let rec_end = rec.checked_add(12)?.checked_add(usize::try_from(get_u64(b, rec + 4)?).ok()?)?;
        if rec.checked_add(Z64_EOCD_LEN)? > loc || get_u32(b, rec)? != Z64_EOCD_SIG || rec_end != loc {
            return None;
        }
        if get_u32(b, rec + 16)? != 0 || get_u32(b, rec + 20)? != 0 {
            return None;
        }
        count = get_u64(b, rec + 32)?;
        cd_size = get_u64(b, rec + 40)?;
        cd_off = get_u64(b, rec + 48)?;
        cd_limit = rec;
    }
    let cd_off = usize::try_from(cd_off).ok()?;
    let cd_end = cd_off.checked_add(usize::try_from(cd_size).ok()?)?;
    // The central directory ends where the end records begin. Checked with
    // equality: in archives written back to back (a DCP shard), the last
    // one's offsets are relative to its own start, and when the archives
    // have the same layout they name the first archive's directory and
    // entries, which would parse as one archive followed by junk.
    if cd_end != cd_limit || count == 0 || count > (cd_size / CENTRAL_LEN as u64) {
        return None;
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut at = cd_off;
    for _ in 0..count {
        let e = central_entry(b, &mut at, cd_end)?;
        if e.data.end > cd_off {
            return None;
        }
        entries.push(e);
    }
    if at != cd_end {
        return None;
    }
    // Entries (local header through payload) must not overlap.
    let mut spans: Vec<Range<usize>> = entries.iter().map(|e| e.local_header..e.data.end).collect();
    spans.sort_by_key(|r| r.start);
    if spans.windows(2).any(|w| w[1].start < w[0].end) {
        return None;
    }
    Some(entries)
}

fn find_eocd(b: &[u8]) -> Option<usize> {
    let last = b.len().checked_sub(EOCD_LEN)?;
    let first = last.saturating_sub(u16::MAX as usize);
    (first..=last).rev().find(|&p| {
        get_u32(b, p) == Some(EOCD_SIG) && get_u16(b, p + 20).map(|c| p + EOCD_LEN + c as usize) == Some(b.len())
    })
}

fn central_entry(b: &[u8], at: &mut usize, cd_end: usize) -> Option<ZipEntry> {
    let h = *at;
    if h.checked_add(CENTRAL_LEN)? > cd_end || get_u32(b, h)? != CENTRAL_SIG {
        return None;
    }
    let flags = get_u16(b, h + 8)?;
    let method = get_u16(b, h + 10)?;
    let mut csize = get_u32(b, h + 20)? as u64;
    let mut usize_ = get_u32(b, h + 24)? as u64;
    let name_len = get_u16(b, h + 28)? as usize;
    let extra_len = get_u16(b, h + 30)? as usize;
    let comment_len = get_u16(b, h + 32)? as usize;
    let mut disk = get_u16(b, h + 34)? as u32;
    let mut lho = get_u32(b, h + 42)? as u64;
    let name_at = h + CENTRAL_LEN;
    let extra_at = name_at + name_len;
    let next = extra_at + extra_len + comment_len;
    if next > cd_end || flags & 1 != 0 {
        return None; // past the directory, or encrypted
    }
    let name = b[name_at..extra_at].to_vec();
    // ZIP64 extended information: only the fields whose 32-bit value is all ones, in order.
    let mut x = extra_at;
    let extra_end = extra_at + extra_len;
    while x + 4 <= extra_end {
        let id = get_u16(b, x)?;
        let len = get_u16(b, x + 2)? as usize;
        let body = x + 4;
        if body + len > extra_end {
            return None;
        }
        if id == 1 {
            let mut f = body;
            let mut take = |v: &mut u64| -> Option<()> {
                if f + 8 > body + len {
                    return None;
                }
                *v = get_u64(b, f)?;
                f += 8;
                Some(())
            };
            if usize_ == 0xFFFF_FFFF {
                take(&mut usize_)?;
            }
            if csize == 0xFFFF_FFFF {
                take(&mut csize)?;
            }
            if lho == 0xFFFF_FFFF {
                take(&mut lho)?;
            }
            if disk == 0xFFFF {
                disk = get_u32(b, f).filter(|_| f + 4 <= body + len)?;
            }
        }
        x = body + len;
    }
    if disk != 0 || (method == 0 && csize != usize_) {
        return None;
    }
    // The local header must agree with the central one.
    let l = usize::try_from(lho).ok()?;
    if get_u32(b, l)? != LOCAL_SIG || get_u16(b, l + 8)? != method {
        return None;
    }
    let lname = get_u16(b, l + 26)? as usize;
    let lextra = get_u16(b, l + 28)? as usize;
    if b.get(l + LOCAL_LEN..l + LOCAL_LEN + lname)? != name.as_slice() {
        return None;
    }
    let start = l + LOCAL_LEN + lname + lextra;
    let end = start.checked_add(usize::try_from(csize).ok()?)?;
    if end > b.len() {
        return None;
    }
    *at = next;
    Some(ZipEntry { name, method, local_header: l, data: start..end })
}

/// Renames `data/<key>` units after the tensors data.pkl says use them
/// (state_dict names, dtype, shape), when every name found is unique; a
/// tensor saved alone keeps its entry name and gains its dtype and shape.
fn name_storages(b: &[u8], entries: &[ZipEntry], dir: &[u8], units: &mut [(Range<usize>, UnitMeta)]) {
    let mut pkl_name = dir.to_vec();
    pkl_name.extend_from_slice(b"data.pkl");
    let Some(pkl) = entries.iter().find(|e| e.name == pkl_name && e.method == 0) else { return };
    let Some(map) = super::pickle::torch_storages(&b[pkl.data.clone()]) else { return };
    let mut named: Vec<Option<&super::pickle::StorageInfo>> = Vec::with_capacity(units.len());
    let mut seen = std::collections::HashSet::new();
    for (_, m) in units.iter() {
        let key = std::str::from_utf8(&m.name[b"data/".len()..]).ok();
        let info = key.and_then(|k| map.get(k));
        // A tensor saved alone (the pickle's root) has an empty path: it keeps the entry name.
        let name = info.filter(|i| !i.name.is_empty()).map_or(&m.name[..], |i| i.name.as_bytes());
        if !seen.insert(name) {
            return; // two units would share a name: keep the entry names
        }
        named.push(info);
    }
    for ((_, m), info) in units.iter_mut().zip(named) {
        if let Some(i) = info {
            if !i.name.is_empty() {
                m.name = i.name.as_bytes().to_vec();
            }
            m.dtype = i.dtype.clone();
            m.shape = i.shape.clone();
        }
    }
}

/// The archive directory (first path component) shared by every entry, as
/// PyTorch's reader requires.
fn archive_dir(entries: &[ZipEntry]) -> Option<&[u8]> {
    let first = &entries.first()?.name;
    let slash = first.iter().position(|&c| c == b'/')?;
    let dir = &first[..=slash];
    entries.iter().all(|e| e.name.starts_with(dir)).then_some(dir)
}

pub(super) fn split(b: &[u8]) -> Option<Split> {
    let entries = parse_zip(b)?;
    let mut units = Vec::new();
    let format;
    if let Some(dir) = archive_dir(&entries).filter(|dir| {
        entries.iter().any(|e| {
            let rest = &e.name[dir.len()..];
            rest == b"data.pkl" || rest == b"constants.pkl"
        })
    }) {
        format = Format::TorchZip;
        for e in &entries {
            // `<archive>/data/<key>`: a storage. Named without the archive
            // directory, which torch.save derives from the file name.
            let rest = &e.name[dir.len()..];
            if let Some(key) = rest.strip_prefix(b"data/") {
                if !key.is_empty() && !key.contains(&b'/') {
                    units.push((e.data.clone(), UnitMeta { name: rest.to_vec(), ..UnitMeta::default() }));
                }
            }
        }
        name_storages(b, &entries, dir, &mut units);
    } else if entries.iter().all(|e| e.name.ends_with(b".npy")) {
        format = Format::Npz;
        for e in &entries {
            let payload = &b[e.data.clone()];
            match parse_npy_header(payload).filter(|_| e.method == 0) {
                Some(h) => units.push((
                    e.data.start + h.data_offset..e.data.end,
                    UnitMeta { name: e.name.clone(), dtype: h.descr, shape: h.shape },
                )),
                None => units.push((e.data.clone(), UnitMeta { name: e.name.clone(), ..UnitMeta::default() })),
            }
        }
    } else {
        return None;
    }
    if !sort_disjoint(&mut units) {
        return None;
    }
    Some(Split { format, pieces: fill_glue(b.len(), units) })
}
