//! Fetches posted by the server thread that needs them.
//!
//! A remote OPEN used to hand its fetch to the communication thread as a
//! command: the server thread queued it and rang the doorbell, and the
//! communication thread woke to post the receives and the request. That
//! wake-up is one of the five hand-offs of a remote OPEN (client -> server
//! thread -> communication thread -> holder -> communication thread ->
//! client), and on a virtual machine a wake-up of a thread whose vCPU is
//! idle costs ~44 µs (bench/remote_profile.py, bench/halt_poll.py).
//!
//! Where MPI granted `MPI_THREAD_MULTIPLE`, the server thread now posts them
//! itself (MPI_Irecv per piece, then MPI_Isend of the request, exactly as the
//! communication thread would, [`super::post_fetch`]) and queues the posted
//! fetch; the communication thread adopts it and does the rest as for any
//! fetch: tests the requests, hashes the pieces, answers, expires. Only
//! these two calls leave the communication thread; no other thread ever
//! drives MPI's progress.
//!
//! The queue rings the doorbell only when it must. A communication thread
//! asleep on the transport's epoll fds, which it trusts to announce every
//! message ([`super::wake`]), is woken by the reply's arrival and finds the
//! posted fetch in its queue then: no wake-up for the post. It is rung when
//! the thread naps instead (a transport without fds), and when the post
//! took long enough ([`LATE`]) that the reply may have arrived before the
//! fetch was queued (a preempted server thread): a wake-up by the reply that
//! found nothing to adopt, followed by a sleep that nothing ends.
//!
//! Reply tags: the fetches posted here draw theirs from their own span
//! ([`super::table::POSTER_FIRST_TAG`] up), under a mutex, so the
//! communication thread's tags need no lock; it frees a posted fetch's tag
//! here once every piece arrived.
//!
//! Shutdown: [`Poster::close`] waits for posts in progress (a read lock held
//! from the tag to the queue) and refuses later ones, so once it returns
//! every posted fetch is queued: the communication thread adopts and
//! cancels them before MPI is finalised.

use super::raw::SharedHandle;
use super::table::{Tags, POSTER_FIRST_TAG, TAG_LIMIT};
use super::{Command, Fetch, Posted};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// A post that took longer than this from its request's send to its queueing
/// rings the doorbell: the holder may have answered already (the fastest
/// 24-byte request and reply here take ~30 µs).
pub const LATE: Duration = Duration::from_micros(15);

/// Where server threads post their fetches.
pub struct Poster {
    handle: SharedHandle,
    /// Whether posting is allowed (false once the communication thread stops).
    open: RwLock<bool>,
    tags: Mutex<Tags>,
    piece: u64,
    pipeline: u64,
}

/// A fetch posted by [`Poster::post`], to queue for the communication thread.
pub struct Post {
    pub command: Command,
    /// When its request was sent.
    pub sent: Instant,
}

impl Poster {
    /// Posts through `handle`; `piece` and `pipeline` as the engine's.
    pub fn new(handle: SharedHandle, piece: u64, pipeline: u64) -> Poster {
        Poster {
            handle,
            open: RwLock::new(true),
            tags: Mutex::new(Tags::span(POSTER_FIRST_TAG, TAG_LIMIT)),
            piece: piece.clamp(1, 1 << 30),
            pipeline,
        }
    }

    /// Posts `f` and hands the posted fetch to `queue` (which must accept
    /// it: it goes to the communication thread), while posting is allowed.
    /// `Err(f)` when it is not, or every tag of the span is taken: the
    /// caller sends `f` as a command instead.
    pub fn post(&self, f: Fetch, queue: impl FnOnce(Post)) -> Result<(), Fetch> {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        if !*open {
            return Err(f);
        }
        let Some(tag) = self.tags.lock().unwrap_or_else(PoisonError::into_inner).alloc() else {
            return Err(f);
        };
        let posted: Posted = super::post_fetch(&self.handle, f, tag, self.piece, self.pipeline);
        queue(Post { command: Command::Posted(posted), sent: Instant::now() });
        drop(open);
        Ok(())
    }

    /// Gives back the tag of a posted fetch whose requests all completed.
    pub fn free_tag(&self, tag: i32) {
        self.tags.lock().unwrap_or_else(PoisonError::into_inner).free(tag);
    }

    /// Refuses posts from now on, after the posts in progress are queued.
    pub fn close(&self) {
        *self.open.write().unwrap_or_else(PoisonError::into_inner) = false;
    }
}
