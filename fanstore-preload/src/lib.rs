//! # fanstore-preload
//!
//! The `LD_PRELOAD` library through which unmodified programs read a
//! FanStore dataset under `/fanstore` (or `FANSTORE_MOUNT`).
//!
//! One principle: **every fd handed to the program is a real kernel fd whose
//! bytes are exactly the file's** (the daemon's extracted local copy, or a
//! memfd from the daemon reopened privately). read, pread, mmap, dup,
//! sendfile, fork, stdio and C++ streams then work natively. Metadata and
//! directories are virtual: answered from the shared-memory index with no
//! system call and no message.
//!
//! Layout (mirrord's layer crate as the model), in floors that only import
//! downwards (checked by the unit test in `layers.rs`):
//! - entry: `hooks/<family>.rs`, the exported libc symbols, one family per
//!   file: pointer conversion and a call, through the dispatchers of
//!   `hooks/mod.rs` (`path_hook`, `fd_hook`, `two_path_hook`,
//!   `empty_path_hook`); `sud/` catches system calls made outside libc
//!   (syscall user dispatch) and serves them through the same hooks; this
//!   file (constructor, fork handlers);
//! - `ops/<family>.rs`: safe implementations returning an [`ops::Outcome`]
//!   (handled / pass to libc / errno); `ops/dirstream.rs` (virtual `DIR *`);
//!   in tiers of their own (bottom up): what inputs and outputs share
//!   (`ops/mod.rs`, `attr.rs`, `open_base.rs`), the output names
//!   (`namespace.rs`), the output bytes (`out.rs`), the dispatchers
//!   between an input and an output (`open.rs`, `stat.rs`, `write.rs`),
//!   then every other family;
//! - ground, itself in floors (bottom up):
//!   - base, needing no process state: `real.rs` (the original libc
//!     functions, resolved lazily, and the FANSTORE_DEBUG report of hooked
//!     symbols), `errno.rs`, `guard.rs` (re-entrancy, panic containment),
//!     `debug.rs` (`FANSTORE_DEBUG=1`), `lock.rs` (the mutex the fork
//!     handlers take), `unhooked.rs` (raw syscalls no hook sees),
//!     `fd_table.rs` (lock-free fd -> node), `user_mem.rs` (the
//!     program's pointers probed before the library touches them: a bad
//!     one gives EFAULT, never a crash; the SIGSEGV/SIGBUS handler that
//!     makes a probe safe, ahead of the program's own);
//!   - `state.rs` (lazy init, index mapping), which calls nothing above it:
//!     an upper floor sets itself up from the loaded state through
//!     `state::once_loaded`;
//!   - daemon: `client.rs` (daemon connection pool), `memfd_pool.rs`
//!     (memfds used again), `parts.rs` (the local partition copies, mapped
//!     on first use), `pending.rs` (O_EXCL markers of the node), `warm.rs`
//!     (batched hints of files decoded here);
//!   - names: `lookup.rs` (index and daemon lookups), `outputs.rs` (outputs
//!     being written, their commit on the last close), `exec_outputs.rs`
//!     (those carried across exec);
//!   - `vcwd.rs`: the virtual cwd (its node, its moves, and its recovery
//!     after exec, at the first look once the state is loaded);
//!   - `paths.rs` (prefix test, classification: ".." resolved through the
//!     lookups, relative paths through the virtual cwd), `locks.rs`
//!     (advisory locks on outputs and virtual directories).
//!
//! The library links no MPI and does nothing at load time beyond
//! registering its fork handlers, arming syscall user dispatch, installing
//! the fault handler of its pointer probes (`user_mem.rs`) and adopting
//! the outputs an exec carried over (`exec_outputs.rs`).

#![allow(clippy::missing_safety_doc)]

pub mod debug;
mod errno;
mod exec_outputs;
mod fd_table;
#[cfg(test)]
mod layers;
mod guard;
pub mod hooks;
mod lock;
mod locks;
mod lookup;
mod memfd_pool;
pub mod ops;
mod parts;
mod paths;
mod real;
mod state;
mod client;
mod outputs;
mod pending;
mod sud;
mod unhooked;
mod user_mem;
mod vcwd;
mod warm;

/// The constructor: the fork handlers, raw-syscall catching for this
/// thread (other libraries' constructors may call fopen before this runs;
/// everything else is lazy), and the outputs the image before an exec was
/// writing (they must be tracked before the program can close them). Arming must happen here, not lazily: a raw
/// syscall can precede every hooked call (see sud/mod.rs for what it does).
extern "C" fn on_load() {
    // SAFETY: registering plain extern "C" handlers.
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    sud::init();
    user_mem::install();
    fd_table::set_owner();
    hooks::exec::resolve_exits();
    exec_outputs::adopt_inherited();
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// Before fork: take every lock of the library, so the child never inherits
/// one held by a thread that does not exist there.
pub(crate) extern "C" fn fork_prepare() {
    // First, with no lock of ours held: copies are made with them.
    ops::lazy_copy::fork_prepare();
    state::fork_lock();
    client::fork_prepare();
    outputs::fork_prepare();
    locks::fork_prepare();
    ops::inotify::fork_prepare();
    memfd_pool::fork_prepare();
    warm::fork_prepare();
}

pub(crate) extern "C" fn fork_parent() {
    warm::fork_parent();
    memfd_pool::fork_parent();
    ops::inotify::fork_release();
    locks::fork_release();
    outputs::fork_release();
    client::fork_parent();
    state::fork_unlock();
    ops::lazy_copy::fork_release();
}

/// In the child: drop the parent's daemon connections (reconnect lazily);
/// the fd table stays, since the fds are inherited.
pub(crate) extern "C" fn fork_child() {
    fd_table::set_owner();
    sud::arm_thread();
    warm::fork_child();
    memfd_pool::fork_child();
    locks::fork_release();
    ops::inotify::fork_release();
    outputs::fork_release();
    client::fork_child();
    state::fork_unlock();
    ops::lazy_copy::fork_release();
}
