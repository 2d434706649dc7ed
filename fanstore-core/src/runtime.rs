//! Where a job's daemons publish themselves, and the node state file.
//!
//! A runtime directory (per user and job, mode 0700) holds, per daemon rank k:
//! `node-k.sock` (the unix socket) and `node-k.state` (a [`NodeState`]).
//! The index lives in shared memory at the path the state names.
//!
//! ```text
//! node state file (written whole, then renamed into place)
//!   0..8    magic "FANSTND\0"        8..12   version (1)
//!  12..16   rank                     16..20  rank count
//!  20..24   status (0 loading, 1 ready, 2 stopping, 3 failed)
//!  24..32   dataset id               32..40  daemon pid
//!  40..44   partition count P        44..48  flags (bit 0: writes enabled,
//!                                            bit 1: outputs go through the
//!                                            checkpoint store, FLAG_DEDUP;
//!                                            bit 2: the daemon keeps copies
//!                                            of dataset files, FLAG_COPIES)
//!  48..52   local dir length         52..56  index path length
//!  56..60   hostname length          60..64  mount length
//!  64..     local dir, index path, hostname, mount (raw bytes, in that order)
//!  then     ceil(P/8) bytes: bit p set when partition p is on this node's local dir
//!  last 8   xxh3 of every byte before it
//! ```

use crate::checksum::xxh3;

/// NodeState flag: the daemon commits outputs of `--dedup-min` bytes and
/// more into its checkpoint store (informational: clients write every
/// output into an unnamed local file either way).
pub const FLAG_DEDUP: u32 = 1 << 1;

/// NodeState flag: the daemon keeps copies of dataset files (`--cache-mem`
/// above 0), so a client that decoded a compressed file itself tells it so
/// (`WARM`) and later opens use the node's copy; without the flag the hint
/// would only cost a message per read.
pub const FLAG_COPIES: u32 = 1 << 2;
use crate::format;
use crate::le::*;
use std::path::{Path, PathBuf};

pub const STATE_MAGIC: [u8; 8] = *b"FANSTND\0";
pub const STATE_VERSION: u32 = 1;
format::layout! {
    format::MAGIC_LEN;
    S_VERSION: 4, S_RANK: 4, S_NRANKS: 4, S_STATUS: 4, S_DATASET: 8, S_PID: 8, S_PARTS: 4, S_FLAGS: 4,
    S_LENS: 16 =>
    S_FIXED_LEN
}

format::coded_enum! {
    /// A daemon's lifecycle state as published in its state file.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Status: u32, from_u32 {
        Loading = 0,
        Ready = 1,
        Stopping = 2,
        Failed = 3,
    }
}

/// What one daemon publishes for its clients and the control CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub rank: u32,
    pub nranks: u32,
    pub status: Status,
    pub dataset_id: u64,
    pub pid: u64,
    pub flags: u32,
    pub local_dir: Vec<u8>,
    pub index_path: Vec<u8>,
    pub hostname: Vec<u8>,
    pub mount: Vec<u8>,
    /// One entry per partition: true when this node holds it locally.
    pub local_partitions: Vec<bool>,
}

impl NodeState {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; S_FIXED_LEN];
        b[..8].copy_from_slice(&STATE_MAGIC);
        put_u32(&mut b, S_VERSION, STATE_VERSION);
        put_u32(&mut b, S_RANK, self.rank);
        put_u32(&mut b, S_NRANKS, self.nranks);
        put_u32(&mut b, S_STATUS, self.status as u32);
        put_u64(&mut b, S_DATASET, self.dataset_id);
        put_u64(&mut b, S_PID, self.pid);
        put_u32(&mut b, S_PARTS, self.local_partitions.len() as u32);
        put_u32(&mut b, S_FLAGS, self.flags);
        for (i, s) in [&self.local_dir, &self.index_path, &self.hostname, &self.mount].iter().enumerate() {
            put_u32(&mut b, S_LENS + 4 * i, s.len() as u32);
        }
        for s in [&self.local_dir, &self.index_path, &self.hostname, &self.mount] {
            b.extend_from_slice(s);
        }
        let mut bits = vec![0u8; self.local_partitions.len().div_ceil(8)];
        for (p, &held) in self.local_partitions.iter().enumerate() {
            if held {
                bits[p / 8] |= 1 << (p % 8);
            }
        }
        b.extend_from_slice(&bits);
        let sum = xxh3(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    /// Decodes a state file's bytes; `None` if they are not a whole, valid state.
    pub fn decode(b: &[u8]) -> Option<NodeState> {
        if b.len() < S_FIXED_LEN + 8 || b[..8] != STATE_MAGIC || u32_at(b, S_VERSION) != STATE_VERSION {
            return None;
        }
        let body = &b[..b.len() - 8];
        if xxh3(body) != u64_at(b, b.len() - 8) {
            return None;
        }
        let parts = u32_at(b, S_PARTS) as usize;
        let mut off = S_FIXED_LEN;
        let mut strs: [Vec<u8>; 4] = Default::default();
        for (i, s) in strs.iter_mut().enumerate() {
            let l = u32_at(b, S_LENS + 4 * i) as usize;
            *s = body.get(off..off.checked_add(l)?)?.to_vec();
            off += l;
        }
        let bits = body.get(off..off.checked_add(parts.div_ceil(8))?)?;
        if off + bits.len() != body.len() {
            return None;
        }
        let [local_dir, index_path, hostname, mount] = strs;
        Some(NodeState {
            rank: u32_at(b, S_RANK),
            nranks: u32_at(b, S_NRANKS),
            status: Status::from_u32(u32_at(b, S_STATUS))?,
            dataset_id: u64_at(b, S_DATASET),
            pid: u64_at(b, S_PID),
            flags: u32_at(b, S_FLAGS),
            local_dir,
            index_path,
            hostname,
            mount,
            local_partitions: (0..parts).map(|p| bits[p / 8] & (1 << (p % 8)) != 0).collect(),
        })
    }

    /// Writes the state to `path` atomically (temp file, then rename).
    pub fn publish(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("state.tmp");
        std::fs::write(&tmp, self.encode())?;
        std::fs::rename(&tmp, path)
    }

    pub fn read(path: &Path) -> std::io::Result<NodeState> {
        let b = std::fs::read(path)?;
        NodeState::decode(&b).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: not a valid node state", path.display()))
        })
    }
}

/// The job identifier: `FANSTORE_JOB_ID`, else the batch system's job id, else `local`.
pub fn job_id() -> String {
    for var in ["FANSTORE_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "COBALT_JOBID"] {
        if let Ok(v) = std::env::var(var) {
            let clean: String = v.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
            if !clean.is_empty() {
                return clean;
            }
        }
    }
    "local".to_string()
}

/// The runtime directory: `FANSTORE_RUNTIME_DIR`, else `$TMPDIR/fanstore-<uid>-<job>` (or under /tmp).
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FANSTORE_RUNTIME_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("TMPDIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    base.join(format!("fanstore-{uid}-{}", job_id()))
}

pub fn socket_path(runtime: &Path, rank: u32) -> PathBuf {
    runtime.join(format!("node-{rank}.sock"))
}

pub fn state_path(runtime: &Path, rank: u32) -> PathBuf {
    runtime.join(format!("node-{rank}.state"))
}

/// The shared-memory path of a rank's index for this user and job.
pub fn index_shm_path(runtime: &Path, rank: u32) -> PathBuf {
    PathBuf::from(format!("{}-r{rank}.index", shm_stem(runtime)))
}

/// The shared-memory file where the daemons of this job on one host count
/// their communication threads that poll (every rank of the host maps it).
pub fn polling_board_path(runtime: &Path) -> PathBuf {
    PathBuf::from(format!("{}.polling", shm_stem(runtime)))
}

/// `/dev/shm/fanstore-<uid>-<job>-<hash of the runtime dir>`.
fn shm_stem(runtime: &Path) -> String {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let tag = xxh3(runtime.as_os_str().as_encoded_bytes()) & 0xffff_ffff;
    format!("/dev/shm/fanstore-{uid}-{}-{tag:08x}", job_id())
}

/// Where the daemon extracts file `node_id` in its local directory.
/// Writes into `out` (no allocation) and returns the length.
pub fn local_file_path_into(local_dir: &[u8], node_id: u32, out: &mut [u8]) -> Option<usize> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 10];
    let num = decimal(node_id, &mut digits);
    let bucket = (node_id & 0xff) as usize;
    let need = local_dir.len() + 4 + 3 + num.len() + 1;
    if need > out.len() {
        return None;
    }
    let mut i = 0;
    for part in [local_dir, b"/in/", &[HEX[bucket >> 4], HEX[bucket & 15], b'/'], num] {
        out[i..i + part.len()].copy_from_slice(part);
        i += part.len();
    }
    out[i] = 0;
    Some(i)
}

/// [`decimal`] of a u64.
pub fn decimal_u64(n: u64, buf: &mut [u8; 20]) -> &[u8] {
    digits_at_end(n, buf)
}

/// The decimal digits of `n`, written at the end of `buf` (no allocation:
/// usable inside the preload library's hooks).
pub fn decimal(n: u32, buf: &mut [u8; 10]) -> &[u8] {
    digits_at_end(u64::from(n), buf)
}

/// `n`'s decimal digits at the end of `buf` (long enough for them).
fn digits_at_end(mut n: u64, buf: &mut [u8]) -> &[u8] {
    let mut d = buf.len();
    loop {
        d -= 1;
        buf[d] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[d..]
}

/// `/proc/self/fd/<fd>`, NUL-terminated, in a stack buffer (no allocation:
/// usable inside the preload library's hooks).
pub fn proc_fd_path(fd: u32) -> [u8; 25] {
    let mut path = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0";
    let mut digits = [0u8; 10];
    let num = decimal(fd, &mut digits);
    path[14..14 + num.len()].copy_from_slice(num);
    path
}

/// [`local_file_path_into`] as a `PathBuf`.
pub fn local_file_path(local_dir: &Path, node_id: u32) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let ld = local_dir.as_os_str().as_bytes();
    let mut buf = vec![0u8; ld.len() + 32];
    let n = local_file_path_into(ld, node_id, &mut buf).unwrap_or(0);
    PathBuf::from(std::ffi::OsStr::from_bytes(&buf[..n]))
}

/// The ranks whose state files exist in `runtime`, in rank order.
pub fn list_states(runtime: &Path) -> Vec<NodeState> {
    let mut v: Vec<NodeState> = std::fs::read_dir(runtime)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".state"))
        .filter_map(|e| NodeState::read(&e.path()).ok())
        .collect();
    v.sort_by_key(|s| s.rank);
    v
}

/// This host's name.
pub fn hostname() -> Vec<u8> {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its full length; gethostname NUL-terminates
    // within it or truncates, and we stop at the first NUL.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return b"localhost".to_vec();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    buf[..n].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets and lengths that `layout!` declares are those the
    /// format has always had.
    #[test]
    fn key_offsets_keep_their_values() {
        assert_eq!((S_VERSION, S_DATASET, S_LENS, S_FIXED_LEN), (8, 24, 48, 64));
    }

    #[test]
    fn state_round_trip_and_corruption() {
        let s = NodeState {
            rank: 2,
            nranks: 4,
            status: Status::Ready,
            dataset_id: 99,
            pid: 1234,
            flags: 0,
            local_dir: b"/tmp/l2".to_vec(),
            index_path: b"/dev/shm/x".to_vec(),
            hostname: b"n1".to_vec(),
            mount: b"/fanstore".to_vec(),
            local_partitions: vec![true, false, true, false, false, false, false, false, true],
        };
        let b = s.encode();
        assert_eq!(NodeState::decode(&b).unwrap(), s);
        for i in [0, 13, 30, b.len() - 12, b.len() - 1] {
            let mut c = b.clone();
            c[i] ^= 1;
            assert!(NodeState::decode(&c).is_none(), "byte {i}");
        }
        assert!(NodeState::decode(&b[..b.len() - 1]).is_none());
    }

    #[test]
    fn decimals() {
        let mut b = [0u8; 10];
        assert_eq!(decimal(0, &mut b), b"0");
        assert_eq!(decimal(4_294_967_295, &mut b), b"4294967295");
        assert_eq!(&proc_fd_path(4_294_967_295)[..], b"/proc/self/fd/4294967295\0");
        assert!(proc_fd_path(7).starts_with(b"/proc/self/fd/7\0"));
    }

    #[test]
    fn local_paths() {
        assert_eq!(local_file_path(Path::new("/ssd/x"), 258), PathBuf::from("/ssd/x/in/02/258"));
        assert_eq!(local_file_path(Path::new("/l"), 0), PathBuf::from("/l/in/00/0"));
        let mut small = [0u8; 8];
        assert!(local_file_path_into(b"/long/local/dir", 1, &mut small).is_none());
    }
}
