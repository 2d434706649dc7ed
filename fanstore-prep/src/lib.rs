//! # fanstore-prep
//!
//! Turns a directory tree into a FanStore dataset, and checks, lists and
//! restores datasets. A dataset directory holds `manifest.fsm` (the whole
//! namespace) and `part-NNNNNN.fsp` partition files (the payloads), whose
//! formats live in `fanstore-core`.
//!
//! - [`walk`]: lists the input tree (bytes paths, no symlink following,
//!   checks for special files and symlinks leaving the tree);
//! - [`assign`]: cuts the files into partitions balanced by bytes;
//! - [`ident`]: the deterministic dataset id;
//! - [`pack`]: the parallel, deterministic packer (workers read and
//!   compress, one writer appends in a fixed order, manifest written last);
//! - [`verify`]: checks every checksum and the manifest against the partitions;
//! - [`ls`]: lists the namespace like `ls -l`;
//! - [`extract`]: restores the tree exactly, sparse files included;
//! - [`holes`]: reads sparse input files without paging their holes in;
//! - [`progress`], [`units`], [`sys`]: progress output, size parsing, and
//!   the `*at` system calls everything above uses.
//!
//! ```no_run
//! use fanstore_prep::pack::{pack, PackOptions};
//! use fanstore_prep::assign::PartitionCount;
//! use fanstore_prep::progress::ProgressMode;
//! use fanstore_core::codec::Compression;
//! let summary = pack(&PackOptions {
//!     input: "/scratch/imagenet".into(),
//!     output: "/scratch/imagenet.fs".into(),
//!     partitions: PartitionCount::Count(64),
//!     compression: Compression::parse("lz4").unwrap(),
//!     replicate_dirs: vec!["val".into()],
//!     threads: 8,
//!     skip_unreadable: false,
//!     skip_special: false,
//!     progress: ProgressMode::Auto,
//!     progress_interval: fanstore_prep::progress::PLAIN_INTERVAL,
//! })?;
//! println!("{summary}");
//! # Ok::<(), fanstore_prep::pack::PackError>(())
//! ```

pub mod assign;
pub mod extract;
pub mod holes;
pub mod ident;
pub mod ls;
pub mod pack;
pub mod progress;
pub mod sys;
pub mod units;
pub mod verify;
pub mod walk;
