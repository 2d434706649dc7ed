//! Safe wrappers over the `*at` system calls that the walk, the packer and
//! the extractor use.
//!
//! Everything is relative to a directory file descriptor, so a tree whose
//! absolute paths exceed the kernel's 4096-byte `PATH_MAX` (a 4096-byte
//! relative path under `/scratch/...`) still works: [`open_beneath`] walks
//! long paths one component at a time.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// Relative paths at least this long are opened one component at a time.
const DIRECT_OPEN_LIMIT: usize = 3800;

/// What kind of inode a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InodeKind {
    Dir,
    File,
    Symlink,
    /// A fifo, socket, or device; the name says which.
    Special(&'static str),
}

/// The stat fields FanStore records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub kind: InodeKind,
    /// Permission bits (`st_mode & 0o7777`).
    pub perm: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub atime_ns: i64,
    pub ctime_ns: i64,
}

fn stat_from(st: &libc::stat) -> Stat {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => InodeKind::Dir,
        libc::S_IFREG => InodeKind::File,
        libc::S_IFLNK => InodeKind::Symlink,
        libc::S_IFIFO => InodeKind::Special("fifo"),
        libc::S_IFSOCK => InodeKind::Special("socket"),
        libc::S_IFCHR => InodeKind::Special("character device"),
        libc::S_IFBLK => InodeKind::Special("block device"),
        _ => InodeKind::Special("unknown file type"),
    };
    let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
    Stat {
        kind,
        perm: st.st_mode & 0o7777,
        size: st.st_size.max(0) as u64,
        mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
        atime_ns: ns(st.st_atime, st.st_atime_nsec),
        ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
    }
}

/// A NUL-terminated copy of `bytes`; a NUL inside is an `InvalidInput` error.
pub fn c_string(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in a path"))
}

/// A path as a NUL-terminated C string, kept on the stack when short: the
/// walk and pack make two system calls with a path per file, and a heap
/// allocation for each was about 2% of packing 100-byte files.
pub struct CPath {
    small: [u8; CPath::SMALL],
    big: Option<CString>,
}

impl CPath {
    const SMALL: usize = 256;

    pub fn new(bytes: &[u8]) -> io::Result<CPath> {
        if bytes.len() >= CPath::SMALL {
            return Ok(CPath { small: [0; CPath::SMALL], big: Some(c_string(bytes)?) });
        }
        if bytes.contains(&0) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in a path"));
        }
        let mut small = [0; CPath::SMALL];
        small[..bytes.len()].copy_from_slice(bytes); // the rest stays 0: NUL-terminated
        Ok(CPath { small, big: None })
    }

    /// Valid while `self` lives.
    pub fn as_ptr(&self) -> *const libc::c_char {
        match &self.big {
            Some(c) => c.as_ptr(),
            None => self.small.as_ptr().cast(),
        }
    }
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `openat(dir, rel, flags, mode)`; `rel` must be short enough for one call.
pub fn openat(dir: BorrowedFd<'_>, rel: &[u8], flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let rel = if rel.is_empty() { &b"."[..] } else { rel };
    let c = CPath::new(rel)?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call and
    // `dir` is an open descriptor borrowed for the duration of the call.
    let fd = check(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
    // SAFETY: openat returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Like [`openat`], but first tries with `O_NOATIME` (so that packing does
/// not change the input's access times) and falls back without it where the
/// kernel refuses (`EPERM`: neither the owner nor privileged).
pub fn openat_noatime(dir: BorrowedFd<'_>, rel: &[u8], flags: i32) -> io::Result<OwnedFd> {
    match openat(dir, rel, flags | libc::O_NOATIME, 0) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => openat(dir, rel, flags, 0),
        other => other,
    }
}

const DIR_FLAGS: i32 = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;

/// Whether this kernel has openat2 (0 unknown, 1 yes, 2 no: ENOSYS).
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// `openat2(dir, rel, flags, mode)` resolving beneath `dir` and refusing a
/// symlink in any component (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`: ELOOP),
/// or None where the kernel lacks openat2 (before Linux 5.6, or filtered
/// out by a sandbox).
fn openat2_beneath(dir: BorrowedFd<'_>, rel: &[u8], flags: i32, mode: u32) -> Option<io::Result<OwnedFd>> {
    if OPENAT2.load(Relaxed) == 2 {
        return None;
    }
    let rel = if rel.is_empty() { &b"."[..] } else { rel };
    let c = match CPath::new(rel) {
        Ok(c) => c,
        Err(e) => return Some(Err(e)),
    };
    let creates = flags & (libc::O_CREAT | libc::O_TMPFILE) != 0;
    // SAFETY: open_how is a plain struct of integers; all-zero is valid.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u32 as u64;
    how.mode = if creates { mode as u64 } else { 0 };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: `c` is NUL-terminated and outlives the call, `how` is a valid
    // open_how of the size passed, and `dir` is open for the call.
    let r = unsafe { libc::syscall(libc::SYS_openat2, dir.as_raw_fd(), c.as_ptr(), &how as *const libc::open_how, std::mem::size_of::<libc::open_how>()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            OPENAT2.store(2, Relaxed);
            return None;
        }
        if e.raw_os_error() == Some(libc::EPERM) && OPENAT2.load(Relaxed) == 0 {
            // A sandbox may refuse the call itself: the walk below decides.
            return None;
        }
        return Some(Err(e));
    }
    OPENAT2.store(1, Relaxed);
    // SAFETY: openat2 returned a fresh descriptor that nothing else owns.
    Some(Ok(unsafe { OwnedFd::from_raw_fd(r as i32) }))
}

/// Opens `rel` (a relative path of any length, `/`-separated, no `..`)
/// beneath `root` with `flags`, never following a symlink in any component
/// (ELOOP): one openat2 call where the kernel has it, else (and for long
/// paths) one directory at a time, each opened with `O_NOFOLLOW`.
pub fn open_beneath(root: BorrowedFd<'_>, rel: &[u8], flags: i32, mode: u32) -> io::Result<OwnedFd> {
    if rel.len() < DIRECT_OPEN_LIMIT {
        if let Some(r) = openat2_beneath(root, rel, flags, mode) {
            return r;
        }
    }
    let (parent, name) = match rel.iter().rposition(|&b| b == b'/') {
        Some(k) => (&rel[..k], &rel[k + 1..]),
        None => (&b""[..], rel),
    };
    let mut dir: Option<OwnedFd> = None;
    for comp in parent.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        let next = match &dir {
            Some(d) => openat(d.as_fd(), comp, DIR_FLAGS, 0)?,
            None => openat(root, comp, DIR_FLAGS, 0)?,
        };
        dir = Some(next);
    }
    match &dir {
        Some(d) => openat(d.as_fd(), name, flags | libc::O_NOFOLLOW, mode),
        None => openat(root, name, flags | libc::O_NOFOLLOW, mode),
    }
}

/// Opens the directory `rel` beneath `root` (see [`open_beneath`]).
pub fn open_dir_beneath(root: BorrowedFd<'_>, rel: &[u8]) -> io::Result<OwnedFd> {
    open_beneath(root, rel, DIR_FLAGS | libc::O_NOATIME, 0).or_else(|e| {
        if e.raw_os_error() == Some(libc::EPERM) {
            open_beneath(root, rel, DIR_FLAGS, 0)
        } else {
            Err(e)
        }
    })
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn lstat_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Stat> {
    let c = CPath::new(name)?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `c` is NUL-terminated, `st` points to writable memory of the
    // right type, and `dir` is open for the duration of the call.
    check(unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), st.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) })?;
    // SAFETY: fstatat succeeded, so it filled `st`.
    Ok(stat_from(unsafe { &st.assume_init() }))
}

/// `fstat(fd)`.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` points to writable memory of the right type; `fd` is open.
    check(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so it filled `st`.
    Ok(stat_from(unsafe { &st.assume_init() }))
}

/// `readlinkat(dir, name)`: the symlink's target bytes.
pub fn readlink_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Vec<u8>> {
    let c = c_string(name)?;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `buf` is writable for `buf.len()` bytes; `c` is NUL-terminated.
        let n = unsafe { libc::readlinkat(dir.as_raw_fd(), c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < buf.len() {
            buf.truncate(n);
            return Ok(buf);
        }
        // The target may have been truncated: grow and retry.
        let bigger = buf.len() * 2;
        buf.resize(bigger, 0);
    }
}

/// The names in directory `dir` (without `.` and `..`), in the order the
/// file system returns them. Consumes a duplicate of the descriptor.
pub fn read_dir_names(dir: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    let dup = dir.try_clone_to_owned()?;
    let raw = dup.into_raw_fd();
    // SAFETY: `raw` is an open directory descriptor we own; on success the
    // DIR stream takes ownership of it and closedir below closes it.
    let stream = unsafe { libc::fdopendir(raw) };
    if stream.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so we still own `raw` and must close it.
        unsafe { libc::close(raw) };
        return Err(e);
    }
    // The stream shares the file offset with `dir`: start from the beginning.
    // SAFETY: `stream` is a valid, open DIR stream.
    unsafe { libc::rewinddir(stream) };
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: errno is thread-local; resetting it lets us tell the end of
        // the stream (NULL, errno 0) from an error (NULL, errno set).
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `stream` is valid until closedir below.
        let ent = unsafe { libc::readdir64(stream) };
        if ent.is_null() {
            // SAFETY: reading this thread's errno.
            let errno = unsafe { *libc::__errno_location() };
            break if errno == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(errno)) };
        }
        // SAFETY: readdir64 returned a valid entry whose d_name is a
        // NUL-terminated string living until the next readdir on `stream`.
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    };
    // SAFETY: `stream` is valid and is not used after this call.
    unsafe { libc::closedir(stream) };
    result.map(|_| names)
}

/// `mkdirat(dir, name, mode)`.
pub fn mkdir_at(dir: BorrowedFd<'_>, name: &[u8], mode: u32) -> io::Result<()> {
    let c = c_string(name)?;
    // SAFETY: `c` is NUL-terminated; `dir` is open.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) }).map(|_| ())
}

/// `symlinkat(target, dir, name)`.
pub fn symlink_at(target: &[u8], dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let t = c_string(target)?;
    let c = c_string(name)?;
    // SAFETY: both strings are NUL-terminated; `dir` is open.
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), c.as_ptr()) }).map(|_| ())
}

/// `fchmodat(dir, name, perm)` (follows nothing: only used on directories we created).
pub fn chmod_at(dir: BorrowedFd<'_>, name: &[u8], perm: u32) -> io::Result<()> {
    let c = c_string(if name.is_empty() { b"." } else { name })?;
    // SAFETY: `c` is NUL-terminated; `dir` is open.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), c.as_ptr(), perm as libc::mode_t, 0) }).map(|_| ())
}

/// `fchmod(fd, perm)`.
pub fn chmod_fd(fd: BorrowedFd<'_>, perm: u32) -> io::Result<()> {
    // SAFETY: `fd` is open for the duration of the call.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), perm as libc::mode_t) }).map(|_| ())
}

fn timespec(ns: i64) -> libc::timespec {
    libc::timespec { tv_sec: ns.div_euclid(1_000_000_000), tv_nsec: ns.rem_euclid(1_000_000_000) }
}

/// Sets access and modification times (ns since the epoch) of `name` in
/// `dir` without following a symlink; an empty `name` means `dir` itself.
pub fn set_times_at(dir: BorrowedFd<'_>, name: &[u8], atime_ns: i64, mtime_ns: i64) -> io::Result<()> {
    let c = c_string(if name.is_empty() { b"." } else { name })?;
    let times = [timespec(atime_ns), timespec(mtime_ns)];
    // SAFETY: `c` is NUL-terminated and `times` is an array of two timespecs
    // as utimensat requires; `dir` is open.
    check(unsafe { libc::utimensat(dir.as_raw_fd(), c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) }).map(|_| ())
}

/// Sets access and modification times of an open file.
pub fn set_times_fd(fd: BorrowedFd<'_>, atime_ns: i64, mtime_ns: i64) -> io::Result<()> {
    let times = [timespec(atime_ns), timespec(mtime_ns)];
    // SAFETY: `times` is an array of two timespecs; `fd` is open.
    check(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) }).map(|_| ())
}

/// `fsync` of a directory, so that a rename inside it is durable.
pub fn sync_dir(path: &std::path::Path) -> io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

#[cfg(test)]
mod tests {

    #[test]
    fn c_paths_are_nul_terminated_short_or_long_and_refuse_nul() {
        for n in [0usize, 1, 255, 256, 4000] {
            let p = vec![b'a'; n];
            let c = CPath::new(&p).unwrap();
            // SAFETY: CPath yields a NUL-terminated string valid while `c` lives.
            let back = unsafe { std::ffi::CStr::from_ptr(c.as_ptr()) };
            assert_eq!(back.to_bytes(), &p[..]);
        }
        assert!(CPath::new(b"a\0b").is_err());
        assert!(CPath::new(&[b'a'; 300].iter().chain(b"\0").copied().collect::<Vec<u8>>()).is_err());
    }
    use super::*;

    #[test]
    fn a_symlink_in_any_component_is_refused() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("real/sub")).unwrap();
        std::fs::write(d.path().join("real/sub/f"), b"x").unwrap();
        std::os::unix::fs::symlink("real", d.path().join("link")).unwrap();
        std::os::unix::fs::symlink("f", d.path().join("real/sub/flink")).unwrap();
        let root = std::fs::File::open(d.path()).unwrap();
        assert!(open_beneath(root.as_fd(), b"real/sub/f", libc::O_RDONLY, 0).is_ok());
        for rel in [&b"link/sub/f"[..], b"real/sub/flink", b"link"] {
            let e = open_beneath(root.as_fd(), rel, libc::O_RDONLY, 0).err();
            assert_eq!(e.and_then(|e| e.raw_os_error()), Some(libc::ELOOP), "{}", String::from_utf8_lossy(rel));
        }
        let e = open_dir_beneath(root.as_fd(), b"link/sub").err();
        assert_eq!(e.and_then(|e| e.raw_os_error()), Some(libc::ELOOP));
        // Creating through a symlinked directory is refused too.
        let e = open_beneath(root.as_fd(), b"link/new", libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600).err();
        assert_eq!(e.and_then(|e| e.raw_os_error()), Some(libc::ELOOP));
        assert!(!d.path().join("real/new").exists());
        // The fallback (as without openat2) refuses the same paths: ELOOP,
        // or ENOTDIR for a symlinked directory opened with O_DIRECTORY.
        // (Other tests running meanwhile take the fallback too: it is correct.)
        OPENAT2.store(2, Relaxed);
        let errors: Vec<Option<i32>> = [&b"link/sub/f"[..], b"real/sub/flink", b"link/new"]
            .iter()
            .map(|rel| open_beneath(root.as_fd(), rel, libc::O_RDONLY | libc::O_CREAT, 0o600).err().and_then(|e| e.raw_os_error()))
            .collect();
        let ok = open_beneath(root.as_fd(), b"real/sub/f", libc::O_RDONLY, 0).is_ok();
        OPENAT2.store(0, Relaxed);
        assert!(ok);
        assert_eq!(errors, [Some(libc::ENOTDIR), Some(libc::ELOOP), Some(libc::ENOTDIR)]);
        assert!(!d.path().join("real/new").exists());
    }

    #[test]
    fn long_relative_paths_open_component_by_component() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::File::open(d.path()).unwrap();
        let comp = vec![b'd'; 200];
        let mut rel = Vec::new();
        while rel.len() < 4000 {
            let parent = open_beneath(root.as_fd(), &rel, DIR_FLAGS, 0).unwrap();
            mkdir_at(parent.as_fd(), &comp, 0o755).unwrap();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(&comp);
        }
        let fd = open_beneath(root.as_fd(), &rel, DIR_FLAGS, 0).unwrap();
        assert_eq!(fstat(fd.as_fd()).unwrap().kind, InodeKind::Dir);
        assert!(read_dir_names(fd.as_fd()).unwrap().is_empty());
    }

    #[test]
    fn times_round_trip_with_nanoseconds_and_before_1970() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::File::open(d.path()).unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        set_times_at(root.as_fd(), b"f", -1_500_000_001, 1_700_000_000_123_456_789).unwrap();
        let st = lstat_at(root.as_fd(), b"f").unwrap();
        assert_eq!((st.atime_ns, st.mtime_ns), (-1_500_000_001, 1_700_000_000_123_456_789));
    }
}
