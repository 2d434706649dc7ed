//! What every service of one daemon rank shares: who the rank is, the
//! dataset's index, where each partition lives, the transport to the other
//! ranks, the counters, and where the rank is in its life.
//!
//! [`Rank`] is the floor below both services ([`crate::inputs::Inputs`],
//! [`crate::outputs::Outputs`]) and the node that owns them
//! ([`crate::node::Node`]); it imports none of them. The one thing a service
//! needs from above, giving back file descriptors when the process runs out,
//! reaches it through the [`FdRelief`] trait the node implements.

use crate::comm::wake::CommTx;
use crate::placement::Placement;
use crate::status::Counters;
use fanstore_core::manifest::IndexView;
use fanstore_core::runtime::Status;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Where the rank is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Loading,
    Ready,
    Stopping,
    Failed,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Loading => "loading",
            Phase::Ready => "ready",
            Phase::Stopping => "stopping",
            Phase::Failed => "failed",
        }
    }
    pub fn status(self) -> Status {
        match self {
            Phase::Loading => Status::Loading,
            Phase::Ready => Status::Ready,
            Phase::Stopping => Status::Stopping,
            Phase::Failed => Status::Failed,
        }
    }
}

/// Fixed facts about this rank, set at start.
#[derive(Debug, Clone)]
pub struct Identity {
    pub rank: u32,
    pub nranks: u32,
    pub host: String,
    pub threading: String,
    pub runtime: PathBuf,
    pub local_dir: PathBuf,
    pub index_path: PathBuf,
    pub mount: String,
}

/// Gives back the file descriptors the rank can spare (its caches' fds);
/// implemented by the node, which owns every cache.
pub trait FdRelief: Send + Sync {
    /// Releases what it can; returns a line for the log.
    fn relieve(&self) -> String;
}

/// The context every service of a rank shares (see the module docs).
pub struct Rank {
    pub id: Identity,
    pub view: IndexView<'static>,
    pub placement: Placement,
    pub counters: Counters,
    pub comm: CommTx,
    pub remote_timeout: Duration,
    /// Set when the rank stops: the server stops accepting and serving.
    pub stopping: AtomicBool,
    /// When the rank became ready (remote MB/s in STATUS is since then).
    pub ready_at: OnceLock<Instant>,
    phase: Mutex<Phase>,
    phase_cv: Condvar,
    fd_relief: Weak<dyn FdRelief>,
}

impl Rank {
    pub fn new(
        id: Identity,
        view: IndexView<'static>,
        placement: Placement,
        comm: CommTx,
        remote_timeout: Duration,
        fd_relief: Weak<dyn FdRelief>,
    ) -> Rank {
        Rank {
            id,
            view,
            placement,
            counters: Counters::default(),
            comm,
            remote_timeout,
            stopping: AtomicBool::new(false),
            ready_at: OnceLock::new(),
            phase: Mutex::new(Phase::Loading),
            phase_cv: Condvar::new(),
            fd_relief,
        }
    }

    pub fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves to `phase` and wakes its waiters ([`crate::node::Node::set_phase`]
    /// also publishes the state file).
    pub fn set_phase(&self, phase: Phase) {
        if phase == Phase::Ready {
            let _ = self.ready_at.set(Instant::now());
        }
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = phase;
        self.phase_cv.notify_all();
    }

    /// Waits until the rank is no longer loading (at most `timeout`).
    pub fn wait_loaded(&self, timeout: Duration) -> Phase {
        let deadline = Instant::now() + timeout;
        let mut g = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        while *g == Phase::Loading {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = self.phase_cv.wait_timeout(g, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        *g
    }

    pub fn state_path(&self) -> PathBuf {
        fanstore_core::runtime::state_path(&self.id.runtime, self.id.rank)
    }

    pub fn socket_path(&self) -> PathBuf {
        fanstore_core::runtime::socket_path(&self.id.runtime, self.id.rank)
    }

    /// Frees what fds the rank can spare (the caches' memfds and spare
    /// copies); called when a call fails with EMFILE/ENFILE, before it is
    /// tried again.
    pub fn relieve_fds(&self) {
        self.counters.fd_pressure.fetch_add(1, Relaxed);
        if let Some(r) = self.fd_relief.upgrade() {
            let what = r.relieve();
            log::debug!("rank {}: out of file descriptors: {what}", self.id.rank);
        }
    }
}
