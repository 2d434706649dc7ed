//! # fanstore-ckpt
//!
//! Tensor-level deduplication of checkpoint files, with owner maps and
//! lineage queries (the engine behind FanStore's checkpoint support; the
//! daemon calls [`CheckpointStore::commit`] when an output file is closed and
//! the `fanstore ckpt ...` commands call the queries).
//!
//! A committed file is recognised ([`mod@split`]: safetensors, torch.save zip
//! archives, .npy, .npz; anything else is cut into content-defined chunks)
//! and split byte-exactly into *units* (tensor payloads) and *glue* (every
//! other byte). Each unit is stored once, identified by its blake3
//! ([`mod@unit`]), appended as a record to a pack file ([`mod@pack`]) (or,
//! for a file handed over for good that is nearly all new raw units, left
//! in that file, adopted by a hard link as an extent: [`mod@extent`]), and
//! encoded losslessly ([`mod@codec`]): a changed tensor
//! whose lineage parent has a tensor of the same name, dtype and shape is a
//! delta against it (XOR of the element bits, byte-grouped, zstd), other
//! tensors are byte-grouped and compressed when that pays, raw otherwise;
//! chains are bounded and bases stay alive while deltas need them
//! ([`mod@units`]). The file becomes a [`recipe`]: its glue inline, its units by
//! hash, and its owner map (tensor name -> owner checkpoint, hash, dtype,
//! shape, size). The owner of a unit is the checkpoint that first stored
//! that exact content, so a checkpoint inherits its parent's owners for
//! every unchanged tensor. Its parent is the earlier live checkpoint that
//! shares the most unit bytes with it (ties: same directory, then the most
//! recent). Reading rebuilds the exact bytes and checks them against the
//! whole-file xxh3 kept in the recipe; a damaged unit is an error, never
//! wrong bytes. Unlinking drops references; a unit no live recipe (or delta)
//! needs becomes dead bytes of its pack, and a pack less than half live is
//! compacted (its live records copied to the active pack, then deleted).
//!
//! ```no_run
//! use fanstore_ckpt::CheckpointStore;
//! let mut store = CheckpointStore::open("/tmp/fanstore/ckpt".as_ref())?;
//! let bytes = std::fs::read("epoch-3.safetensors").unwrap();
//! let info = store.commit(b"run1/epoch-3.safetensors", &bytes)?;
//! println!("{} new of {} bytes, parent {:?}", info.new_bytes, info.logical, info.parent);
//! assert_eq!(store.read(b"run1/epoch-3.safetensors")?, bytes);
//! print!("{}", store.log(b"run1/epoch-3.safetensors")?.to_table());
//! print!("{}", store.du().to_json());
//! # Ok::<(), fanstore_ckpt::CkptError>(())
//! ```
//!
//! A writer that knows which tensors the store holds already commits from
//! parts instead ([`CheckpointStore::commit_parts`], [`mod@parts`]): glue,
//! references to stored units, and only the new units' bytes.
//!
//! ## The store directory
//!
//! ```text
//! <dir>/lock                       empty; flock'd by the one process that has the store open
//! <dir>/catalog.fsc                path -> checkpoint id, tombstones, next id  (catalog)
//! <dir>/recipes/<id:016x>.fsr      one recipe + owner map per live checkpoint (recipe)
//! <dir>/units/<seq:016x>.fsk       pack files: units appended as records      (pack)
//! <dir>/units/<seq>-<nonce>.fsx    extents: committed files adopted whole, hard-linked (extent)
//! <dir>/units/<blake3>.fsu         one file per unit: stores written before packs (still read)
//! <dir>/tmp/                       recipe and catalog temp files, renamed into place; emptied at open
//! ```
//!
//! Every file starts with a magic and a version, every integer is
//! little-endian and every header and section carries an xxh3, as in
//! `fanstore-core`. Checkpoint ids are a counter kept in the catalog; they
//! never change, so a rename only changes the path -> id mapping and owner
//! maps stay valid.
//!
//! **Crash safety.** Recipes and the catalog are written to `tmp/` and
//! renamed into place; units are appended to the active pack (no recipe
//! can refer to a record before the commit point, so a partial one is
//! unreferenced: open truncates a torn tail). A commit writes its new
//! units, then its recipe, then the catalog: the catalog rename is the
//! commit point (an extent is linked before its records are appended; one
//! that no committed record names is deleted at open). An unlink writes the
//! catalog first, then deletes the recipe, and the freed units become dead
//! bytes of their packs and extents.
//! Compaction copies live records, fdatasyncs the copies, and only then
//! deletes the old pack; a crash in between leaves two records of a unit,
//! and open takes the latest that checks out. Reference counts and unit
//! locations are not stored separately: they are recomputed at open from
//! the live recipes and the pack record headers, so they cannot disagree
//! with them. Open also sweeps what an interrupted operation left (temp
//! files, recipes the catalog does not list, unit files no live recipe
//! refers to, packs nothing lives in). So a crash of the process loses at most the
//! commit, unlink or rename in flight. Without [`StoreOptions::fsync`]
//! nothing is fsync'd: a power loss or kernel crash can also lose or tear
//! files written shortly before, which open or `verify` then reports by
//! their checksums; with it (or after [`CheckpointStore::sync`]) everything
//! committed is on stable storage.
//!
//! **Persistence.** The directory is self-contained and position-independent.
//! To drain it to `--persist`: call [`CheckpointStore::sync`], copy
//! `catalog.fsc`, `recipes/` and `units/` (not `lock` or `tmp/`) while no
//! mutation runs; a pack already copied whose header (sequence number and
//! nonce) is unchanged only grew, so its tail is enough; an extent never
//! changes, and its name is unique, so one already copied is done. A later job opens the copy with [`CheckpointStore::open`]
//! and keeps deduplicating against it: checkpoint ids continue from the
//! catalog's counter, and units already stored are reused by hash. A copy
//! taken while mutations run may miss files the copied catalog names (open
//! then fails naming the recipe, or read and `verify` name the unit): the
//! daemon pauses commits and unlinks while it drains.

pub mod catalog;
pub mod codec;
pub mod drained;
pub mod error;
pub mod extent;
pub mod huffman;
pub mod json;
pub mod matching;
pub mod pack;
mod packs;
pub mod parts;
pub mod parts_file;
pub mod query;
pub mod recipe;
pub mod render;
pub mod split;
pub mod store;
pub mod unit;
pub mod units;

pub use error::{CkptError, Result};
pub use query::{DiffReport, DiffStatus, DuReport, LogReport, LsReport, OwnersReport, VerifyReport};
pub use split::{split, CdcParams, Format, Split};
pub use store::{CheckpointStore, CommitInfo, StoreOptions, UnlinkInfo};
pub use packs::CompactionHook;
pub use parts::PartUnit;
pub use units::SharedBytes;
