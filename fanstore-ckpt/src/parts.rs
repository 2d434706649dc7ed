//! Commits from parts: a checkpoint whose writer knows which of its
//! tensors the store holds already (the `fanstore` Python package's
//! `fanstore.torch.save`) sends its glue bytes, a reference (blake3) for
//! each unchanged tensor and the bytes of the changed ones only.
//!
//! The writer gives a *skeleton* of the file: its exact length, every glue
//! byte in place, the unit ranges left as they are (zeros: the skeleton is
//! never read there). The store splits the skeleton as it splits any file
//! (only the structured formats: safetensors, torch.save zips, npy/npz,
//! DCP shards, whose split reads headers, never tensor bytes), and refuses
//! the commit unless the split's units are exactly the writer's. So a
//! checkpoint committed from parts has the recipe, owner map and lineage
//! the same bytes written through POSIX would have.
//!
//! A reference must name a unit the store holds, of the unit's length:
//! anything else is [`CkptError::UnknownUnit`] and nothing is committed
//! (the writer then sends those bytes). The whole-file xxh3 (kept in the
//! recipe and checked on every read) is the writer's: the store never has
//! the bytes of referenced units at hand to compute it. A wrong one makes
//! every read of the checkpoint fail its whole-file check (EIO), never
//! return other bytes.

use crate::error::{CkptError, Result};
use crate::split::{self, Format, Piece};
use crate::store::{check_path, CheckpointStore, CommitInfo, Stored, UnitPlan};
use crate::unit::{self, Hash};
use std::ops::Range;

/// Where one unit of a commit from parts comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartUnit {
    /// A unit the store holds: its blake3.
    Ref(Hash),
    /// New bytes: this range of the payload.
    New(Range<usize>),
}

impl CheckpointStore {
    /// Checks that `units` are the units of `skeleton` as the store splits
    /// it and that every reference names a unit of this store (see
    /// [`Self::commit_parts`] for the arguments), without committing
    /// anything. Returns the blake3 of every unit, in order (the new ones
    /// hashed here): a caller can answer its writer before it commits.
    pub fn check_parts(&self, skeleton: &[u8], units: &[(Range<usize>, PartUnit)], payload: &[u8]) -> Result<Vec<Hash>> {
        self.check_parts_shape(skeleton, units, payload)?;
        Ok(hash_new_units(units, payload, self.opts.threads))
    }

    /// [`Self::check_parts`] without hashing: the split of `skeleton`.
    fn check_parts_shape(&self, skeleton: &[u8], units: &[(Range<usize>, PartUnit)], payload: &[u8]) -> Result<split::Split> {
        // The skeleton's unit ranges are zeros never written: not read.
        let zeros: Vec<Range<usize>> = units.iter().map(|(r, _)| r.clone()).collect();
        let split = split::split_structured_skipping(skeleton, &zeros)
            .filter(|s| s.format != Format::Opaque)
            .ok_or_else(|| CkptError::Invalid("the parts are not a checkpoint format the store recognises".into()))?;
        let file_units: Vec<&Range<usize>> = split
            .pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Unit(r, _) => Some(r),
                Piece::Glue(_) => None,
            })
            .collect();
        if file_units.len() != units.len() || file_units.iter().zip(units).any(|(a, (b, _))| *a != b) {
            return Err(CkptError::Invalid(format!(
                "the parts name {} units, the {} split of their glue finds {} elsewhere",
                units.len(),
                split.format.name(),
                file_units.len()
            )));
        }
        for (r, u) in units {
            match u {
                PartUnit::Ref(h) => match self.units.get(h) {
                    Some(info) if info.len == r.len() as u64 => {}
                    _ => return Err(CkptError::UnknownUnit { hash: unit::hex(h), len: r.len() as u64 }),
                },
                PartUnit::New(p) if p.len() != r.len() || p.end > payload.len() => {
                    return Err(CkptError::Invalid(format!("new unit bytes {p:?} for a unit of {} bytes in a payload of {}", r.len(), payload.len())));
                }
                PartUnit::New(_) => {}
            }
        }
        Ok(split)
    }

    /// Commits the checkpoint at `path` (replacing any there) from parts:
    /// `skeleton` is the file with its glue in place, `units` the file's
    /// unit ranges in order, each with where its bytes are (see the module
    /// doc), `payload` the new units' bytes, `file_xxh3` the whole file's
    /// xxh3. Returns what the commit did and the blake3 of every unit, in
    /// order. On error nothing is committed and the store is unchanged.
    pub fn commit_parts(
        &mut self,
        path: &[u8],
        skeleton: &[u8],
        units: &[(Range<usize>, PartUnit)],
        payload: &[u8],
        file_xxh3: u64,
    ) -> Result<(CommitInfo, Vec<Hash>)> {
        check_path(path)?;
        let split = self.check_parts_shape(skeleton, units, payload)?;
        let id = self.catalog.next_id;
        let (plans, lineage) = self.plan_units(path, &split);
        let new_plans: Vec<UnitPlan> = plans
            .into_iter()
            .zip(units)
            .filter_map(|(plan, (_, u))| match u {
                PartUnit::New(p) => Some(UnitPlan { range: p.clone(), ..plan }),
                PartUnit::Ref(_) => None,
            })
            .collect();
        let mut st = Stored::default();
        let mark = self.packs().mark();
        if let Err(e) = self.store_units(payload, &new_plans, None, &mut st) {
            self.give_back(&mark, None);
            return Err(e);
        }
        let mut fresh = st.hashes.iter();
        let hashes: Vec<Hash> = units
            .iter()
            .map(|(_, u)| match u {
                PartUnit::Ref(h) => *h,
                PartUnit::New(_) => *fresh.next().unwrap_or_else(|| unreachable!("one hash per new unit")),
            })
            .collect();
        let parent = self.parent_of(path, &hashes, lineage);
        let (rec, _) = self.build_recipe(id, parent, split, skeleton, &hashes, file_xxh3, st.new_bytes, false);
        match self.finish_commit(path, rec, &st.written) {
            Ok(info) => Ok((info, hashes)),
            Err(e) => {
                let _ = std::fs::remove_file(self.recipe_path(id));
                self.give_back(&mark, None);
                Err(e)
            }
        }
    }
}

/// The blake3 of every unit of `units` (a reference's is its own), the new
/// ones hashed on this thread and up to `helpers` more (units claimed one
/// at a time; large checkpoints only).
fn hash_new_units(units: &[(Range<usize>, PartUnit)], payload: &[u8], helpers: usize) -> Vec<Hash> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let new_bytes: usize = units.iter().map(|(r, u)| if matches!(u, PartUnit::New(_)) { r.len() } else { 0 }).sum();
    let helpers = if new_bytes >= 4 << 20 { helpers } else { 0 };
    let next = AtomicUsize::new(0);
    let work = || {
        let mut got = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((_, u)) = units.get(i) else { return got };
            let h = match u {
                PartUnit::Ref(h) => *h,
                PartUnit::New(p) => *blake3::hash(&payload[p.clone()]).as_bytes(),
            };
            got.push((i, h));
        }
    };
    let mut all: Vec<(usize, Hash)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..helpers).map(|_| s.spawn(work)).collect();
        let mut all = work();
        for h in hs {
            all.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        all
    });
    all.sort_unstable_by_key(|(i, _)| *i);
    all.into_iter().map(|(_, h)| h).collect()
}
