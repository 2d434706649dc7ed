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
//! Where MPI granted `MPI_THREAD_MULTIPLE`, the server thread now posts the
//! receives itself (MPI_Irecv per piece, exactly as the communication thread
//! would, `super::post_receives`), queues the posted fetch, then sends the
//! request (MPI_Isend) and queues that send; the communication thread adopts
//! both and does the rest as for any fetch: tests the requests, hashes the
//! pieces, answers, expires. Only these two calls leave the communication
//! thread: no other thread probes or tests (the calls that drive MPI's
//! progress).
//!
//! The fetch is queued before its request leaves: the reply cannot arrive
//! before the communication thread can find the fetch. So the queue rings
//! the doorbell only when the thread's sleep would not end at the reply's
//! arrival: a thread asleep on the transport's epoll fds, which it trusts to
//! announce every message ([`super::wake`]), is woken by the reply and
//! adopts the fetch then, with no wake-up for the post. The request's send
//! is queued after it (never rung: the reply's arrival, or the fetch's
//! deadline, wakes the thread), and kept until it completes.
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
use super::{Command, Fetch, SentRequest, TAG_REQUEST};
use std::sync::{Mutex, PoisonError, RwLock};

/// Where server threads post their fetches.
pub struct Poster {
    handle: SharedHandle,
    /// Whether posting is allowed (false once the communication thread stops).
    open: RwLock<bool>,
    tags: Mutex<Tags>,
    piece: u64,
    pipeline: u64,
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

    /// Posts `f`'s receives, hands the posted fetch to `queue`, then sends
    /// its request and hands that over too, while posting is allowed.
    /// `queue` must accept every command: they go to the communication
    /// thread (which needs waking for a [`Command::Posted`] only, [`super::wake`]). `Err(f)` when posting is closed, or every tag of the span is
    /// taken: the caller sends `f` as a command instead.
    pub fn post(&self, f: Fetch, mut queue: impl FnMut(Command)) -> Result<(), Fetch> {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        if !*open {
            return Err(f);
        }
        let Some(tag) = self.tags.lock().unwrap_or_else(PoisonError::into_inner).alloc() else {
            return Err(f);
        };
        let holder = f.holder;
        let (mut posted, request) = super::post_receives(&self.handle, f, tag, self.piece, self.pipeline);
        let Some(msg) = request else {
            // Answered with its error already; queued for its receives to complete.
            queue(Command::Posted(posted));
            return Ok(());
        };
        // The fetch completes on its pieces alone; the send is tracked apart.
        posted.pending.state.request_done(true);
        queue(Command::Posted(posted));
        // SAFETY: `msg` is boxed; it is handed to the communication thread,
        // which keeps it until the send completes (or dropped here if the
        // send was never started).
        match unsafe { self.handle.isend(msg.as_ptr(), msg.len(), holder, TAG_REQUEST) } {
            Ok(request) => queue(Command::Sent(SentRequest { request, msg })),
            // Rare (MPI refused a 24-byte send): the fetch times out at its deadline.
            Err(e) => log::warn!("rank {}: sending a request to rank {holder}: {e}", self.handle.rank),
        }
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
