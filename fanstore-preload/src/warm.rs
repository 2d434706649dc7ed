//! The hints that this process decoded dataset files itself ([`fanstore_core::wire::op::WARM`]):
//! the daemon then makes node copies of them in the background, so later
//! opens on the node are plain opens.
//!
//! A training epoch decodes thousands of files a second, and one message
//! per file cost a system call here and a wake-up of the daemon's server
//! thread there, for a hint that waits anyway. So the hints are sent in
//! batches, one one-way message of up to [`BATCH`] node ids:
//! - when the batch is full;
//! - at the next hint once the oldest one waited [`FLUSH_AFTER_NS`];
//! - when the process ends: its exit handler, or the `_exit` hook (the
//!   workers of a DataLoader end with `os._exit`). A process killed by a
//!   signal loses its last batch: a hint is best effort.
//!
//! A fork child starts with no hints (the batch it inherited is its
//! parent's to send); a vfork child, which shares its parent's memory,
//! sends nothing.

use crate::lock::Locked;
use crate::state::State;
use std::sync::atomic::{AtomicBool, Ordering};

/// Node ids per message (4 bytes each in the payload).
pub const BATCH: usize = 64;
/// A batch is sent at the next hint once its oldest hint waited this long.
const FLUSH_AFTER_NS: u64 = 50_000_000;

struct Hints {
    ids: [u32; BATCH],
    n: usize,
    /// CLOCK_MONOTONIC_COARSE of the oldest hint in `ids`, ns.
    since: u64,
    /// The dataset the ids belong to.
    dataset: u64,
}

static HINTS: Locked<Hints> = Locked::new(Hints { ids: [0; BATCH], n: 0, since: 0, dataset: 0 });
/// Set once a hint was queued, when the exit handler is registered (until
/// then the exit paths skip the lock).
static EVER: AtomicBool = AtomicBool::new(false);

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec (vDSO, no system call).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Queues the hint that this process decoded file `node` of `st`'s dataset
/// itself; sends the batch when it is full or old.
pub fn hint(st: &State, node: u32) {
    // A plain load per hint; the read-modify-write only the first time.
    if !EVER.load(Ordering::Relaxed) && !EVER.swap(true, Ordering::Relaxed) {
        // SAFETY: registering a plain extern "C" fn with no arguments.
        unsafe { libc::atexit(at_exit) };
    }
    let now = now_ns();
    let mut out = [0u32; BATCH];
    let n = HINTS.with(|h| {
        if h.n > 0 && h.dataset != st.dataset_id {
            h.n = 0; // another dataset's ids (a new job in this process): stale
        }
        if h.n == 0 {
            h.since = now;
            h.dataset = st.dataset_id;
        }
        h.ids[h.n] = node;
        h.n += 1;
        if h.n < BATCH && now.saturating_sub(h.since) < FLUSH_AFTER_NS {
            return 0;
        }
        take(h, &mut out)
    });
    if n > 0 {
        crate::client::warm(st, &out[..n]);
    }
}

fn take(h: &mut Hints, out: &mut [u32; BATCH]) -> usize {
    let n = h.n;
    out[..n].copy_from_slice(&h.ids[..n]);
    h.n = 0;
    n
}

/// Sends the hints still queued (the process ends: its exit handler, `_exit`).
pub fn flush() {
    if !EVER.load(Ordering::Relaxed) || crate::fd_table::borrowed() {
        return;
    }
    let Some(_g) = crate::guard::Guard::enter() else { return };
    let Some(st) = crate::state::state() else { return };
    let mut out = [0u32; BATCH];
    let n = HINTS.with(|h| if h.dataset == st.dataset_id { take(h, &mut out) } else { 0 });
    if n > 0 {
        crate::client::warm(st, &out[..n]);
    }
}

extern "C" fn at_exit() {
    flush();
}

pub fn fork_prepare() {
    HINTS.lock();
}

pub fn fork_parent() {
    HINTS.unlock();
}

/// In a fork child: the inherited hints are the parent's.
pub fn fork_child() {
    // SAFETY: the prepare handler took the lock and this is the child's only thread.
    unsafe { HINTS.force() }.n = 0;
    HINTS.unlock();
}
