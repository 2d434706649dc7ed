//! The store's packs ([`mod@crate::pack`]): which exist, the one units are
//! appended to, how many bytes of each hold live units, where every unit
//! is, and compaction.
//!
//! **Appending.** A new unit is encoded, then reserves `128 + body` bytes
//! at the end of an active pack (a short critical section) and is
//! pwritten there. Each encode/write thread of a commit (a *lane*) has an
//! active pack of its own: buffered writes into one file serialize on its
//! inode lock (two threads writing 5 MiB records into one file took 2-4x
//! as long as into two files here). Past [`crate::StoreOptions::pack_size`] the next
//! reservation starts a new pack. A failed write retires the active pack
//! (the next unit starts a new one), so that nothing committed is ever
//! appended after a hole.
//!
//! **Locations at open.** Every pack's record headers are scanned (one
//! pread per record, bodies skipped); a unit referenced by a live recipe,
//! or needed as a delta base, is located in the pack records first and in
//! a unit file (`<blake3>.fsu`, stores written before packs) second. A unit
//! with records in several packs takes the latest whose body checks out.
//! A pack whose scan stopped early (a torn append) is truncated at its last
//! good record when every needed unit was found, and reported by
//! [`CheckpointStore::repairs`]; when some unit is missing it is left
//! untouched and marked damaged (never appended to, compacted or deleted).
//!
//! **Dead bytes and compaction.** Freeing a unit leaves its record in place
//! as dead bytes of its pack. When a pack holds less than
//! [`crate::StoreOptions::compact_below_percent`] live bytes (the active
//! one once it holds at least `min(1 MiB, pack_size / 2)` of records; a
//! new active pack is started first), its live records are appended to the
//! active pack, the destination is
//! fdatasync'd (always: compaction must not make old data less durable),
//! the locations switch, and the old pack is unlinked. A crash before the
//! unlink leaves two records of those units (either reads back; open takes
//! the latest that checks out); after it, only the synced copies. Delta
//! bases are units like any other (their dependants keep them live), and
//! records are copied as they are, so chains are unchanged.
//!
//! **Extents.** An external record's payload lies in an extent file
//! ([`mod@crate::extent`]). The set counts each extent's live payload bytes
//! (its glue and the units other checkpoints stored first are never live
//! there). An extent with none is deleted; one below the same threshold has
//! its live units appended to the active pack as raw records, synced, the
//! locations switched, then it is deleted: a crash in between leaves both
//! records, and open takes the latest usable one (an external record is
//! usable only while its extent exists).

use crate::error::{CkptError, Result};
use crate::pack::{self, PackHeader, Record};
use crate::store::CheckpointStore;
use crate::unit::{self, Hash, UnitHeader};
use fanstore_core::FormatError;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

/// Called with the name of each step of a compaction (see
/// [`CheckpointStore::set_compaction_hook`]).
pub type CompactionHook = Box<dyn Fn(&str) + Send + Sync>;

/// Where a unit's stored bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnitLoc {
    /// A unit file `units/<blake3>.fsu` (stores written before packs).
    File,
    /// The record at byte `off` of pack `seq`.
    Pack { seq: u64, off: u64 },
}

/// One pack as the store knows it.
pub(crate) struct Pack {
    pub path: PathBuf,
    pub file: Arc<File>,
    /// Bytes of the file, reservations included (the next record goes here).
    pub end: u64,
    /// Bytes of the records that hold live units.
    pub live: u64,
    /// Holds bytes a scan could not parse while some needed unit was not
    /// found: never appended to, truncated, compacted or deleted.
    pub damaged: bool,
}

/// One extent (a committed file adopted whole, see [`mod@crate::extent`]).
/// Not kept open: a store can hold more extents than a process may have
/// descriptors, and an open per unit read costs microseconds.
pub(crate) struct Extent {
    pub path: PathBuf,
    pub nonce: u64,
    /// Bytes of the file.
    pub len: u64,
    /// Payload bytes of the live units in it.
    pub live: u64,
}

/// Every pack of a store, and the one being appended to.
pub(crate) struct PackSet {
    dir: PathBuf,
    packs: BTreeMap<u64, Pack>,
    /// Extents by sequence number (shared with packs: never the same).
    extents: BTreeMap<u64, Extent>,
    /// The pack each writer thread (lane) appends to.
    active: Vec<Option<u64>>,
    pack_size: u64,
    /// No new pack takes a lower number (packs open left unread, as damaged, keep theirs).
    next_floor: u64,
}

impl PackSet {
    pub fn new(units_dir: PathBuf, opts: &crate::StoreOptions) -> PackSet {
        PackSet {
            dir: units_dir,
            packs: BTreeMap::new(),
            extents: BTreeMap::new(),
            active: vec![None; opts.threads + 1],
            pack_size: opts.pack_size.max(pack::HEADER_LEN as u64 + 1),
            next_floor: 1,
        }
    }

    fn is_active(&self, seq: u64) -> bool {
        self.active.contains(&Some(seq))
    }

    /// The highest sequence number (never deleted, so never reused).
    fn last(&self) -> Option<u64> {
        self.packs.keys().next_back().copied()
    }

    /// Reserves `len` bytes for one record in the pack of writer `lane`:
    /// (pack, its file and path, offset).
    fn reserve(&mut self, lane: usize, len: u64) -> Result<(u64, Arc<File>, PathBuf, u64)> {
        let size = self.pack_size;
        let lane = lane % self.active.len();
        let fits = |p: &Pack| !p.damaged && (p.end == pack::HEADER_LEN as u64 || p.end.saturating_add(len) <= size);
        let seq = match self.active[lane].filter(|s| self.packs.get(s).is_some_and(fits)) {
            Some(s) => s,
            None => self.roll(lane)?,
        };
        let Some(p) = self.packs.get_mut(&seq) else { unreachable!("the active pack is in the set") };
        let off = p.end;
        p.end += len;
        Ok((seq, p.file.clone(), p.path.clone(), off))
    }

    /// The next sequence number for a pack or an extent.
    fn next_seq(&mut self) -> u64 {
        let top = self.last().max(self.extents.keys().next_back().copied());
        let seq = top.map_or(1, |s| s + 1).max(self.next_floor);
        self.next_floor = seq + 1;
        seq
    }

    /// Starts a new pack for writer `lane`.
    fn roll(&mut self, lane: usize) -> Result<u64> {
        let seq = self.next_seq();
        let header = PackHeader { seq, nonce: pack::new_nonce(seq) };
        let path = pack::path(&self.dir, seq);
        let file = Arc::new(pack::create(&path, &header)?);
        self.packs.insert(seq, Pack { path, file, end: pack::HEADER_LEN as u64, live: 0, damaged: false });
        self.active[lane] = Some(seq);
        Ok(seq)
    }

    /// After a failed write into pack `seq`: append nothing more to it.
    fn retire(&mut self, seq: u64) {
        for a in self.active.iter_mut().filter(|a| **a == Some(seq)) {
            *a = None;
        }
    }

    /// Every pack's length now: what [`Self::give_back`] returns to.
    pub(crate) fn mark(&self) -> BTreeMap<u64, u64> {
        self.packs.iter().map(|(&s, p)| (s, p.end)).collect()
    }

    /// Gives back the bytes appended since `mark` (a commit that failed, say
    /// on a full disk, must not keep the disk full): each pack is cut back to
    /// its marked length, a pack created since to its header (it keeps its
    /// number: numbers are never reused). Damaged packs are left alone.
    /// Nothing appended since `mark` may be referenced: commits do not
    /// overlap, and a failed one registered none of its units.
    pub(crate) fn give_back(&mut self, mark: &BTreeMap<u64, u64>) {
        for (seq, p) in self.packs.iter_mut() {
            let to = mark.get(seq).copied().unwrap_or(pack::HEADER_LEN as u64);
            if p.damaged || p.end <= to {
                continue;
            }
            // If the cut fails the bytes stay as dead bytes: compaction takes them later.
            if p.file.set_len(to).is_ok() {
                p.end = to;
            }
        }
    }

    fn add_live(&mut self, seq: u64, n: u64) {
        if let Some(p) = self.packs.get_mut(&seq) {
            p.live += n;
        }
    }

    fn sub_live(&mut self, seq: u64, n: u64) {
        if let Some(p) = self.packs.get_mut(&seq) {
            p.live = p.live.saturating_sub(n);
        }
    }

    /// Links `f` (`len` bytes, which nothing writes any more) into the
    /// units directory as a new extent: (sequence number, nonce).
    pub(crate) fn adopt(&mut self, f: &File, len: u64) -> Result<(u64, u64)> {
        let seq = self.next_seq();
        let nonce = pack::new_nonce(seq);
        let path = crate::extent::path(&self.dir, seq, nonce);
        crate::extent::link(f, &path).map_err(|e| CkptError::io(&path, e))?;
        self.extents.insert(seq, Extent { path, nonce, len, live: 0 });
        Ok((seq, nonce))
    }

    /// Deletes extent `seq` (nothing may refer to it any more).
    pub(crate) fn drop_extent(&mut self, seq: u64) -> Result<()> {
        match self.extents.remove(&seq) {
            Some(x) => std::fs::remove_file(&x.path).map_err(|e| CkptError::io(&x.path, e)),
            None => Ok(()),
        }
    }

    fn add_extent_live(&mut self, seq: u64, n: u64) {
        if let Some(x) = self.extents.get_mut(&seq) {
            x.live += n;
        }
    }

    fn sub_extent_live(&mut self, seq: u64, n: u64) {
        if let Some(x) = self.extents.get_mut(&seq) {
            x.live = x.live.saturating_sub(n);
        }
    }

    /// Extent `seq`'s path, if its nonce is `nonce`.
    fn extent_path(&self, seq: u64, nonce: u64) -> Option<PathBuf> {
        self.extents.get(&seq).filter(|x| x.nonce == nonce).map(|x| x.path.clone())
    }

    /// An extent to compact: fewer than `percent` % of its bytes live (or none).
    fn sparse_extent(&self, percent: u8) -> Option<u64> {
        self.extents
            .iter()
            .find(|(_, x)| x.live == 0 || (x.len as u128) * percent as u128 > x.live as u128 * 100)
            .map(|(&s, _)| s)
    }

    /// Pack `seq`'s file and path.
    fn file(&self, seq: u64) -> Option<(Arc<File>, PathBuf)> {
        self.packs.get(&seq).map(|p| (p.file.clone(), p.path.clone()))
    }

    /// A pack to compact: not damaged, not the last one unless it is the
    /// active one, with fewer than `percent` % of its record bytes live
    /// (or none at all). The active pack also needs `min(1 MiB, pack
    /// size / 2)` of records, so that small frees do not roll pack after
    /// pack; without it a store smaller than one pack would never give
    /// back the space of deleted checkpoints.
    fn sparse(&self, percent: u8) -> Option<u64> {
        let last = self.last();
        let floor = (1u64 << 20).min(self.pack_size / 2);
        self.packs
            .iter()
            .filter(|(&s, p)| !p.damaged && (Some(s) != last || self.is_active(s)))
            .find(|(&s, p)| {
                let records = p.end - pack::HEADER_LEN as u64;
                if self.is_active(s) && records < floor.max(1) {
                    return false;
                }
                p.live == 0 || (records as u128) * percent as u128 > p.live as u128 * 100
            })
            .map(|(&s, _)| s)
    }

    /// (packs and extents, bytes of their files that hold no live unit).
    pub fn usage(&self) -> (u64, u64) {
        let dead = self.packs.values().map(|p| p.end.saturating_sub(p.live)).sum::<u64>()
            + self.extents.values().map(|x| x.len.saturating_sub(x.live)).sum::<u64>();
        ((self.packs.len() + self.extents.len()) as u64, dead)
    }
}

fn lock(m: &Mutex<PackSet>) -> MutexGuard<'_, PackSet> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Copies `len` bytes from `src` at `from` to `dst` at `to`.
fn copy_range(src: &File, from: u64, dst: &File, to: u64, len: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; len.min(4 << 20) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        src.read_exact_at(&mut buf[..n], from + done)?;
        dst.write_all_at(&buf[..n], to + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Names unit `h` in a format error found in its pack record.
fn name_unit(e: CkptError, h: &Hash) -> CkptError {
    let tag = |entry: String| format!("{entry} of {}", unit::hex(h));
    let CkptError::Format(e) = e else { return e };
    let named = match e {
        FormatError::Checksum { file, entry, offset, stored, computed } => {
            FormatError::Checksum { file, entry: tag(entry), offset, stored, computed }
        }
        FormatError::Corrupt { file, entry, offset, problem } => FormatError::Corrupt { file, entry: tag(entry), offset, problem },
        FormatError::Truncated { file, entry, offset, needed, len } => FormatError::Truncated { file, entry: tag(entry), offset, needed, len },
        other => other,
    };
    named.into()
}

/// The records of one unit found by the scans at open: (pack, record).
type Candidates = Vec<(u64, Record)>;

/// The scans of every pack at open (path, open file, records), by sequence number.
type Scans = BTreeMap<u64, (PathBuf, File, pack::Scan)>;

/// Chooses which record of unit `h` (of `len` bytes when known) to use
/// when several packs hold one: the latest whose body checks out and whose
/// delta base can be located in turn (all records of a unit decode to the
/// same bytes, but one left dead by an unlink may be a delta against a
/// base that is gone since, and with one pack per writer lane a higher
/// sequence number is not always a later write); the latest, failing
/// that. A single record is taken as it is (damage shows when it is read).
fn pick_record(h: &Hash, len: Option<u64>, index: &HashMap<Hash, Candidates>, scans: &Scans, units_dir: &std::path::Path, depth: u8) -> Option<(u64, Record)> {
    let cands: Vec<&(u64, Record)> = index.get(h)?.iter().filter(|(_, r)| len.is_none_or(|l| r.head.len == l)).collect();
    if cands.len() <= 1 {
        return cands.first().map(|c| **c);
    }
    let base_found = |b: &Hash| {
        depth < crate::units::CHAIN_LIMIT
            && (pick_record(b, None, index, scans, units_dir, depth + 1).is_some() || unit::path(units_dir, b).exists())
    };
    let extent_found = |x: &unit::ExtentRef| crate::extent::path(units_dir, x.seq, x.nonce).exists();
    let usable = |(seq, r): &(u64, Record)| {
        scans.get(seq).is_some_and(|(p, f, _)| pack::body_ok(p, f, r))
            && r.head.base.as_ref().is_none_or(base_found)
            && r.head.extent.as_ref().is_none_or(extent_found)
    };
    cands.iter().rev().find(|c| usable(c)).or(cands.last()).map(|c| **c)
}

impl CheckpointStore {
    pub(crate) fn packs(&self) -> MutexGuard<'_, PackSet> {
        lock(&self.packs)
    }

    /// Appends one encoded unit (`head`, `body`) to the pack of writer
    /// `lane` and returns where it is. The pack's live bytes count it once
    /// the commit registers it ([`Self::register_written`]).
    pub(crate) fn append_unit(&self, lane: usize, head: &UnitHeader, body: &[u8]) -> Result<UnitLoc> {
        let len = unit::HEADER_LEN as u64 + body.len() as u64;
        let (seq, f, path, off) = self.packs().reserve(lane, len)?;
        let r = f.write_all_at(&head.encode(), off).and_then(|_| f.write_all_at(body, off + unit::HEADER_LEN as u64));
        if let Err(e) = r {
            self.packs().retire(seq);
            return Err(CkptError::io(path, e));
        }
        Ok(UnitLoc::Pack { seq, off })
    }

    /// Counts a unit located at `loc` (`len` record bytes; an external
    /// one's `payload` bytes in extent `extent`) as live.
    pub(crate) fn count_live(&self, loc: Option<UnitLoc>, len: u64, extent: Option<u64>, payload: u64) {
        let mut set = self.packs();
        if let Some(UnitLoc::Pack { seq, .. }) = loc {
            set.add_live(seq, len);
        }
        if let Some(x) = extent {
            set.add_extent_live(x, payload);
        }
    }

    /// A freed unit's stored bytes: a unit file is deleted, a pack record
    /// becomes dead bytes of its pack, an external unit's payload dead
    /// bytes of its extent.
    pub(crate) fn forget_stored(&self, h: &Hash, u: &crate::units::UnitInfo) {
        match u.loc {
            Some(UnitLoc::Pack { seq, .. }) => {
                let mut set = self.packs();
                set.sub_live(seq, u.file_len);
                if let Some(x) = u.extent {
                    set.sub_extent_live(x, u.len);
                }
            }
            Some(UnitLoc::File) | None => {
                let _ = std::fs::remove_file(self.unit_path(h));
            }
        }
    }

    /// Loads unit `h` from where it is stored (see [`unit::load_at`]).
    pub(crate) fn load_stored(&self, h: &Hash, dst: &mut [u8], full: bool, budget: u8) -> Result<()> {
        let loc = self.units.get(h).and_then(|u| u.loc);
        let Some(UnitLoc::Pack { seq, off }) = loc else {
            return unit::load_into(&self.unit_path(h), h, dst, full, budget, &mut |b, bud, d| self.load_unit_within(b, d, false, bud))
                .map(|_| ());
        };
        let Some((f, path)) = self.packs().file(seq) else {
            return Err(CkptError::Invalid(format!("unit {} is in pack {seq}, which is gone", unit::hex(h))));
        };
        let mut from_base = false;
        let head = unit::read_header_at(&path, &f, off).map_err(|e| name_unit(e, h))?;
        let r = unit::load_with(
            &path,
            &f,
            off,
            head,
            h,
            dst,
            full,
            budget,
            &mut |b, bud, d| self.load_unit_within(b, d, false, bud).inspect_err(|_| from_base = true),
            &mut |xh, d| {
                let Some(x) = xh.extent else { unreachable!("decode gives every external unit an extent") };
                let Some(xpath) = self.packs().extent_path(x.seq, x.nonce) else {
                    let want = crate::extent::path(&self.dir.join(crate::store::UNITS_DIR), x.seq, x.nonce);
                    return Err(CkptError::Invalid(format!(
                        "unit {} lies in extent {}, which is missing (its record: {} at byte {off})",
                        unit::hex(h),
                        want.display(),
                        path.display()
                    )));
                };
                let xf = File::open(&xpath).map_err(|e| CkptError::io(&xpath, e))?;
                crate::extent::read_checked(&xpath, &xf, xh, d, full)
            },
        );
        match r {
            Ok(_) => Ok(()),
            Err(e) if from_base => Err(e),
            Err(e) => Err(name_unit(e, h)),
        }
    }

    /// Where unit `h` is stored: (file, offset of its record or 0 for a
    /// unit file, bytes of the record). For tests and tools that inspect
    /// or damage stored bytes.
    pub fn unit_location(&self, h: &Hash) -> Option<(PathBuf, u64, u64)> {
        let u = self.units.get(h)?;
        match u.loc? {
            UnitLoc::File => Some((self.unit_path(h), 0, u.file_len)),
            UnitLoc::Pack { seq, off } => self.packs().file(seq).map(|(_, p)| (p, off, u.file_len)),
        }
    }

    /// The header of every stored unit (live ones and the bases deltas
    /// need), read from where it is stored, in no particular order.
    pub fn unit_headers(&self) -> Result<Vec<UnitHeader>> {
        let mut out = Vec::with_capacity(self.units.len());
        for h in self.units.keys() {
            let head = match self.unit_location(h) {
                Some((path, off, _)) if off > 0 => {
                    let f = File::open(&path).map_err(|e| CkptError::io(&path, e))?;
                    unit::read_header_at(&path, &f, off)?
                }
                _ => unit::read_header(&self.unit_path(h))?,
            };
            out.push(head);
        }
        Ok(out)
    }

    /// What open repaired or found damaged in the packs (a truncated torn
    /// append, a pack left alone because a unit is missing), and faults of
    /// compactions since; each names the file. The caller logs them.
    pub fn repairs(&self) -> &[String] {
        &self.repairs
    }

    /// [`Self::repairs`], emptied (to log each once).
    pub fn take_repairs(&mut self) -> Vec<String> {
        std::mem::take(&mut self.repairs)
    }

    /// Calls `hook` with the name of each step of a compaction as it is
    /// reached ("record copied", "copies synced", "pack removed"): tests
    /// snapshot the directory there to check what a crash would leave.
    pub fn set_compaction_hook(&mut self, hook: Option<CompactionHook>) {
        self.compaction_hook = hook;
    }

    fn step(&self, name: &str) {
        if let Some(h) = &self.compaction_hook {
            h(name);
        }
    }

    /// At open: scans every pack, then locates every unit the live recipes
    /// refer to (and the bases their deltas need, counting dependants),
    /// counts live bytes per pack, truncates torn tails when nothing needed
    /// is missing, and picks the pack to append to. A unit that cannot be
    /// located keeps no location: its reads fail naming it.
    pub(crate) fn locate_units(&mut self) -> Result<()> {
        let udir = self.dir.join(crate::store::UNITS_DIR);
        let mut scans: Scans = BTreeMap::new();
        let mut broken: Vec<(PathBuf, CkptError)> = Vec::new();
        let mut extents: BTreeMap<u64, Extent> = BTreeMap::new();
        for ent in std::fs::read_dir(&udir).map_err(|e| CkptError::io(&udir, e))? {
            let ent = ent.map_err(|e| CkptError::io(&udir, e))?;
            if let Some((seq, nonce)) = ent.file_name().to_str().and_then(crate::extent::parse_name) {
                let path = ent.path();
                let len = ent.metadata().map_err(|e| CkptError::io(&path, e))?.len();
                // Not possible while numbers only grow within a store's life;
                // the file is left for a person to look at.
                if let Some(other) = extents.get(&seq) {
                    self.repairs.push(format!("two extents numbered {seq}: {} and {}; the second left in place, unused", other.path.display(), path.display()));
                    continue;
                }
                extents.insert(seq, Extent { path, nonce, len, live: 0 });
                continue;
            }
            let Some(seq) = ent.file_name().to_str().and_then(pack::parse_name) else {
                continue;
            };
            let path = ent.path();
            let opened = pack::open(&path).and_then(|(f, h)| {
                if h.seq != seq {
                    return Err(FormatError::Corrupt {
                        file: path.clone(),
                        entry: "pack header".into(),
                        offset: 16,
                        problem: format!("sequence number {}, the file is named {seq}", h.seq),
                    }
                    .into());
                }
                pack::scan_open(&path, &f, h).map(|s| (f, s))
            });
            match opened {
                Ok(x) => {
                    scans.insert(seq, (path, x.0, x.1));
                }
                Err(e) => broken.push((path, e)),
            }
        }
        let mut index: HashMap<Hash, Candidates> = HashMap::new();
        for (&seq, (_, _, s)) in &scans {
            for r in &s.records {
                index.entry(r.head.blake3).or_default().push((seq, *r));
            }
        }
        let mut todo: Vec<Hash> = self.units.keys().copied().collect();
        while let Some(h) = todo.pop() {
            let want = self.units.get(&h).map_or(0, |u| u.len);
            let known_len = want != 0 || self.units.get(&h).is_some_and(|u| u.owner != u64::MAX);
            let picked = pick_record(&h, known_len.then_some(want), &index, &scans, &udir, 0);
            let (head, loc) = match picked {
                Some((seq, r)) => (r.head, UnitLoc::Pack { seq, off: r.off }),
                None => match unit::read_header(&self.unit_path(&h)) {
                    Ok(head) if head.blake3 == h && (!known_len || head.len == want) => (head, UnitLoc::File),
                    _ => continue,
                },
            };
            let Some(u) = self.units.get_mut(&h) else {
                continue;
            };
            u.len = head.len;
            u.set_stored(&head, loc);
            if let Some(b) = head.base {
                match self.units.get_mut(&b) {
                    Some(bu) => bu.dependants += 1,
                    None => {
                        // A base only deltas need: its length is in its header.
                        let mut bu = crate::units::UnitInfo::new(0, u64::MAX);
                        bu.dependants = 1;
                        self.units.insert(b, bu);
                        todo.push(b);
                    }
                }
            }
        }
        let missing: Vec<Hash> = self.units.iter().filter(|(_, u)| u.loc.is_none()).map(|(h, _)| *h).collect();
        let mut set = PackSet::new(udir, &self.opts);
        for (path, e) in broken {
            let seq = path.file_name().and_then(|n| n.to_str()).and_then(pack::parse_name).unwrap_or(0);
            set.next_floor = set.next_floor.max(seq + 1);
            if missing.is_empty() {
                self.repairs.push(format!("{e}; no unit needed it: removed {}", path.display()));
                let _ = std::fs::remove_file(&path);
            } else {
                self.repairs.push(format!("{e}; left in place ({} units not found)", missing.len()));
            }
        }
        for (seq, (path, f, s)) in scans {
            let mut damaged = false;
            let mut end = s.file_len;
            if let Some(e) = &s.tail {
                if missing.is_empty() {
                    f.set_len(s.valid_len).map_err(|e| CkptError::io(&path, e))?;
                    end = s.valid_len;
                    self.repairs.push(format!("{e}: torn append, {} of {} bytes kept", s.valid_len, s.file_len));
                } else {
                    damaged = true;
                    self.repairs.push(format!("{e}: left in place, {} needed units not found", missing.len()));
                }
            }
            set.packs.insert(seq, Pack { path, file: Arc::new(f), end, live: 0, damaged });
        }
        set.extents = extents;
        for u in self.units.values() {
            if let Some(UnitLoc::Pack { seq, .. }) = u.loc {
                set.add_live(seq, u.file_len);
            }
            if let Some(x) = u.extent {
                set.add_extent_live(x, u.len);
            }
        }
        // Extents nothing lives in (a crash before the catalog named the
        // commit that adopted one, or after compaction copied its units) go now.
        let dead: Vec<u64> = set.extents.iter().filter(|(_, x)| x.live == 0).map(|(&s, _)| s).collect();
        for seq in dead {
            set.drop_extent(seq)?;
        }
        // Packs nothing lives in any more (a crash after compaction copied
        // them, before it deleted them) go now.
        while let Some(seq) = set.sparse(0).filter(|s| set.packs.get(s).is_some_and(|p| p.live == 0)) {
            if let Some(p) = set.packs.remove(&seq) {
                std::fs::remove_file(&p.path).map_err(|e| CkptError::io(&p.path, e))?;
            }
        }
        // The newest packs with room go on taking units, one per writer lane.
        let open: Vec<u64> = set.packs.iter().rev().filter(|(_, p)| !p.damaged && p.end < set.pack_size).map(|(&s, _)| s).collect();
        for (lane, seq) in open.into_iter().take(set.active.len()).enumerate() {
            set.active[lane] = Some(seq);
        }
        *self.packs() = set;
        Ok(())
    }

    /// Compacts every pack and extent that
    /// [`crate::StoreOptions::compact_below_percent`] calls sparse (see the
    /// module documentation). Returns the packs and extents removed.
    pub fn compact(&mut self) -> Result<usize> {
        let mut n = 0;
        loop {
            let Some(seq) = self.packs().sparse_extent(self.opts.compact_below_percent) else { break };
            self.compact_extent(seq)?;
            n += 1;
        }
        loop {
            let Some(seq) = self.packs().sparse(self.opts.compact_below_percent) else {
                return Ok(n);
            };
            self.compact_pack(seq)?;
            n += 1;
        }
    }

    /// After unlinks: compacts, keeping a fault for [`Self::repairs`]
    /// instead of failing the unlink that was already committed.
    pub(crate) fn compact_quietly(&mut self) {
        if let Err(e) = self.compact() {
            self.repairs.push(format!("compaction stopped: {e}"));
        }
    }

    /// Copies the live units of extent `seq` into packs as raw records
    /// (synced), switches them there, then deletes the extent. A crash
    /// before the delete leaves both records of each unit (either reads
    /// back); after it, only the copies.
    fn compact_extent(&mut self, seq: u64) -> Result<()> {
        let members: Vec<Hash> = self.units.iter().filter(|(_, u)| u.extent == Some(seq)).map(|(h, _)| *h).collect();
        let mut moved = Vec::with_capacity(members.len());
        let mut touched = BTreeSet::new();
        for h in members {
            let Some(u) = self.units.get(&h) else { continue };
            let (len, old) = (u.len, u.loc);
            let payload = self.unit_bytes(&h, len, false)?;
            let head = UnitHeader::raw(len, h, fanstore_core::checksum::xxh3(&payload));
            let loc = self.append_unit(0, &head, &payload)?;
            if let UnitLoc::Pack { seq: dseq, .. } = loc {
                touched.insert(dseq);
            }
            moved.push((h, head, loc, old));
            self.step("record copied");
        }
        self.sync_copies(touched)?;
        for (h, head, loc, old) in moved {
            let Some(u) = self.units.get_mut(&h) else { continue };
            let old_len = u.file_len;
            u.loc = Some(loc);
            u.file_len = head.file_len();
            u.encoding = head.encoding;
            u.extent = None;
            let mut set = self.packs();
            if let UnitLoc::Pack { seq: dseq, .. } = loc {
                set.add_live(dseq, head.file_len());
            }
            if let Some(UnitLoc::Pack { seq: oseq, .. }) = old {
                set.sub_live(oseq, old_len);
            }
            set.sub_extent_live(seq, head.len);
        }
        self.packs().drop_extent(seq)?;
        self.step("extent removed");
        Ok(())
    }

    /// fdatasyncs the packs a compaction copied records into (compaction
    /// must not make old data less durable), then reports the step.
    fn sync_copies(&self, touched: BTreeSet<u64>) -> Result<()> {
        for dseq in touched {
            if let Some((f, p)) = self.packs().file(dseq) {
                f.sync_data().map_err(|e| CkptError::io(&p, e))?;
            }
        }
        self.step("copies synced");
        Ok(())
    }

    fn compact_pack(&mut self, seq: u64) -> Result<()> {
        let mut members: Vec<(u64, Hash, u64)> = self
            .units
            .iter()
            .filter_map(|(h, u)| match u.loc {
                Some(UnitLoc::Pack { seq: s, off }) if s == seq => Some((off, *h, u.file_len)),
                _ => None,
            })
            .collect();
        members.sort_unstable();
        let Some((src, src_path)) = self.packs().file(seq) else {
            return Ok(());
        };
        {
            // The copies go to a new pack, and the last pack is never deleted.
            let mut set = self.packs();
            set.retire(seq);
            if set.last() == Some(seq) {
                set.roll(0)?;
            }
        }
        let mut moved = Vec::with_capacity(members.len());
        let mut touched = BTreeSet::new();
        for (off, h, len) in members {
            let (dseq, dst, dpath, doff) = self.packs().reserve(0, len)?;
            touched.insert(dseq);
            if let Err(e) = copy_range(&src, off, &dst, doff, len) {
                self.packs().retire(dseq);
                return Err(CkptError::io(format!("{} -> {}", src_path.display(), dpath.display()), e));
            }
            moved.push((h, dseq, doff, len));
            self.step("record copied");
        }
        self.sync_copies(touched)?;
        for (h, dseq, doff, len) in moved {
            if let Some(u) = self.units.get_mut(&h) {
                u.loc = Some(UnitLoc::Pack { seq: dseq, off: doff });
            }
            let mut set = self.packs();
            set.add_live(dseq, len);
            set.sub_live(seq, len);
        }
        let removed = self.packs().packs.remove(&seq);
        if removed.is_some() {
            std::fs::remove_file(&src_path).map_err(|e| CkptError::io(&src_path, e))?;
        }
        self.step("pack removed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(dir: &std::path::Path, threads: usize, pack_size: u64) -> PackSet {
        PackSet::new(dir.to_path_buf(), &crate::StoreOptions { threads, pack_size, ..crate::StoreOptions::default() })
    }

    #[test]
    fn each_lane_appends_to_its_own_pack_and_sequence_numbers_only_grow() {
        let d = tempfile::tempdir().unwrap();
        let mut s = set(d.path(), 2, 1000);
        let (a, _, _, off_a) = s.reserve(0, 100).unwrap();
        let (b, _, _, off_b) = s.reserve(1, 100).unwrap();
        let (c, _, _, _) = s.reserve(2, 100).unwrap();
        assert!(a < b && b < c, "{a} {b} {c}");
        assert_eq!((off_a, off_b), (pack::HEADER_LEN as u64, pack::HEADER_LEN as u64));
        // A lane keeps its pack, at the next offset; lanes past the count wrap.
        assert_eq!(s.reserve(0, 100).unwrap().0, a);
        let (wrapped, _, _, off) = s.reserve(3, 50).unwrap();
        assert_eq!((wrapped, off), (a, pack::HEADER_LEN as u64 + 200));
        assert_eq!(s.packs[&a].end, pack::HEADER_LEN as u64 + 250);
        // Full: the lane rolls to a new pack; a record larger than a pack gets one of its own.
        let (d1, _, _, _) = s.reserve(0, 900).unwrap();
        assert!(d1 > c);
        let (d2, _, _, off) = s.reserve(0, 5000).unwrap();
        assert!(d2 > d1 && off == pack::HEADER_LEN as u64);
        // A failed write retires the pack: the lane's next record starts another.
        s.retire(b);
        assert!(s.reserve(1, 10).unwrap().0 > d2);
        assert!(!s.is_active(b));
    }

    #[test]
    fn only_sparse_packs_are_compacted_and_never_the_last_one_unless_active() {
        let d = tempfile::tempdir().unwrap();
        let mut s = set(d.path(), 0, 1000);
        let (a, _, _, _) = s.reserve(0, 600).unwrap();
        let (b, _, _, _) = s.reserve(0, 600).unwrap();
        s.add_live(a, 600);
        s.add_live(b, 600);
        assert_eq!(s.sparse(50), None, "all live");
        s.sub_live(a, 400);
        assert_eq!(s.sparse(50), Some(a), "a third live");
        assert_eq!(s.sparse(30), None, "above 30%");
        // The active pack too, once it holds enough records (here min(1 MiB, 500)).
        s.sub_live(a, 200);
        s.add_live(a, 600);
        s.sub_live(b, 600);
        assert_eq!(s.sparse(50), Some(b));
        // Not the last pack when it is not active (its number must not be reused).
        s.retire(b);
        assert_eq!(s.sparse(50), None);
        assert_eq!(s.usage(), (2, 2 * pack::HEADER_LEN as u64 + 600));
    }
}
