//! # fanstore-cli
//!
//! The library half of `fanstore`, the control CLI of a job's FanStore
//! daemons (the binary is `src/main.rs`). Everything here talks to the
//! daemons through their unix sockets or reads what they left on disk, so
//! the crate depends on neither MPI nor fanstore-daemon: it builds on a
//! login node, in a container or for a Python package, with no MPI
//! compiler.
//!
//! - [`ckpt_query`]: `fanstore ckpt ls|log|owners|diff|du|verify|match`,
//!   asked of every rank's checkpoint store and merged;
//! - [`export`]: `fanstore export DIR --to PLAIN`, the outputs drained to
//!   a `--persist` directory written out as plain files.
//!
//! What the CLI shares with the daemon and with other clients lives in
//! fanstore-core: the socket client ([`fanstore_core::client`]), the STATUS
//! text and its table ([`fanstore_core::status`]), the watch client
//! ([`fanstore_core::watch_client`]), the rank lock files
//! ([`fanstore_core::rank_lock`]), the persist directory's layout
//! ([`fanstore_core::persisted`]) and the CKPT query codec
//! ([`fanstore_core::wire::ckpt`]).
//!
//! ```no_run
//! use fanstore_cli::ckpt_query::{self, Query};
//! let rt = fanstore_core::runtime::runtime_dir();
//! // `fanstore ckpt log /fanstore/run/ck-9.pt --json`
//! let q = Query::Log { path: fanstore_core::client::relative_to_mount("/fanstore/run/ck-9.pt", "/fanstore"), json: true };
//! println!("{}", ckpt_query::run(&rt, &q)?.text);
//! # Ok::<(), ckpt_query::QueryError>(())
//! ```

pub mod ckpt_query;
pub mod export;
