//! Sleeping without spinning: how the communication thread waits when it
//! has nothing to poll for.
//!
//! Before, an idle thread napped in `recv_timeout` on its command channel
//! for 10-50 µs at a time during a burst of reads. A wait that short never
//! parks: crossbeam spins and yields for most of it, and on a shared 2-core
//! machine the holder ranks of a 4-rank job spent ~1.8 ms of CPU per file
//! served doing that (perf: crossbeam `recv`, `sched_yield` and the context
//! switches around them were 60% of a holder's samples).
//!
//! Now it sleeps in one `ppoll` on
//! - a [`Doorbell`]: an eventfd that a [`CommTx`] rings after queueing a
//!   command, only when the thread said it is going to sleep;
//! - the MPI library's own epoll descriptors ([`transport_fds`]): the TCP
//!   transports (UCX's, OpenMPI's libevent) register every connection's
//!   socket in an epoll set created when MPI starts, and an epoll fd is
//!   readable while one of its sockets has an event, so a peer's message
//!   wakes the thread within microseconds instead of at the end of a nap.
//!
//! How long a sleep may last. A wake-up by an fd is cheap here (a pipe
//! ping-pong between two processes: 3.5-4 µs of CPU per wake-up), a timer
//! that fires is not (a 50 µs ppoll timeout: ~35 µs of CPU and ~160 µs of
//! wall time on this VM). So:
//! - with no transport fd to wait on (shared memory, verbs without a
//!   completion channel), every sleep is one nap of the caller's ladder
//!   (10-50 µs during a burst, up to 20 ms after 10 s idle): the thread
//!   polls as often as before, never later;
//! - while the transport's fds are trusted, a sleep lasts at least
//!   [`Waiter::with_fd_bound`] (2 ms by default): a peer's message, the next
//!   bytes of a transfer or a command end it, and the timer only guards
//!   against a transport that needs polling. A sleep that ends by its
//!   timeout and is followed by work (the fds did not say so: a shared
//!   memory transport between ranks of one host) makes the waiter distrust
//!   the fds for the next [`DISTRUST_SLEEPS`] sleeps, which then follow the
//!   nap ladder again; twice as many after a miss that comes within
//!   [`DISTRUST_SLEEPS`] trusted sleeps of the trust coming back (a
//!   transport the fds never announce, such as shared memory, soon naps
//!   for good), but no more than [`DISTRUST_SLEEPS`] after a miss that ends
//!   a longer trusted stretch (a rare miss, which UCX over TCP has: 0-2 in
//!   a 4-rank training job).
//!
//! The round of progress after a wake-up must look twice: MPI_Iprobe drives
//! progress only after it found nothing, so the probe whose progress reads
//! a request off the socket reports no message (see `Engine::poll`). With
//! one probe, every request that woke a holder waited for the sleep's
//! timeout instead, and each such timeout counted as a miss: a holder of a
//! 4-rank training job napped through ~30000 timer wake-ups (~35 µs of CPU
//! each) as the misses doubled its naps.
//!
//! ```no_run
//! # use fanstore_daemon::comm::wake;
//! let (tx, rx, bell) = wake::channel();
//! let mut waiter = wake::Waiter::new(bell.expect("an eventfd"), wake::transport_fds());
//! // a server thread: tx.send(command) rings the bell if the thread sleeps
//! waiter.sleep(&rx, std::time::Duration::from_millis(5));
//! # drop(tx);
//! ```

use super::post::Poster;
use super::{Command, Fetch};
use crossbeam::channel::{Receiver, SendError, Sender};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// An eventfd rung by command senders while the communication thread sleeps.
pub struct Doorbell {
    fd: OwnedFd,
    asleep: AtomicBool,
    /// The thread's current sleep waits on the transport's fds, trusted to
    /// announce every message (set before `asleep`).
    on_fds: AtomicBool,
}

impl Doorbell {
    fn new() -> std::io::Result<Doorbell> {
        // SAFETY: eventfd with valid flags; the fd returned is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        Ok(Doorbell { fd: unsafe { OwnedFd::from_raw_fd(fd) }, asleep: AtomicBool::new(false), on_fds: AtomicBool::new(false) })
    }

    /// Wakes the thread if it announced a sleep (one write per sleep at most).
    fn ring(&self) {
        if self.asleep.swap(false, SeqCst) {
            let one = 1u64;
            // SAFETY: writing 8 bytes from a live u64 to our eventfd.
            unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// After another thread queued a posted fetch: wakes the thread unless
    /// it sleeps on the transport's fds, trusted, so that the reply's
    /// arrival will wake it ([`super::post`]).
    fn ring_unless_fds_wake(&self) {
        if self.asleep.load(SeqCst) && self.on_fds.load(SeqCst) {
            return;
        }
        self.ring();
    }

    /// Resets the counter after a wake-up by the bell.
    fn drain(&self) {
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a live u64 from our nonblocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

/// The sending side of the command channel: queues, then rings the bell.
#[derive(Clone)]
pub struct CommTx {
    tx: Sender<Command>,
    bell: Option<Arc<Doorbell>>,
    /// Set once MPI runs with `MPI_THREAD_MULTIPLE` (shared by every clone).
    poster: Arc<OnceLock<Arc<Poster>>>,
}

impl CommTx {
    pub fn send(&self, c: Command) -> Result<(), SendError<Command>> {
        self.tx.send(c)?;
        if let Some(b) = &self.bell {
            b.ring();
        }
        Ok(())
    }

    /// Lets every clone post its fetches itself through `p` ([`super::post`]).
    pub fn enable_posting(&self, p: Arc<Poster>) {
        let _ = self.poster.set(p);
    }

    /// Starts a remote read: posted by this thread where it may, else sent
    /// to the communication thread to post. Err when neither can be done
    /// (the communication thread is gone; `f`'s reply was not sent).
    pub fn fetch(&self, f: Fetch) -> Result<(), SendError<Command>> {
        let f = match self.poster.get() {
            Some(p) => {
                let mut queued = Ok(());
                let res = p.post(f, |c| {
                    // (The request's send needs no wake-up: the reply's
                    // arrival, or the fetch's deadline, wakes the thread.)
                    let posted = matches!(c, Command::Posted(_));
                    if let Err(e) = self.tx.send(c) {
                        queued = Err(e);
                        return;
                    }
                    if let Some(b) = self.bell.as_ref().filter(|_| posted) {
                        b.ring_unless_fds_wake();
                    }
                });
                match res {
                    // (The receiver lives until the communication thread
                    // closed the poster and drained the queue: cannot fail.)
                    Ok(()) => return queued.inspect_err(|_| log::error!("a posted fetch found the communication thread gone")),
                    Err(f) => f,
                }
            }
            None => f,
        };
        self.send(Command::Fetch(f))
    }
}

/// The command channel with its doorbell (no bell if no eventfd could be made).
pub fn channel() -> (CommTx, Receiver<Command>, Option<Arc<Doorbell>>) {
    let (tx, rx) = crossbeam::channel::unbounded();
    let bell = match Doorbell::new() {
        Ok(b) => Some(Arc::new(b)),
        Err(e) => {
            log::warn!("eventfd for the communication thread: {e}; it naps on its channel instead");
            None
        }
    };
    (CommTx { tx, bell: bell.clone(), poster: Arc::new(OnceLock::new()) }, rx, bell)
}

/// The epoll descriptors open in this process: called right after MPI
/// started and before the daemon opens its own, these are the transport's.
pub fn transport_fds() -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    let mut fds: Vec<RawFd> = dir
        .filter_map(|e| {
            let e = e.ok()?;
            let fd: RawFd = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            (target.as_os_str() == "anon_inode:[eventpoll]").then_some(fd)
        })
        .collect();
    fds.sort_unstable();
    fds
}

/// What ended a sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// A command was queued (the bell, or one was waiting already).
    Command,
    /// A transport fd was ready.
    Transport,
    /// The timeout passed with nothing ready.
    Timeout,
}

/// Sleeps of the communication thread: on its bell and the transport's fds.
pub struct Waiter {
    bell: Arc<Doorbell>,
    fds: Vec<libc::pollfd>,
    /// Wake-ups by a transport fd in a row after which nothing happened.
    empty_wakes: u32,
    /// Shortest bound of a sleep while the transport's fds are trusted (zero: never longer than the nap).
    fd_bound: Duration,
    /// Sleeps left during which the fds are not trusted (after a timeout that found work).
    distrust: u32,
    /// Timeouts that found work, in all.
    missed: u64,
    /// Sleeps of distrust after the next miss.
    penalty: u32,
    /// Sleeps that trusted the fds since the last miss.
    trusted_run: u32,
    /// The last sleep's timeout was longer than the caller's nap (it trusted the fds).
    trusted: bool,
    /// Sleeps ended by a command, by a transport fd, by the timeout; and
    /// transport wake-ups after which nothing happened.
    tally: [u64; 4],
}

/// Sleeps that follow the nap ladder after the first timeout that found work the fds did not announce.
pub const DISTRUST_SLEEPS: u32 = 64;
/// Default of [`Waiter::with_fd_bound`].
pub const FD_BOUND: Duration = Duration::from_millis(2);

/// A transport fd that wakes this many sleeps in a row with nothing to do
/// is always ready (not an epoll set the progress engine drains): the
/// waiter stops watching the transport, and the thread naps as before.
const EMPTY_WAKES_MAX: u32 = 1000;

impl Waiter {
    pub fn new(bell: Arc<Doorbell>, transport: Vec<RawFd>) -> Waiter {
        let mut fds = vec![libc::pollfd { fd: bell.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        fds.extend(transport.into_iter().map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }));
        Waiter { bell, fds, empty_wakes: 0, fd_bound: FD_BOUND, distrust: 0, missed: 0, penalty: DISTRUST_SLEEPS, trusted_run: 0, trusted: false, tally: [0; 4] }
    }

    /// While the transport's fds are trusted, sleeps last at least `bound`
    /// (zero: every sleep is the caller's nap, as with no transport fd).
    pub fn with_fd_bound(mut self, bound: Duration) -> Waiter {
        self.fd_bound = bound;
        self
    }

    /// The timeout of the next sleep, given the caller's nap.
    pub fn bound(&self, nap: Duration) -> Duration {
        if self.trusts() {
            nap.max(self.fd_bound)
        } else {
            nap
        }
    }

    fn trusts(&self) -> bool {
        self.transport_count() > 0 && self.distrust == 0 && !self.fd_bound.is_zero()
    }

    /// Timeouts that were followed by work no fd announced.
    pub fn missed_wakes(&self) -> u64 {
        self.missed
    }

    /// Sleeps ended by a command, by a transport fd and by the timeout, and
    /// the transport wake-ups after which nothing happened (for the log).
    pub fn tally(&self) -> [u64; 4] {
        self.tally
    }

    /// After a sleep ended by `how`: whether the round of progress that
    /// followed found anything to do (`useful`: a message, a completion or a
    /// command; for a transport wake-up, a transfer still in flight too).
    pub fn woke(&mut self, how: Woke, useful: bool) {
        self.tally[how as usize] += 1;
        if how == Woke::Transport && !useful {
            self.tally[3] += 1;
        }
        match how {
            Woke::Transport => self.transport_woke(useful),
            // Only a sleep that trusted the fds can miss: a nap's timeout is its purpose.
            Woke::Timeout if useful && self.trusted && self.transport_count() > 0 => {
                self.missed += 1;
                if self.trusted_run > DISTRUST_SLEEPS {
                    // A long trusted stretch since the last miss: a rare miss, not a transport the fds never announce.
                    self.penalty = DISTRUST_SLEEPS;
                }
                self.trusted_run = 0;
                log::debug!("a sleep's timeout found work the transport's fds did not announce: naps for {} sleeps", self.penalty);
                self.distrust = self.penalty;
                self.penalty = self.penalty.saturating_mul(2);
            }
            _ => {}
        }
    }

    /// How many transport descriptors a sleep also waits on.
    pub fn transport_count(&self) -> usize {
        self.fds.len() - 1
    }

    /// After a sleep that a transport fd ended: whether the round of
    /// progress that followed found anything to do.
    fn transport_woke(&mut self, useful: bool) {
        if useful {
            self.empty_wakes = 0;
            return;
        }
        self.empty_wakes += 1;
        if self.empty_wakes >= EMPTY_WAKES_MAX {
            log::warn!(
                "the MPI library's epoll fds woke the communication thread {EMPTY_WAKES_MAX} times in a row with nothing to do: \
                 it no longer waits on them (it naps and polls as without them)"
            );
            self.fds.truncate(1);
        }
    }

    /// Sleeps until a command is queued, the transport has an event, or
    /// `timeout` passed. Returns at once if a command is already queued.
    pub fn sleep(&mut self, rx: &Receiver<Command>, timeout: Duration) -> Woke {
        self.trusted = self.trusts() && timeout >= self.fd_bound;
        if self.trusted {
            self.trusted_run = self.trusted_run.saturating_add(1);
        }
        self.distrust = self.distrust.saturating_sub(1);
        self.bell.on_fds.store(self.trusted, SeqCst);
        self.bell.asleep.store(true, SeqCst);
        // A command queued before the flag was set rang no bell: look first.
        if !rx.is_empty() {
            self.bell.asleep.store(false, SeqCst);
            return Woke::Command;
        }
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
        };
        for p in &mut self.fds {
            p.revents = 0;
        }
        // SAFETY: `fds` is a live array of fds.len() pollfds; ts is a valid
        // timespec; no signal mask change (null).
        unsafe { libc::ppoll(self.fds.as_mut_ptr(), self.fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
        // Whoever rings from now on finds the flag clear and writes nothing.
        self.bell.asleep.store(false, SeqCst);
        let rung = self.fds[0].revents != 0;
        if rung {
            self.bell.drain();
        }
        if self.fds[1..].iter().any(|p| p.revents != 0) {
            Woke::Transport
        } else if rung || !rx.is_empty() {
            Woke::Command
        } else {
            Woke::Timeout
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_queued_command_ends_a_sleep_at_once() {
        let (tx, rx, bell) = channel();
        let mut w = Waiter::new(bell.expect("eventfd"), Vec::new());
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            tx.send(Command::Stop).map_err(|_| ()).expect("send");
            tx
        });
        let t = Instant::now();
        assert_eq!(w.sleep(&rx, Duration::from_secs(20)), Woke::Command);
        assert!(t.elapsed() < Duration::from_secs(10), "the bell did not wake the sleep: {:?}", t.elapsed());
        assert!(matches!(rx.try_recv(), Ok(Command::Stop)));
        drop(sender.join());
        // Nothing queued, nothing rung: the sleep lasts its timeout.
        let t = Instant::now();
        assert_eq!(w.sleep(&rx, Duration::from_millis(30)), Woke::Timeout);
        assert!(t.elapsed() >= Duration::from_millis(25), "woke early: {:?}", t.elapsed());
    }

    #[test]
    fn an_always_ready_fd_is_dropped_after_empty_wake_ups() {
        let (_tx, rx, bell) = channel();
        // An eventfd holding a count is always readable: a stand-in for an
        // epoll set nobody drains.
        // SAFETY: eventfd with valid flags.
        let fd = unsafe { libc::eventfd(1, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        let mut w = Waiter::new(bell.expect("eventfd"), vec![fd]);
        for _ in 0..EMPTY_WAKES_MAX {
            assert_eq!(w.sleep(&rx, Duration::from_secs(5)), Woke::Transport, "the ready fd did not end the sleep");
            w.woke(Woke::Transport, false);
        }
        assert_eq!(w.transport_count(), 0);
        let t = Instant::now();
        assert_eq!(w.sleep(&rx, Duration::from_millis(30)), Woke::Timeout);
        assert!(t.elapsed() >= Duration::from_millis(25), "woke early: {:?}", t.elapsed());
        // SAFETY: closing the fd this test opened.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn an_epoll_fd_with_a_ready_socket_ends_a_sleep() {
        let (_tx, rx, bell) = channel();
        let mut pair = [0; 2];
        // SAFETY: socketpair into a live array of two ints.
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) }, 0);
        let ep = idle_epoll();
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 0 };
        // SAFETY: ep and pair[0] are live fds; ev is a valid event.
        assert_eq!(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, pair[0], &mut ev) }, 0);
        assert!(transport_fds().contains(&ep));
        let mut w = Waiter::new(bell.expect("eventfd"), vec![ep]);
        let writer = pair[1];
        let t = Instant::now();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: writing one byte to our socket.
            unsafe { libc::write(writer, b"x".as_ptr().cast(), 1) };
        });
        assert_eq!(w.sleep(&rx, Duration::from_secs(20)), Woke::Transport);
        assert!(t.elapsed() < Duration::from_secs(10), "the socket did not wake the sleep: {:?}", t.elapsed());
        h.join().expect("writer");
        for fd in [ep, pair[0], pair[1]] {
            // SAFETY: closing fds this test opened.
            unsafe { libc::close(fd) };
        }
    }

    /// A new epoll set with nothing registered: never ready.
    fn idle_epoll() -> i32 {
        // SAFETY: epoll_create1 takes no pointers.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        ep
    }

    #[test]
    fn trusted_fds_lengthen_sleeps_until_a_timeout_finds_work() {
        let (_tx, rx, bell) = channel();
        let ep = idle_epoll();
        let nap = Duration::from_micros(50);
        let mut w = Waiter::new(bell.expect("eventfd"), vec![ep]).with_fd_bound(Duration::from_millis(40));
        assert_eq!(w.bound(nap), Duration::from_millis(40));
        assert_eq!(w.bound(Duration::from_millis(100)), Duration::from_millis(100), "a longer nap stays longer");
        let t = Instant::now();
        assert_eq!(w.sleep(&rx, w.bound(nap)), Woke::Timeout);
        assert!(t.elapsed() >= Duration::from_millis(35), "the trusted sleep ended early: {:?}", t.elapsed());
        // A timeout followed by nothing to do keeps the trust.
        w.woke(Woke::Timeout, false);
        assert_eq!(w.bound(nap), Duration::from_millis(40));
        // A nap's timeout that finds work is no miss.
        w.sleep(&rx, nap);
        w.woke(Woke::Timeout, true);
        assert_eq!(w.missed_wakes(), 0);
        // A trusted sleep's timeout followed by work: the fds missed it, back to the naps.
        w.sleep(&rx, w.bound(nap));
        w.woke(Woke::Timeout, true);
        assert_eq!(w.missed_wakes(), 1);
        assert_eq!(w.bound(nap), nap);
        for _ in 0..DISTRUST_SLEEPS {
            assert_eq!(w.bound(nap), nap);
            w.sleep(&rx, Duration::ZERO);
        }
        assert_eq!(w.bound(nap), Duration::from_millis(40), "trust comes back after DISTRUST_SLEEPS sleeps");
        // A second miss distrusts twice as long.
        w.sleep(&rx, w.bound(nap));
        w.woke(Woke::Timeout, true);
        for _ in 0..DISTRUST_SLEEPS * 2 {
            assert_eq!(w.bound(nap), nap);
            w.sleep(&rx, Duration::ZERO);
        }
        assert_eq!(w.bound(nap), Duration::from_millis(40));
        assert_eq!(w.missed_wakes(), 2);
        // Without transport fds, or with the bound off, sleeps are the naps.
        let (_tx2, rx2, bell2) = channel();
        let plain = Waiter::new(bell2.expect("eventfd"), Vec::new());
        assert_eq!(plain.bound(nap), nap);
        let off = Waiter::new(channel().2.expect("eventfd"), vec![ep]).with_fd_bound(Duration::ZERO);
        assert_eq!(off.bound(nap), nap);
        drop(rx2);
        // SAFETY: closing the fd this test opened.
        unsafe { libc::close(ep) };
    }

    #[test]
    fn a_miss_after_a_long_trusted_stretch_distrusts_no_longer_than_the_first() {
        let (_tx, rx, bell) = channel();
        let ep = idle_epoll();
        let nap = Duration::from_micros(50);
        let bound = Duration::from_millis(1);
        let mut w = Waiter::new(bell.expect("eventfd"), vec![ep]).with_fd_bound(bound);
        let distrusted = |w: &mut Waiter| {
            let mut n = 0;
            while w.bound(nap) == nap {
                w.sleep(&rx, Duration::ZERO);
                n += 1;
            }
            n
        };
        // Two misses in a row (the second at the first trusted sleep): the naps double.
        for expected in [DISTRUST_SLEEPS, 2 * DISTRUST_SLEEPS] {
            w.sleep(&rx, w.bound(nap));
            w.woke(Woke::Timeout, true);
            assert_eq!(distrusted(&mut w), expected);
        }
        // Then more than DISTRUST_SLEEPS trusted sleeps with nothing missed: the next miss is a rare one.
        for _ in 0..=DISTRUST_SLEEPS {
            w.sleep(&rx, w.bound(nap));
            w.woke(Woke::Timeout, false);
        }
        w.sleep(&rx, w.bound(nap));
        w.woke(Woke::Timeout, true);
        assert_eq!(w.missed_wakes(), 3);
        assert_eq!(distrusted(&mut w), DISTRUST_SLEEPS, "a rare miss distrusted longer than the first");
        // And one right after it doubles again.
        w.sleep(&rx, w.bound(nap));
        w.woke(Woke::Timeout, true);
        assert_eq!(distrusted(&mut w), 2 * DISTRUST_SLEEPS);
        // SAFETY: closing the fd this test opened.
        unsafe { libc::close(ep) };
    }
}
