//! The checkpoint store: commit, read, unlink and rename of checkpoint
//! files, deduplicated at unit level (see the crate documentation for the
//! directory layout and what a crash can lose).
//!
//! In memory the store keeps the catalog, the owner map of every live
//! checkpoint and, per unit, its length, owner, reference count and the
//! live checkpoints that refer to it. All of it is rebuilt at open from the
//! catalog and the recipes: reference counts are not a second source of
//! truth on disk that could drift from the recipes after a crash.

use crate::catalog::{self, Catalog, CatalogEntry};
use crate::codec::{self, Encoding};
use crate::error::{CkptError, Result};
use crate::recipe::{self, Recipe, RecipePiece, TensorEntry};
use crate::split::{self, CdcParams, Format, Piece, Split};
use crate::unit::{self, Hash, UnitHeader};
use crate::packs::{PackSet, UnitLoc};
use crate::units::{Hot, SharedBytes, UnitInfo};
use fanstore_core::checksum::{xxh3, StreamingChecksum};
use fanstore_core::format::read_full;
use fanstore_core::FormatError;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// How a store behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// Chunk sizes of the fallback for unrecognised files.
    pub cdc: CdcParams,
    /// Flush the file system (syncfs) before every catalog write, so that
    /// units and recipes are on stable storage before the commit point, and
    /// fsync the catalog and its directory: power-loss safety at a large
    /// cost. Off by default: renames alone make the store safe against a
    /// crash of the process; [`CheckpointStore::sync`] flushes everything
    /// when the store is about to be drained.
    pub fsync: bool,
    /// Helper threads that hash units while the committing thread writes
    /// (files of 4 MiB and more). Default: one less than the available
    /// cores, at least 1, at most 3.
    pub threads: usize,
    /// Longest delta chain: a changed tensor is stored as a delta against
    /// its lineage parent's tensor while that one's chain is shorter, else
    /// against the chain's first (full) unit, else in full; a read decodes
    /// at most `max_chain + 1` units per tensor. 0: no deltas.
    pub max_chain: u8,
    /// Hot copies kept at most (see [`CheckpointStore::commit_shared`]).
    pub hot: usize,
    /// Bytes of hot copies kept at most, the newest always kept (if `hot`
    /// is not 0): older ones are dropped, oldest first, past this total.
    pub hot_bytes: u64,
    /// Bytes past which units go to a new pack file (a larger unit gets a
    /// pack of its own). Default 256 MiB. Each thread writing units of a
    /// commit appends to a pack of its own, so up to `threads + 1` packs
    /// are being filled at a time.
    pub pack_size: u64,
    /// A pack (other than the one being appended to) whose live records
    /// fill less than this percentage of it is compacted after an unlink:
    /// its live records are copied to the active pack and it is deleted.
    /// Default 50; 0 only deletes packs nothing lives in.
    pub compact_below_percent: u8,
}

impl Default for StoreOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        StoreOptions {
            cdc: CdcParams::default(),
            fsync: false,
            threads: cores.saturating_sub(1).clamp(1, 3),
            max_chain: 4,
            hot: 2,
            hot_bytes: u64::MAX,
            pack_size: 256 << 20,
            compact_below_percent: 50,
        }
    }
}

/// What a commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    pub id: u64,
    /// The earlier live checkpoint sharing the most unit bytes, if any.
    pub parent: Option<u64>,
    pub format: Format,
    /// Bytes of the file.
    pub logical: u64,
    /// Bytes this commit added to the store: new unit bodies (as stored:
    /// compressed or delta-encoded) plus glue.
    pub new_bytes: u64,
    pub units_total: usize,
    /// Units (distinct contents) first stored by this commit.
    pub units_new: usize,
    /// Of the new units: stored as deltas against the lineage parent's tensors.
    pub units_delta: usize,
    /// Of the new units: byte-grouped and compressed (the rest are raw).
    pub units_grouped: usize,
    /// The checkpoint previously at this path, now replaced.
    pub replaced: Option<u64>,
    /// xxh3 of the whole file (kept in the recipe and checked on every read).
    pub file_xxh3: u64,
}

/// What an unlink (or a replacing commit or rename) freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UnlinkInfo {
    pub id: u64,
    pub units_freed: usize,
    /// Unit payload bytes freed.
    pub bytes_freed: u64,
}

/// A live checkpoint's owner map, as loaded from its recipe.
#[derive(Debug, Clone)]
pub(crate) struct LiveCkpt {
    pub tensors: Vec<TensorEntry>,
    /// Bytes of the recipe's glue section.
    pub glue_len: u64,
}

/// A node-local, content-addressed checkpoint store in one directory.
pub struct CheckpointStore {
    pub(crate) dir: PathBuf,
    _lock: File,
    pub(crate) opts: StoreOptions,
    pub(crate) catalog: Catalog,
    pub(crate) catalog_len: u64,
    pub(crate) live: BTreeMap<u64, LiveCkpt>,
    pub(crate) by_path: HashMap<Vec<u8>, u64>,
    pub(crate) units: HashMap<Hash, UnitInfo>,
    pub(crate) hot: Vec<Hot>,
    pub(crate) packs: std::sync::Mutex<PackSet>,
    /// What open repaired and compaction faults (see [`CheckpointStore::repairs`]).
    pub(crate) repairs: Vec<String>,
    pub(crate) compaction_hook: Option<crate::packs::CompactionHook>,
    tmp_seq: u64,
    /// A link into the store failed once (another file system, a file
    /// system without hard links): files are copied until the store is
    /// reopened, without a failing link per commit.
    adopt_off: bool,
}

const LOCK_FILE: &str = "lock";
pub const UNITS_DIR: &str = "units";
pub const RECIPES_DIR: &str = "recipes";
const TMP_DIR: &str = "tmp";

/// Files at least this long get a helper thread for hashing.
const PIPELINE_MIN: usize = 4 << 20;

/// A unit's blake3 and xxh3, in one pass over cache-sized blocks.
fn unit_hashes(b: &[u8]) -> (Hash, u64) {
    let mut b3 = blake3::Hasher::new();
    let mut x = StreamingChecksum::new();
    for block in b.chunks(128 << 10) {
        b3.update(block);
        x.update(block);
    }
    (*b3.finalize().as_bytes(), x.digest())
}

/// A unit a commit stored: its hash, header, and where it went.
pub(crate) type Written = (Hash, UnitHeader, UnitLoc);

/// What hashing and storing the units of a commit produced.
#[derive(Default)]
pub(crate) struct Stored {
    /// blake3 of every unit, in unit order.
    pub(crate) hashes: Vec<Hash>,
    pub(crate) file_xxh3: u64,
    /// Units first stored by this commit, and where (dead bytes of their
    /// pack if it fails).
    pub(crate) written: Vec<Written>,
    /// Unit body bytes written (an external unit's payload in its extent included).
    pub(crate) new_bytes: u64,
    /// The extent (sequence number, nonce) this commit adopted its file
    /// as (deleted if it fails).
    pub(crate) extent: Option<(u64, u64)>,
    /// Why the file was not adopted although it qualified (for [`CheckpointStore::repairs`]).
    pub(crate) adopt_error: Option<CkptError>,
}

/// How one unit of a file is to be stored.
pub(crate) struct UnitPlan {
    pub(crate) range: std::ops::Range<usize>,
    /// Element width of its dtype (byte grouping).
    pub(crate) width: usize,
    /// The lineage parent's tensor of the same name, dtype, shape and length.
    pub(crate) base: Option<Hash>,
}

impl CheckpointStore {
    /// Opens (creating if needed) the store in `dir` with default options.
    pub fn open(dir: &Path) -> Result<CheckpointStore> {
        Self::open_with(dir, StoreOptions::default())
    }

    /// Opens (creating if needed) the store in `dir`. Takes an exclusive
    /// lock on the directory, loads the catalog and every live recipe's owner
    /// map, and sweeps what a crash may have left: temp files, recipes of
    /// checkpoints the catalog does not list, units no live recipe refers to.
    pub fn open_with(dir: &Path, opts: StoreOptions) -> Result<CheckpointStore> {
        for d in [dir.to_path_buf(), dir.join(UNITS_DIR), dir.join(RECIPES_DIR), dir.join(TMP_DIR)] {
            std::fs::create_dir_all(&d).map_err(|e| CkptError::io(&d, e))?;
        }
        let lock_path = dir.join(LOCK_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| CkptError::io(&lock_path, e))?;
        {
            use std::os::fd::AsRawFd;
            // SAFETY: flock on a file descriptor we own; no memory is shared.
            let r = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    return Err(CkptError::Locked { dir: dir.into() });
                }
                return Err(CkptError::io(&lock_path, e));
            }
        }
        let mut store = CheckpointStore {
            dir: dir.into(),
            _lock: lock,
            opts,
            catalog: Catalog::default(),
            catalog_len: 0,
            live: BTreeMap::new(),
            by_path: HashMap::new(),
            units: HashMap::new(),
            hot: Vec::new(),
            packs: std::sync::Mutex::new(PackSet::new(dir.join(UNITS_DIR), &opts)),
            repairs: Vec::new(),
            compaction_hook: None,
            tmp_seq: 0,
            adopt_off: false,
        };
        clear_dir(&dir.join(TMP_DIR))?;
        let cat_path = dir.join(catalog::FILE_NAME);
        match std::fs::read(&cat_path) {
            Ok(b) => {
                store.catalog = Catalog::decode(&cat_path, &b)?;
                store.catalog_len = b.len() as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // A new store, unless something is already there: then the
                // catalog was lost and sweeping would delete everything.
                if dir_has_entries(&dir.join(RECIPES_DIR))? {
                    return Err(FormatError::Corrupt {
                        file: cat_path,
                        entry: "catalog".into(),
                        offset: 0,
                        problem: "missing, but the store holds recipes".into(),
                    }
                    .into());
                }
                let c = Catalog::default();
                store.write_catalog(&c)?;
                store.catalog = c;
            }
            Err(e) => return Err(CkptError::io(&cat_path, e)),
        }
        let live: Vec<CatalogEntry> = store.catalog.entries.iter().filter(|e| e.live).cloned().collect();
        for e in live {
            let r = store.load_recipe(e.id, false)?;
            if r.logical != e.logical {
                let file = store.recipe_path(e.id);
                return Err(FormatError::Corrupt {
                    file,
                    entry: "recipe header".into(),
                    offset: 0,
                    problem: format!("{} logical bytes, the catalog says {}", r.logical, e.logical),
                }
                .into());
            }
            store.check_lengths(e.id, &r.tensors)?;
            store.add_refs(e.id, &r.tensors);
            store.by_path.insert(e.path.clone(), e.id);
            store.live.insert(e.id, LiveCkpt { tensors: r.tensors, glue_len: r.glue_len });
        }
        store.locate_units()?;
        store.sweep()?;
        Ok(store)
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn recipe_path(&self, id: u64) -> PathBuf {
        self.dir.join(RECIPES_DIR).join(recipe::file_name(id))
    }

    pub(crate) fn unit_path(&self, h: &Hash) -> PathBuf {
        unit::path(&self.dir.join(UNITS_DIR), h)
    }

    fn tmp_path(&mut self) -> PathBuf {
        self.tmp_seq += 1;
        self.dir.join(TMP_DIR).join(format!("{}.tmp", self.tmp_seq))
    }

    /// Loads recipe `id`: metadata only (header, owner map, pieces) or with glue.
    pub(crate) fn load_recipe(&self, id: u64, with_glue: bool) -> Result<Recipe> {
        let file = self.recipe_path(id);
        let mut f = File::open(&file).map_err(|e| CkptError::io(&file, e))?;
        let mut b = Vec::new();
        if with_glue {
            f.read_to_end(&mut b).map_err(|e| CkptError::io(&file, e))?;
        } else {
            let mut head = vec![0u8; recipe::HEADER_LEN];
            let n = read_full(&mut f, &mut head).map_err(|e| CkptError::io(&file, e))?;
            head.truncate(n);
            let want = Recipe::meta_len(&file, &head)?;
            b = head;
            b.resize(want.max(b.len()), 0);
            let n = read_full(&mut f, &mut b[recipe::HEADER_LEN..]).map_err(|e| CkptError::io(&file, e))?;
            b.truncate(recipe::HEADER_LEN + n);
        }
        let r = Recipe::decode(&file, &b, with_glue)?;
        if r.id != id {
            return Err(FormatError::Corrupt {
                file,
                entry: "recipe header".into(),
                offset: 16,
                problem: format!("recipe of checkpoint {}, expected {id}", r.id),
            }
            .into());
        }
        Ok(r)
    }

    /// Checks that every unit of `tensors` has one length across recipes
    /// (a unit's identity is its content).
    fn check_lengths(&self, id: u64, tensors: &[TensorEntry]) -> Result<()> {
        for t in tensors {
            if let Some(u) = self.units.get(&t.hash).filter(|u| u.len != t.len) {
                return Err(FormatError::Corrupt {
                    file: self.recipe_path(id),
                    entry: format!("tensor {}", String::from_utf8_lossy(&t.name)),
                    offset: 0,
                    problem: format!("unit {} is {} bytes here and {} bytes elsewhere", unit::hex(&t.hash), t.len, u.len),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Deletes recipes the catalog does not list as live, unit files no
    /// live recipe refers to (what a crash between writing them and the
    /// catalog leaves behind) and other strays in `units/`; packs and
    /// extents are [`Self::locate_units`]'s.
    fn sweep(&mut self) -> Result<()> {
        let rdir = self.dir.join(RECIPES_DIR);
        for ent in std::fs::read_dir(&rdir).map_err(|e| CkptError::io(&rdir, e))? {
            let ent = ent.map_err(|e| CkptError::io(&rdir, e))?;
            let name = ent.file_name();
            let id = name.to_str().and_then(|n| n.strip_suffix(".fsr")).and_then(|n| u64::from_str_radix(n, 16).ok());
            if !id.is_some_and(|id| self.live.contains_key(&id)) {
                remove_file(&ent.path())?;
            }
        }
        let udir = self.dir.join(UNITS_DIR);
        for ent in std::fs::read_dir(&udir).map_err(|e| CkptError::io(&udir, e))? {
            let ent = ent.map_err(|e| CkptError::io(&udir, e))?;
            let name = ent.file_name();
            let name_str = name.to_str();
            if name_str.and_then(crate::pack::parse_name).is_some() || name_str.and_then(crate::extent::parse_name).is_some() {
                continue;
            }
            let h = name.to_str().and_then(|n| n.strip_suffix(".fsu")).and_then(unit::parse_hex);
            if !h.is_some_and(|h| self.units.get(&h).is_some_and(|u| u.loc == Some(UnitLoc::File))) {
                remove_file(&ent.path())?;
            }
        }
        Ok(())
    }

    fn write_atomic(&mut self, dest: &Path, bytes: &[u8]) -> Result<()> {
        let tmp = self.tmp_path();
        let mut f = File::create(&tmp).map_err(|e| CkptError::io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| CkptError::io(&tmp, e))?;
        if self.opts.fsync {
            f.sync_data().map_err(|e| CkptError::io(&tmp, e))?;
        }
        drop(f);
        std::fs::rename(&tmp, dest).map_err(|e| CkptError::io(dest, e))
    }

    fn write_catalog(&mut self, c: &Catalog) -> Result<()> {
        let b = c.encode();
        let dest = self.dir.join(catalog::FILE_NAME);
        self.write_atomic(&dest, &b)?;
        if self.opts.fsync {
            sync_dir(&self.dir)?;
        }
        self.catalog_len = b.len() as u64;
        Ok(())
    }

    /// The live checkpoint at `path`.
    pub fn id_of(&self, path: &[u8]) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// The catalog entry of checkpoint `id` (live or deleted).
    pub fn entry(&self, id: u64) -> Option<&CatalogEntry> {
        let i = self.catalog.entries.binary_search_by_key(&id, |e| e.id).ok()?;
        Some(&self.catalog.entries[i])
    }

    /// Every checkpoint the catalog knows, live and deleted, in id order.
    pub fn entries(&self) -> &[CatalogEntry] {
        &self.catalog.entries
    }

    /// The owner map of live checkpoint `id`.
    pub fn tensors(&self, id: u64) -> Option<&[TensorEntry]> {
        self.live.get(&id).map(|l| l.tensors.as_slice())
    }

    /// Commits the contents of `file` as the checkpoint at `path`. A file
    /// sealed against writing and shrinking (a memfd with `F_SEAL_WRITE` and
    /// `F_SEAL_SHRINK`, as the daemon seals a closed output) is committed
    /// from a memory map with no copy; any other file is read first, since
    /// its bytes could change under a mapping.
    pub fn commit_file(&mut self, path: &[u8], file: &File) -> Result<CommitInfo> {
        use std::os::fd::AsRawFd;
        let name = PathBuf::from(String::from_utf8_lossy(path).into_owned());
        let len = file.metadata().map_err(|e| CkptError::io(&name, e))?.len();
        // SAFETY: fcntl(F_GET_SEALS) on a descriptor we borrow; it only reads flags.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        let need = libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK;
        if len > 0 && seals >= 0 && seals & need == need {
            // SAFETY: the seals forbid every write and every shrink of the
            // file from now on, so the mapped bytes cannot change or vanish.
            let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| CkptError::io(&name, e))?;
            return self.commit(path, &map);
        }
        // pread from 0 to EOF: the descriptor's offset is left alone.
        use std::os::unix::fs::FileExt;
        let mut bytes = vec![0u8; len as usize];
        let mut n = 0;
        loop {
            if n == bytes.len() {
                bytes.resize(n + (1 << 20).max(n / 8), 0);
            }
            match file.read_at(&mut bytes[n..], n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CkptError::io(&name, e)),
            }
        }
        bytes.truncate(n);
        self.commit(path, &bytes)
    }

    /// Commits `bytes` as the checkpoint at `path` (replacing any checkpoint
    /// there). On error nothing is committed and the store is unchanged.
    ///
    /// Every unit is hashed (helper threads share the work for large
    /// files); the new ones are then encoded ([`mod@crate::codec`]: a delta
    /// against the lineage parent's tensor of the same name, dtype and
    /// shape, or byte-grouped and compressed, or raw, whichever is smallest)
    /// and written, also in parallel.
    pub fn commit(&mut self, path: &[u8], bytes: &[u8]) -> Result<CommitInfo> {
        self.commit_inner(path, bytes, None, None)
    }

    /// Commits `bytes` like [`Self::commit`] and keeps them as a *hot copy*
    /// of the new checkpoint (the last [`StoreOptions::hot`] commits): reads
    /// of it are served from these bytes, and the next commit finds its
    /// delta bases there instead of decoding them. The caller promises the
    /// bytes never change (a map of a sealed or handed-over file).
    pub fn commit_shared(&mut self, path: &[u8], bytes: SharedBytes) -> Result<CommitInfo> {
        let keep = bytes.clone();
        self.commit_inner(path, (*bytes).as_ref(), Some(keep), None)
    }

    /// Commits like [`Self::commit_shared`], where `bytes` map `file`, which
    /// the caller hands over for good: nothing writes it any more. When at
    /// least [`crate::extent::ADOPT_PERCENT`] % of it are new units that
    /// stay raw (fresh incompressible tensors, large unknown files), the
    /// file is hard-linked into the store as an extent and those units'
    /// payloads are not copied (see [`mod@crate::extent`]); otherwise, or
    /// if the link fails (another file system), the commit is the same as
    /// [`Self::commit_shared`]. `file_xxh3`: the xxh3 of the whole file
    /// when the caller computed it already (the store then does not read
    /// the file a third time for it; a wrong value makes every read of the
    /// checkpoint fail its whole-file check, never return other bytes).
    pub fn commit_adopting(&mut self, path: &[u8], bytes: SharedBytes, file: &File, file_xxh3: Option<u64>) -> Result<CommitInfo> {
        let keep = bytes.clone();
        self.commit_inner(path, (*bytes).as_ref(), Some(keep), Some((file, file_xxh3)))
    }

    fn commit_inner(&mut self, path: &[u8], bytes: &[u8], keep: Option<SharedBytes>, adopt: Option<(&File, Option<u64>)>) -> Result<CommitInfo> {
        check_path(path)?;
        let split = split::split(bytes, &self.opts.cdc);
        debug_assert!(split.check_cover(bytes.len()));
        let id = self.catalog.next_id;
        let (plans, lineage) = self.plan_units(path, &split);

        let mut st = Stored::default();
        // On failure what this commit appended is given back (a full disk
        // must not stay full because a commit failed).
        let mark = self.packs().mark();
        let stored = self.store_units(bytes, &plans, adopt, &mut st);
        if let Some(e) = st.adopt_error.take() {
            self.adopt_off = true;
            self.repairs.push(format!("{e}: adopting a committed file failed; files are copied from now on, until the store is reopened"));
        }
        if let Err(e) = stored {
            self.give_back(&mark, st.extent.map(|x| x.0));
            return Err(e);
        }
        let Stored { hashes, file_xxh3, written, new_bytes, extent, .. } = st;

        let parent = self.parent_of(path, &hashes, lineage);
        let (rec, hot_units) = self.build_recipe(id, parent, split, bytes, &hashes, file_xxh3, new_bytes, keep.is_some());
        let result = self.finish_commit(path, rec, &written);
        match &result {
            Ok(_) => {
                if let Some(k) = keep {
                    self.keep_hot(id, k, hot_units, extent.is_some());
                }
            }
            Err(_) => {
                // Nothing was committed: give back what it appended.
                let _ = std::fs::remove_file(self.recipe_path(id));
                self.give_back(&mark, extent.map(|x| x.0));
            }
        }
        result
    }

    /// How each unit of `split` is to be stored (ranges into the split
    /// file), with the delta base each changed tensor gets from the lineage
    /// parent (the tensor of the same name, dtype, shape and length), and
    /// that lineage parent.
    pub(crate) fn plan_units(&self, path: &[u8], split: &Split) -> (Vec<UnitPlan>, Option<u64>) {
        let mut plans = Vec::new();
        for p in &split.pieces {
            if let Piece::Unit(r, meta) = p {
                plans.push(UnitPlan { range: r.clone(), width: codec::width_of(&meta.dtype), base: None });
            }
        }
        let lineage = self.lineage_parent(path, &split.pieces);
        if let Some(ts) = lineage.and_then(|p| self.live.get(&p)).filter(|_| self.opts.max_chain > 0) {
            let mut by_name: HashMap<(&[u8], &str, &[u64], u64), Hash> = HashMap::new();
            for t in &ts.tensors {
                by_name.entry((&t.name, &t.dtype, &t.shape, t.len)).or_insert(t.hash);
            }
            let metas = split.pieces.iter().filter_map(|p| match p {
                Piece::Unit(r, m) => Some((r, m)),
                Piece::Glue(_) => None,
            });
            for (plan, (r, m)) in plans.iter_mut().zip(metas) {
                let dtype = clip_dtype(&m.dtype);
                plan.base = by_name.get(&(&m.name[..], &dtype[..], &m.shape[..], r.len() as u64)).copied();
            }
        }
        (plans, lineage)
    }

    /// The parent of a new checkpoint of units `hashes`: the live
    /// checkpoint sharing the most unit bytes with it (ties: same
    /// directory, then the most recent), else its lineage parent.
    pub(crate) fn parent_of(&self, path: &[u8], hashes: &[Hash], lineage: Option<u64>) -> Option<u64> {
        let mut shared: HashMap<u64, u64> = HashMap::new();
        let mut seen = HashSet::with_capacity(hashes.len());
        for h in hashes {
            if !seen.insert(*h) {
                continue;
            }
            if let Some(info) = self.units.get(h) {
                for &c in &info.ckpts {
                    *shared.entry(c).or_default() += info.len;
                }
            }
        }
        let my_dir = parent_dir(path);
        shared
            .iter()
            .filter(|(_, &b)| b > 0)
            .max_by_key(|(&c, &b)| {
                let same_dir = self.entry(c).is_some_and(|e| parent_dir(&e.path) == my_dir);
                (b, same_dir, c)
            })
            .map(|(&c, _)| c)
            .or(lineage)
    }

    /// The recipe of checkpoint `id`: the glue of `split` copied from
    /// `glue_src` (the file, or a skeleton of it holding its glue in
    /// place), its units by `hashes` (in unit order) with their owners.
    /// With `want_hot`, also where each unit lies in the file (for a hot copy).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build_recipe(
        &self,
        id: u64,
        parent: Option<u64>,
        split: Split,
        glue_src: &[u8],
        hashes: &[Hash],
        file_xxh3: u64,
        unit_bytes: u64,
        want_hot: bool,
    ) -> (Recipe, HashMap<Hash, std::ops::Range<usize>>) {
        let mut glue = Vec::new();
        let mut rpieces = Vec::with_capacity(split.pieces.len());
        let mut tensors = Vec::with_capacity(hashes.len());
        let mut hot_units = HashMap::new();
        for p in split.pieces {
            match p {
                Piece::Glue(r) => {
                    rpieces.push(RecipePiece::Glue { off: glue.len() as u64, len: r.len() as u64 });
                    glue.extend_from_slice(&glue_src[r]);
                }
                Piece::Unit(r, meta) => {
                    let i = tensors.len();
                    let h = hashes[i];
                    rpieces.push(RecipePiece::Unit { index: i as u32 });
                    if want_hot {
                        hot_units.entry(h).or_insert_with(|| r.clone());
                    }
                    tensors.push(TensorEntry {
                        name: meta.name,
                        dtype: clip_dtype(&meta.dtype),
                        shape: meta.shape.into_iter().take(u16::MAX as usize).collect(),
                        hash: h,
                        len: r.len() as u64,
                        owner: self.units.get(&h).map_or(id, |u| u.owner),
                    });
                }
            }
        }
        let rec = Recipe {
            id,
            parent: parent.unwrap_or(0),
            format: split.format,
            logical: glue_src.len() as u64,
            file_xxh3,
            new_bytes: unit_bytes + glue.len() as u64,
            tensors,
            pieces: rpieces,
            glue_len: glue.len() as u64,
            glue,
        };
        (rec, hot_units)
    }

    /// After a failed commit: the packs cut back to `mark`, the extent it
    /// adopted (if any) deleted.
    pub(crate) fn give_back(&self, mark: &BTreeMap<u64, u64>, extent: Option<u64>) {
        let mut set = self.packs();
        set.give_back(mark);
        if let Some(x) = extent {
            let _ = set.drop_extent(x);
        }
    }

    /// The live checkpoint a new file at `path` most likely continues: the
    /// one with the most tensors of the same name, dtype, shape and length
    /// (ties: same directory, then the most recent). Its tensors are the
    /// delta bases of the new file's changed tensors.
    fn lineage_parent(&self, path: &[u8], pieces: &[Piece]) -> Option<u64> {
        let mut want: HashSet<(&[u8], &[u64], u64)> = HashSet::new();
        for p in pieces {
            if let Piece::Unit(r, m) = p {
                if !m.name.is_empty() && r.len() >= codec::MIN_ENCODE {
                    want.insert((&m.name, &m.shape, r.len() as u64));
                }
            }
        }
        if want.is_empty() {
            return None;
        }
        let my_dir = parent_dir(path);
        self.live
            .iter()
            .map(|(&id, l)| {
                let n = l
                    .tensors
                    .iter()
                    .filter(|t| want.contains(&(&t.name[..], &t.shape[..], t.len)))
                    .count();
                let same_dir = self.entry(id).is_some_and(|e| parent_dir(&e.path) == my_dir);
                (n, same_dir, id)
            })
            .filter(|&(n, _, _)| n > 0)
            .max()
            .map(|(_, _, id)| id)
    }

    /// Hashes every unit (blake3 for identity, xxh3 for its file header)
    /// and computes the whole file's xxh3, then encodes and writes the
    /// units the store does not have. Both phases run on this thread and,
    /// for large files, on helper threads.
    pub(crate) fn store_units(&self, bytes: &[u8], plans: &[UnitPlan], adopt: Option<(&File, Option<u64>)>, st: &mut Stored) -> Result<()> {
        let known_sum = adopt.and_then(|a| a.1);
        let adopt = adopt.map(|a| a.0);
        use std::sync::atomic::{AtomicUsize, Ordering};
        let n = plans.len();
        let helpers = if bytes.len() >= PIPELINE_MIN { self.opts.threads } else { 0 };
        // Phase 1: hashes, claimed one unit at a time.
        let claim = AtomicUsize::new(0);
        // A tensor equal to its lineage parent's, whose bytes a hot copy
        // holds, is that unit: a memcmp instead of a blake3 (frozen tensors).
        // Its xxh3 is not needed: the unit is stored already.
        let hash_one = |i: usize| {
            let b = &bytes[plans[i].range.clone()];
            match plans[i].base {
                Some(bh) if self.hot_unit(&bh).is_some_and(|hb| hb == b) => (bh, 0),
                _ => unit_hashes(b),
            }
        };
        let mut ready: Vec<Option<(Hash, u64)>> = vec![None; n];
        let file_sum = std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel::<(usize, Hash, u64)>();
            let mut first = None;
            for k in 0..helpers {
                let (claim, hash_one, tx) = (&claim, &hash_one, tx.clone());
                let handle = scope.spawn(move || {
                    let sum = (k == 0 && known_sum.is_none()).then(|| xxh3(bytes));
                    loop {
                        let i = claim.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        let (h, x) = hash_one(i);
                        if tx.send((i, h, x)).is_err() {
                            break;
                        }
                    }
                    sum
                });
                if k == 0 {
                    first = Some(handle);
                }
            }
            drop(tx);
            loop {
                let j = claim.fetch_add(1, Ordering::Relaxed);
                if j >= n {
                    break;
                }
                ready[j] = Some(hash_one(j));
            }
            for (i, h, x) in rx {
                ready[i] = Some((h, x));
            }
            let sum = first.and_then(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            sum.or(known_sum).unwrap_or_else(|| xxh3(bytes))
        });
        st.file_xxh3 = file_sum;
        // Which units are new (first occurrence of each new hash).
        let mut new = Vec::new();
        let mut fresh = HashSet::new();
        for (i, r) in ready.iter().enumerate() {
            let Some((h, x)) = *r else { unreachable!("every unit was hashed") };
            let len = plans[i].range.len() as u64;
            match self.units.get(&h) {
                Some(info) if info.len != len => {
                    return Err(FormatError::Corrupt {
                        file: self.unit_path(&h),
                        entry: "unit".into(),
                        offset: 0,
                        problem: format!("blake3 collision: {} and {len} bytes", info.len),
                    }
                    .into());
                }
                Some(_) => {}
                None if fresh.insert(h) => new.push((i, h, x)),
                None => {}
            }
            st.hashes.push(h);
        }
        // A file that is nearly all new units is adopted as an extent when
        // the caller hands it over: its raw units are then not copied.
        let len = bytes.len() as u64;
        let new_len: u64 = new.iter().map(|&(i, _, _)| plans[i].range.len() as u64).sum();
        let qualifies = len >= crate::extent::ADOPT_MIN && new_len * 100 >= crate::extent::ADOPT_PERCENT * len;
        if let Some(f) = adopt.filter(|_| qualifies && !self.adopt_off) {
            let same = f.metadata().map_err(|e| CkptError::io("the committed file", e)).and_then(|m| {
                if m.len() == len {
                    Ok(())
                } else {
                    Err(CkptError::Invalid(format!("the file to adopt holds {} bytes, the commit {len}", m.len())))
                }
            });
            match same.and_then(|_| self.packs().adopt(f, len)) {
                Ok(x) => st.extent = Some(x),
                // The file lost its last name since its commit (a program
                // removed the output before this queued commit ran): it
                // cannot be linked any more, and is copied as any file not
                // adopted. Adopting others still works.
                Err(CkptError::Format(FormatError::Io { source, .. })) if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => st.adopt_error = Some(e),
            }
        }
        let extent = st.extent;
        let empty_sum = xxh3(&[]);
        // Phase 2: encode and write the new units, each thread into its own
        // pack (writes into one file serialize on its inode lock).
        let next = AtomicUsize::new(0);
        let out: std::sync::Mutex<(Vec<Written>, Option<CkptError>)> = std::sync::Mutex::new((Vec::new(), None));
        let work = |lane: usize| loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(i, h, x)) = new.get(k) else { return };
            let plan = &plans[i];
            let payload = &bytes[plan.range.clone()];
            let base = self.delta_base(&h, plan);
            let (mut head, body) = unit::encode(&h, x, payload, plan.width, base.as_ref().map(|(bh, d, b)| (bh, *d, &b[..])));
            let r = match extent {
                // A raw unit of an adopted file: a record that points into the extent.
                Some((seq, nonce)) if head.encoding == Encoding::Raw => {
                    head.encoding = Encoding::External;
                    head.extent = Some(unit::ExtentRef { seq, nonce, off: plan.range.start as u64 });
                    head.body_len = 0;
                    head.body_xxh3 = empty_sum;
                    self.append_unit(lane, &head, &[])
                }
                _ => self.append_unit(lane, &head, &body),
            };
            let mut g = out.lock().unwrap_or_else(|p| p.into_inner());
            match r {
                Ok(loc) => g.0.push((h, head, loc)),
                Err(e) => {
                    g.1.get_or_insert(e);
                    next.store(new.len(), Ordering::Relaxed);
                    return;
                }
            }
        };
        let helpers = helpers.min(new.len().saturating_sub(1));
        std::thread::scope(|s| {
            let hs: Vec<_> = (1..=helpers).map(|lane| s.spawn(move || work(lane))).collect();
            work(0);
            for h in hs {
                h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            }
        });
        let (mut written, fault) = out.into_inner().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = fault {
            return Err(e);
        }
        // More of the file compressed than the sampling of new bytes
        // promised: its external units are copied after all, and the extent,
        // mostly dead, goes.
        let external: u64 = written.iter().filter(|(_, h, _)| h.encoding == Encoding::External).map(|(_, h, _)| h.len).sum();
        if let Some((seq, _)) = extent.filter(|_| external * 100 < crate::extent::ADOPT_PERCENT * len) {
            for (h, head, loc) in written.iter_mut().filter(|(_, h, _)| h.encoding == Encoding::External) {
                let Some(x) = head.extent else { continue };
                let payload = &bytes[x.off as usize..(x.off + head.len) as usize];
                let raw = UnitHeader::raw(head.len, *h, head.xxh3);
                *loc = self.append_unit(0, &raw, payload)?;
                *head = raw;
            }
            st.extent = None;
            self.packs().drop_extent(seq)?;
        }
        st.new_bytes += written.iter().map(|(_, h, _)| h.body_len + if h.encoding == Encoding::External { h.len } else { 0 }).sum::<u64>();
        st.written = written;
        Ok(())
    }

    /// The base a new unit is encoded against, with its chain depth and
    /// payload: the lineage parent's tensor while its chain is shorter than
    /// [`StoreOptions::max_chain`], else that chain's first (full) unit. None
    /// when there is none or it cannot be read (the unit is then stored in
    /// full: a damaged base never fails a commit).
    fn delta_base(&self, h: &Hash, plan: &UnitPlan) -> Option<(Hash, u8, std::borrow::Cow<'_, [u8]>)> {
        let mut bh = plan.base.filter(|b| b != h)?;
        let mut info = self.units.get(&bh)?;
        if info.depth >= self.opts.max_chain {
            while let Some(up) = info.base {
                bh = up;
                info = self.units.get(&bh)?;
            }
            if bh == *h || info.depth != 0 {
                return None;
            }
        }
        let len = plan.range.len() as u64;
        if info.len != len {
            return None;
        }
        let bytes = match self.hot_unit(&bh) {
            Some(b) => std::borrow::Cow::Borrowed(b),
            None => std::borrow::Cow::Owned(self.unit_bytes(&bh, len, false).ok()?),
        };
        Some((bh, info.depth, bytes))
    }

    pub(crate) fn finish_commit(&mut self, path: &[u8], rec: Recipe, written: &[Written]) -> Result<CommitInfo> {
        let units_new = written.len();
        let id = rec.id;
        let enc = rec.encode();
        let rpath = self.recipe_path(id);
        self.write_atomic(&rpath, &enc)?;
        if self.opts.fsync {
            self.sync()?;
        }
        let replaced = self.by_path.get(path).copied();
        let mut cat = self.catalog.clone();
        cat.next_id = id + 1;
        cat.generation += 1;
        if let Some(old) = replaced {
            tombstone(&mut cat, old);
        }
        cat.entries.push(CatalogEntry {
            id,
            parent: rec.parent,
            logical: rec.logical,
            new_bytes: rec.new_bytes,
            recipe_len: enc.len() as u64,
            path: path.to_vec(),
            live: true,
            format: rec.format,
            tensors: rec.tensors.len() as u64,
        });
        self.write_catalog(&cat)?;
        // Committed. Update memory, then free what the replaced checkpoint held alone.
        self.catalog = cat;
        self.add_refs(id, &rec.tensors);
        for (h, head, loc) in written {
            self.register_written(h, head, *loc);
        }
        self.by_path.insert(path.to_vec(), id);
        let count = |e: Encoding| written.iter().filter(|(_, h, _)| h.encoding == e).count();
        let info = CommitInfo {
            id,
            parent: (rec.parent != 0).then_some(rec.parent),
            format: rec.format,
            logical: rec.logical,
            new_bytes: rec.new_bytes,
            units_total: rec.tensors.len(),
            units_new,
            units_delta: count(Encoding::Delta),
            units_grouped: count(Encoding::Grouped),
            replaced,
            file_xxh3: rec.file_xxh3,
        };
        self.live.insert(id, LiveCkpt { tensors: rec.tensors, glue_len: rec.glue_len });
        if let Some(old) = replaced {
            self.release(old);
        }
        Ok(info)
    }

    /// Removes the checkpoint at `path`; units no other live checkpoint
    /// refers to are deleted.
    pub fn unlink(&mut self, path: &[u8]) -> Result<UnlinkInfo> {
        let id = self.id_of(path).ok_or_else(|| CkptError::not_found(path))?;
        let mut cat = self.catalog.clone();
        cat.generation += 1;
        tombstone(&mut cat, id);
        self.write_catalog(&cat)?;
        self.catalog = cat;
        self.by_path.remove(path);
        Ok(self.release(id))
    }

    /// Renames a checkpoint: only the path -> id mapping changes, so owner
    /// maps naming it stay valid. A live checkpoint at `to` is replaced.
    pub fn rename(&mut self, from: &[u8], to: &[u8]) -> Result<Option<UnlinkInfo>> {
        check_path(to)?;
        let id = self.id_of(from).ok_or_else(|| CkptError::not_found(from))?;
        if from == to {
            return Ok(None);
        }
        let replaced = self.id_of(to);
        let mut cat = self.catalog.clone();
        cat.generation += 1;
        if let Some(old) = replaced {
            tombstone(&mut cat, old);
        }
        if let Ok(i) = cat.entries.binary_search_by_key(&id, |e| e.id) {
            cat.entries[i].path = to.to_vec();
        }
        self.write_catalog(&cat)?;
        self.catalog = cat;
        self.by_path.remove(from);
        self.by_path.insert(to.to_vec(), id);
        Ok(replaced.map(|old| self.release(old)))
    }

    /// After the catalog no longer lists `id` as live: drop its references,
    /// delete its recipe and the units that reached zero. Deletion is best
    /// effort: the catalog is already written, and a file that could not be
    /// removed now is swept at the next open.
    fn release(&mut self, id: u64) -> UnlinkInfo {
        self.drop_hot(id);
        let Some(l) = self.live.remove(&id) else { return UnlinkInfo { id, ..UnlinkInfo::default() } };
        let freed = self.drop_refs(id, &l.tensors);
        let mut info = UnlinkInfo { id, units_freed: freed.len(), bytes_freed: 0 };
        for (h, u) in freed {
            info.bytes_freed += u.len;
            self.forget_stored(&h, &u);
        }
        let _ = remove_file(&self.recipe_path(id));
        self.compact_quietly();
        info
    }

    /// Writes the exact bytes of the checkpoint at `path` to `out`. Every
    /// unit is decoded and checked (header, length, checksums) before any of
    /// its bytes are written; the whole-file checksum is checked at the end.
    /// A hot copy is written as it is. Returns the byte count.
    pub fn read_to<W: Write + ?Sized>(&self, path: &[u8], out: &mut W) -> Result<u64> {
        let id = self.id_of(path).ok_or_else(|| CkptError::not_found(path))?;
        let name = PathBuf::from(String::from_utf8_lossy(path).into_owned());
        if let Some(hot) = self.hot_file(id) {
            let b: &[u8] = (**hot).as_ref();
            let stored = self.load_recipe(id, false)?.file_xxh3;
            check_file_sum(path, stored, xxh3(b))?;
            out.write_all(b).map_err(|e| CkptError::io(&name, e))?;
            return Ok(b.len() as u64);
        }
        let r = self.load_recipe(id, true)?;
        let mut sum = StreamingChecksum::new();
        let mut buf = Vec::new();
        for p in &r.pieces {
            match *p {
                RecipePiece::Glue { off, len } => {
                    let g = &r.glue[off as usize..(off + len) as usize];
                    sum.update(g);
                    out.write_all(g).map_err(|e| CkptError::io(&name, e))?;
                }
                RecipePiece::Unit { index } => {
                    let t = &r.tensors[index as usize];
                    let n = usize::try_from(t.len).map_err(|_| CkptError::Invalid("unit larger than memory".into()))?;
                    buf.resize(n, 0);
                    self.load_unit(&t.hash, &mut buf, false)?;
                    sum.update(&buf);
                    out.write_all(&buf).map_err(|e| CkptError::io(&name, e))?;
                }
            }
        }
        check_file_sum(path, r.file_xxh3, sum.digest())?;
        Ok(r.logical)
    }

    /// The exact bytes of the checkpoint at `path`, checked against the
    /// whole-file checksum; a damaged unit is an error, never wrong bytes.
    pub fn read(&self, path: &[u8]) -> Result<Vec<u8>> {
        let id = self.id_of(path).ok_or_else(|| CkptError::not_found(path))?;
        let logical = self.entry(id).map_or(0, |e| e.logical);
        let len = usize::try_from(logical).map_err(|_| CkptError::Invalid("checkpoint larger than memory".into()))?;
        let mut out = vec![0u8; len];
        self.read_into(path, &mut out)?;
        Ok(out)
    }

    /// Flushes every file of the store to stable storage (before a drain).
    pub fn sync(&self) -> Result<()> {
        use std::os::fd::AsRawFd;
        let d = File::open(&self.dir).map_err(|e| CkptError::io(&self.dir, e))?;
        // SAFETY: syncfs on a directory fd we own; no memory is shared.
        if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
            return Err(CkptError::io(&self.dir, std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

fn check_file_sum(path: &[u8], stored: u64, computed: u64) -> Result<()> {
    if stored != computed {
        return Err(CkptError::FileChecksum { path: String::from_utf8_lossy(path).into_owned(), stored, computed });
    }
    Ok(())
}

fn tombstone(cat: &mut Catalog, id: u64) {
    if let Ok(i) = cat.entries.binary_search_by_key(&id, |e| e.id) {
        cat.entries[i].live = false;
        cat.entries[i].recipe_len = 0;
    }
}

pub(crate) fn check_path(path: &[u8]) -> Result<()> {
    if path.is_empty() || path.contains(&0) || path.len() > u32::MAX as usize {
        return Err(CkptError::Invalid(format!("bad checkpoint path {:?}", String::from_utf8_lossy(path))));
    }
    Ok(())
}

/// The directory part of a path (`a/b/c` -> `a/b`, `c` -> empty).
pub(crate) fn parent_dir(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&c| c == b'/') {
        Some(i) => &path[..i],
        None => &[],
    }
}

fn clip_dtype(d: &str) -> String {
    let mut end = d.len().min(u16::MAX as usize);
    while !d.is_char_boundary(end) {
        end -= 1;
    }
    d[..end].to_string()
}

fn remove_file(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CkptError::io(p, e)),
    }
}

fn clear_dir(d: &Path) -> Result<()> {
    for ent in std::fs::read_dir(d).map_err(|e| CkptError::io(d, e))? {
        let p = ent.map_err(|e| CkptError::io(d, e))?.path();
        remove_file(&p)?;
    }
    Ok(())
}

fn dir_has_entries(d: &Path) -> Result<bool> {
    Ok(std::fs::read_dir(d).map_err(|e| CkptError::io(d, e))?.next().is_some())
}

fn sync_dir(d: &Path) -> Result<()> {
    File::open(d).and_then(|f| f.sync_all()).map_err(|e| CkptError::io(d, e))
}
