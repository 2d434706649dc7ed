//! Thin wrappers over the few MPI calls the daemon makes.
//!
//! The communication thread (the daemon's main thread, which also
//! initialised MPI) makes every call but two: where MPI granted
//! `MPI_THREAD_MULTIPLE`, a server thread posts the receives and the request
//! message of its own fetch ([`super::post`]) through a [`SharedHandle`].
//! [`Comm`] owns the communicator and is deliberately neither `Send` nor
//! `Sync` under MPI implementations whose handles are pointers (OpenMPI);
//! a [`SharedHandle`] is made only from it, only under that threading level.
//! Errors are returned, not fatal: the communicator uses MPI_ERRORS_RETURN.

use mpi::ffi;
use std::os::raw::{c_int, c_void};
use std::time::{Duration, Instant};

pub type Request = ffi::MPI_Request;

/// An MPI error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("MPI error code {0}")]
pub struct MpiError(pub i32);

fn check(code: c_int) -> Result<(), MpiError> {
    if code == 0 {
        Ok(())
    } else {
        Err(MpiError(code))
    }
}

/// The daemon's own communicator (a duplicate of MPI_COMM_WORLD, so no
/// other library's traffic can match ours): owns it, frees it when dropped.
pub struct Comm {
    handle: Handle,
}

impl std::ops::Deref for Comm {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.handle
    }
}

/// The communicator's handle, with this rank and the job's size: the calls.
#[derive(Clone, Copy)]
pub struct Handle {
    comm: ffi::MPI_Comm,
    pub rank: u32,
    pub size: u32,
}

/// A [`Handle`] other threads may call through (posting only).
#[derive(Clone, Copy)]
pub struct SharedHandle(Handle);

// SAFETY: made only by `Comm::share` when MPI granted MPI_THREAD_MULTIPLE,
// under which any thread may call MPI concurrently; its users stop calling
// before the communicator is freed (the gate of `super::post::Poster`).
unsafe impl Send for SharedHandle {}
// SAFETY: as above: MPI itself serialises concurrent calls on one handle.
unsafe impl Sync for SharedHandle {}

impl std::ops::Deref for SharedHandle {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.0
    }
}

/// A completed request reported by [`Handle::testsome`].
#[derive(Debug, Clone, Copy)]
pub struct Done {
    pub index: usize,
    /// Bytes received (receives) or 0.
    pub count: usize,
    pub error: i32,
}

impl Comm {
    /// Duplicates MPI_COMM_WORLD. MPI must be initialised.
    pub fn dup_world() -> Result<Comm, MpiError> {
        // SAFETY: an MPI_Comm is a plain handle (int or pointer); zero is a
        // placeholder that MPI_Comm_dup overwrites.
        let mut comm: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
        // SAFETY: MPI is initialised (caller's contract); `comm` is a valid out pointer.
        check(unsafe { ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut comm) })?;
        // SAFETY: comm is the valid communicator just created.
        check(unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) })?;
        let (mut rank, mut size) = (0, 0);
        // SAFETY: valid communicator and out pointers.
        check(unsafe { ffi::MPI_Comm_rank(comm, &mut rank) })?;
        // SAFETY: as above.
        check(unsafe { ffi::MPI_Comm_size(comm, &mut size) })?;
        Ok(Comm { handle: Handle { comm, rank: rank as u32, size: size as u32 } })
    }

    /// A handle other threads may call through, if MPI granted
    /// `MPI_THREAD_MULTIPLE` (`multiple`).
    ///
    /// # Safety
    /// Every call through the handle must end before this `Comm` is dropped.
    pub unsafe fn share(&self, multiple: bool) -> Option<SharedHandle> {
        multiple.then_some(SharedHandle(self.handle))
    }
}

impl Handle {

    /// Starts sending `len` bytes at `buf` to `dest`.
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid and unchanged until the request completes.
    pub unsafe fn isend(&self, buf: *const u8, len: usize, dest: u32, tag: i32) -> Result<Request, MpiError> {
        let count = c_int::try_from(len).map_err(|_| MpiError(-1))?;
        // SAFETY: a zeroed handle is a placeholder that MPI_Isend overwrites.
        let mut req: Request = unsafe { std::mem::zeroed() };
        // SAFETY: the caller keeps the buffer alive; the communicator is valid.
        check(unsafe {
            ffi::MPI_Isend(buf as *const c_void, count, ffi::RSMPI_UINT8_T, dest as c_int, tag, self.comm, &mut req)
        })?;
        Ok(req)
    }

    /// Starts receiving up to `len` bytes from `src` into `buf`.
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid, and not be otherwise accessed, until the
    /// request completes.
    pub unsafe fn irecv(&self, buf: *mut u8, len: usize, src: u32, tag: i32) -> Result<Request, MpiError> {
        let count = c_int::try_from(len).map_err(|_| MpiError(-1))?;
        // SAFETY: placeholder overwritten by MPI_Irecv.
        let mut req: Request = unsafe { std::mem::zeroed() };
        // SAFETY: the caller keeps the buffer alive and exclusive; valid communicator.
        check(unsafe {
            ffi::MPI_Irecv(buf as *mut c_void, count, ffi::RSMPI_UINT8_T, src as c_int, tag, self.comm, &mut req)
        })?;
        Ok(req)
    }

    /// A message with `tag` from any rank, if one has arrived: (source, bytes).
    pub fn iprobe(&self, tag: i32) -> Result<Option<(u32, usize)>, MpiError> {
        let mut flag: c_int = 0;
        // SAFETY: MPI_Status is plain data; all-zero is a valid value to overwrite.
        let mut st: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: valid communicator and out pointers.
        check(unsafe { ffi::MPI_Iprobe(ffi::RSMPI_ANY_SOURCE, tag, self.comm, &mut flag, &mut st) })?;
        if flag == 0 {
            return Ok(None);
        }
        let mut count: c_int = 0;
        // SAFETY: st was filled by a successful probe.
        check(unsafe { ffi::MPI_Get_count(&st, ffi::RSMPI_UINT8_T, &mut count) })?;
        Ok(Some((st.MPI_SOURCE as u32, count.max(0) as usize)))
    }

    /// A message with any tag from any rank, if one has arrived: (source,
    /// tag, bytes). One probe drives the transport's progress once, where
    /// a probe per tag would drive it once per tag.
    pub fn iprobe_any(&self) -> Result<Option<(u32, i32, usize)>, MpiError> {
        let mut flag: c_int = 0;
        // SAFETY: MPI_Status is plain data; all-zero is a valid value to overwrite.
        let mut st: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: valid communicator and out pointers.
        check(unsafe { ffi::MPI_Iprobe(ffi::RSMPI_ANY_SOURCE, ffi::RSMPI_ANY_TAG, self.comm, &mut flag, &mut st) })?;
        if flag == 0 {
            return Ok(None);
        }
        let mut count: c_int = 0;
        // SAFETY: st was filled by a successful probe.
        check(unsafe { ffi::MPI_Get_count(&st, ffi::RSMPI_UINT8_T, &mut count) })?;
        Ok(Some((st.MPI_SOURCE as u32, st.MPI_TAG, count.max(0) as usize)))
    }

    /// Receives a message already seen by [`iprobe`](Self::iprobe) (so this does not wait).
    pub fn recv_probed(&self, buf: &mut [u8], src: u32, tag: i32) -> Result<usize, MpiError> {
        // SAFETY: plain data placeholder.
        let mut st: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        let count = c_int::try_from(buf.len()).map_err(|_| MpiError(-1))?;
        // SAFETY: buf is a live, exclusive buffer of `count` bytes for the duration of the call.
        check(unsafe {
            ffi::MPI_Recv(buf.as_mut_ptr() as *mut c_void, count, ffi::RSMPI_UINT8_T, src as c_int, tag, self.comm, &mut st)
        })?;
        let mut got: c_int = 0;
        // SAFETY: st was filled by a successful receive.
        check(unsafe { ffi::MPI_Get_count(&st, ffi::RSMPI_UINT8_T, &mut got) })?;
        Ok(got.max(0) as usize)
    }

    /// Tests every request; appends the completed ones to `done`.
    /// Completed entries are set to MPI_REQUEST_NULL by MPI.
    pub fn testsome(&self, reqs: &mut [Request], done: &mut Vec<Done>) -> Result<(), MpiError> {
        if reqs.is_empty() {
            return Ok(());
        }
        let n = reqs.len();
        let mut outcount: c_int = 0;
        let mut indices: Vec<c_int> = vec![0; n];
        // SAFETY: plain data placeholders.
        let mut statuses: Vec<ffi::MPI_Status> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        // SAFETY: the three arrays have n entries each, as MPI_Testsome requires.
        let rc = unsafe {
            ffi::MPI_Testsome(n as c_int, reqs.as_mut_ptr(), &mut outcount, indices.as_mut_ptr(), statuses.as_mut_ptr())
        };
        // MPI_ERR_IN_STATUS: per-request errors are in the statuses; handled below.
        if rc != 0 && outcount <= 0 {
            return Err(MpiError(rc));
        }
        // MPI_UNDEFINED (negative) when no request was active.
        if outcount <= 0 {
            return Ok(());
        }
        for k in 0..outcount as usize {
            let st = &statuses[k];
            let mut count: c_int = 0;
            // SAFETY: st was filled by MPI_Testsome for a completed request.
            unsafe { ffi::MPI_Get_count(st, ffi::RSMPI_UINT8_T, &mut count) };
            let error = if rc == 0 { 0 } else { st.MPI_ERROR };
            done.push(Done { index: indices[k] as usize, count: count.max(0) as usize, error });
        }
        Ok(())
    }

    /// Asks MPI to cancel a pending request (it still has to complete).
    pub fn cancel(&self, req: &mut Request) {
        // SAFETY: req is an active request handle of this process.
        unsafe { ffi::MPI_Cancel(req) };
    }

    /// The maximum of `v` over all ranks, waiting at most `timeout`, calling
    /// `idle` between polls. `None` on timeout or MPI error.
    pub fn allreduce_max(&self, v: i32, timeout: Duration, mut idle: impl FnMut()) -> Option<i32> {
        let send = v;
        let mut recv: i32 = 0;
        // SAFETY: placeholder overwritten by MPI_Iallreduce.
        let mut req: Request = unsafe { std::mem::zeroed() };
        // SAFETY: send and recv live on this frame until the request completes:
        // we poll it to completion below, or abort the job on timeout.
        let rc = unsafe {
            ffi::MPI_Iallreduce(
                &send as *const i32 as *const c_void,
                &mut recv as *mut i32 as *mut c_void,
                1,
                ffi::RSMPI_INT32_T,
                ffi::RSMPI_MAX,
                self.comm,
                &mut req,
            )
        };
        if rc != 0 {
            return None;
        }
        if self.wait(&mut req, timeout, &mut idle) {
            Some(recv)
        } else {
            // The buffers must outlive the request: leave them to process exit.
            log::error!("rank {}: collective check timed out after {:?}; aborting the job", self.rank, timeout);
            self.abort(3)
        }
    }

    /// A barrier that gives up after `timeout` (then returns false).
    pub fn barrier(&self, timeout: Duration, mut idle: impl FnMut()) -> bool {
        // SAFETY: placeholder overwritten by MPI_Ibarrier.
        let mut req: Request = unsafe { std::mem::zeroed() };
        // SAFETY: valid communicator and out pointer.
        if unsafe { ffi::MPI_Ibarrier(self.comm, &mut req) } != 0 {
            return false;
        }
        self.wait(&mut req, timeout, &mut idle)
    }

    fn wait(&self, req: &mut Request, timeout: Duration, idle: &mut dyn FnMut()) -> bool {
        let deadline = Instant::now() + timeout;
        let mut nap = Duration::from_micros(20);
        loop {
            let mut flag: c_int = 0;
            // SAFETY: req is an active request; status is ignored.
            let rc = unsafe { ffi::MPI_Test(req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if rc != 0 {
                return false;
            }
            if flag != 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            idle();
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }

    /// Aborts every rank of the job.
    pub fn abort(&self, code: i32) -> ! {
        // SAFETY: valid communicator; MPI_Abort does not return on success.
        unsafe { ffi::MPI_Abort(self.comm, code) };
        std::process::exit(code)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the communicator we duplicated and still own.
        unsafe { ffi::MPI_Comm_free(&mut self.handle.comm) };
    }
}

/// Finalises MPI (drops `universe`) under a watchdog: MPICH 4.0 over UCX
/// has been seen to hang in MPI_Finalize (one rank in a PMI barrier, the
/// other in UCX progress) after every message completed. If finalising takes
/// longer than `timeout`, the watchdog runs `before_exit` and the process
/// exits with `code`; once MPI_Finalize returned, the watchdog does nothing.
pub fn finalize(universe: mpi::environment::Universe, timeout: Duration, code: i32, before_exit: impl FnOnce() + Send + 'static) {
    let finalized = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = finalized.clone();
    let spawned = std::thread::Builder::new().name("finalize-watchdog".into()).spawn(move || {
        std::thread::sleep(timeout);
        if done.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        log::warn!("MPI_Finalize did not return within {timeout:?}; exiting anyway");
        before_exit();
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::process::exit(code);
    });
    if spawned.is_err() {
        log::warn!("no finalize watchdog: MPI_Finalize may hang");
    }
    drop(universe);
    finalized.store(true, std::sync::atomic::Ordering::Release);
}

/// Before MPI starts (the process has no other thread yet): messages of at
/// most `max` bytes cross UCX eagerly, by setting UCX_RNDV_THRESH to
/// `max + 1`, unless the environment already sets it (the user's choice
/// wins) or `max` is 0. Returns the value set, if any.
pub fn set_ucx_eager_max(max: u64) -> Option<String> {
    if max == 0 {
        return None;
    }
    let thresh = max.saturating_add(1).to_string();
    set_env_default("UCX_RNDV_THRESH", &thresh).then_some(thresh)
}

/// Before MPI starts (the process has no other thread yet): OpenMPI's
/// event library watches its TCP connections with epoll instead of its
/// default, poll, so that the connections are in an epoll set the idle
/// communication thread can sleep on ([`super::wake::transport_fds`]).
/// With poll, no fd announced a peer's message: each request waited for a
/// sleep's timeout (2 ranks, 154 requests: 0 wake-ups by an fd, 1822 by
/// the timeout; with epoll: 193 and 106). Unless the environment sets
/// OMPI_MCA_opal_event_include; other MPI libraries ignore it.
pub fn set_openmpi_event_epoll() -> bool {
    set_env_default("OMPI_MCA_opal_event_include", "epoll")
}

/// Sets `key` to `value` unless the environment already has it (the
/// user's choice wins). Returns whether it was set.
fn set_env_default(key: &str, value: &str) -> bool {
    if std::env::var_os(key).is_some() {
        return false;
    }
    std::env::set_var(key, value);
    true
}

#[cfg(test)]
mod tests {
    use super::set_ucx_eager_max;

    #[test]
    fn ucx_eager_max_sets_the_threshold_unless_the_environment_does() {
        // The only test touching this variable.
        std::env::remove_var("UCX_RNDV_THRESH");
        assert_eq!(set_ucx_eager_max(0), None);
        assert!(std::env::var_os("UCX_RNDV_THRESH").is_none());
        assert_eq!(set_ucx_eager_max(256 << 10).as_deref(), Some("262145"));
        assert_eq!(std::env::var("UCX_RNDV_THRESH").as_deref(), Ok("262145"));
        std::env::set_var("UCX_RNDV_THRESH", "8k");
        assert_eq!(set_ucx_eager_max(256 << 10), None);
        assert_eq!(std::env::var("UCX_RNDV_THRESH").as_deref(), Ok("8k"));
        std::env::remove_var("UCX_RNDV_THRESH");
    }
}
