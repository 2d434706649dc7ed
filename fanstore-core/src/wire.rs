//! Client <-> daemon messages over a `SOCK_SEQPACKET` unix socket: one
//! message per datagram, file contents travel as an attached fd (SCM_RIGHTS).
//!
//! ```text
//! request                                reply
//!  0..4   magic "FSRQ"                    0..4   magic "FSRP"
//!  4..6   version (1)                     4..6   version (1)
//!  6..8   op                              6..8   op (echoed)
//!  8..16  request id                      8..16  request id (echoed)
//! 16..24  arg0                           16..20  errno (0 = success), i32
//! 24..32  arg1                           20..24  flags (bit 0: an fd is attached)
//! 32..36  payload length                 24..32  value
//! 36..40  reserved, zero                 32..36  payload length
//! 40..    payload                        36..40  reserved, zero
//!                                        40..    payload
//! ```
//!
//! Ops: `PING`; `OPEN` (arg0 node id, arg1 dataset id; reply: an fd whose
//! bytes are the file's); `STATUS` (reply payload: this rank's status text);
//! `STOP` (shut the whole job down). All integers little-endian.
//!
//! Output (write path) ops; `path` payloads are normalised paths relative
//! to the mount root, without a leading '/':
//!
//! ```text
//! COMMIT    payload path, fd attached (the output file: an unnamed local
//!           file or a memfd), arg0 COMMIT_EXCL, COMMIT_SOLE, COMMIT_LATE, COMMIT_MADE_AHEAD bits,
//!           arg1 mode bits; reply errno once the owner rank registered it
//! OUT_STAT  payload path, arg0 STAT_NOFOLLOW, STAT_PARENT bits; reply value = size,
//!           payload = StatAnswer (OutRecord, 56 bytes, first); with STAT_PARENT an
//!           ENOENT reply carries the errno of the name's directory (and,
//!           with STAT_NEW_FILE, may carry a file made ahead for the output)
//! OUT_OPEN  payload path, arg0 OUT_OPEN_TO_WRITE; reply: an fd with the
//!           output's bytes
//! OUT_LIST  payload directory path, arg0 = entries to skip; reply value =
//!           entries in this reply (0: end), payload = entries, each
//!           0 kind (1 file, 2 dir, 3 symlink, 4 fifo, 5 socket) | 1..3 name length u16 | name
//! MKDIR     payload path, arg1 mode; reply errno (EEXIST ...)
//! MKNOD     payload path, arg1 st_mode (S_IFIFO, S_IFSOCK, S_IFREG, S_IFCHR,
//!           S_IFBLK), arg0 MKNOD_BIND | rdev << MKNOD_RDEV_SHIFT; reply value = output id, payload = the real
//!           object's path on this node (see op::MKNOD)
//! RMDIR     payload path; reply errno (ENOTEMPTY, ENOTDIR ...)
//! UNLINK    payload path; reply errno (EISDIR ...)
//! RENAME    payload from NUL to; reply errno
//! SYNC      arg0 1: copy the output bytes this rank holds to --persist,
//!           arg0 2: write the records this rank owns (those whose bytes are
//!           there); reply value = count (EINVAL without --persist)
//! CKPT      a checkpoint query answered from this rank's checkpoint store
//!           (`fanstore ckpt`, [`ckpt::Query`]): arg0 kind (1 ls, 2 log,
//!           3 owners, 4 diff, 5 du, 6 verify, 7 match), arg1 bit 0 JSON,
//!           payload paths NUL-separated (match: its keys in a memfd
//!           attached); reply: an fd (memfd) holding the report text, value 1 when
//!           verify found damage; ENOENT when this store has no such
//!           checkpoint, ENOTSUP when the rank has no store
//! SETATTR   payload path, arg0 SETATTR_MODE (arg1 = permission bits) or
//!           SETATTR_MTIME (arg1 = mtime ns, i64); reply errno (ENOENT,
//!           EROFS for an input)
//!
//! WATCH_*   namespace events of outputs, ops 40-45: see crate::watchev
//! CKPT_PUT  payload path, memfd attached (a parts file: glue, unit references,
//!           new unit bytes), arg0 COMMIT_EXCL, arg1 mode bits; reply value =
//!           unit count and a memfd of their blake3s (see op::CKPT_PUT)
//!
//! OutRecord  0..8 size | 8..12 mode | 12..16 holder rank | 16..24 mtime ns
//!           (i64) | 24..32 output id | 32..40 xxh3 of the bytes | 40..48 atime
//!           | 48..56 ctime | 56..60 uid | 60..64 gid | 64..72 inode base
//!           | 72..76 link count (0: 1) | 76..80 zero
//! ```
//!
//! Who asks: the daemon takes a connection's caller from the socket
//! (SO_PEERCRED: effective uid and gid, and the process's groups), so a
//! request carries no credentials; the library opens a new connection
//! when its effective ids change (a program that drops privileges).

use crate::le::*;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

pub const REQ_MAGIC: [u8; 4] = *b"FSRQ";
pub const REP_MAGIC: [u8; 4] = *b"FSRP";
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 40;
/// Largest message either side sends.
pub const MAX_MESSAGE: usize = 64 * 1024;

pub mod op {
    pub const PING: u16 = 1;
    pub const OPEN: u16 = 2;
    pub const STATUS: u16 = 3;
    pub const STOP: u16 = 4;
    pub const COMMIT: u16 = 5;
    pub const OUT_STAT: u16 = 6;
    pub const OUT_OPEN: u16 = 7;
    pub const OUT_LIST: u16 = 8;
    pub const MKDIR: u16 = 9;
    pub const RMDIR: u16 = 10;
    pub const UNLINK: u16 = 11;
    pub const RENAME: u16 = 12;
    pub const SYNC: u16 = 13;
    pub const CKPT: u16 = 14;
    pub const SETATTR: u16 = 15;
    /// Payload `link path NUL target`: creates an output symlink (EEXIST if
    /// the name exists).
    pub const SYMLINK: u16 = 16;
    /// One-way (the daemon sends no reply): node ids of dataset files the
    /// client has just decoded itself from a local partition copy, as
    /// little-endian u32s in the payload (empty payload: the one id in
    /// arg0; arg1 = dataset id); the daemon makes their node copies in the
    /// background (within `--cache-mem`), so later opens on the node are
    /// plain opens. Dropped when the daemon is busy. See [`warm_ids`].
    pub const WARM: u16 = 17;
    /// Payload `from NUL to`: a hard link `to` of output `from` (its last
    /// component not followed); EEXIST, EPERM for a directory or symlink.
    pub const LINK: u16 = 19;
    /// A special file: payload path, arg1 its st_mode (S_IFIFO, S_IFSOCK or
    /// S_IFREG plus permission bits, the umask applied by the client), arg0
    /// [`super::MKNOD_BIND`] for the name of a socket the client binds
    /// itself. The daemon makes the real object (a FIFO, an unbound socket
    /// inode, an empty file) at `<local dir>/out/<id>`, named by its output
    /// id so that a rename leaves it in place, and registers the record
    /// held by its rank (EEXIST if the name exists). Reply value = the id,
    /// payload = the real object's absolute path.
    pub const MKNOD: u16 = 18;
    /// Namespace events (`fanstore watch`, inotify): see [`crate::watchev`].
    pub const WATCH_ADD: u16 = 40;
    pub const WATCH_RM: u16 = 41;
    pub const WATCH_SINK: u16 = 42;
    pub const WATCH_KERNEL: u16 = 43;
    pub const WATCH_EVENT: u16 = 44;
    pub const WATCH_INFO: u16 = 45;
    /// A checkpoint from parts (the `fanstore` Python package): payload
    /// path, arg0 [`super::COMMIT_EXCL`], arg1 mode bits, a sealed memfd
    /// attached holding a parts file (glue, references to units the node's
    /// checkpoint store holds, new unit bytes; its layout is
    /// `fanstore_ckpt::parts_file`'s). The daemon commits it into its store
    /// and registers the record as COMMIT does. Reply value = unit count,
    /// an fd (memfd) attached holding each unit's blake3 (32 bytes) in file
    /// order. ESTALE: a reference names a unit the store does not hold
    /// (nothing is committed: send those bytes); ENOTSUP: no store
    /// (`--dedup off`: use COMMIT); EINVAL: a malformed parts
    /// file, or parts that are not the file's units as the store splits it.
    pub const CKPT_PUT: u16 = 46;

    /// Ops that turn a connection into a watcher session (not WATCH_INFO).
    pub fn is_watch(op: u16) -> bool {
        (WATCH_ADD..=WATCH_EVENT).contains(&op)
    }
}

/// OUT_STAT arg0 bit: do not follow a symlink in the last component
/// (lstat, readlink). Symlinks in the directories of the path are always
/// followed.
pub const STAT_NOFOLLOW: u64 = 1;
/// OUT_STAT arg0 bit, for an open that may create the name: when the path
/// has no record (ENOENT), the reply's payload is the errno (u32 LE) that
/// the name's directory gives, 0 when it is a directory the name can be
/// created in (ENOENT, ENOTDIR otherwise); an empty payload when the daemon
/// did not look (a directory reached through a symlink out of the mount).
/// Saves the open a second round trip to the daemon.
pub const STAT_PARENT: u64 = 2;
/// OUT_STAT arg0 bit: when the name (followed) is a committed regular
/// output the caller may read, the reply also carries an fd with its bytes
/// (an open for reading in one round trip instead of OUT_STAT + OUT_OPEN).
pub const STAT_OPEN: u64 = 4;
/// OUT_STAT arg0 bit, with [`STAT_PARENT`], for an open that creates the
/// name: an ENOENT reply whose directory can hold the name may carry an
/// fd (FLAG_FD): an unnamed file on the node's local disk made ahead by
/// the daemon, for the new output's bytes (only for a caller with the
/// daemon's own effective ids; without one the client makes its file).
pub const STAT_NEW_FILE: u64 = 8;

/// The OUT_STAT reply payload after the record: the path the daemon
/// resolved (relative to the mount; empty if it is the asked path), then a
/// symlink's target.
///
/// ```text
/// 0..40    OutRecord
/// 40..44   resolved path length n (u32 LE)
/// 44..44+n resolved path
/// 44+n..   symlink target (only for a symlink not followed)
/// ```
pub struct StatAnswer<'a> {
    pub rec: OutRecord,
    pub resolved: &'a [u8],
    pub target: &'a [u8],
}

impl<'a> StatAnswer<'a> {
    pub fn encode(rec: &OutRecord, resolved: &[u8], target: &[u8]) -> Vec<u8> {
        let mut b = Vec::with_capacity(OutRecord::LEN + 4 + resolved.len() + target.len());
        rec.encode_into(&mut b);
        b.extend_from_slice(&(resolved.len() as u32).to_le_bytes());
        b.extend_from_slice(resolved);
        b.extend_from_slice(target);
        b
    }
    /// None if `b` is malformed.
    pub fn decode(b: &'a [u8]) -> Option<StatAnswer<'a>> {
        let rec = OutRecord::decode(b)?;
        let n = u32::from_le_bytes(b.get(OutRecord::LEN..OutRecord::LEN + 4)?.try_into().ok()?) as usize;
        let rest = b.get(OutRecord::LEN + 4..)?;
        Some(StatAnswer { rec, resolved: rest.get(..n)?, target: rest.get(n..)? })
    }
}

/// SYNC phases (arg0).
pub const SYNC_DATA: u64 = 1;
pub const SYNC_META: u64 = 2;

/// COMMIT arg0 bit: fail with EEXIST if the path exists.
pub const COMMIT_EXCL: u64 = 1;
/// COMMIT arg0 bit: the attached fd is a read-only description of the
/// client's unnamed file, which no process had open for writing (nor
/// mapped writable) when the client closed it: nothing can change its bytes
/// any more, so the daemon may serve reads from it as it is.
pub const COMMIT_SOLE: u64 = 4;
/// COMMIT arg0 bit: the last close, in a program started by exec, of an
/// output its parent created and may have committed already while this
/// program still wrote it (`Popen(cmd, stdout=open(path, "w"))`). The daemon
/// stores it as a new version only if the path's current version was
/// committed here from this same file while something still wrote it;
/// otherwise the parent's own commit is still to come (or another file
/// replaced it), and this one is dropped.
pub const COMMIT_LATE: u64 = 8;

/// COMMIT arg0 bit: the attached fd is a read-only description of an
/// unnamed file the daemon made ahead for this output, which the client
/// could not prove sole (the daemon's own fd of it may still have been
/// open): the daemon waits until it has closed its fd and checks again.
pub const COMMIT_MADE_AHEAD: u64 = 16;

/// RENAME arg0 bit: fail with EEXIST if the new name exists (renameat2's
/// RENAME_NOREPLACE), checked at its owner for a file.
pub const RENAME_NOREPLACE: u64 = 1;

/// OUT_OPEN arg0: the bytes are the start of a new version the caller
/// writes ("r+", "a" of a file it may write but not read): write
/// permission is checked instead of read permission.
pub const OUT_OPEN_TO_WRITE: u64 = 1;

/// SETATTR arg0: set the permission bits to arg1.
pub const SETATTR_MODE: u64 = 1;
/// SETATTR arg0: set the modification time to arg1 (ns since the epoch, i64).
pub const SETATTR_MTIME: u64 = 2;
/// SETATTR arg0: set the access time to arg1 (ns since the epoch, i64).
pub const SETATTR_ATIME: u64 = 3;
/// SETATTR arg0: set the owner to arg1 = uid | gid << 32 (`u32::MAX`:
/// unchanged), as chown(2) does: root (or a caller with CAP_CHOWN) gives a
/// file to anyone; the owner may change only its group, to one of its own.
pub const SETATTR_OWNER: u64 = 4;
/// SETATTR arg0 bit: the times are "now" (utime with a null pointer,
/// UTIME_NOW): allowed to a caller with write permission, not only the owner.
pub const SETATTR_NOW: u64 = 0x200;
/// SETATTR arg0 bit with SETATTR_OWNER: leave the mode bits as they are
/// (the owner of a file chowned while it was being written, given after
/// its commit: the mode it was committed with already lost them).
pub const SETATTR_KEEP_MODE: u64 = 0x400;
/// SETATTR arg0 bit (with one of the above): do not follow a symlink in the
/// last component (lutimes, fchmodat/utimensat with AT_SYMLINK_NOFOLLOW);
/// a symlink's mode cannot change (EOPNOTSUPP, as Linux says).
pub const SETATTR_NOFOLLOW: u64 = 0x100;

/// MKNOD arg0 bit: the name of a unix socket the client binds itself at
/// the path of the reply (the daemon makes no object; the record is there
/// from the reply on).
pub const MKNOD_BIND: u64 = 1;
/// MKNOD arg0: a character or block device's number, shifted left by this
/// (the record keeps it as its `sum`, which a device has no other use for).
pub const MKNOD_RDEV_SHIFT: u32 = 8;

/// Entry kinds of an OUT_LIST reply.
pub const KIND_FILE: u8 = 1;
pub const KIND_DIR: u8 = 2;
pub const KIND_LINK: u8 = 3;
pub const KIND_FIFO: u8 = 4;
pub const KIND_SOCK: u8 = 5;
pub const KIND_CHR: u8 = 6;
pub const KIND_BLK: u8 = 7;

/// uid and gid of a record that stands for an input of the dataset (an
/// OUT_STAT through a symlink into it): the library shows its own user.
pub const INPUT_OWNER: u32 = u32::MAX;

/// Metadata of one output file or directory, as the owner rank keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutRecord {
    /// A file's length; a directory's number of subdirectories (its
    /// `st_nlink` is that plus 2).
    pub size: u64,
    /// Full st_mode (S_IFREG, S_IFDIR or S_IFLNK plus permission bits). A
    /// symlink's `size` is its target's length and `sum` the target's xxh3;
    /// its holder keeps the target as the output's bytes.
    pub mode: u32,
    pub holder: u32,
    pub mtime_ns: i64,
    pub id: u64,
    pub sum: u64,
    /// Access time (set by the utime family; reads do not change it, as
    /// with `noatime`).
    pub atime_ns: i64,
    /// Status change time: the record's creation, chmod, utime, rename.
    pub ctime_ns: i64,
    /// Owner and group: the creator's effective ids (chown changes them).
    pub uid: u32,
    pub gid: u32,
    /// The base of the inode number stat shows ([`ino_of_path`] of the
    /// path it was created at, 0 for records older than it): a rename
    /// keeps it, so the number follows the file, as natively.
    pub ino: u64,
    /// Hard links: the number of names of a linked file's shared record
    /// (0 for a file that was never linked: one name).
    pub nlink: u32,
}

/// [`OutRecord::sum`] of a file whose holder has not hashed it yet: a
/// checkpoint the checkpoint store takes behind its close is hashed by the
/// store's commit worker, not on the close's path, and its record gets its
/// sum then. Until then nothing checks the file's bytes against it.
pub const SUM_PENDING: u64 = 0;

/// The holder of a record that names a hard-linked file: the file's own
/// record (bytes, attributes, link count) is kept at its owner under
/// [`linked_key`]`(sum as rank, id)`; the name's record only points there.
pub const LINKED_HOLDER: u32 = u32::MAX - 2;

/// `mode` less what a write by a process that is not root, or a chown,
/// takes from a file: set-user-ID, and set-group-ID when the group may
/// execute it (the kernel's `file_remove_privs` and chown's ATTR_KILL_*).
pub fn mode_without_privs(mode: u32) -> u32 {
    let mode = mode & !libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        mode & !libc::S_ISGID
    } else {
        mode
    }
}

/// The key of the shared record of a hard-linked file made by rank `rank`
/// with sequence `seq`: it starts with '/', which no path relative to the
/// mount does, so no name is ever it, no listing shows it and no
/// directory move takes it ([`is_linked_key`]).
pub fn linked_key(rank: u32, seq: u64) -> Vec<u8> {
    format!("/inode/{rank}/{seq}").into_bytes()
}

/// True for the key of a hard-linked file's shared record (not a path).
pub fn is_linked_key(key: &[u8]) -> bool {
    key.first() == Some(&b'/')
}

/// The inode number of an output created at `path` (relative to the
/// mount): a hash of the path, top bit set (input inodes are small node ids).
pub fn ino_of_path(path: &[u8]) -> u64 {
    crate::checksum::xxh3(path) | (1 << 63)
}

impl OutRecord {
    /// ```text
    /// 0..8 size | 8..12 mode | 12..16 holder | 16..24 mtime ns | 24..32 id
    /// 32..40 xxh3 | 40..48 atime ns | 48..56 ctime ns | 56..60 uid
    /// 60..64 gid | 64..72 inode base | 72..76 nlink | 76..80 zero  (all LE)
    /// ```
    pub const LEN: usize = 80;
    /// The record before uid and gid (persisted indexes of version 2).
    pub const LEN_V2: usize = 56;
    /// The record before atime and ctime (persisted indexes of version 1).
    pub const LEN_V1: usize = 40;
    /// A new record's three times: mtime `mtime_ns`, atime the same, ctime `now_ns`.
    pub fn with_times(mut self, mtime_ns: i64, now_ns: i64) -> OutRecord {
        (self.mtime_ns, self.atime_ns, self.ctime_ns) = (mtime_ns, mtime_ns, now_ns);
        self
    }
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    /// Whether a process with effective uid `uid` (and `in_group` saying
    /// which groups it is in, its effective gid among them) may `want`
    /// this record (`R_OK`/`W_OK`/`X_OK` bits), as the kernel's
    /// `generic_permission` says: root reads and writes anything and
    /// searches a directory or runs a file with an x bit; anyone else gets
    /// the bits of the owner, the group or the others, the first class it
    /// is in. A record of an input ([`INPUT_OWNER`]) is the asker's own.
    pub fn allows(&self, uid: u32, in_group: impl Fn(u32) -> bool, want: u32) -> bool {
        if uid == 0 {
            return want & 1 == 0 || self.is_dir() || self.mode & 0o111 != 0;
        }
        let bits = if uid == self.uid || self.uid == INPUT_OWNER {
            self.mode >> 6
        } else if in_group(self.gid) {
            self.mode >> 3
        } else {
            self.mode
        } & 7;
        bits & want == want
    }
    /// A name of a hard-linked file (its record is at [`Self::linked_key`]).
    pub fn is_linked_name(&self) -> bool {
        self.holder == LINKED_HOLDER
    }
    /// The key of the shared record a linked name points at.
    pub fn linked_key(&self) -> Vec<u8> {
        linked_key(self.sum as u32, self.id)
    }
    pub fn is_link(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }
    /// A FIFO or a unix socket: a real object on its holder's node
    /// (`<local dir>/out/<id>`), no bytes.
    pub fn is_special(&self) -> bool {
        matches!(self.mode & libc::S_IFMT, libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK)
    }
    /// A character or block device's number (kept in `sum`), else 0.
    pub fn rdev(&self) -> u64 {
        if matches!(self.mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK) {
            self.sum
        } else {
            0
        }
    }
    /// The listing kind of this record.
    pub fn kind(&self) -> u8 {
        match self.mode & libc::S_IFMT {
            libc::S_IFDIR => KIND_DIR,
            libc::S_IFLNK => KIND_LINK,
            libc::S_IFIFO => KIND_FIFO,
            libc::S_IFSOCK => KIND_SOCK,
            libc::S_IFCHR => KIND_CHR,
            libc::S_IFBLK => KIND_BLK,
            _ => KIND_FILE,
        }
    }
    pub fn encode_into(&self, b: &mut Vec<u8>) {
        let mut h = [0u8; Self::LEN];
        put_u64(&mut h, 0, self.size);
        put_u32(&mut h, 8, self.mode);
        put_u32(&mut h, 12, self.holder);
        put_u64(&mut h, 16, self.mtime_ns as u64);
        put_u64(&mut h, 24, self.id);
        put_u64(&mut h, 32, self.sum);
        put_u64(&mut h, 40, self.atime_ns as u64);
        put_u64(&mut h, 48, self.ctime_ns as u64);
        put_u32(&mut h, 56, self.uid);
        put_u32(&mut h, 60, self.gid);
        put_u64(&mut h, 64, self.ino);
        put_u32(&mut h, 72, self.nlink);
        b.extend_from_slice(&h);
    }
    /// Decodes the first LEN bytes of `b` (None if shorter).
    pub fn decode(b: &[u8]) -> Option<OutRecord> {
        if b.len() < Self::LEN {
            return None;
        }
        Some(OutRecord {
            size: u64_at(b, 0),
            mode: u32_at(b, 8),
            holder: u32_at(b, 12),
            mtime_ns: u64_at(b, 16) as i64,
            id: u64_at(b, 24),
            sum: u64_at(b, 32),
            atime_ns: u64_at(b, 40) as i64,
            ctime_ns: u64_at(b, 48) as i64,
            uid: u32_at(b, 56),
            gid: u32_at(b, 60),
            ino: u64_at(b, 64),
            nlink: u32_at(b, 72),
        })
    }
    /// Decodes a version-2 record (the first LEN_V2 bytes); its owner is
    /// `uid`/`gid` (who reads it back: records had no owner then).
    pub fn decode_v2(b: &[u8], uid: u32, gid: u32) -> Option<OutRecord> {
        let b = b.get(..Self::LEN_V2)?;
        let mut full = [0u8; Self::LEN];
        full[..Self::LEN_V2].copy_from_slice(b);
        Some(OutRecord { uid, gid, ..OutRecord::decode(&full)? })
    }
    /// Decodes a version-1 record (the first LEN_V1 bytes; atime and ctime
    /// are its mtime).
    pub fn decode_v1(b: &[u8]) -> Option<OutRecord> {
        let b = b.get(..Self::LEN_V1)?;
        let mut full = [0u8; Self::LEN];
        full[..Self::LEN_V1].copy_from_slice(b);
        let r = OutRecord::decode(&full)?;
        Some(OutRecord { atime_ns: r.mtime_ns, ctime_ns: r.mtime_ns, ..r })
    }
}

/// Appends one OUT_LIST entry; false (nothing appended) if it would make
/// `b` longer than `limit`.
pub fn push_entry(b: &mut Vec<u8>, kind: u8, name: &[u8], limit: usize) -> bool {
    if name.len() > u16::MAX as usize || b.len() + 3 + name.len() > limit {
        return false;
    }
    b.push(kind);
    b.extend_from_slice(&(name.len() as u16).to_le_bytes());
    b.extend_from_slice(name);
    true
}

/// The entries of an OUT_LIST payload (stops at the first malformed one).
pub fn entries(mut b: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 3 {
            return None;
        }
        let n = u16::from_le_bytes([b[1], b[2]]) as usize;
        if b.len() < 3 + n {
            return None;
        }
        let e = (b[0], &b[3..3 + n]);
        b = &b[3 + n..];
        Some(e)
    })
}

/// Reply flag: an fd is attached.
pub const FLAG_FD: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub op: u16,
    pub id: u64,
    pub arg0: u64,
    pub arg1: u64,
    pub payload: Vec<u8>,
}

/// The node ids a [`op::WARM`] request carries: its payload's little-endian
/// u32s (a trailing partial id is ignored), or arg0 when the payload is empty.
pub fn warm_ids(req: &Request) -> impl Iterator<Item = u32> + '_ {
    let single = req.payload.is_empty().then(|| u32::try_from(req.arg0).ok()).flatten();
    req.payload.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).chain(single)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub op: u16,
    pub id: u64,
    pub errno: i32,
    pub flags: u32,
    pub value: u64,
    pub payload: Vec<u8>,
}

/// A message that is not a valid request or reply.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("message of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported protocol version {0}")]
    Version(u16),
    #[error("payload length {0} does not match the message")]
    Length(u32),
}

fn check<'a>(b: &'a [u8], magic: &[u8; 4]) -> Result<&'a [u8], WireError> {
    if b.len() < HEADER_LEN {
        return Err(WireError::Short(b.len()));
    }
    if &b[..4] != magic {
        return Err(WireError::BadMagic);
    }
    let v = u16_at(b, 4);
    if v != VERSION {
        return Err(WireError::Version(v));
    }
    let len = u32_at(b, 32);
    if len as usize != b.len() - HEADER_LEN {
        return Err(WireError::Length(len));
    }
    Ok(&b[HEADER_LEN..])
}

impl Request {
    pub fn new(op: u16, id: u64, arg0: u64, arg1: u64) -> Request {
        Request { op, id, arg0, arg1, payload: Vec::new() }
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b[..4].copy_from_slice(&REQ_MAGIC);
        put_u16(&mut b, 4, VERSION);
        put_u16(&mut b, 6, self.op);
        put_u64(&mut b, 8, self.id);
        put_u64(&mut b, 16, self.arg0);
        put_u64(&mut b, 24, self.arg1);
        put_u32(&mut b, 32, self.payload.len() as u32);
        b.extend_from_slice(&self.payload);
        b
    }
    pub fn decode(b: &[u8]) -> Result<Request, WireError> {
        let payload = check(b, &REQ_MAGIC)?.to_vec();
        Ok(Request { op: u16_at(b, 6), id: u64_at(b, 8), arg0: u64_at(b, 16), arg1: u64_at(b, 24), payload })
    }
}

impl Reply {
    pub fn ok(req: &Request, value: u64) -> Reply {
        Reply { op: req.op, id: req.id, errno: 0, flags: 0, value, payload: Vec::new() }
    }
    pub fn err(req: &Request, errno: i32) -> Reply {
        Reply { op: req.op, id: req.id, errno, flags: 0, value: 0, payload: Vec::new() }
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b[..4].copy_from_slice(&REP_MAGIC);
        put_u16(&mut b, 4, VERSION);
        put_u16(&mut b, 6, self.op);
        put_u64(&mut b, 8, self.id);
        put_u32(&mut b, 16, self.errno as u32);
        put_u32(&mut b, 20, self.flags);
        put_u64(&mut b, 24, self.value);
        put_u32(&mut b, 32, self.payload.len() as u32);
        b.extend_from_slice(&self.payload);
        b
    }
    pub fn decode(b: &[u8]) -> Result<Reply, WireError> {
        let payload = check(b, &REP_MAGIC)?.to_vec();
        Ok(Reply {
            op: u16_at(b, 6),
            id: u64_at(b, 8),
            errno: u32_at(b, 16) as i32,
            flags: u32_at(b, 20),
            value: u64_at(b, 24),
            payload,
        })
    }
}

/// Sends one datagram on a connected SOCK_SEQPACKET socket, with `fd` attached if given.
pub fn send_msg(sock: RawFd, bytes: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    sendmsg_with(sock, bytes, fd, libc::MSG_NOSIGNAL)
}

/// [`send_msg`] that never blocks: `WouldBlock` when the socket's buffer
/// is full (a thread that must not wait on a client, as the communication
/// thread, then leaves the reply to the client's connection thread).
pub fn try_send_msg(sock: RawFd, bytes: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    sendmsg_with(sock, bytes, fd, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
}

fn sendmsg_with(sock: RawFd, bytes: &[u8], fd: Option<RawFd>, flags: libc::c_int) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut _, iov_len: bytes.len() };
    // Room for one cmsghdr carrying one int, 8-aligned.
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is plain data; all-zero is a valid empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at cbuf, which is larger than `space`,
        // so CMSG_FIRSTHDR returns a valid, aligned header inside it and
        // CMSG_DATA a pointer with room for one int.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd);
        }
    }
    loop {
        // SAFETY: msg points at live buffers (iov over `bytes`, cbuf) for the call.
        let r = unsafe { libc::sendmsg(sock, &msg, flags) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one datagram into `buf`; returns its length and the attached fd
/// (close-on-exec), if any. A length of 0 means the peer closed.
pub fn recv_msg(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    recv_msg_flags(sock, buf, 0)
}

/// [`recv_msg`] if a datagram is there now; None if not.
pub fn try_recv_msg(sock: RawFd, buf: &mut [u8]) -> io::Result<Option<(usize, Option<OwnedFd>)>> {
    match recv_msg_flags(sock, buf, libc::MSG_DONTWAIT) {
        Ok(r) => Ok(Some(r)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// Waits for a datagram on `sock` for at most `spin` by asking again and
/// again (giving the CPU to any other runnable thread between asks)
/// instead of sleeping: where a sleeping thread's wake-up costs tens of
/// microseconds (a VM whose idle vCPUs halt), a reply or request that
/// comes within `spin` costs none. None: nothing came.
pub fn spin_recv_msg(sock: RawFd, buf: &mut [u8], spin: std::time::Duration) -> io::Result<Option<(usize, Option<OwnedFd>)>> {
    let start = std::time::Instant::now();
    loop {
        if let Some(r) = try_recv_msg(sock, buf)? {
            return Ok(Some(r));
        }
        if start.elapsed() >= spin {
            return Ok(None);
        }
        std::thread::yield_now();
    }
}

/// When to spin for the next message ([`spin_recv_msg`]): always while
/// spins find one; after a spin that found nothing, not for the next 1,
/// 2, 4 ... 64 waits, then once again. A peer whose messages come far
/// apart costs at most one spin in 64 waits.
#[derive(Debug, Default, Clone, Copy)]
pub struct SpinPolicy {
    skip: u32,
    backoff: u32,
}

impl SpinPolicy {
    pub const fn new() -> SpinPolicy {
        SpinPolicy { skip: 0, backoff: 0 }
    }

    /// Whether this wait spins first.
    pub fn should_spin(&mut self) -> bool {
        if self.skip == 0 {
            return true;
        }
        self.skip -= 1;
        false
    }

    /// What the spin found.
    pub fn spun(&mut self, found: bool) {
        if found {
            self.backoff = 0;
        } else {
            self.backoff = (self.backoff * 2).clamp(1, 64);
            self.skip = self.backoff;
        }
    }
}

fn recv_msg_flags(sock: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: iov and cbuf are live, writable buffers of the given lengths.
        let r = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fd = None;
    // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG macros
    // walk only within that buffer.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(data.add(i));
                    let owned = OwnedFd::from_raw_fd(raw);
                    if fd.is_none() {
                        fd = Some(owned);
                    } // extra fds are closed by drop
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "message larger than the receive buffer"));
    }
    Ok((n, fd))
}

/// The CKPT request: a `fanstore ckpt` query, encoded by the CLI and
/// decoded by the daemon that answers it from its checkpoint store.
///
/// ```
/// use fanstore_core::wire::ckpt::Query;
/// let q = Query::Diff { a: b"run/ck1".to_vec(), b: b"run/ck2".to_vec(), json: true };
/// let (arg0, arg1, payload) = q.encode();
/// assert_eq!(Query::decode(arg0, arg1, &payload), Some(q));
/// ```
pub mod ckpt {
    use std::os::fd::OwnedFd;

    /// A `fanstore ckpt` query (wire op CKPT).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Query {
        Ls { dir: Vec<u8>, json: bool },
        Log { path: Vec<u8>, json: bool },
        Owners { path: Vec<u8>, json: bool },
        Diff { a: Vec<u8>, b: Vec<u8>, json: bool },
        /// Always JSON: the CLI adds the ranks up.
        Du,
        Verify { path: Option<Vec<u8>>, json: bool },
        /// Always JSON: the CLI ranks the ranks' rows together. `keys`: a
        /// key list (`fanstore_ckpt::matching`), sent in a memfd attached to
        /// the request (a model's list can exceed a message); `exclude`: the
        /// queried checkpoint's own path, or empty (the payload).
        Match { exclude: Vec<u8>, keys: Vec<u8> },
    }

    /// Query kinds on the wire (CKPT's arg0); arg1 bit 0 asks for JSON; the
    /// payload holds the paths, NUL-separated.
    pub mod kind {
        pub const LS: u64 = 1;
        pub const LOG: u64 = 2;
        pub const OWNERS: u64 = 3;
        pub const DIFF: u64 = 4;
        pub const DU: u64 = 5;
        pub const VERIFY: u64 = 6;
        pub const MATCH: u64 = 7;
    }

    impl Query {
        /// (arg0, arg1, payload) of the CKPT request.
        pub fn encode(&self) -> (u64, u64, Vec<u8>) {
            let j = |json: &bool| u64::from(*json);
            match self {
                Query::Ls { dir, json } => (kind::LS, j(json), dir.clone()),
                Query::Log { path, json } => (kind::LOG, j(json), path.clone()),
                Query::Owners { path, json } => (kind::OWNERS, j(json), path.clone()),
                Query::Diff { a, b, json } => (kind::DIFF, j(json), [&a[..], b"\0", &b[..]].concat()),
                Query::Du => (kind::DU, 1, Vec::new()),
                Query::Verify { path, json } => (kind::VERIFY, j(json), path.clone().unwrap_or_default()),
                Query::Match { exclude, .. } => (kind::MATCH, 1, exclude.clone()),
            }
        }

        /// The bytes sent in a memfd with the request, if any.
        pub fn attachment(&self) -> Option<&[u8]> {
            match self {
                Query::Match { keys, .. } => Some(keys),
                _ => None,
            }
        }

        /// Fills in what came in the attached file (at most 64 MiB); None when
        /// a query that needs it has none.
        pub fn with_attachment(self, file: Option<OwnedFd>) -> Option<Query> {
            match self {
                Query::Match { exclude, .. } => {
                    use std::io::Read;
                    let mut keys = Vec::new();
                    std::fs::File::from(file?).take(64 << 20).read_to_end(&mut keys).ok()?;
                    Some(Query::Match { exclude, keys })
                }
                q => Some(q),
            }
        }

        pub fn decode(arg0: u64, arg1: u64, payload: &[u8]) -> Option<Query> {
            let json = arg1 & 1 != 0;
            let p = payload.to_vec();
            Some(match arg0 {
                kind::LS => Query::Ls { dir: p, json },
                kind::LOG => Query::Log { path: p, json },
                kind::OWNERS => Query::Owners { path: p, json },
                kind::DIFF => {
                    let i = payload.iter().position(|&b| b == 0)?;
                    Query::Diff { a: payload[..i].to_vec(), b: payload[i + 1..].to_vec(), json }
                }
                kind::DU => Query::Du,
                kind::VERIFY => Query::Verify { path: (!p.is_empty()).then_some(p), json },
                kind::MATCH => Query::Match { exclude: p, keys: Vec::new() },
                _ => return None,
            })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn queries_roundtrip_on_the_wire() {
            for q in [
                Query::Ls { dir: b"run".to_vec(), json: true },
                Query::Log { path: b"a/b".to_vec(), json: false },
                Query::Owners { path: b"a".to_vec(), json: true },
                Query::Diff { a: b"a".to_vec(), b: b"b/c".to_vec(), json: false },
                Query::Du,
                Query::Verify { path: None, json: true },
                Query::Verify { path: Some(b"p".to_vec()), json: false },
            ] {
                let (a0, a1, p) = q.encode();
                assert_eq!(Query::decode(a0, a1, &p), Some(q));
            }
            assert_eq!(Query::decode(99, 0, b""), None);
            // match: the keys travel in an attached file
            let q = Query::Match { exclude: b"a/b".to_vec(), keys: vec![0, 1, 0, 2] };
            let (a0, a1, p) = q.encode();
            let fd = crate::client::sealed_memfd("keys", q.attachment().unwrap()).unwrap();
            assert_eq!(Query::decode(a0, a1, &p).and_then(|d| d.with_attachment(Some(fd))), Some(q.clone()));
            assert_eq!(Query::decode(a0, a1, &p).and_then(|d| d.with_attachment(None)), None);
            assert_eq!(Query::decode(kind::DIFF, 0, b"no-separator"), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spin_that_finds_nothing_backs_off_to_one_in_64() {
        let mut p = SpinPolicy::new();
        assert!(p.should_spin());
        p.spun(true);
        assert!(p.should_spin(), "spins while they find messages");
        // A peer that never sends soon: spins get rarer, down to 1 wait in 65.
        let mut spins = 0;
        for _ in 0..1000 {
            if p.should_spin() {
                spins += 1;
                p.spun(false);
            }
        }
        assert!((15..=30).contains(&spins), "{spins} spins in 1000 waits");
        // One spin that finds a message: back to spinning every time.
        while !p.should_spin() {}
        p.spun(true);
        assert!((0..10).all(|_| p.should_spin()));
    }

    #[test]
    fn a_spin_finds_what_comes_and_gives_up_in_time() {
        let [a, b] = {
            let mut fds = [0; 2];
            // SAFETY: fds is a valid 2-int array.
            assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) }, 0);
            fds
        };
        let mut buf = [0u8; 64];
        let t0 = std::time::Instant::now();
        assert!(spin_recv_msg(a, &mut buf, std::time::Duration::from_micros(200)).unwrap().is_none());
        assert!(t0.elapsed() >= std::time::Duration::from_micros(200));
        send_msg(b, b"hello", None).unwrap();
        let got = spin_recv_msg(a, &mut buf, std::time::Duration::from_micros(200)).unwrap();
        assert_eq!(got.map(|(n, fd)| (n, fd.is_none())), Some((5, true)));
        assert_eq!(&buf[..5], b"hello");
        // SAFETY: closing the pair made above.
        unsafe {
            libc::close(a);
            libc::close(b);
        }
    }

    #[test]
    fn stat_answer_round_trip_and_malformed() {
        let rec = OutRecord { size: 4, mode: libc::S_IFLNK | 0o777, holder: 1, mtime_ns: -3, id: 9, sum: 7, atime_ns: -2, ctime_ns: 8, uid: 1000, gid: 1001, ino: 1 << 63 | 77, nlink: 0 };
        let b = StatAnswer::encode(&rec, b"run/ck-9", b"ck-9");
        let a = StatAnswer::decode(&b).unwrap();
        assert_eq!((a.rec, a.resolved, a.target), (rec, &b"run/ck-9"[..], &b"ck-9"[..]));
        assert!(a.rec.is_link() && a.rec.kind() == KIND_LINK);
        assert!(StatAnswer::decode(&b[..OutRecord::LEN + 2]).is_none(), "cut in the length");
        let mut long = b[..OutRecord::LEN].to_vec();
        long.extend_from_slice(&100u32.to_le_bytes());
        assert!(StatAnswer::decode(&long).is_none(), "a resolved path longer than the message");
    }
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;

    #[test]
    fn warm_ids_from_the_payload_or_arg0() {
        let mut r = Request::new(op::WARM, 1, 5, 99);
        assert_eq!(warm_ids(&r).collect::<Vec<_>>(), [5]);
        r.payload = [7u32, 8, 1 << 31].iter().flat_map(|i| i.to_le_bytes()).collect();
        assert_eq!(warm_ids(&Request::decode(&r.encode()).unwrap()).collect::<Vec<_>>(), [7, 8, 1 << 31]);
        r.payload.push(3); // a cut id is not one
        assert_eq!(warm_ids(&r).count(), 3);
        r.payload.clear();
        r.arg0 = u64::MAX; // not a node id
        assert_eq!(warm_ids(&r).count(), 0);
    }

    #[test]
    fn encode_decode() {
        let mut r = Request::new(op::OPEN, 7, 42, 99);
        r.payload = b"abc".to_vec();
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        let mut p = Reply::err(&r, libc::ENOENT);
        p.payload = b"x".to_vec();
        assert_eq!(Reply::decode(&p.encode()).unwrap(), p);
        let mut b = r.encode();
        b[0] = b'X';
        assert_eq!(Request::decode(&b), Err(WireError::BadMagic));
        let mut b = r.encode();
        b[4] = 9;
        assert_eq!(Request::decode(&b), Err(WireError::Version(9)));
        assert_eq!(Request::decode(&r.encode()[..41]), Err(WireError::Length(3)));
        assert_eq!(Reply::decode(&[0u8; 5]), Err(WireError::Short(5)));
    }

    #[test]
    fn a_write_or_chown_takes_set_user_id_and_executable_set_group_id() {
        assert_eq!(mode_without_privs(libc::S_IFREG | 0o6755), libc::S_IFREG | 0o755);
        // Set-group-ID without a group x bit is mandatory locking, not privilege: kept.
        assert_eq!(mode_without_privs(libc::S_IFREG | 0o6745), libc::S_IFREG | 0o2745);
        let input = OutRecord { mode: libc::S_IFREG | 0o600, uid: INPUT_OWNER, gid: INPUT_OWNER, ..Default::default() };
        assert!(input.allows(1000, |_| false, 6), "an input's record is the asker's own");
    }

    #[test]
    fn out_record_and_entries() {
        let r = OutRecord { size: 5, mode: libc::S_IFREG | 0o644, holder: 3, mtime_ns: -7, id: 9, sum: 11, atime_ns: 1 << 40, ctime_ns: -(1 << 41), uid: 7, gid: u32::MAX, ino: 5, nlink: 3 };
        let mut b = Vec::new();
        r.encode_into(&mut b);
        assert_eq!(b.len(), OutRecord::LEN);
        assert_eq!(OutRecord::decode(&b), Some(r));
        assert_eq!(OutRecord::decode(&b[..OutRecord::LEN - 1]), None);
        // A version-2 record (no owner, no inode base) belongs to whom reads it.
        assert_eq!(OutRecord::decode_v2(&b[..OutRecord::LEN_V2], 4, 5), Some(OutRecord { uid: 4, gid: 5, ino: 0, nlink: 0, ..r }));
        let mut l = Vec::new();
        assert!(push_entry(&mut l, KIND_FILE, b"a", 100));
        assert!(push_entry(&mut l, KIND_DIR, b"bc", 100));
        assert!(!push_entry(&mut l, KIND_DIR, b"toolong", 10));
        let got: Vec<_> = entries(&l).collect();
        assert_eq!(got, vec![(KIND_FILE, &b"a"[..]), (KIND_DIR, &b"bc"[..])]);
        assert_eq!(entries(&l[..4]).count(), 1);
    }

    #[test]
    fn fd_passing_over_seqpacket() {
        let mut sv = [0; 2];
        // SAFETY: sv has room for two fds.
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, sv.as_mut_ptr()) }, 0);
        // SAFETY: socketpair returned two fresh fds that we now own.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"payload bytes").unwrap();
        f.rewind().unwrap();
        send_msg(a.as_raw_fd(), b"hello", Some(f.as_raw_fd())).unwrap();
        let mut buf = [0u8; 64];
        let (n, fd) = recv_msg(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        let mut got = String::new();
        std::fs::File::from(fd.unwrap()).read_to_string(&mut got).unwrap();
        assert_eq!(got, "payload bytes");
        send_msg(a.as_raw_fd(), b"no fd", None).unwrap();
        let (n, fd) = recv_msg(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!((&buf[..n], fd.is_none()), (&b"no fd"[..], true));
        drop(a);
        assert_eq!(recv_msg(b.as_raw_fd(), &mut buf).unwrap().0, 0);
    }
}
