//! Namespace events of outputs pushed to watchers: `fanstore watch` and
//! inotify instances (through the preload library) on `/fanstore` paths.
//! Formats and client ops: [`fanstore_core::watchev`].
//!
//! ## Routing
//!
//! - **Interests.** A node with a watcher on directory (or file) `W`
//!   (recursive or not) tells every rank once, with [`wop::SUB`] (synchronously,
//!   before the watch request is answered: an event that happens after
//!   `inotify_add_watch` returned is never missed). Every rank therefore knows
//!   every node's interests; a change with nobody interested costs no message.
//! - **Publish.** The daemon that completed a change (commit, unlink, mkdir,
//!   rmdir, rename: after its last step, so the file is readable from every
//!   node) sends one [`NsEvent`] ([`wop::PUBLISH`]) to the metadata owner of
//!   the event's directory (of the destination, for a rename), and waits for
//!   its answer before the client's call returns.
//! - **Sequence.** The owner numbers the event and, under one lock, hands it
//!   to every interested node ([`wop::DELIVER`], an MPI message from the
//!   owner: MPI keeps messages between two ranks in order), so every node sees
//!   a directory's events in the order its owner applied them.
//! - **Causality.** The owner answers the publisher only once every node it
//!   handed the event to has queued it (their DELIVER replies; a node that
//!   does not answer within 5 s is given up). A change made after another
//!   one returned is therefore seen after it by every watcher, even where
//!   their directories have different owners: the unlink of `d/f` then the
//!   rmdir of `d` reach a watcher of `d` as IN_DELETE, then IN_DELETE_SELF
//!   and IN_IGNORED, as from the kernel (without it, the owner of `d`'s
//!   parent could deliver the rmdir before the owner of `d` delivered the
//!   unlink: seen once in a CI run).
//! - **Delivery.** A node turns an event into records for each local watcher
//!   session, queues them (bounded: beyond [`sessions::QUEUE_MAX`] the session reports
//!   an overflow, IN_Q_OVERFLOW) and wakes the session's thread through an
//!   eventfd. The session thread sleeps in `poll` (connection, eventfd,
//!   forwarded kernel inotify fd, sink): nothing spins while nothing happens.
//! - **Prefetch.** A node that delivered a close or a rename of a file held
//!   by another rank to a local watcher starts fetching its bytes into the
//!   node's shared copy ([`crate::outputs::remote_out`]) right away: the consumer's
//!   open, which follows the event, waits for that fetch instead of starting
//!   its own after the event's round trip to the program.
//! - **End.** A session ends when its client closes the connection, dies, or
//!   closes its end of the sink socket; its watches are dropped and the
//!   interests it alone held are withdrawn from every rank.

use crate::comm::{Command, MetaCall};
use crate::outputs::Outputs;
use fanstore_core::watchev::{self, Kind, NsEvent, Rec, IN_ALL_EVENTS, IN_IGNORED, IN_ONLYDIR, IN_Q_OVERFLOW};
use fanstore_core::wire::{self, op, OutRecord, Reply, Request};
use std::collections::HashSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Rank-to-rank ops of the event routing (never sent by clients).
pub mod wop {
    /// payload flags (bit 0: add, else remove; bit 1: recursive) then the
    /// watched path, arg0 node.
    pub const SUB: u16 = 140;
    /// payload NsEvent, to the owner of its directory: number it, forward it.
    pub const PUBLISH: u16 = 141;
    /// payload NsEvent (numbered), owner -> a node with interested watchers.
    pub const DELIVER: u16 = 142;
}

pub fn is_mop(op: u16) -> bool {
    (wop::SUB..=wop::DELIVER).contains(&op)
}

/// How long a blocked session thread sleeps before it looks at the stop flag.
const POLL_MS: i32 = 1000;

/// Ids of DELIVER messages, apart from the ids of the metadata requests of
/// [`crate::outputs::held`].
static DELIVER_IDS: AtomicU64 = AtomicU64::new(1 << 62);
static COOKIES: AtomicU64 = AtomicU64::new(1);

pub mod sessions;

use sessions::{lock, Out, Session, SessState, Watch};

/// An owner's answer to a watch op: the reply, to be sent once every
/// node in `acks` answered (a PUBLISH's DELIVERs; empty for the rest).
pub(crate) struct WatchAnswer {
    pub reply: Reply,
    pub acks: Vec<(u32, crossbeam::channel::Receiver<Vec<u8>>)>,
}

impl WatchAnswer {
    fn now(reply: Reply) -> WatchAnswer {
        WatchAnswer { reply, acks: Vec::new() }
    }

    /// The reply, once the nodes answered (each within its DELIVER's
    /// timeout, after which the communication thread drops the waiter).
    pub fn wait(self) -> Reply {
        for (node, rx) in self.acks {
            if rx.recv_timeout(DELIVER_TIMEOUT + Duration::from_secs(1)).is_err() {
                log::warn!("rank {node} did not take a watched event within {DELIVER_TIMEOUT:?}");
            }
        }
        self.reply
    }
}

/// How long an owner waits for a node to take an event it delivers.
const DELIVER_TIMEOUT: Duration = Duration::from_secs(5);

impl Outputs {
    /// Lets events start fetching the files they announce (set once the
    /// node is shared; without it, nothing is prefetched).
    pub fn attach_watch(self: &Arc<Self>) {
        let _ = self.watch_prefetch.set(Arc::downgrade(self));
    }


    /// Rank-to-rank watch ops ([`wop`]), answered on whichever thread asks
    /// (a PUBLISH's answer waits for its deliveries: [`WatchAnswer`]).
    pub(crate) fn watch_meta(&self, req: &Request) -> WatchAnswer {
        match req.op {
            wop::PUBLISH => match NsEvent::decode(&req.payload) {
                Some(ev) => self.sequence(req, ev),
                None => WatchAnswer::now(Reply::err(req, libc::EINVAL)),
            },
            _ => WatchAnswer::now(self.watch_meta_now(req)),
        }
    }

    fn watch_meta_now(&self, req: &Request) -> Reply {
        match req.op {
            wop::SUB => {
                let Some((&flags, path)) = req.payload.split_first() else { return Reply::err(req, libc::EINVAL) };
                let on = flags & 1 != 0;
                let key = (req.arg0 as u32, path.to_vec(), flags & 2 != 0);
                let mut r = lock(&self.watch.routes);
                if on {
                    r.interests.insert(key);
                } else {
                    r.interests.remove(&key);
                }
                Reply::ok(req, 0)
            }
            wop::DELIVER => match NsEvent::decode(&req.payload) {
                Some(ev) => {
                    self.deliver_local(&ev);
                    Reply::ok(req, 0)
                }
                None => Reply::err(req, libc::EINVAL),
            },
            _ => Reply::err(req, libc::EINVAL),
        }
    }

    /// The owner numbers a published event and hands it to every node
    /// interested in it (in order: under one lock, every DELIVER is queued
    /// to the communication thread, which sends them in that order).
    fn sequence(&self, req: &Request, mut ev: NsEvent) -> WatchAnswer {
        let mut acks = Vec::new();
        let mut r = lock(&self.watch.routes);
        r.seq += 1;
        ev.seq = r.seq;
        let nodes: HashSet<u32> = r.interests.iter().filter(|(_, w, rec)| ev.concerns(w, *rec)).map(|k| k.0).collect();
        let mut msg = None;
        for n in nodes {
            if n == self.rank.id.rank {
                self.deliver_local(&ev);
                continue;
            }
            let msg = msg.get_or_insert_with(|| {
                let mut q = Request::new(wop::DELIVER, 0, 0, 0);
                q.payload = ev.encode();
                q
            });
            msg.id = DELIVER_IDS.fetch_add(1, Relaxed);
            let (tx, rx) = crossbeam::channel::bounded(1);
            let call = MetaCall { dest: n, id: msg.id, msg: msg.encode(), reply: tx, timeout: DELIVER_TIMEOUT };
            if self.rank.comm.send(Command::Meta(call)).is_err() {
                log::warn!("rank {}: event for rank {n} dropped: stopping", self.rank.id.rank);
                continue;
            }
            acks.push((n, rx));
        }
        WatchAnswer { reply: Reply::ok(req, ev.seq), acks }
    }

    fn deliver_local(&self, ev: &NsEvent) {
        let sessions: Vec<Arc<Session>> = lock(&self.watch.local).sessions.values().cloned().collect();
        let mut wanted = false;
        for s in sessions {
            wanted |= s.deliver(ev);
        }
        if wanted {
            self.prefetch(ev);
        }
    }

    /// A file a local watcher was just told about, held by another rank:
    /// start fetching it into the node's shared copy now (on a thread of its
    /// own: this may run on the MPI thread), so the consumer's open, which
    /// follows the event, finds it loaded or loading.
    fn prefetch(&self, ev: &NsEvent) {
        if ev.holder == self.rank.id.rank || ev.holder >= self.rank.id.nranks || ev.size == 0 || !self.remote_outs.keeps(ev.size) {
            return;
        }
        let Some(node) = self.watch_prefetch.get().and_then(std::sync::Weak::upgrade) else { return };
        let rec = OutRecord { size: ev.size, mode: libc::S_IFREG, holder: ev.holder, id: ev.id, sum: ev.sum, ..Default::default() };
        let path = if ev.kind == Kind::Rename { ev.to.clone() } else { ev.path.clone() };
        let spawned = std::thread::Builder::new().name("fanstore-prefetch".into()).spawn(move || {
            if let Err(e) = node.load_remote_output(&path, &rec) {
                log::debug!("rank {}: prefetching '{}': errno {e}", node.rank.id.rank, String::from_utf8_lossy(&path));
            }
        });
        if let Err(e) = spawned {
            log::warn!("rank {}: spawning a prefetch thread: {e}", self.rank.id.rank);
        }
    }

    /// Publishes a completed change (see the module doc). A change nobody
    /// watches costs nothing; a failure to publish is logged, never the
    /// change's error.
    /// `rec`: the file's record (its size; for a close or a rename, where its
    /// bytes are, so watching nodes can fetch them at once).
    pub(crate) fn publish(&self, kind: Kind, path: &[u8], to: &[u8], is_dir: bool, replaced: bool, rec: Option<&OutRecord>) {
        let bytes = rec.filter(|_| matches!(kind, Kind::Close | Kind::Rename) && !is_dir);
        let ev = NsEvent {
            kind,
            is_dir,
            replaced,
            node: self.rank.id.rank,
            cookie: if kind == Kind::Rename { (COOKIES.fetch_add(1, Relaxed) as u32 & 0x00ff_ffff) | (self.rank.id.rank << 24) } else { 0 },
            size: rec.map_or(0, |r| r.size),
            holder: bytes.map_or(u32::MAX, |r| r.holder),
            id: bytes.map_or(0, |r| r.id),
            sum: bytes.map_or(0, |r| r.sum),
            time_ns: crate::outputs::names::now_ns(),
            seq: 0,
            path: path.to_vec(),
            to: to.to_vec(),
        };
        let wanted = lock(&self.watch.routes).interests.iter().any(|(_, w, rec)| ev.concerns(w, *rec));
        if !wanted {
            return;
        }
        let dir = if kind == Kind::Rename { watchev::parent(to).0 } else { watchev::parent(path).0 };
        if let Err(e) = self.meta_to(self.owner(dir), wop::PUBLISH, 0, ev.encode()) {
            log::warn!("rank {}: publishing a {} event of '{}': errno {e}", self.rank.id.rank, kind.name(), String::from_utf8_lossy(path));
        }
    }

    /// Tells every rank that this node starts (or stops) watching `path`.
    fn announce_to_all(&self, path: &[u8], recursive: bool, on: bool) {
        let mut payload = vec![u8::from(on) | (u8::from(recursive) << 1)];
        payload.extend_from_slice(path);
        for r in 0..self.rank.id.nranks {
            if let Err(e) = self.meta_to(r, wop::SUB, u64::from(self.rank.id.rank), payload.clone()) {
                log::warn!("rank {}: rank {r} did not take a watch interest: errno {e}", self.rank.id.rank);
            }
        }
    }

    /// Counts a watch on (path, recursive); the first one is announced.
    fn interest_add(&self, path: &[u8], recursive: bool) {
        let _order = lock(&self.watch.announcing);
        let first = {
            let mut l = lock(&self.watch.local);
            let c = l.counts.entry((path.to_vec(), recursive)).or_insert(0);
            *c += 1;
            *c == 1
        };
        if first {
            self.announce_to_all(path, recursive, true);
        }
    }

    /// Uncounts a watch; the last one is withdrawn.
    fn interest_drop(&self, path: &[u8], recursive: bool) {
        let _order = lock(&self.watch.announcing);
        let last = {
            let mut l = lock(&self.watch.local);
            let key = (path.to_vec(), recursive);
            match l.counts.get_mut(&key) {
                Some(c) if *c > 1 => {
                    *c -= 1;
                    false
                }
                Some(_) => {
                    l.counts.remove(&key);
                    true
                }
                None => false,
            }
        };
        if last {
            self.announce_to_all(path, recursive, false);
        }
    }

    /// Is `path` something to watch? Ok(is a directory); ENOENT if neither
    /// an input nor an output.
    fn watch_target(&self, path: &[u8]) -> Result<bool, i32> {
        if let Some(n) = self.rank.view.lookup(path) {
            return Ok(n.is_dir());
        }
        self.out_stat(path).map(|r| r.is_dir())
    }

    /// WATCH_INFO: sessions, watches, and interests routed by this rank.
    pub fn watch_info_reply(&self, req: &Request) -> Reply {
        let sessions: Vec<Arc<Session>> = lock(&self.watch.local).sessions.values().cloned().collect();
        let watches: usize = sessions.iter().map(|s| lock(&s.state).watches.len()).sum();
        let interests = lock(&self.watch.routes).interests.len();
        let mut rep = Reply::ok(req, sessions.len() as u64);
        rep.payload = format!("sessions={} watches={watches} interests={interests}\n", sessions.len()).into_bytes();
        rep
    }
}

fn eventfd() -> Option<OwnedFd> {
    // SAFETY: plain eventfd creation; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    // SAFETY: fd is a new descriptor that we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A watcher session on connection `conn`, which sent `first` (a WATCH_*
/// op): runs until the client goes away. Called on the connection's thread.
pub fn session(outputs: &Outputs, conn: RawFd, first: Request, attached: Option<OwnedFd>) {
    let Some(wake) = eventfd() else {
        let _ = wire::send_msg(conn, &Reply::err(&first, libc::EMFILE).encode(), None);
        return;
    };
    let s = Arc::new(Session { state: Mutex::new(SessState::default()), wake });
    let id = {
        let mut l = lock(&outputs.watch.local);
        l.next += 1;
        let id = l.next;
        l.sessions.insert(id, s.clone());
        id
    };
    log::debug!("rank {}: watcher session {id} starts", outputs.rank.id.rank);
    let mut sess = Run { outputs, conn, s: &s, sink: None, kernel: None, pending: None, kbuf: Vec::new() };
    let mut buf = vec![0u8; wire::MAX_MESSAGE];
    let mut next = Some((first, attached));
    let why = loop {
        if outputs.rank.stopping.load(Relaxed) {
            break "the daemon stops";
        }
        if let Some((req, fd)) = next.take() {
            if sess.request(&req, fd).is_err() {
                break "its client went away during a reply";
            }
        }
        match sess.wait(&mut buf) {
            Ok(Some(r)) => next = Some(r),
            Ok(None) => {}
            Err(why) => break why,
        }
    };
    log::debug!("rank {}: watcher session {id} ends: {why}", outputs.rank.id.rank);
    lock(&outputs.watch.local).sessions.remove(&id);
    let watches = std::mem::take(&mut lock(&s.state).watches);
    let ended = std::mem::take(&mut lock(&s.state).ended);
    for (path, rec) in watches.into_iter().map(|w| (w.path, w.recursive)).chain(ended) {
        outputs.interest_drop(&path, rec);
    }
}

/// The session thread's own state.
struct Run<'a> {
    outputs: &'a Outputs,
    conn: RawFd,
    s: &'a Session,
    sink: Option<OwnedFd>,
    kernel: Option<OwnedFd>,
    /// A record that did not fit into the sink yet.
    pending: Option<Vec<u8>>,
    kbuf: Vec<u8>,
}

impl Run<'_> {
    fn reply(&self, req: &Request, r: Result<u64, i32>) -> Result<(), ()> {
        let rep = match r {
            Ok(v) => Reply::ok(req, v),
            Err(e) => Reply::err(req, e),
        };
        wire::send_msg(self.conn, &rep.encode(), None).map_err(|_| ())
    }

    fn request(&mut self, req: &Request, fd: Option<OwnedFd>) -> Result<(), ()> {
        match req.op {
            op::WATCH_ADD => {
                let r = self.add(req);
                self.reply(req, r.map(|()| 0))
            }
            op::WATCH_RM => {
                let wd = req.arg0 as i32;
                let removed = {
                    let mut st = lock(&self.s.state);
                    let i = st.watches.iter().position(|w| w.wd == wd);
                    let w = i.map(|i| st.watches.remove(i));
                    if w.is_some() && st.inotify {
                        let mut b = Vec::new();
                        watchev::push_inotify(&mut b, wd, &Rec { mask: IN_IGNORED, cookie: 0, name: Vec::new() });
                        Session::push(&mut st, Out::Ino(b));
                    }
                    w
                };
                match removed {
                    Some(w) => {
                        self.s.wake();
                        self.outputs.interest_drop(&w.path, w.recursive);
                        self.reply(req, Ok(0))
                    }
                    None => self.reply(req, Err(libc::EINVAL)),
                }
            }
            op::WATCH_SINK => match fd {
                Some(f) => {
                    // SAFETY: fcntl on the fd we were handed: our writes must never block.
                    unsafe {
                        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
                        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
                    }
                    self.sink = Some(f);
                    lock(&self.s.state).inotify = true;
                    self.reply(req, Ok(0))
                }
                None => self.reply(req, Err(libc::EINVAL)),
            },
            op::WATCH_KERNEL => match fd {
                Some(f) if self.sink.is_some() => {
                    self.kernel = Some(f);
                    self.reply(req, Ok(0))
                }
                _ => self.reply(req, Err(libc::EINVAL)),
            },
            _ => self.reply(req, Err(libc::EINVAL)),
        }
    }

    fn add(&mut self, req: &Request) -> Result<(), i32> {
        let wd = i32::try_from(req.arg0).map_err(|_| libc::EINVAL)?;
        let mask = req.arg1 as u32;
        let recursive = req.arg1 & watchev::WATCH_RECURSIVE != 0;
        if mask & IN_ALL_EVENTS == 0 {
            return Err(libc::EINVAL);
        }
        let path = req.payload.clone();
        let is_dir = self.outputs.watch_target(&path)?;
        if mask & IN_ONLYDIR != 0 && !is_dir {
            return Err(libc::ENOTDIR);
        }
        let old = {
            let mut st = lock(&self.s.state);
            let w = Watch { wd, path: path.clone(), mask, recursive };
            match st.watches.iter().position(|w| w.wd == wd) {
                Some(i) => Some(std::mem::replace(&mut st.watches[i], w)),
                None => {
                    st.watches.push(w);
                    None
                }
            }
        };
        // The new interest first, so no event falls between the two.
        self.outputs.interest_add(&path, recursive);
        if let Some(o) = old {
            self.outputs.interest_drop(&o.path, o.recursive);
        }
        Ok(())
    }

    /// Sends what is queued, then sleeps until something happens.
    /// Ok(Some) is a new request; Err: the session is over (why).
    fn wait(&mut self, buf: &mut [u8]) -> Result<Option<(Request, Option<OwnedFd>)>, &'static str> {
        self.flush().map_err(|()| "sending records failed")?;
        let ended = std::mem::take(&mut lock(&self.s.state).ended);
        for (p, r) in ended {
            self.outputs.interest_drop(&p, r);
        }
        let blocked = self.pending.is_some();
        let mut fds = vec![
            libc::pollfd { fd: self.conn, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: self.s.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        if let Some(k) = &self.kernel {
            // A full sink: the kernel's own queue holds its events meanwhile.
            fds.push(libc::pollfd { fd: k.as_raw_fd(), events: if blocked { 0 } else { libc::POLLIN }, revents: 0 });
        }
        if let Some(s) = &self.sink {
            fds.push(libc::pollfd { fd: s.as_raw_fd(), events: if blocked { libc::POLLOUT } else { 0 }, revents: 0 });
        }
        // SAFETY: fds is a valid array of pollfds of the length given.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_MS) };
        if n <= 0 {
            return Ok(None);
        }
        let sink_ix = fds.len() - 1;
        if self.sink.is_some() && fds[sink_ix].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            return Err("the program closed its inotify fd");
        }
        if fds[1].revents & libc::POLLIN != 0 {
            let mut v = 0u64;
            // SAFETY: reading 8 bytes from our own eventfd into v.
            unsafe { libc::read(self.s.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        }
        if self.kernel.is_some() && fds[2].revents & libc::POLLIN != 0 {
            self.forward_kernel();
        }
        if fds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            return match wire::recv_msg(self.conn, buf) {
                Ok((0, _)) => Err("the client closed its connection"),
                Err(_) => Err("the connection failed"),
                Ok((n, fd)) => match Request::decode(&buf[..n]) {
                    Ok(r) => Ok(Some((r, fd))),
                    Err(_) => Err("a bad request"),
                },
            };
        }
        Ok(None)
    }

    /// Moves the kernel inotify instance's records into the queue.
    fn forward_kernel(&mut self) {
        let Some(k) = &self.kernel else { return };
        self.kbuf.resize(64 << 10, 0);
        // SAFETY: reading into our own buffer of its length.
        let n = unsafe { libc::read(k.as_raw_fd(), self.kbuf.as_mut_ptr().cast(), self.kbuf.len()) };
        if n <= 0 {
            return;
        }
        let mut st = lock(&self.s.state);
        for r in watchev::split_inotify(&self.kbuf[..n as usize]) {
            Session::push(&mut st, Out::Ino(r.to_vec()));
        }
    }

    /// Sends queued records until the queue is empty or the sink is full.
    fn flush(&mut self) -> Result<(), ()> {
        loop {
            let item = match self.pending.take() {
                Some(b) => Some(Out::Ino(b)),
                None => {
                    let mut st = lock(&self.s.state);
                    match st.queue.pop_front() {
                        Some(o) => Some(o),
                        None if st.overflow => {
                            st.overflow = false;
                            if st.inotify {
                                let mut b = Vec::new();
                                watchev::push_inotify(&mut b, -1, &Rec { mask: IN_Q_OVERFLOW, cookie: 0, name: Vec::new() });
                                Some(Out::Ino(b))
                            } else {
                                Some(Out::Ns(Vec::new()))
                            }
                        }
                        None => None,
                    }
                }
            };
            match item {
                None => return Ok(()),
                Some(Out::Ns(b)) => {
                    let mut rep = Reply { op: op::WATCH_EVENT, id: 0, errno: 0, flags: 0, value: u64::from(b.is_empty()), payload: b };
                    rep.payload.truncate(wire::MAX_MESSAGE - wire::HEADER_LEN);
                    wire::send_msg(self.conn, &rep.encode(), None).map_err(|_| ())?;
                }
                Some(Out::Ino(b)) => {
                    let Some(sink) = &self.sink else { continue };
                    // SAFETY: writing our own buffer to the sink (O_NONBLOCK;
                    // a closed reader is EPIPE: SIGPIPE is ignored in the daemon).
                    let r = unsafe { libc::write(sink.as_raw_fd(), b.as_ptr().cast(), b.len()) };
                    if r < 0 {
                        let e = std::io::Error::last_os_error();
                        if e.kind() == std::io::ErrorKind::WouldBlock {
                            self.pending = Some(b);
                            return Ok(());
                        }
                        if e.kind() == std::io::ErrorKind::Interrupted {
                            self.pending = Some(b);
                            continue;
                        }
                        return Err(());
                    }
                }
            }
        }
    }
}
