//! The held journal: which output each file of `out/` is, for recovery
//! after a kill. One append-only file per rank, `out/journal.held`: a
//! commit appends the output's path and record (one `write`), a drop or a
//! rename appends again, and a restart with the same `--local` replays it.
//! It replaces one sidecar file per output (`out/<id>.rec`, still read at
//! recovery): creating a file costs an inode, measured at 30-400 µs on
//! this disk (by block group), as much as the output's own file again.
//!
//! ```text
//! journal.held
//!   header (24 bytes): magic "FANSTHJ\0" | version u32 (1) | reserved u32 | xxh3 of bytes 0..16
//!   entries, repeated:
//!     0..4      entry length L (u32 LE, all of it)
//!     4         kind: 1 set (the output's name and record), 2 drop
//!     5..13     output id (u64 LE)
//!     set:      the record (OutRecord, 80 bytes), then the path (the rest)
//!     L-8..L    xxh3 of the entry's bytes 0..L-8
//! ```
//!
//! A replay stops at the first entry that is short or fails its checksum
//! (the one a kill cut): everything before it holds. When the file has
//! more than twice as many entries as live outputs (and at least
//! [`COMPACT_MIN`]), it is rewritten with one set per live output (a
//! temporary file renamed into place).

use fanstore_core::checksum::xxh3;
use fanstore_core::wire::OutRecord;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The journal's name in `out/`.
pub const JOURNAL: &str = "journal.held";
const MAGIC: [u8; 8] = *b"FANSTHJ\0";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 24;
const SET: u8 = 1;
const DROP: u8 = 2;
/// Entries below which the journal is never compacted.
pub const COMPACT_MIN: usize = 4096;

fn header() -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    let sum = xxh3(&b[..16]);
    b[16..24].copy_from_slice(&sum.to_le_bytes());
    b
}

fn entry(kind: u8, id: u64, set: Option<(&[u8], &OutRecord)>) -> Vec<u8> {
    let mut b = vec![0u8; 4];
    b.push(kind);
    b.extend_from_slice(&id.to_le_bytes());
    if let Some((path, rec)) = set {
        rec.encode_into(&mut b);
        b.extend_from_slice(path);
    }
    let len = (b.len() + 8) as u32;
    b[..4].copy_from_slice(&len.to_le_bytes());
    let sum = xxh3(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

/// Replays journal bytes: every live output's (id, path, record), and
/// whether the bytes ended cleanly (false: a damaged or cut entry, and
/// what follows it, was ignored). None if the header is not a journal's.
pub fn replay(bytes: &[u8]) -> Option<(HashMap<u64, (Vec<u8>, OutRecord)>, bool)> {
    if bytes.len() < HEADER_LEN || bytes[..HEADER_LEN] != header() {
        return None;
    }
    let mut live = HashMap::new();
    let mut at = HEADER_LEN;
    while at < bytes.len() {
        let Some(len) = bytes.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize) else { return Some((live, false)) };
        let Some(e) = bytes.get(at..at + len).filter(|_| len >= 21) else { return Some((live, false)) };
        let (body, sum) = e.split_at(len - 8);
        if u64::from_le_bytes(sum.try_into().unwrap_or([0; 8])) != xxh3(body) {
            return Some((live, false));
        }
        let id = u64::from_le_bytes(body[5..13].try_into().unwrap_or([0; 8]));
        match body[4] {
            SET => {
                let Some(rec) = body.get(13..13 + OutRecord::LEN).and_then(OutRecord::decode) else { return Some((live, false)) };
                live.insert(id, (body[13 + OutRecord::LEN..].to_vec(), rec));
            }
            DROP => {
                live.remove(&id);
            }
            _ => return Some((live, false)),
        }
        at += len;
    }
    Some((live, true))
}

#[derive(Default)]
struct Inner {
    /// Open for appending (None until the first entry, or after a failure).
    file: Option<File>,
    live: HashMap<u64, (Vec<u8>, OutRecord)>,
    entries: usize,
}

/// This rank's journal in `dir` (its `out/`), kept open for appending.
pub struct HeldJournal {
    dir: PathBuf,
    inner: Mutex<Inner>,
}

impl HeldJournal {
    pub fn new(dir: PathBuf) -> HeldJournal {
        HeldJournal { dir, inner: Mutex::new(Inner::default()) }
    }

    fn path(&self) -> PathBuf {
        self.dir.join(JOURNAL)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `e` (opening the journal, with its header, on first use).
    fn append(&self, inner: &mut Inner, e: &[u8], fsync: bool) -> std::io::Result<()> {
        if inner.file.is_none() {
            std::fs::create_dir_all(&self.dir)?;
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(self.path())?;
            if f.metadata()?.len() == 0 {
                f.write_all(&header())?;
            }
            inner.file = Some(f);
        }
        let f = inner.file.as_mut().ok_or(std::io::ErrorKind::NotFound)?;
        let r = f.write_all(e).and_then(|()| if fsync { f.sync_data() } else { Ok(()) });
        if r.is_err() {
            inner.file = None; // reopened (and checked) by the next append
        }
        inner.entries += 1;
        r
    }

    /// Output `rec.id`, held here, is named `path`.
    pub fn set(&self, path: &[u8], rec: &OutRecord, fsync: bool) -> Result<(), i32> {
        let mut inner = self.lock();
        self.append(&mut inner, &entry(SET, rec.id, Some((path, rec))), fsync).map_err(|e| crate::fdio::io_errno(&e))?;
        inner.live.insert(rec.id, (path.to_vec(), *rec));
        self.maybe_compact(&mut inner);
        Ok(())
    }

    /// Output `id` is renamed `path` (nothing if it is not held here).
    pub fn rename(&self, id: u64, path: &[u8], fsync: bool) {
        let rec = self.lock().live.get(&id).map(|(_, r)| *r);
        if let Some(rec) = rec {
            if let Err(e) = self.set(path, &rec, fsync) {
                log::warn!("{}: recording the rename of output {id}: errno {e}", self.path().display());
            }
        }
    }

    /// Output `id`, closed with its sum pending (`wire::SUM_PENDING`), has
    /// the whole-file xxh3 `sum`: returns the path it is named now (None if
    /// it is not held here).
    pub fn set_sum(&self, id: u64, sum: u64) -> Option<Vec<u8>> {
        let mut inner = self.lock();
        let (path, mut rec) = inner.live.get(&id).cloned()?;
        if rec.sum == fanstore_core::wire::SUM_PENDING {
            rec.sum = sum;
            if let Err(e) = self.append(&mut inner, &entry(SET, id, Some((&path, &rec))), false) {
                log::warn!("{}: recording the sum of output {id}: {e}", self.path().display());
            }
            inner.live.insert(id, (path.clone(), rec));
            self.maybe_compact(&mut inner);
        }
        Some(path)
    }

    /// Output `id` is no longer held here.
    pub fn drop_output(&self, id: u64) {
        let mut inner = self.lock();
        if inner.live.remove(&id).is_some() {
            if let Err(e) = self.append(&mut inner, &entry(DROP, id, None), false) {
                log::warn!("{}: recording the drop of output {id}: {e}", self.path().display());
            }
            self.maybe_compact(&mut inner);
        }
    }

    /// The path and record output `id` was last set with.
    pub fn get(&self, id: u64) -> Option<(Vec<u8>, OutRecord)> {
        self.lock().live.get(&id).cloned()
    }

    fn maybe_compact(&self, inner: &mut Inner) {
        if inner.entries < COMPACT_MIN || inner.entries < 2 * inner.live.len() {
            return;
        }
        let tmp = self.dir.join(format!("{JOURNAL}.tmp"));
        let r = (|| {
            let mut b = header().to_vec();
            for (id, (p, r)) in &inner.live {
                b.extend_from_slice(&entry(SET, *id, Some((p, r))));
            }
            let mut f = File::create(&tmp)?;
            f.write_all(&b)?;
            f.sync_data()?;
            std::fs::rename(&tmp, self.path())?;
            std::fs::OpenOptions::new().append(true).open(self.path())
        })();
        match r {
            Ok(f) => {
                inner.file = Some(f);
                inner.entries = inner.live.len();
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                log::warn!("{}: compacting: {e}", self.path().display());
                inner.entries = inner.live.len().max(COMPACT_MIN / 2); // try again later
            }
        }
    }
}

/// What a killed run left in `from` (its `out/`, set aside): every held
/// output's (path, record), from its journal and from sidecar files
/// (`<id>.rec`, written by earlier versions).
pub fn recovered(from: &Path) -> Vec<(Vec<u8>, OutRecord)> {
    let mut found: HashMap<u64, (Vec<u8>, OutRecord)> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir(from) {
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("rec") {
                continue;
            }
            let Ok(b) = std::fs::read(&p) else { continue };
            match crate::outputs::persist::decode_index(&p, &b) {
                Ok(mut recs) => {
                    if let Some((path, rec)) = recs.pop() {
                        found.insert(rec.id, (path, rec));
                    }
                }
                Err(_) => log::warn!("ignoring damaged {}", p.display()),
            }
        }
    }
    let jp = from.join(JOURNAL);
    if let Ok(b) = std::fs::read(&jp) {
        match replay(&b) {
            Some((live, clean)) => {
                if !clean {
                    log::warn!("{}: the last entry was cut (a kill while writing it): ignored", jp.display());
                }
                found.extend(live);
            }
            None => log::warn!("{}: not a held journal (bad header): ignored", jp.display()),
        }
    }
    let mut v: Vec<_> = found.into_values().collect();
    v.sort_by_key(|(_, r)| r.id);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64) -> OutRecord {
        OutRecord { size: 3, mode: libc::S_IFREG | 0o644, holder: 0, id, sum: 9, ..Default::default() }
    }

    #[test]
    fn set_rename_drop_replay() {
        let d = tempfile::tempdir().unwrap();
        let j = HeldJournal::new(d.path().to_path_buf());
        j.set(b"a/x", &rec(1), false).unwrap();
        j.set(b"a/y", &rec(2), true).unwrap();
        j.rename(1, b"b/x", false);
        j.drop_output(2);
        j.set(b"c", &rec(3), false).unwrap();
        let got = recovered(d.path());
        assert_eq!(got, vec![(b"b/x".to_vec(), rec(1)), (b"c".to_vec(), rec(3))]);
        assert_eq!(j.get(1), Some((b"b/x".to_vec(), rec(1))));
    }

    /// A cut or damaged entry ends the replay: what came before holds.
    #[test]
    fn a_cut_or_damaged_entry_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let j = HeldJournal::new(d.path().to_path_buf());
        j.set(b"one", &rec(1), false).unwrap();
        j.set(b"two", &rec(2), false).unwrap();
        let b = std::fs::read(d.path().join(JOURNAL)).unwrap();
        let (live, clean) = replay(&b).unwrap();
        assert!(clean && live.len() == 2);
        let (live, clean) = replay(&b[..b.len() - 3]).unwrap();
        assert!(!clean && live.len() == 1 && live.contains_key(&1));
        let mut bad = b.clone();
        let last = bad.len() - 12;
        bad[last] ^= 1;
        let (live, clean) = replay(&bad).unwrap();
        assert!(!clean && live.len() == 1);
        let mut bad = b.clone();
        bad[2] ^= 1;
        assert!(replay(&bad).is_none());
    }

    #[test]
    fn compaction_keeps_exactly_the_live_outputs() {
        let d = tempfile::tempdir().unwrap();
        let j = HeldJournal::new(d.path().to_path_buf());
        for i in 0..(COMPACT_MIN as u64 * 3) {
            j.set(format!("f{i}").as_bytes(), &rec(i), false).unwrap();
            if i % 4 != 0 {
                j.drop_output(i);
            }
        }
        let len = std::fs::metadata(d.path().join(JOURNAL)).unwrap().len();
        let got = recovered(d.path());
        assert_eq!(got.len(), COMPACT_MIN * 3 / 4);
        assert!(got.iter().all(|(p, r)| r.id % 4 == 0 && p == format!("f{}", r.id).as_bytes()));
        assert!(len < COMPACT_MIN as u64 * 3 * 80, "never compacted: {len} bytes");
        assert!(!d.path().join(format!("{JOURNAL}.tmp")).exists());
    }
}
