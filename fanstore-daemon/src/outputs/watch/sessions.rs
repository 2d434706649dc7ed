//! The watch state of a rank: the interests of every node, this rank's
//! watcher sessions and their queues ([`super`] routes events through them).

use fanstore_core::watchev::{self, NsEvent, Rec};
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

/// Records a session may have queued before it reports an overflow (the
/// kernel's default `max_queued_events`); `FANSTORE_WATCH_QUEUE` in the
/// daemon's environment changes it (tests use a small one).
pub const QUEUE_MAX: usize = 16384;

pub(super) fn queue_max() -> usize {
    static Q: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *Q.get_or_init(|| {
        std::env::var("FANSTORE_WATCH_QUEUE").ok().and_then(|v| v.trim().parse().ok()).filter(|&n| n > 0).unwrap_or(QUEUE_MAX)
    })
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The watch state of one rank.
#[derive(Default)]
pub struct WatchState {
    pub(super) routes: Mutex<Routes>,
    pub(super) local: Mutex<Local>,
    /// Held across a count change and its announcement, so that one session
    /// withdrawing an interest and another taking it again reach every rank
    /// in the order they happened here.
    pub(super) announcing: Mutex<()>,
}

/// Every node's interests (known on every rank) and this rank's event numbers.
#[derive(Default)]
pub(super) struct Routes {
    pub(super) interests: HashSet<(u32, Vec<u8>, bool)>,
    pub(super) seq: u64,
}

/// This rank's watcher sessions, and how many watches hold each interest.
#[derive(Default)]
pub(super) struct Local {
    pub(super) next: u64,
    pub(super) sessions: HashMap<u64, Arc<Session>>,
    pub(super) counts: HashMap<(Vec<u8>, bool), usize>,
}

pub(super) struct Watch {
    pub(super) wd: i32,
    pub(super) path: Vec<u8>,
    pub(super) mask: u32,
    pub(super) recursive: bool,
}

/// What a session sends its client.
pub(super) enum Out {
    /// An encoded NsEvent (to `fanstore watch`, as a WATCH_EVENT reply).
    Ns(Vec<u8>),
    /// One `struct inotify_event` (to the sink).
    Ino(Vec<u8>),
}

#[derive(Default)]
pub(super) struct SessState {
    pub(super) watches: Vec<Watch>,
    pub(super) queue: VecDeque<Out>,
    pub(super) overflow: bool,
    pub(super) inotify: bool,
    /// Interests of watches that ended while an event was delivered
    /// (withdrawn by the session thread, which may wait on other ranks).
    pub(super) ended: Vec<(Vec<u8>, bool)>,
}

pub(super) struct Session {
    pub(super) state: Mutex<SessState>,
    pub(super) wake: OwnedFd,
}

impl Session {
    pub(super) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our own eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Queues `o`, or notes an overflow. Caller holds the state lock.
    pub(super) fn push(st: &mut SessState, o: Out) {
        if st.queue.len() >= queue_max() {
            st.overflow = true;
        } else {
            st.queue.push_back(o);
        }
    }

    /// Turns `ev` into this session's records; true if there were any.
    pub(super) fn deliver(&self, ev: &NsEvent) -> bool {
        let mut st = lock(&self.state);
        let mut any = false;
        if st.inotify {
            let mut recs: Vec<Rec> = Vec::new();
            let mut i = 0;
            while i < st.watches.len() {
                recs.clear();
                let w = &st.watches[i];
                let wd = w.wd;
                let ends = watchev::inotify_records(ev, &w.path, w.mask, w.recursive, &mut recs);
                for r in &recs {
                    let mut b = Vec::with_capacity(watchev::INOTIFY_HEAD + r.name.len() + 16);
                    watchev::push_inotify(&mut b, wd, r);
                    Session::push(&mut st, Out::Ino(b));
                    any = true;
                }
                if ends {
                    let w = st.watches.remove(i);
                    st.ended.push((w.path, w.recursive));
                } else {
                    i += 1;
                }
            }
        } else if st.watches.iter().any(|w| ev.concerns(&w.path, w.recursive)) {
            Session::push(&mut st, Out::Ns(ev.encode()));
            any = true;
        }
        drop(st);
        if any {
            self.wake();
        }
        any
    }
}
