//! Request bookkeeping of the communication thread, free of MPI calls so it
//! can be unit tested: reply-tag allocation, splitting payloads into pieces,
//! the table of outstanding nonblocking operations, and the per-fetch state
//! that turns piece completions into one result.

use std::collections::HashSet;
use std::time::Instant;

/// First tag used for replies; lower tags carry requests and control.
pub const FIRST_REPLY_TAG: i32 = 16;
/// Tags stay below the MPI standard's guaranteed minimum `MPI_TAG_UB` (32767).
pub const TAG_LIMIT: i32 = 32767;
/// Reply tags from here up belong to fetches posted by server threads
/// ([`super::post`]); those below, to the communication thread's own.
pub const POSTER_FIRST_TAG: i32 = 16384;

/// Reply tags: each fetch in flight owns one until all its pieces completed,
/// so a late reply can never land in another fetch's buffer.
#[derive(Debug)]
pub struct Tags {
    first: i32,
    limit: i32,
    next: i32,
    in_use: HashSet<i32>,
}

impl Default for Tags {
    fn default() -> Self {
        Tags::span(FIRST_REPLY_TAG, TAG_LIMIT)
    }
}

impl Tags {
    /// The tags `first..limit`.
    pub fn span(first: i32, limit: i32) -> Tags {
        Tags { first, limit, next: first, in_use: HashSet::new() }
    }

    /// A free tag, or `None` when every tag is taken.
    pub fn alloc(&mut self) -> Option<i32> {
        let span = (self.limit - self.first).max(0) as usize;
        for _ in 0..span {
            let t = self.next;
            self.next = if t + 1 >= self.limit { self.first } else { t + 1 };
            if self.in_use.insert(t) {
                return Some(t);
            }
        }
        None
    }

    pub fn free(&mut self, t: i32) {
        self.in_use.remove(&t);
    }

    pub fn in_use(&self) -> usize {
        self.in_use.len()
    }
}

/// Splits `len` bytes into consecutive pieces of at most `piece` bytes
/// (offset, length). An empty payload is one empty piece.
pub fn pieces(len: u64, piece: u64) -> Vec<(u64, usize)> {
    let piece = piece.clamp(1, i32::MAX as u64);
    if len == 0 {
        return vec![(0, 0)];
    }
    (0..len.div_ceil(piece)).map(|i| (i * piece, (len - i * piece).min(piece) as usize)).collect()
}

/// The pieces a payload of `len` bytes crosses in: payloads of at least
/// twice `pipeline` bytes cross in pieces of `pipeline` bytes (so the
/// requester can checksum each piece while the next ones are on the wire;
/// 0 disables this), and no piece exceeds `max_piece`. Both sides compute it
/// from the stored length and the job-wide settings alone.
pub fn plan(len: u64, max_piece: u64, pipeline: u64) -> Vec<(u64, usize)> {
    let piece = if pipeline > 0 && len >= 2 * pipeline { pipeline.min(max_piece) } else { max_piece };
    pieces(len, piece)
}

/// What an outstanding MPI request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Piece `piece` of the reply to fetch `fetch`.
    Piece { fetch: u64, piece: usize },
    /// The request message of fetch `fetch`.
    RequestSent { fetch: u64 },
    /// A message sent for a peer (reply piece or control); `send` names its buffer.
    Sent { send: u64 },
}

/// Outstanding nonblocking requests of type `R` (an MPI_Request) and what
/// each belongs to, kept as two parallel arrays so the request array can be
/// passed to MPI_Testsome as is.
#[derive(Debug)]
pub struct ReqTable<R> {
    reqs: Vec<R>,
    slots: Vec<Slot>,
}

impl<R: Copy> Default for ReqTable<R> {
    fn default() -> Self {
        ReqTable { reqs: Vec::new(), slots: Vec::new() }
    }
}

impl<R: Copy> ReqTable<R> {
    pub fn push(&mut self, r: R, s: Slot) {
        self.reqs.push(r);
        self.slots.push(s);
    }
    pub fn len(&self) -> usize {
        self.reqs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }
    pub fn requests_mut(&mut self) -> &mut [R] {
        &mut self.reqs
    }
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }
    /// Removes the entries at `indices` (as MPI_Testsome reports them, any
    /// order, no duplicates) and returns their slots in the order given.
    pub fn take(&mut self, indices: &[usize]) -> Vec<Slot> {
        let mut done = vec![false; self.reqs.len()];
        let mut out = Vec::with_capacity(indices.len());
        for &i in indices {
            if let Some(d) = done.get_mut(i) {
                if !*d {
                    *d = true;
                    out.push(self.slots[i]);
                }
            }
        }
        let mut k = 0;
        self.reqs.retain(|_| {
            k += 1;
            !done[k - 1]
        });
        let mut k = 0;
        self.slots.retain(|_| {
            k += 1;
            !done[k - 1]
        });
        out
    }
}

/// Why a fetch failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("rank {0} did not answer in time")]
    Timeout(u32),
    #[error("rank {0} could not serve the file")]
    Holder(u32),
    #[error("MPI error {1} talking to rank {0}")]
    Mpi(u32, i32),
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("too many remote reads in flight")]
    Busy,
    #[error("receive buffer of {0} bytes for a payload of {1}")]
    BadBuffer(usize, u64),
}

/// The progress of one fetch: its pieces and its request message.
#[derive(Debug)]
pub struct FetchState {
    pub holder: u32,
    pub tag: i32,
    pub deadline: Instant,
    expected: Vec<usize>,
    outstanding: usize,
    failed: bool,
    /// The requester has been answered (timeout); the buffer is kept until
    /// the posted receives complete, then dropped.
    pub abandoned: bool,
}

impl FetchState {
    /// A fetch whose reply arrives as pieces of the `expected` lengths.
    pub fn new(holder: u32, tag: i32, deadline: Instant, expected: Vec<usize>) -> FetchState {
        let outstanding = expected.len() + 1;
        FetchState { holder, tag, deadline, expected, outstanding, failed: false, abandoned: false }
    }
    /// Piece `i` completed with `count` bytes. The holder signals an error
    /// by sending empty pieces; a short piece is a failure too.
    pub fn piece_done(&mut self, i: usize, count: usize) {
        if self.expected.get(i) != Some(&count) {
            self.failed = true;
        }
        self.outstanding = self.outstanding.saturating_sub(1);
    }
    /// The request message completed (or failed to send).
    pub fn request_done(&mut self, ok: bool) {
        self.failed |= !ok;
        self.outstanding = self.outstanding.saturating_sub(1);
    }
    /// Bytes expected in all.
    pub fn bytes(&self) -> usize {
        self.expected.iter().sum()
    }
    pub fn fail(&mut self) {
        self.failed = true;
    }
    /// Every posted operation of this fetch has completed.
    pub fn complete(&self) -> bool {
        self.outstanding == 0
    }
    pub fn result(&self) -> Result<(), FetchError> {
        if self.failed {
            Err(FetchError::Holder(self.holder))
        } else {
            Ok(())
        }
    }
}

/// The request message of a fetch (16 bytes, little-endian):
/// `0..4 node id | 4..8 reply tag | 8..16 stored length`.
/// Length of a TAG_REQUEST message (see the protocol in [`super`]).
pub const REQUEST_LEN: usize = 24;

/// A request for `stored_len` bytes of `node_id` (a dataset file, an output
/// with [`super::OUT_BIT`], or a partition range with [`super::PART_BIT`]
/// starting at `offset`; 0 otherwise), answered on `tag`.
pub fn encode_request(node_id: u32, tag: i32, stored_len: u64, offset: u64) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
    b[..4].copy_from_slice(&node_id.to_le_bytes());
    b[4..8].copy_from_slice(&tag.to_le_bytes());
    b[8..16].copy_from_slice(&stored_len.to_le_bytes());
    b[16..24].copy_from_slice(&offset.to_le_bytes());
    b
}

/// (node id, reply tag, stored length, offset) of a request.
pub fn decode_request(b: &[u8; REQUEST_LEN]) -> (u32, i32, u64, u64) {
    let mut n = [0u8; 4];
    let mut t = [0u8; 4];
    let mut l = [0u8; 8];
    let mut o = [0u8; 8];
    n.copy_from_slice(&b[..4]);
    t.copy_from_slice(&b[4..8]);
    l.copy_from_slice(&b[8..16]);
    o.copy_from_slice(&b[16..24]);
    (u32::from_le_bytes(n), i32::from_le_bytes(t), u64::from_le_bytes(l), u64::from_le_bytes(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_wrap_and_skip_busy_ones() {
        let mut t = Tags::default();
        let a = t.alloc().unwrap();
        assert_eq!(a, FIRST_REPLY_TAG);
        let all: Vec<i32> = (1..(TAG_LIMIT - FIRST_REPLY_TAG)).map(|_| t.alloc().unwrap()).collect();
        assert_eq!(all.last(), Some(&(TAG_LIMIT - 1)));
        assert_eq!(t.alloc(), None, "exhausted");
        t.free(FIRST_REPLY_TAG + 5);
        assert_eq!(t.alloc(), Some(FIRST_REPLY_TAG + 5));
        t.free(a);
        t.free(FIRST_REPLY_TAG + 7);
        assert_eq!(t.alloc(), Some(FIRST_REPLY_TAG + 7), "continues from where it was, skipping busy tags");
        assert_eq!(t.in_use(), (TAG_LIMIT - FIRST_REPLY_TAG - 1) as usize);
    }

    #[test]
    fn spans_of_tags_never_overlap() {
        let mut own = Tags::span(FIRST_REPLY_TAG, POSTER_FIRST_TAG);
        let mut posted = Tags::span(POSTER_FIRST_TAG, TAG_LIMIT);
        let a: Vec<i32> = std::iter::from_fn(|| own.alloc()).collect();
        let b: Vec<i32> = std::iter::from_fn(|| posted.alloc()).collect();
        assert_eq!(a.len(), (POSTER_FIRST_TAG - FIRST_REPLY_TAG) as usize);
        assert_eq!(b.len(), (TAG_LIMIT - POSTER_FIRST_TAG) as usize);
        assert!(a.iter().all(|t| (FIRST_REPLY_TAG..POSTER_FIRST_TAG).contains(t)));
        assert!(b.iter().all(|t| (POSTER_FIRST_TAG..TAG_LIMIT).contains(t)));
        posted.free(TAG_LIMIT - 1);
        assert_eq!(posted.alloc(), Some(TAG_LIMIT - 1), "a freed tag of the span comes back");
    }

    #[test]
    fn piece_split() {
        assert_eq!(pieces(0, 10), vec![(0, 0)]);
        assert_eq!(pieces(10, 10), vec![(0, 10)]);
        assert_eq!(pieces(25, 10), vec![(0, 10), (10, 10), (20, 5)]);
        let big = pieces(5 << 30, 1 << 30);
        assert_eq!(big.len(), 5);
        assert!(big.iter().all(|p| p.1 == 1 << 30));
        assert_eq!(pieces(3, u64::MAX), vec![(0, 3)], "pieces never exceed an MPI int count");
    }

    #[test]
    fn plan_pipelines_large_payloads() {
        assert_eq!(plan(100, 1 << 30, 1 << 20), vec![(0, 100)]);
        assert_eq!(plan((2 << 20) - 1, 1 << 30, 1 << 20).len(), 1);
        assert_eq!(plan(5 << 20, 1 << 30, 1 << 20).len(), 5);
        assert_eq!(plan(5 << 20, 64 << 10, 1 << 20).len(), 80, "a smaller --mpi-piece wins");
        assert_eq!(plan(5 << 20, 1 << 30, 0).len(), 1, "pipelining off");
    }

    #[test]
    fn table_removes_completed_entries() {
        let mut t: ReqTable<i32> = ReqTable::default();
        for i in 0..5 {
            t.push(100 + i, Slot::Sent { send: i as u64 });
        }
        let got = t.take(&[3, 0, 3]);
        assert_eq!(got, vec![Slot::Sent { send: 3 }, Slot::Sent { send: 0 }]);
        assert_eq!(t.requests_mut(), &[101, 102, 104]);
        assert_eq!(t.slots()[2], Slot::Sent { send: 4 });
        assert_eq!(t.take(&[9]), vec![]);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn fetch_state_accounts_pieces_and_errors() {
        let d = Instant::now();
        let mut f = FetchState::new(2, 20, d, vec![10, 10, 5]);
        f.request_done(true);
        f.piece_done(1, 10);
        f.piece_done(0, 10);
        assert!(!f.complete());
        f.piece_done(2, 5);
        assert!(f.complete());
        assert_eq!(f.result(), Ok(()));
        let mut g = FetchState::new(3, 21, d, vec![10]);
        g.piece_done(0, 0); // the holder's error signal
        g.request_done(true);
        assert!(g.complete());
        assert_eq!(g.result(), Err(FetchError::Holder(3)));
    }

    #[test]
    fn request_message_round_trip() {
        let b = encode_request(0xdead_beef, 31000, 5 << 30, 7 << 33);
        assert_eq!(decode_request(&b), (0xdead_beef, 31000, 5 << 30, 7 << 33));
    }
}
