//! The communication thread: every MPI call of the daemon runs here, but
//! the two that post a server thread's own fetch ([`post`]).
//!
//! Other threads talk to it through a crossbeam channel of [`Command`]s;
//! each fetch carries its own reply channel (and arrives posted already
//! where MPI granted `MPI_THREAD_MULTIPLE`). The thread never blocks in
//! MPI: it polls nonblocking operations (MPI_Iprobe for incoming requests
//! and control messages, MPI_Testsome over a table of Isend/Irecv requests),
//! so any number of remote reads are in flight at once, in both directions.
//!
//! Protocol on the daemon's communicator (a dup of MPI_COMM_WORLD):
//!
//! ```text
//! tag 1 (TAG_REQUEST)  requester -> holder, 24 bytes, little-endian:
//!                        0..4 node id | 4..8 reply tag | 8..16 stored length
//!                        | 16..24 offset (partition ranges; zero otherwise)
//! reply tag (16..32766) holder -> requester: the stored (possibly compressed)
//!                        payload, in order, on the tag the request named, in
//!                        pieces (table::plan): `--mpi-pipeline` bytes each
//!                        (default 1 MiB) from twice that size up, never more
//!                        than `--mpi-piece` bytes (default 1 GiB: larger
//!                        payloads always cross in pieces).
//!                        The requester pre-posts one receive per piece
//!                        straight into the destination buffer, so the bytes
//!                        are never copied on arrival. A holder that cannot
//!                        serve the file sends every piece empty.
//! tag 2 (TAG_CTRL)     8 bytes: 0..4 op (1 = STOP) | 4..8 sender rank
//! tag 3 (TAG_META_REQ) any rank -> metadata owner of an output path: one
//!                        [`fanstore_core::wire::Request`] (ops in
//!                        [`crate::outputs::held::mop`]), answered at once by the
//!                        owner's [`MetaServer`] on this thread, or later
//!                        from another thread ([`Command::MetaReply`])
//! tag 4 (TAG_META_REP) owner -> asker: one [`fanstore_core::wire::Reply`]
//!                        echoing the request id
//! ```
//!
//! Outputs reuse TAG_REQUEST for their bytes: node ids with bit 31 set
//! ([`OUT_BIT`]) name output files (`out/<id>` in the holder's local dir).
//! Node ids with bit 30 set and bit 31 clear ([`PART_BIT`]) name a byte
//! range of a whole partition (the low 30 bits are the partition id, the
//! offset field says where the range starts): background replication of
//! remote partitions ([`crate::inputs::replicate`]). Dataset node ids stay below
//! 2^30 (the loader refuses larger manifests).
//!
//! The requester verifies the payload's xxh3 against the manifest (end to
//! end: a bad local copy on the holder is caught too); this thread hashes
//! each piece as soon as it and every piece before it arrived, so the
//! checksum of a large payload is ready when its last piece is. A fetch with no
//! complete answer by its deadline is answered with [`FetchError::Timeout`];
//! its receives stay posted (its tag stays reserved) until they complete, so
//! a late reply can never land in another fetch's buffer.

pub mod post;
pub mod raw;
pub mod spin;
pub mod table;
pub mod wake;

// The two imports of the inputs service, on purpose: a fetched payload is
// received straight into a spare copy file's pages (recycle::Spare), and the
// communication thread answers the client of a remote OPEN itself once the
// bytes are verified (client_reply::Direct). Behind a trait each would cost a
// dynamic call and an allocation per remote read on the hottest path.
use crate::inputs::client_reply::Direct;
use crate::status::Counters;
use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use raw::{Comm, Done, Request};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};
pub use table::FetchError;
use table::{FetchState, ReqTable, Slot, Tags};

pub use crate::ids::{CTRL_STOP, OUT_BIT, PART_BIT, TAG_CTRL, TAG_META_REP, TAG_META_REQ, TAG_REQUEST};

/// Naps while idle grow from FIRST_NAP, doubling, up to a cap that depends
/// on how long the rank has been idle: a request arriving during a burst of
/// reads waits at most ~50 µs to be seen, one after a pause of seconds at
/// most 5 ms, one after 10 s of silence at most 20 ms. Each wake-up costs
/// ~50 µs of CPU on a virtual machine whose timers are expensive: 200 naps a
/// second were ~1% of a core per idle rank, 50 are a quarter of that.
const FIRST_NAP: Duration = Duration::from_micros(10);
/// How long a polling thread trusts its last look at the CPUs' run queues.
/// Each look reads /proc/loadavg, which the kernel formats anew (~0.5 µs):
/// looked at on every round of polling, that was ~8% of the daemons' CPU
/// for one reader's remote opens (perf), while a thread that waits behind
/// a polling one waits for a time slice of milliseconds, not microseconds.
const CROWD_RECHECK: Duration = Duration::from_micros(20);
/// A payload larger than this crosses the transport in several rounds
/// (rendezvous, pieces): the communication thread polls (on `spin`'s terms)
/// for as long as it is in flight.
const LARGE_PAYLOAD: usize = 256 << 10;

/// How long a stop that drains waits for this rank's sums to settle, and
/// then for the other ranks (see [`Engine::shutdown`]): a commit queue is
/// at most 4 GiB, which the store's worker reads at 0.5-1 GB/s here.
pub const SETTLE_WAIT: Duration = Duration::from_secs(60);

fn nap_cap(idle: Duration) -> Duration {
    if idle < Duration::from_millis(20) {
        Duration::from_micros(50)
    } else if idle < Duration::from_secs(1) {
        Duration::from_micros(500)
    } else if idle < Duration::from_secs(5) {
        Duration::from_millis(2)
    } else if idle < Duration::from_secs(10) {
        Duration::from_millis(5)
    } else {
        Duration::from_millis(20)
    }
}

/// Where a fetched payload is received: the first `len` bytes of a
/// (reusable, already faulted-in) buffer, or the whole of a spare copy
/// file's kept mapping, so an uncompressed file's bytes land in the copy
/// a client will read with no copy on arrival ([`crate::inputs::recycle::Spare`]).
/// The communication thread owns it until every receive into it completed:
/// a fetch that timed out keeps it (and a spare's file stays unreachable)
/// until the late bytes are in.
pub struct RecvBuf {
    mem: RecvMem,
    len: usize,
}

/// The memory behind a [`RecvBuf`].
pub enum RecvMem {
    Heap(Vec<u8>),
    Spare(crate::inputs::recycle::Spare),
}

impl RecvBuf {
    /// The first `len` bytes of `buf` (grown to `len` if shorter).
    pub fn heap(mut buf: Vec<u8>, len: usize) -> RecvBuf {
        if buf.len() < len {
            buf.resize(len, 0);
        }
        RecvBuf { mem: RecvMem::Heap(buf), len }
    }

    /// The whole of `s` through its kept mapping (made now). Err(s) if it
    /// cannot be mapped.
    pub fn spare(mut s: crate::inputs::recycle::Spare) -> Result<RecvBuf, crate::inputs::recycle::Spare> {
        let len = match s.parts() {
            (_, Some(b)) => b.len(),
            (_, None) => return Err(s),
        };
        Ok(RecvBuf { mem: RecvMem::Spare(s), len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the bytes go into a spare's pages (the copy's own file).
    pub fn is_spare(&self) -> bool {
        matches!(self.mem, RecvMem::Spare(_))
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.mem {
            RecvMem::Heap(v) => &v[..self.len],
            RecvMem::Spare(s) => s.mapped(self.len),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            RecvMem::Heap(v) => &mut v[..self.len],
            RecvMem::Spare(s) => s.parts().1.unwrap_or_default(),
        }
    }

    /// The memory back, for reuse.
    pub fn into_mem(self) -> RecvMem {
        self.mem
    }
}

/// Answers the client of `d` with the copy's file, once `buf` holds the
/// file's verified bytes: the spare received into, else the copy's file
/// written here with `buf`'s bytes. Never blocks on the client.
fn answer_directly(d: &Direct, buf: &RecvBuf) -> bool {
    d.client.send_from_comm(|| match (&buf.mem, d.dest) {
        (RecvMem::Spare(s), _) => Some(s.file().as_raw_fd()),
        (RecvMem::Heap(_), Some(dest)) => {
            // SAFETY: `dest` is an fd the connection thread keeps open while
            // the answer is SENDING; ManuallyDrop leaves it open here.
            let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(dest) });
            crate::fdio::write_all_at(&file, buf.bytes(), 0).ok().map(|()| dest)
        }
        (RecvMem::Heap(_), None) => None,
    })
}

/// The received payload and its xxh3, computed piece by piece as the pieces
/// arrived (the requester compares it with the manifest); 0 for a partition
/// range, whose reader checks each file in it.
pub type FetchReply = Result<(RecvBuf, u64), FetchError>;

/// One remote read: ask `holder` for the stored payload of `node_id`.
pub struct Fetch {
    pub node_id: u32,
    pub holder: u32,
    pub stored_len: u64,
    /// Where a partition range starts ([`PART_BIT`]); 0 for files and outputs.
    pub offset: u64,
    /// Exactly `stored_len` bytes long.
    pub buf: RecvBuf,
    pub reply: Sender<FetchReply>,
    pub timeout: Duration,
    /// Answer the client of this remote OPEN from here once the payload is
    /// verified and in the copy's file ([`crate::inputs::client_reply`]).
    pub direct: Option<Direct>,
}

/// A fetch whose receives are posted (and its request sent, or about to
/// be), waiting for the communication thread to test them (`Engine::adopt`).
pub struct Posted {
    pending: PendingFetch,
    /// The requests posted, each with the piece it receives (None: the request message).
    reqs: Vec<(Request, Option<usize>)>,
}

// SAFETY: `pending.base` points into `pending.buf`, which moves with it
// (its bytes do not move); the requests are handles of this process's MPI,
// which any thread may use under MPI_THREAD_MULTIPLE, the only level at
// which a Posted crosses threads ([`post`]).
unsafe impl Send for Posted {}

/// The request message of a fetch, to send once its receives are posted.
pub type RequestMsg = Box<[u8; table::REQUEST_LEN]>;

/// A request message in flight, sent by a server thread ([`post`]).
pub struct SentRequest {
    request: Request,
    msg: RequestMsg,
}

// SAFETY: `msg` is boxed (its bytes do not move with it); `request` is a
// handle of this process's MPI, which any thread may use under
// MPI_THREAD_MULTIPLE, the only level at which one crosses threads.
unsafe impl Send for SentRequest {}

/// Posts the receives of `f`'s payload (one per piece, straight into its
/// buffer) on reply tag `tag`, and returns the fetch with its request
/// message, not sent yet. A fetch that cannot be posted is answered with
/// its error here and comes back abandoned, without a request, with its
/// receives already posted (to complete before the buffer is dropped).
pub(crate) fn post_receives(comm: &raw::Handle, mut f: Fetch, tag: i32, piece: u64, pipeline: u64) -> (Posted, Option<RequestMsg>) {
    let parts = table::plan(f.stored_len, piece, pipeline);
    let request = Box::new(table::encode_request(f.node_id, tag, f.stored_len, f.offset));
    let mut state = FetchState::new(f.holder, tag, Instant::now() + f.timeout, parts.iter().map(|p| p.1).collect());
    let have = f.buf.bytes_mut().len();
    if have as u64 != f.stored_len {
        let _ = f.reply.send(Err(FetchError::BadBuffer(have, f.stored_len)));
        state.abandoned = true;
        let pending = PendingFetch::new(state, f.buf, std::ptr::null(), Vec::new(), None, None);
        return (Posted { pending, reqs: Vec::new() }, None);
    }
    let base = f.buf.bytes_mut().as_mut_ptr();
    let mut reqs = Vec::with_capacity(parts.len() + 1);
    for (i, &(off, len)) in parts.iter().enumerate() {
        // SAFETY: `buf` is exactly stored_len bytes (checked above) and
        // every piece lies inside it; the buffer moves into the Posted
        // below, then into the engine's fetches (moving a Vec or a spare
        // with its mapping does not move its bytes), and stays there,
        // untouched, until every posted receive completed.
        match unsafe { comm.irecv(base.add(off as usize), len, f.holder, tag) } {
            Ok(r) => reqs.push((r, Some(i))),
            Err(e) => {
                let posted = reqs.len();
                let pending = failed(comm, f, state, base, parts, posted, e);
                return (Posted { pending, reqs }, None);
            }
        }
    }
    let mut pending = PendingFetch::new(state, f.buf, base, parts, Some(f.reply), f.direct);
    // A partition range spans many files: its reader checks each file's
    // checksum itself (replication, read-ahead), so no whole-range hash.
    pending.hashes = f.node_id & (OUT_BIT | PART_BIT) != PART_BIT;
    (Posted { pending, reqs }, Some(request))
}

/// A fetch that could not be posted whole (`posted` receives were): answered
/// with `e` now, kept abandoned until those receives complete.
fn failed(comm: &raw::Handle, f: Fetch, mut state: FetchState, base: *mut u8, parts: Vec<(u64, usize)>, posted: usize, e: raw::MpiError) -> PendingFetch {
    // Receives already posted stay posted: the fetch is abandoned and
    // cleaned up when (if ever) they complete.
    log::warn!("rank {}: posting a fetch from rank {}: {e}", comm.rank, f.holder);
    let _ = f.reply.send(Err(FetchError::Mpi(f.holder, e.0)));
    state.abandoned = true;
    state.fail();
    for _ in posted..parts.len() {
        state.piece_done(usize::MAX, 0);
    }
    state.request_done(false);
    PendingFetch::new(state, f.buf, base, parts, None, None)
}

/// One metadata request to another rank (never to this one: the caller
/// answers those itself). `msg` is an encoded wire Request with id `id`.
pub struct MetaCall {
    pub dest: u32,
    pub id: u64,
    pub msg: Vec<u8>,
    pub reply: Sender<Vec<u8>>,
    pub timeout: Duration,
}

/// Who waits for a metadata reply, and until when.
type MetaWaiter = (Sender<Vec<u8>>, Instant);

/// Answers metadata requests of peers (the owner side).
pub trait MetaServer {
    /// `msg` is an encoded wire Request from rank `src`; the result an
    /// encoded Reply, or None when the server answers later, from another
    /// thread, with a [`Command::MetaReply`] (it must not wait here: this is
    /// the communication thread, which the answer it waits for may need).
    fn handle_meta(&self, src: u32, msg: &[u8]) -> Option<Vec<u8>>;
}

pub enum Command {
    Fetch(Fetch),
    /// A fetch a server thread posted itself ([`post`]); its request is
    /// sent after it was queued, and tracked apart ([`Command::Sent`]).
    Posted(Posted),
    /// A request message a server thread sent after queueing its fetch:
    /// kept until the send completes.
    Sent(SentRequest),
    Meta(MetaCall),
    /// A reply (an encoded wire Reply) to a peer's metadata request that
    /// [`MetaServer::handle_meta`] left for later.
    MetaReply { dest: u32, msg: Vec<u8> },
    /// Shut the whole job down (this rank tells the others).
    Stop,
}

/// A payload this rank sends to a peer.
pub enum SendBuf {
    Heap(Vec<u8>),
    Map(memmap2::Mmap),
    /// A range of a mapped local partition copy.
    Part(std::sync::Arc<memmap2::Mmap>, std::ops::Range<usize>),
}

impl SendBuf {
    pub fn bytes(&self) -> &[u8] {
        match self {
            SendBuf::Heap(v) => v,
            SendBuf::Map(m) => m,
            SendBuf::Part(m, r) => &m[r.clone()],
        }
    }
}

/// What this rank can serve to peers.
pub trait PeerSource {
    /// The stored payload of `node_id`, if this rank holds it and its stored
    /// length is `stored_len`.
    /// `spare` is a previously used buffer to read into, if the source wants one.
    fn payload(&self, node_id: u32, stored_len: u64, spare: Option<Vec<u8>>) -> Option<SendBuf>;

    /// Bytes `offset..offset + len` of partition `p`'s file, if this rank
    /// loaded that partition (a peer replicating it).
    fn partition_range(&self, _p: u32, _offset: u64, _len: u64) -> Option<SendBuf> {
        None
    }
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// A client asked this rank (STOP), or a signal arrived.
    Local,
    /// Another rank told us to stop.
    Peer(u32),
    /// Every sender of commands is gone.
    Orphaned,
}

struct PendingFetch {
    state: FetchState,
    buf: RecvBuf,
    /// Start of `buf`'s bytes (pieces are hashed through it, never the whole buffer).
    base: *const u8,
    parts: Vec<(u64, usize)>,
    arrived: Vec<bool>,
    /// Pieces hashed so far (a prefix of `parts`).
    hashed: usize,
    hasher: fanstore_core::checksum::StreamingChecksum,
    /// Whether the pieces are hashed (not for a partition range: the reply's sum is then 0).
    hashes: bool,
    started: Instant,
    reply: Option<Sender<FetchReply>>,
    direct: Option<Direct>,
    /// The request message while its send is in flight (sent by this thread).
    _request: Option<RequestMsg>,
}

impl PendingFetch {
    fn new(
        state: FetchState,
        buf: RecvBuf,
        base: *const u8,
        parts: Vec<(u64, usize)>,
        reply: Option<Sender<FetchReply>>,
        direct: Option<Direct>,
    ) -> Self {
        let n = parts.len();
        PendingFetch {
            state,
            buf,
            base,
            parts,
            arrived: vec![false; n],
            hashed: 0,
            hasher: fanstore_core::checksum::StreamingChecksum::new(),
            hashes: true,
            started: Instant::now(),
            reply,
            direct,
            _request: None,
        }
    }

    /// Piece `i` arrived whole: hash every piece of the completed prefix.
    fn arrived(&mut self, i: usize) {
        if let Some(a) = self.arrived.get_mut(i) {
            *a = true;
        }
        while self.hashed < self.parts.len() && self.arrived[self.hashed] {
            let (off, len) = self.parts[self.hashed];
            // SAFETY: this piece's receive has completed, so MPI no longer
            // writes these bytes; the slice covers only them (other pieces of
            // the same buffer may still be written), inside the buffer that
            // `self.buf` keeps alive.
            let piece = unsafe { std::slice::from_raw_parts(self.base.add(off as usize), len) };
            if self.hashes {
                self.hasher.update(piece);
            }
            self.hashed += 1;
        }
    }
}

struct PendingSend {
    buf: Option<SendBuf>,
    _small: Box<[u8]>,
    outstanding: usize,
}

/// The state of the communication thread.
pub struct Engine<'a> {
    comm: &'a Comm,
    source: &'a dyn PeerSource,
    counters: &'a Counters,
    piece: u64,
    pipeline: u64,
    table: ReqTable<Request>,
    /// Reply tags of the fetches this thread posts.
    tags: Tags,
    /// Where server threads post their own fetches (MPI_THREAD_MULTIPLE).
    poster: Option<std::sync::Arc<post::Poster>>,
    fetches: HashMap<u64, PendingFetch>,
    sends: HashMap<u64, PendingSend>,
    next_id: u64,
    done: Vec<Done>,
    /// Send buffers of completed replies, reused (fresh pages are costly).
    spare: Vec<Vec<u8>>,
    /// Keep polling (yielding) this long after the last activity before napping.
    spin: Duration,
    /// Polls after activity only while no runnable thread waits for a CPU
    /// (None: for all of `spin` regardless). See [`spin`].
    spin_check: Option<spin::RunQueue>,
    /// When `spin_check` last found a CPU idle.
    idle_cpu_seen: Option<Instant>,
    /// Counted on the polling board now.
    polling: bool,
    meta: Option<&'a dyn MetaServer>,
    /// Metadata requests sent, by (destination, request id).
    meta_pending: HashMap<(u32, u64), MetaWaiter>,
    /// Sleeps on the doorbell and the transport's fds (None: naps on the channel).
    waiter: Option<wake::Waiter>,
}

/// Messages received per round of progress before completions are tested.
const PROBES_PER_POLL: usize = 256;
const SPARE_MAX: usize = 1 << 20;
const SPARE_COUNT: usize = 8;

impl<'a> Engine<'a> {
    /// `piece`: largest MPI message (at most 1 GiB); `pipeline`: piece size
    /// of large payloads (0: one message up to `piece`). Equal on every rank.
    pub fn new(comm: &'a Comm, source: &'a dyn PeerSource, counters: &'a Counters, piece: u64, pipeline: u64) -> Self {
        Engine {
            comm,
            source,
            counters,
            piece: piece.clamp(1, 1 << 30),
            pipeline,
            table: ReqTable::default(),
            tags: Tags::span(table::FIRST_REPLY_TAG, table::POSTER_FIRST_TAG),
            poster: None,
            fetches: HashMap::new(),
            sends: HashMap::new(),
            next_id: 0,
            done: Vec::new(),
            spare: Vec::new(),
            spin: Duration::ZERO,
            spin_check: None,
            idle_cpu_seen: None,
            polling: false,
            meta: None,
            meta_pending: HashMap::new(),
            waiter: None,
        }
    }

    /// Answers peers' metadata requests with `m`.
    pub fn with_meta(mut self, m: &'a dyn MetaServer) -> Self {
        self.meta = Some(m);
        self
    }

    fn start_meta(&mut self, m: MetaCall) {
        let small = m.msg.into_boxed_slice();
        let id = self.id();
        // SAFETY: `small` is boxed and kept in `sends` until the send completes.
        match unsafe { self.comm.isend(small.as_ptr(), small.len(), m.dest, TAG_META_REQ) } {
            Ok(req) => {
                self.table.push(req, Slot::Sent { send: id });
                self.sends.insert(id, PendingSend { buf: None, _small: small, outstanding: 1 });
                self.meta_pending.insert((m.dest, m.id), (m.reply, Instant::now() + m.timeout));
            }
            Err(e) => log::warn!("rank {}: metadata request to rank {}: {e}", self.comm.rank, m.dest),
        }
    }

    /// Answers a peer's metadata request (`n` bytes from `src`, probed).
    fn meta_request(&mut self, src: u32, n: usize) {
        let mut b = vec![0u8; n];
        if !matches!(self.comm.recv_probed(&mut b, src, TAG_META_REQ), Ok(k) if k == n) {
            return;
        }
        let Some(m) = self.meta else { return };
        if let Some(reply) = m.handle_meta(src, &b) {
            self.send_meta_reply(src, reply);
        }
    }

    /// Sends a metadata reply to rank `src`, which asked.
    fn send_meta_reply(&mut self, src: u32, reply: Vec<u8>) {
        let reply = reply.into_boxed_slice();
        let id = self.id();
        // SAFETY: `reply` is boxed and kept in `sends` until the send completes.
        match unsafe { self.comm.isend(reply.as_ptr(), reply.len(), src, TAG_META_REP) } {
            Ok(req) => {
                self.table.push(req, Slot::Sent { send: id });
                self.sends.insert(id, PendingSend { buf: None, _small: reply, outstanding: 1 });
            }
            Err(e) => log::warn!("rank {}: metadata reply to rank {src}: {e}", self.comm.rank),
        }
    }

    /// Routes a metadata reply (`n` bytes from `src`, probed) to its asker.
    fn meta_reply(&mut self, src: u32, n: usize) {
        let mut b = vec![0u8; n];
        if !matches!(self.comm.recv_probed(&mut b, src, TAG_META_REP), Ok(k) if k == n) {
            return;
        }
        let Ok(rep) = fanstore_core::wire::Reply::decode(&b) else { return };
        if let Some((tx, _)) = self.meta_pending.remove(&(src, rep.id)) {
            let _ = tx.send(b);
        }
    }

    fn command(&mut self, c: Command) -> bool {
        match c {
            Command::Fetch(f) => self.start_fetch(f),
            Command::Posted(p) => self.adopt(p),
            Command::Sent(s) => self.track_send(s),
            Command::Meta(m) => self.start_meta(m),
            Command::MetaReply { dest, msg } => self.send_meta_reply(dest, msg),
            Command::Stop => return false,
        }
        true
    }

    /// Adopts the fetches server threads post through `p`, and closes it
    /// before shutting down.
    pub fn with_poster(mut self, p: std::sync::Arc<post::Poster>) -> Self {
        self.poster = Some(p);
        self
    }

    /// Sleeps through `w` when idle (see [`wake`]) instead of napping on the channel.
    pub fn with_waiter(mut self, w: wake::Waiter) -> Self {
        self.waiter = Some(w);
        self
    }

    /// Polls without napping for `spin` after each activity: lower latency
    /// for the next request of a burst, at the price of a busy core.
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// Polls after activity ([`with_spin`](Self::with_spin)) only while
    /// `q` says no runnable thread waits for a CPU: polling on a CPU that
    /// another thread wants takes it from that thread (a reader, a holder
    /// hashing its reply, the daemon's own copying).
    ///
    /// Polling stops at the first sight of a waiting thread: letting
    /// threads wait 20 or 50 µs before stopping cost the training reader on
    /// 4 ranks 1% and 8% (2013 and 1857 files/s against 2034), and did not
    /// lower one reader's latency (120 and 111 µs against 66).
    pub fn with_spin_check(mut self, q: Option<spin::RunQueue>) -> Self {
        self.spin_check = q;
        self
    }

    /// Serves until a stop. `signal` is set by SIGTERM/SIGINT.
    pub fn run(&mut self, rx: &Receiver<Command>, signal: &AtomicBool) -> StopCause {
        let cause = self.progress_loop(rx, signal);
        self.set_polling(false);
        cause
    }

    /// Counts this thread on the host's polling board while it polls after
    /// activity (see [`spin`]).
    fn set_polling(&mut self, on: bool) {
        if self.polling != on {
            self.polling = on;
            if let Some(q) = &self.spin_check {
                if on {
                    q.enter();
                } else {
                    q.leave();
                }
            }
        }
    }

    /// Whether a runnable thread waits for a CPU ([`spin::RunQueue::crowded`];
    /// false without a check). After a look that found a CPU idle, the next
    /// [`CROWD_RECHECK`] poll without looking again.
    fn crowded(&mut self, now: Instant) -> bool {
        let Some(q) = &self.spin_check else { return false };
        if self.idle_cpu_seen.is_some_and(|at| now.duration_since(at) < CROWD_RECHECK) {
            return false;
        }
        let spare = q.spare();
        self.idle_cpu_seen = spare.filter(|&s| s >= 1).map(|_| now);
        spare.is_none_or(|s| s < 0)
    }

    fn progress_loop(&mut self, rx: &Receiver<Command>, signal: &AtomicBool) -> StopCause {
        let mut last_active = Instant::now();
        let mut last_expiry = Instant::now();
        let mut nap = FIRST_NAP;
        let mut woke: Option<wake::Woke> = None;
        // This polling period was cut short: a thread waited for a CPU.
        let mut cut_short = false;
        // Short naps are only short with a small timer slack (default 50 µs).
        // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64, 0u64, 0u64, 0u64) };
        loop {
            let mut active = false;
            loop {
                match rx.try_recv() {
                    Ok(c) => {
                        active = true;
                        if !self.command(c) {
                            return StopCause::Local;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return StopCause::Orphaned,
                }
            }
            match self.poll() {
                Ok(a) => active |= a,
                Err(cause) => return cause,
            }
            if let Some(how) = woke.take() {
                // A transport wake-up during a transfer is useful even before
                // it completes; a timeout is useful only if it found work.
                let useful = active || (how == wake::Woke::Transport && self.busy());
                if let Some(w) = self.waiter.as_mut() {
                    w.woke(how, useful);
                    let [cmd, fd, timeout, idle] = w.tally();
                    for (c, v) in self.counters.comm_wakes.iter().zip([cmd, fd, timeout, idle, w.missed_wakes()]) {
                        c.store(v, Relaxed);
                    }
                }
            }
            if signal.load(Relaxed) {
                log::info!("rank {}: signal received, stopping the job", self.comm.rank);
                return StopCause::Local;
            }
            let now = Instant::now();
            if now.duration_since(last_expiry) >= Duration::from_millis(5) {
                self.expire(now);
                last_expiry = now;
            }
            if active {
                // Work is no polling: it does not yield its CPU.
                self.set_polling(false);
                last_active = now;
                nap = FIRST_NAP;
                cut_short = false;
                continue;
            }
            // Transfers in flight progress only while we poll, but the
            // transport's fds wake a sleep when their sockets have work:
            // with them, poll only for `spin` after the last activity.
            let wakes = self.waiter.as_ref().is_some_and(|w| w.transport_count() > 0);
            if self.busy() && !wakes {
                std::thread::yield_now();
                continue;
            }
            // Poll for `spin` after the last activity, and while a large
            // payload is in flight, to or from this rank: it crosses the
            // socket in many rounds (rendezvous handshakes, pieces), each a
            // wake-up of a CPU that halted meanwhile if the thread slept
            // (perf during one reader's 2 MiB remote reads: 87% of the
            // samples in the halt). Either way only while no thread waits
            // for a CPU. Side by side (alternating fresh jobs): one reader,
            // 2 ranks, OPEN+read median 1408 against 1736 µs at 2 MiB (4
            // jobs x 2 rounds) and 3.9 against 5.5 ms at 8 MiB; 4 daemons,
            // 4 readers, 3/4 remote, 2 MiB, local directory on ext4 with
            // 384 MiB to extract ahead: 2398 against 2167 MB/s (4 jobs x 3
            // rounds); read ahead (1 MiB runs) for 4 readers of 128 KiB
            // files: 939 against 868 MB/s (6 cold jobs). Small payloads are
            // one message, which one wake-up delivers: polling through those
            // beyond `spin` too (whenever anything was in flight) cost that
            // ext4 job 13% at 128 KiB (1119 against 1282 MB/s).
            if !self.spin.is_zero() && (now.duration_since(last_active) < self.spin || self.large_in_flight()) {
                self.set_polling(true);
                if !self.crowded(now) {
                    std::thread::yield_now();
                    continue;
                }
                if !cut_short {
                    cut_short = true;
                    self.counters.comm_spins_stopped.fetch_add(1, Relaxed);
                    if let Some(q) = self.spin_check.as_ref().filter(|_| log::log_enabled!(log::Level::Debug)) {
                        log::debug!("rank {}: polling stops: (runnable, polling) {:?}, {} CPUs", self.comm.rank, q.waiting(), q.cpus());
                    }
                }
            }
            self.set_polling(false);
            if let Some(w) = self.waiter.as_mut() {
                // Whatever ends the sleep (a command, a peer's message) is
                // seen at the top of the loop, which resets the nap.
                woke = Some(w.sleep(rx, w.bound(nap)));
                nap = (nap * 2).min(nap_cap(now.duration_since(last_active)));
                continue;
            }
            match rx.recv_timeout(nap) {
                Ok(c) => {
                    last_active = Instant::now();
                    if !self.command(c) {
                        return StopCause::Local;
                    }
                }
                Err(RecvTimeoutError::Timeout) => nap = (nap * 2).min(nap_cap(now.duration_since(last_active))),
                Err(RecvTimeoutError::Disconnected) => return StopCause::Orphaned,
            }
        }
    }

    /// A payload larger than [`LARGE_PAYLOAD`] crosses, to or from this
    /// rank (a fetch someone still waits for, or a reply being sent).
    fn large_in_flight(&self) -> bool {
        self.fetches.values().any(|f| !f.state.abandoned && f.parts.iter().map(|p| p.1).sum::<usize>() > LARGE_PAYLOAD)
            || self.sends.values().any(|s| s.buf.as_ref().is_some_and(|b| b.bytes().len() > LARGE_PAYLOAD))
    }

    /// Work that needs polling to progress: fetches someone waits for, and sends.
    fn busy(&self) -> bool {
        !self.sends.is_empty() || !self.meta_pending.is_empty() || self.fetches.values().any(|f| !f.state.abandoned)
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn start_fetch(&mut self, f: Fetch) {
        let Some(tag) = self.tags.alloc() else {
            let _ = f.reply.send(Err(FetchError::Busy));
            return;
        };
        let (mut posted, request) = post_receives(self.comm, f, tag, self.piece, self.pipeline);
        if let Some(request) = request {
            // SAFETY: `request` is boxed and kept with the fetch until the send completes.
            match unsafe { self.comm.isend(request.as_ptr(), request.len(), posted.pending.state.holder, TAG_REQUEST) } {
                Ok(r) => {
                    posted.reqs.push((r, None));
                    posted.pending._request = Some(request);
                }
                Err(e) => {
                    let p = &mut posted.pending;
                    log::warn!("rank {}: sending a request to rank {}: {e}", self.comm.rank, p.state.holder);
                    if let Some(reply) = p.reply.take() {
                        let _ = reply.send(Err(FetchError::Mpi(p.state.holder, e.0)));
                    }
                    p.direct = None;
                    p.state.abandoned = true;
                    p.state.fail();
                    p.state.request_done(false);
                }
            }
        }
        self.adopt(posted);
    }

    /// Takes over a posted fetch: tests its requests from now on.
    fn adopt(&mut self, p: Posted) {
        let tag = p.pending.state.tag;
        if p.reqs.is_empty() {
            self.free_tag(tag);
            return;
        }
        let id = self.id();
        for (r, piece) in p.reqs {
            self.table.push(r, piece.map_or(Slot::RequestSent { fetch: id }, |piece| Slot::Piece { fetch: id, piece }));
        }
        if !p.pending.state.abandoned {
            self.counters.remote_sent.fetch_add(1, Relaxed);
            if self.poster.is_some() && tag >= table::POSTER_FIRST_TAG {
                self.counters.remote_posted.fetch_add(1, Relaxed);
            }
        }
        self.fetches.insert(id, p.pending);
    }

    /// Keeps a request message until its send, made by another thread, completes.
    fn track_send(&mut self, s: SentRequest) {
        let id = self.id();
        self.table.push(s.request, Slot::Sent { send: id });
        let small: Box<[u8]> = s.msg;
        self.sends.insert(id, PendingSend { buf: None, _small: small, outstanding: 1 });
    }

    fn free_tag(&mut self, tag: i32) {
        match &self.poster {
            Some(p) if tag >= table::POSTER_FIRST_TAG => p.free_tag(tag),
            _ => self.tags.free(tag),
        }
    }

    /// One round of progress. Returns whether anything happened.
    fn poll(&mut self) -> Result<bool, StopCause> {
        let mut active = false;
        // Incoming messages of every kind, with one probe each: every probe
        // drives the transport's progress (system calls over TCP), so a
        // probe per tag cost an idle rank four times the work per nap.
        // Payload replies never show here: their receives are posted before
        // the request that asks for them is sent.
        // MPI_Iprobe looks for a message, then drives progress when it finds
        // none: a message that progress reads off the socket then waits in
        // the library, with no fd to announce it. So a round ends only at
        // the second probe in a row that finds nothing.
        let mut empty = 0;
        for _ in 0..PROBES_PER_POLL {
            let (src, tag, n) = match self.comm.iprobe_any() {
                Ok(Some(m)) => {
                    empty = 0;
                    m
                }
                Ok(None) if empty == 0 => {
                    empty = 1;
                    continue;
                }
                Ok(None) => break,
                Err(e) => {
                    log::error!("rank {}: MPI_Iprobe: {e}", self.comm.rank);
                    break;
                }
            };
            active = true;
            match tag {
                TAG_REQUEST => {
                    let mut b = [0u8; table::REQUEST_LEN];
                    match self.comm.recv_probed(&mut b, src, TAG_REQUEST) {
                        Ok(table::REQUEST_LEN) => self.serve(src, &b),
                        Ok(n) => log::warn!("rank {}: {n}-byte request from rank {src} ignored", self.comm.rank),
                        Err(e) => log::warn!("rank {}: receiving a request from rank {src}: {e}", self.comm.rank),
                    }
                }
                TAG_META_REQ => self.meta_request(src, n),
                TAG_META_REP => self.meta_reply(src, n),
                TAG_CTRL => {
                    let mut b = [0u8; 8];
                    if let Ok(8) = self.comm.recv_probed(&mut b, src, TAG_CTRL) {
                        let op = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        if op == CTRL_STOP {
                            log::info!("rank {}: rank {src} asks every rank to stop", self.comm.rank);
                            return Err(StopCause::Peer(src));
                        }
                    }
                }
                other => {
                    // A reply whose receive is gone (cannot happen while the
                    // fetch's tag stays reserved): received and dropped.
                    let mut b = vec![0u8; n.max(1)];
                    let _ = self.comm.recv_probed(&mut b, src, other);
                    log::warn!("rank {}: unexpected {n}-byte message with tag {other} from rank {src} dropped", self.comm.rank);
                }
            }
        }
        // Completions.
        if !self.table.is_empty() {
            self.done.clear();
            let mut done = std::mem::take(&mut self.done);
            if let Err(e) = self.comm.testsome(self.table.requests_mut(), &mut done) {
                log::error!("rank {}: MPI_Testsome: {e}", self.comm.rank);
            }
            if !done.is_empty() {
                active = true;
                let idx: Vec<usize> = done.iter().map(|d| d.index).collect();
                let slots = self.table.take(&idx);
                for (slot, d) in slots.into_iter().zip(done.iter()) {
                    self.completed(slot, d);
                }
            }
            self.done = done;
        }
        Ok(active)
    }

    /// Answers a peer's request for one payload.
    fn serve(&mut self, src: u32, b: &[u8; table::REQUEST_LEN]) {
        let (node_id, tag, stored_len, offset) = table::decode_request(b);
        let parts = table::plan(stored_len, self.piece, self.pipeline);
        let t = Instant::now();
        let buf = if node_id & (OUT_BIT | PART_BIT) == PART_BIT {
            self.source.partition_range(node_id & !PART_BIT, offset, stored_len)
        } else {
            let spare = self.spare.pop();
            self.source.payload(node_id, stored_len, spare)
        };
        log::debug!("rank {}: payload of node {node_id} ({stored_len} B) for rank {src} ready in {:?}", self.comm.rank, t.elapsed());
        if buf.is_none() {
            log::warn!("rank {}: rank {src} asked for node {node_id}, which this rank cannot serve", self.comm.rank);
            self.counters.errors.fetch_add(1, Relaxed);
        }
        let id = self.id();
        let mut outstanding = 0;
        let base: *const u8 = buf.as_ref().map_or(std::ptr::NonNull::<u8>::dangling().as_ptr() as *const u8, |b| b.bytes().as_ptr());
        for &(off, len) in &parts {
            let (ptr, len) = match &buf {
                // SAFETY: off + len <= stored_len == the buffer's length (checked by `payload`).
                Some(_) => (unsafe { base.add(off as usize) }, len),
                None => (base, 0), // empty pieces signal "cannot serve"
            };
            // SAFETY: the buffer moves into `sends` below and is dropped only
            // after every send of it completed.
            match unsafe { self.comm.isend(ptr, len, src, tag) } {
                Ok(r) => {
                    self.table.push(r, Slot::Sent { send: id });
                    outstanding += 1;
                }
                Err(e) => {
                    log::warn!("rank {}: replying to rank {src}: {e}", self.comm.rank);
                    break;
                }
            }
        }
        if buf.is_some() {
            self.counters.remote_served.fetch_add(1, Relaxed);
            self.counters.remote_bytes_out.fetch_add(stored_len, Relaxed);
        }
        if outstanding > 0 {
            self.sends.insert(id, PendingSend { buf, _small: Box::new([]), outstanding });
        }
    }

    fn completed(&mut self, slot: Slot, d: &Done) {
        match slot {
            Slot::Sent { send } => {
                if let Some(s) = self.sends.get_mut(&send) {
                    s.outstanding -= 1;
                    if s.outstanding == 0 {
                        if let Some(PendingSend { buf: Some(SendBuf::Heap(v)), .. }) = self.sends.remove(&send) {
                            // Keep a few small send buffers warm for the next replies.
                            if v.capacity() <= SPARE_MAX && self.spare.len() < SPARE_COUNT {
                                self.spare.push(v);
                            }
                        }
                    }
                }
            }
            Slot::Piece { fetch, piece } => {
                if let Some(f) = self.fetches.get_mut(&fetch) {
                    if d.error != 0 {
                        f.state.fail();
                    }
                    f.state.piece_done(piece, d.count);
                    f.arrived(piece);
                }
                self.finish_if_complete(fetch);
            }
            Slot::RequestSent { fetch } => {
                if let Some(f) = self.fetches.get_mut(&fetch) {
                    f.state.request_done(d.error == 0);
                }
                self.finish_if_complete(fetch);
            }
        }
    }

    fn finish_if_complete(&mut self, fetch: u64) {
        if !self.fetches.get(&fetch).is_some_and(|f| f.state.complete()) {
            return;
        }
        let Some(f) = self.fetches.remove(&fetch) else { return };
        self.free_tag(f.state.tag);
        if let Some(reply) = f.reply {
            let complete = f.hashed == f.parts.len();
            let res = f.state.result().and_then(|()| {
                if complete {
                    Ok((f.buf, if f.hashes { f.hasher.digest() } else { 0 }))
                } else {
                    Err(FetchError::Holder(f.state.holder))
                }
            });
            if let Ok((b, sum)) = &res {
                self.counters.remote_bytes_in.fetch_add(b.bytes().len() as u64, Relaxed);
                // (Never past the deadline: the waiting thread may have given up.)
                if let Some(d) = f.direct.as_ref().filter(|d| d.expected == *sum && Instant::now() < f.state.deadline) {
                    answer_directly(d, b);
                }
            }
            log::debug!(
                "rank {}: {} B from rank {} in {:?} ({} pieces)",
                self.comm.rank,
                f.state.bytes(),
                f.state.holder,
                f.started.elapsed(),
                f.parts.len()
            );
            let _ = reply.send(res);
        }
    }

    /// Answers fetches past their deadline; their receives stay posted.
    fn expire(&mut self, now: Instant) {
        self.meta_pending.retain(|_, (_, deadline)| *deadline > now);
        for f in self.fetches.values_mut() {
            if !f.state.abandoned && now >= f.state.deadline {
                f.state.abandoned = true;
                log::warn!("rank {}: rank {} did not answer within the deadline", self.comm.rank, f.state.holder);
                if let Some(reply) = f.reply.take() {
                    let _ = reply.send(Err(FetchError::Timeout(f.state.holder)));
                }
            }
        }
    }

    /// Shuts the communication down: tells the other ranks when the stop is
    /// ours, fails fetches in flight, lets sends finish (bounded), and meets
    /// every rank in a barrier (bounded) so no rank finalises while others
    /// still talk to it. Returns false if a bounded wait ran out.
    /// Returns whether every rank took part (the stop is clean), and the
    /// largest `drain_secs` of the ranks (0 when not every rank reached the
    /// barrier).
    ///
    /// `settled`, given at a stop that drains (the same on every rank):
    /// before anything else, this rank serves as usual until `settled`
    /// says its own work towards the drain is done (the checkpoint store's
    /// sums have reached their records, on whatever rank), then meets the
    /// other ranks in a barrier, still serving, so that no rank stops
    /// answering while another still sends it such work. Both waits are
    /// bounded ([`SETTLE_WAIT`]); a rank that gives up drains what it has.
    pub fn shutdown(&mut self, cause: StopCause, rx: &Receiver<Command>, drain_secs: i32, settled: Option<&dyn Fn() -> bool>) -> (bool, i32) {
        let me = self.comm.rank;
        if let Some(w) = &self.waiter {
            let [cmd, fd, timeout, idle] = w.tally();
            log::info!(
                "rank {me}: sleeps ended by a command {cmd}, by MPI's fds {fd} ({idle} of them with nothing to do), by the \
                 timeout {timeout}; timeouts that found work no fd announced: {}",
                w.missed_wakes()
            );
        }
        if cause == StopCause::Local {
            for r in (0..self.comm.size).filter(|&r| r != me) {
                let mut msg = Vec::with_capacity(8);
                msg.extend_from_slice(&CTRL_STOP.to_le_bytes());
                msg.extend_from_slice(&me.to_le_bytes());
                let small = msg.into_boxed_slice();
                let id = self.id();
                // SAFETY: `small` is boxed and kept in `sends` until the send completes.
                match unsafe { self.comm.isend(small.as_ptr(), small.len(), r, TAG_CTRL) } {
                    Ok(req) => {
                        self.table.push(req, Slot::Sent { send: id });
                        self.sends.insert(id, PendingSend { buf: None, _small: small, outstanding: 1 });
                    }
                    Err(e) => log::warn!("rank {me}: telling rank {r} to stop: {e}"),
                }
            }
        }
        if let Some(settled) = settled {
            self.settle(rx, settled);
        }
        // No server thread posts from here on (posts in progress end first):
        // every fetch posted is in the channel or adopted.
        if let Some(p) = &self.poster {
            p.close();
        }
        // Nobody gets an answer from here on.
        for f in self.fetches.values_mut() {
            if let Some(reply) = f.reply.take() {
                let _ = reply.send(Err(FetchError::ShuttingDown));
            }
            f.state.abandoned = true;
        }
        while let Ok(c) = rx.try_recv() {
            match c {
                Command::Fetch(f) => {
                    let _ = f.reply.send(Err(FetchError::ShuttingDown));
                }
                // Its receives are posted: adopted, to be cancelled below.
                Command::Posted(mut p) => {
                    if let Some(reply) = p.pending.reply.take() {
                        let _ = reply.send(Err(FetchError::ShuttingDown));
                    }
                    p.pending.direct = None;
                    p.pending.state.abandoned = true;
                    self.adopt(p);
                }
                Command::Sent(s) => self.track_send(s),
                Command::Meta(_) | Command::MetaReply { .. } | Command::Stop => {}
            }
        }
        self.meta_pending.clear();
        // Cancel posted receives; they still complete (as cancelled).
        let n = self.table.len();
        for i in 0..n {
            if matches!(self.table.slots()[i], Slot::Piece { .. }) {
                let mut r = self.table.requests_mut()[i];
                self.comm.cancel(&mut r);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.table.is_empty() && Instant::now() < deadline {
            let _ = self.drain_incoming();
            let _ = self.poll_completions_only();
            std::thread::sleep(Duration::from_micros(200));
        }
        let mut clean = self.table.is_empty();
        if !clean {
            log::warn!("rank {me}: {} MPI operations still pending at shutdown", self.table.len());
        }
        let comm = self.comm;
        let met = comm.barrier(Duration::from_secs(10), || {
            let _ = self.drain_incoming();
            let _ = self.poll_completions_only();
        });
        if !met {
            log::warn!("rank {me}: not every rank reached the shutdown barrier within 10 s");
            clean = false;
        }
        if !met {
            return (false, 0);
        }
        // Every rank passed the barrier, so every rank asks: the maximum
        // arrives at once (a timeout would abort the job).
        let slowest = comm.allreduce_max(drain_secs, Duration::from_secs(10), || {
            let _ = self.drain_incoming();
            let _ = self.poll_completions_only();
        });
        (clean, slowest.unwrap_or(0))
    }

    /// The first step of a stop that drains (see [`Self::shutdown`]).
    fn settle(&mut self, rx: &Receiver<Command>, settled: &dyn Fn() -> bool) {
        let me = self.comm.rank;
        let started = Instant::now();
        let mut nap = Duration::from_micros(50);
        while !settled() {
            if started.elapsed() >= SETTLE_WAIT {
                log::warn!("rank {me}: the checkpoint store's sums did not settle within {SETTLE_WAIT:?}; stopping anyway");
                break;
            }
            if self.serve_round(rx) {
                nap = Duration::from_micros(50);
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(2));
            }
        }
        let comm = self.comm;
        if !comm.barrier(SETTLE_WAIT, || {
            self.serve_round(rx);
        }) {
            log::warn!("rank {me}: not every rank settled its sums within {SETTLE_WAIT:?}");
        }
        log::info!("rank {me}: settled for the drain in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
    }

    /// One round of the usual service while stopping: commands (a second
    /// stop is ignored) and incoming messages. Returns whether anything
    /// happened.
    fn serve_round(&mut self, rx: &Receiver<Command>) -> bool {
        let mut active = false;
        while let Ok(c) = rx.try_recv() {
            active = true;
            let _ = self.command(c);
        }
        // A peer's stop (CTRL_STOP) ends a round early; this rank stops already.
        active | self.poll().unwrap_or(true)
    }

    /// Receives and drops requests and control messages (used when stopping).
    fn drain_incoming(&mut self) -> bool {
        let mut any = false;
        for tag in [TAG_REQUEST, TAG_CTRL, TAG_META_REQ, TAG_META_REP] {
            while let Ok(Some((src, n))) = self.comm.iprobe(tag) {
                let mut b = vec![0u8; n.max(1)];
                let _ = self.comm.recv_probed(&mut b, src, tag);
                any = true;
            }
        }
        any
    }

    fn poll_completions_only(&mut self) -> bool {
        if self.table.is_empty() {
            return false;
        }
        let mut done = Vec::new();
        let _ = self.comm.testsome(self.table.requests_mut(), &mut done);
        let idx: Vec<usize> = done.iter().map(|d| d.index).collect();
        let slots = self.table.take(&idx);
        for (slot, d) in slots.into_iter().zip(done.iter()) {
            self.completed(slot, d);
        }
        !done.is_empty()
    }
}

