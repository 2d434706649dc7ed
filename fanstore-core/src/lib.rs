//! # fanstore-core
//!
//! The formats and rules every FanStore component shares:
//!
//! - [`partition`]: partition files (a subset of the dataset's payloads);
//! - [`manifest`]: the namespace, laid out so that it is also the
//!   shared-memory index that clients map ([`manifest::IndexView`]);
//! - [`codec`]: raw, lz4 and zstd payloads;
//! - [`path`]: path normalisation without allocation;
//! - [`wire`]: the client <-> daemon messages;
//! - [`runtime`]: where a job's sockets, shared memory and local files live;
//! - [`align`]: read buffers the kernel copies into at full speed.
//!
//! ```no_run
//! use fanstore_core::manifest::Manifest;
//! let m = Manifest::open("imagenet.fs/manifest.fsm".as_ref())?;
//! let v = m.view();
//! if let Some(n) = v.lookup(b"train/n01440764/1.JPEG") {
//!     println!("{} bytes in partition {}", n.size(), n.partition());
//! }
//! # Ok::<(), fanstore_core::FormatError>(())
//! ```

pub mod align;
pub mod checksum;
pub mod client;
pub mod codec;
pub mod error;
pub mod format;
pub mod le;
pub mod manifest;
pub mod partition;
pub mod path;
pub mod persisted;
pub mod rank_lock;
pub mod record_table;
pub mod runtime;
pub mod status;
pub mod watchev;
pub mod tiers;
pub mod watch_client;
pub mod wire;

pub use error::FormatError;
