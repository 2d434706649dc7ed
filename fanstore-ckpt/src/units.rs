//! The store's side of units: what it knows about each one in memory
//! (references, encoding, delta base), keeping bases alive while deltas
//! need them, decoding units (through their delta chains), the hot copies
//! of recently committed files, and parallel reads.
//!
//! **Delta bases.** A delta unit needs its base to decode, and the base may
//! belong to a checkpoint that is deleted later. Every unit counts its
//! *dependants* (delta units whose base it is) besides its references from
//! live recipes; it is deleted only when both are zero, and deleting a
//! delta releases its base in turn. Neither count is stored: references
//! come from the live recipes, dependants from the unit headers, both read
//! at open. Chains are bounded ([`crate::StoreOptions::max_chain`]), so a
//! read decodes at most `max_chain + 1` units per tensor.
//!
//! **Hot copies.** The bytes of the last few committed files, when the
//! caller hands them over as shared immutable bytes
//! ([`CheckpointStore::commit_shared`]), serve both reads of those
//! checkpoints (no decode at all) and the delta bases of the next commit
//! (a training run's next checkpoint deltas against the previous one, which
//! is then still hot).

use crate::codec::Encoding;
use crate::error::{CkptError, Result};
use crate::packs::UnitLoc;
use crate::recipe::{RecipePiece, TensorEntry};
use crate::store::CheckpointStore;
use crate::unit::{self, Hash};
use fanstore_core::checksum::xxh3;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Immutable bytes shared with the caller (a memory map of a committed file).
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Deepest chain any header may claim (bounds recursion on damaged stores).
pub(crate) const CHAIN_LIMIT: u8 = 64;

/// One stored unit, as known in memory.
#[derive(Debug, Clone)]
pub(crate) struct UnitInfo {
    pub len: u64,
    pub owner: u64,
    /// References from live recipes (one per tensor entry).
    pub refs: u64,
    /// The live checkpoints that refer to this unit, ascending.
    pub ckpts: Vec<u64>,
    /// Bytes of the unit file (0 until its header was read).
    pub file_len: u64,
    pub encoding: Encoding,
    pub base: Option<Hash>,
    pub depth: u8,
    /// Delta units whose base this is.
    pub dependants: u64,
    /// Where it is stored (None: not found at open; its reads fail).
    pub loc: Option<UnitLoc>,
    /// The extent an external unit's payload lies in.
    pub extent: Option<u64>,
}

impl UnitInfo {
    pub fn new(len: u64, owner: u64) -> UnitInfo {
        UnitInfo { len, owner, refs: 0, ckpts: Vec::new(), file_len: 0, encoding: Encoding::Raw, base: None, depth: 0, dependants: 0, loc: None, extent: None }
    }

    /// Takes what the unit's header says of how it is stored, and where it
    /// was found (`loc`).
    pub fn set_stored(&mut self, head: &unit::UnitHeader, loc: UnitLoc) {
        self.file_len = head.file_len();
        self.encoding = head.encoding;
        self.base = head.base;
        self.depth = head.depth;
        self.loc = Some(loc);
        self.extent = head.extent.map(|x| x.seq);
    }
}

/// A recently committed file's bytes and where each of its units lies.
pub(crate) struct Hot {
    pub id: u64,
    pub bytes: SharedBytes,
    pub units: HashMap<Hash, Range<usize>>,
    /// The file is also an extent of the store (adopted): its bytes are in
    /// the store's directory, not beside it.
    pub in_store: bool,
}

impl CheckpointStore {
    pub(crate) fn add_refs(&mut self, id: u64, tensors: &[TensorEntry]) {
        for t in tensors {
            let u = self.units.entry(t.hash).or_insert_with(|| UnitInfo::new(t.len, t.owner));
            u.owner = u.owner.min(t.owner);
            u.refs += 1;
            if u.ckpts.last() != Some(&id) {
                u.ckpts.push(id);
            }
        }
    }

    /// Records a unit this commit wrote at `loc` (after its references were added).
    pub(crate) fn register_written(&mut self, h: &Hash, head: &unit::UnitHeader, loc: UnitLoc) {
        if let Some(u) = self.units.get_mut(h) {
            u.set_stored(head, loc);
        }
        if self.units.contains_key(h) {
            self.count_live(Some(loc), head.file_len(), head.extent.map(|x| x.seq), head.len);
        }
        if let Some(b) = head.base.and_then(|b| self.units.get_mut(&b)) {
            b.dependants += 1;
        }
    }

    /// Drops checkpoint `id`'s references; returns the units that are no
    /// longer needed (no reference, no dependant), bases freed in turn included.
    pub(crate) fn drop_refs(&mut self, id: u64, tensors: &[TensorEntry]) -> Vec<(Hash, UnitInfo)> {
        let mut freed = Vec::new();
        let mut check = Vec::new();
        for t in tensors {
            let Some(u) = self.units.get_mut(&t.hash) else { continue };
            u.refs = u.refs.saturating_sub(1);
            u.ckpts.retain(|&c| c != id);
            if u.refs == 0 {
                check.push(t.hash);
            }
        }
        while let Some(h) = check.pop() {
            let Some(u) = self.units.get(&h) else { continue };
            if u.refs > 0 || u.dependants > 0 {
                continue;
            }
            let base = u.base;
            if let Some(u) = self.units.remove(&h) {
                freed.push((h, u));
            }
            if let Some(bh) = base {
                if let Some(b) = self.units.get_mut(&bh) {
                    b.dependants = b.dependants.saturating_sub(1);
                    if b.dependants == 0 && b.refs == 0 {
                        check.push(bh);
                    }
                }
            }
        }
        freed
    }

    /// The bytes of unit `h` in a hot copy, if one holds it.
    pub(crate) fn hot_unit(&self, h: &Hash) -> Option<&[u8]> {
        self.hot.iter().rev().find_map(|hot| hot.units.get(h).map(|r| &hot.bytes.as_ref().as_ref()[r.clone()]))
    }

    /// Loads unit `h` (`dst.len()` bytes) into `dst`: from a hot copy when
    /// one holds it, else decoded from its file through its chain; checked
    /// against its xxh3 (and blake3 when `full`).
    pub(crate) fn load_unit(&self, h: &Hash, dst: &mut [u8], full: bool) -> Result<()> {
        self.load_unit_within(h, dst, full, CHAIN_LIMIT)
    }

    pub(crate) fn load_unit_within(&self, h: &Hash, dst: &mut [u8], full: bool, budget: u8) -> Result<()> {
        if let Some(b) = self.hot_unit(h).filter(|b| b.len() == dst.len()) {
            dst.copy_from_slice(b);
            if full && unit::hash(dst) != *h {
                return Err(CkptError::Invalid(format!("hot copy of unit {} changed", unit::hex(h))));
            }
            return Ok(());
        }
        self.load_stored(h, dst, full, budget)
    }

    /// The payload of unit `h` (`len` bytes), as [`Self::load_unit`] loads it.
    pub(crate) fn unit_bytes(&self, h: &Hash, len: u64, full: bool) -> Result<Vec<u8>> {
        let n = usize::try_from(len).map_err(|_| CkptError::Invalid("unit larger than memory".into()))?;
        let mut v = vec![0u8; n];
        self.load_unit(h, &mut v, full)?;
        Ok(v)
    }

    /// Keeps `bytes` (checkpoint `id`'s file) as a hot copy, dropping the
    /// oldest beyond [`crate::StoreOptions::hot`] copies or
    /// [`crate::StoreOptions::hot_bytes`] bytes.
    pub(crate) fn keep_hot(&mut self, id: u64, bytes: SharedBytes, units: HashMap<Hash, Range<usize>>, in_store: bool) {
        if self.opts.hot == 0 {
            return;
        }
        self.hot.retain(|h| h.id != id);
        self.hot.push(Hot { id, bytes, units, in_store });
        self.limit_hot(self.opts.hot, self.opts.hot_bytes);
    }

    /// Drops the oldest hot copies until at most `n` are left and the
    /// total is at most `bytes` (the newest one is kept while `n` > 0).
    pub fn limit_hot(&mut self, n: usize, bytes: u64) {
        let len = |h: &Hot| (*h.bytes).as_ref().len() as u64;
        let mut total: u64 = self.hot.iter().map(len).sum();
        while self.hot.len() > n || (self.hot.len() > 1 && total > bytes) {
            total -= len(&self.hot[0]);
            self.hot.remove(0);
        }
    }

    /// Stops serving the checkpoint at `path` from a hot copy (its file may
    /// change). False if it had none.
    pub fn forget_hot(&mut self, path: &[u8]) -> bool {
        let Some(id) = self.id_of(path) else { return false };
        let had = self.hot_file(id).is_some();
        self.drop_hot(id);
        had
    }

    /// Replaces the bytes of the hot copy of the checkpoint at `path` with
    /// the same bytes elsewhere (a copy in another file); false when it is
    /// not hot or the length differs. The caller promises equal bytes.
    pub fn replace_hot(&mut self, path: &[u8], bytes: SharedBytes) -> bool {
        let Some(id) = self.id_of(path) else { return false };
        match self.hot.iter_mut().find(|h| h.id == id) {
            Some(h) if (*h.bytes).as_ref().len() == (*bytes).as_ref().len() => {
                h.bytes = bytes;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn drop_hot(&mut self, id: u64) {
        self.hot.retain(|h| h.id != id);
    }

    /// The hot copy of checkpoint `id`, if the store still keeps one.
    pub(crate) fn hot_file(&self, id: u64) -> Option<&SharedBytes> {
        self.hot.iter().find(|h| h.id == id).map(|h| &h.bytes)
    }

    /// True if the checkpoint at `path` is read from a hot copy (no decode).
    pub fn is_hot(&self, path: &[u8]) -> bool {
        self.id_of(path).is_some_and(|id| self.hot_file(id).is_some())
    }

    /// Writes the exact bytes of the checkpoint at `path` into `dst` (whose
    /// length must be the checkpoint's), decoding units on up to
    /// [`crate::StoreOptions::threads`] + 1 threads, then checks the
    /// whole-file checksum. A damaged unit is an error, never wrong bytes.
    pub fn read_into(&self, path: &[u8], dst: &mut [u8]) -> Result<()> {
        let id = self.id_of(path).ok_or_else(|| CkptError::not_found(path))?;
        if let Some(hot) = self.hot_file(id) {
            let b: &[u8] = hot.as_ref().as_ref();
            if b.len() == dst.len() {
                dst.copy_from_slice(b);
                return self.check_whole(path, id, dst);
            }
        }
        let r = self.load_recipe(id, true)?;
        if r.logical != dst.len() as u64 {
            return Err(CkptError::Invalid(format!("checkpoint of {} bytes read into {} bytes", r.logical, dst.len())));
        }
        let mut tasks: Vec<Mutex<Option<(&mut [u8], &TensorEntry)>>> = Vec::new();
        let mut rest = &mut dst[..];
        for p in &r.pieces {
            match *p {
                RecipePiece::Glue { off, len } => {
                    let (head, tail) = std::mem::take(&mut rest).split_at_mut(len as usize);
                    head.copy_from_slice(&r.glue[off as usize..(off + len) as usize]);
                    rest = tail;
                }
                RecipePiece::Unit { index } => {
                    let t = &r.tensors[index as usize];
                    let (head, tail) = std::mem::take(&mut rest).split_at_mut(t.len as usize);
                    tasks.push(Mutex::new(Some((head, t))));
                    rest = tail;
                }
            }
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let work = || -> Result<()> {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(task) = tasks.get(i) else { return Ok(()) };
                let taken = task.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some((d, t)) = taken {
                    self.load_unit(&t.hash, d, false)?;
                }
            }
        };
        let helpers = if tasks.len() > 1 && r.logical >= 4 << 20 { self.opts.threads } else { 0 };
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..helpers).map(|_| s.spawn(work)).collect();
            let mine = work();
            hs.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).fold(mine, |a, b| a.and(b))
        })?;
        drop(tasks);
        if xxh3(dst) != r.file_xxh3 {
            return Err(CkptError::FileChecksum { path: String::from_utf8_lossy(path).into_owned(), stored: r.file_xxh3, computed: xxh3(dst) });
        }
        Ok(())
    }

    fn check_whole(&self, path: &[u8], id: u64, b: &[u8]) -> Result<()> {
        let stored = self.load_recipe(id, false)?.file_xxh3;
        let computed = xxh3(b);
        if stored != computed {
            return Err(CkptError::FileChecksum { path: String::from_utf8_lossy(path).into_owned(), stored, computed });
        }
        Ok(())
    }
}
