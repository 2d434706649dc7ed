//! The original libc functions of every hooked symbol, for library code
//! and for the hooks themselves: never call a hooked name through `libc::`
//! from inside the library (it would resolve to our hook). Each original
//! is resolved lazily with `dlsym(RTLD_NEXT)` (a [`Slot`]); one that libc
//! lacks fails with ENOSYS.
//!
//! The list below is the one list of hooked symbols, grouped as the files
//! of `crate::hooks` are (one family each). `hooks!` checks at compile
//! time that each hook has an original here with its very prototype, and a
//! unit test there that each family here is exactly a hook file's.

use crate::debug::B;
use crate::errno::set_errno;
use libc::{
    c_char, c_int, c_long, c_uint, c_ulong, c_void, dev_t, dirent, dirent64, gid_t, loff_t, mode_t, off64_t, off_t, pid_t,
    pthread_attr_t, pthread_t, sighandler_t, sigset_t, size_t, ssize_t, uid_t, DIR, FILE,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The lazily resolved address of one original libc function.
pub struct Slot {
    name: &'static str,
    ptr: AtomicUsize,
}

const MISSING: usize = 1;

impl Slot {
    pub const fn new(name_nul: &'static str) -> Slot {
        Slot { name: name_nul, ptr: AtomicUsize::new(0) }
    }

    pub fn name(&self) -> &'static str {
        self.name.trim_end_matches('\0')
    }

    #[inline]
    pub fn get(&self) -> Option<usize> {
        match self.ptr.load(Ordering::Relaxed) {
            0 => self.resolve(),
            MISSING => None,
            p => Some(p),
        }
    }

    #[cold]
    fn resolve(&self) -> Option<usize> {
        // SAFETY: name is NUL-terminated; dlsym/dlvsym only read it.
        let mut p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr().cast()) } as usize;
        if p == 0 {
            // Compat-only symbols (no default version) are invisible to dlsym.
            // SAFETY: as above, both strings are NUL-terminated.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, self.name.as_ptr().cast(), c"GLIBC_2.2.5".as_ptr()) } as usize;
        }
        if p == 0 {
            self.ptr.store(MISSING, Ordering::Relaxed);
            crate::debug::emit(format_args!("libc has no symbol {}: calls to it fail with ENOSYS", self.name()));
            None
        } else {
            self.ptr.store(p, Ordering::Relaxed);
            Some(p)
        }
    }

    /// Resolved (or known missing) without logging: for the debug report.
    fn probe(&self) -> bool {
        if self.ptr.load(Ordering::Relaxed) == 0 {
            // SAFETY: as in resolve.
            let mut p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr().cast()) } as usize;
            if p == 0 {
                // SAFETY: as in resolve.
                p = unsafe { libc::dlvsym(libc::RTLD_NEXT, self.name.as_ptr().cast(), c"GLIBC_2.2.5".as_ptr()) } as usize;
            }
            self.ptr.store(if p == 0 { MISSING } else { p }, Ordering::Relaxed);
        }
        self.ptr.load(Ordering::Relaxed) != MISSING
    }
}

/// What an original returns when libc lacks it: failure with ENOSYS.
pub trait Missing {
    fn missing() -> Self;
}

fn enosys() {
    set_errno(libc::ENOSYS);
}

macro_rules! missing_int {
    ($($t:ty),*) => {$(
        impl Missing for $t {
            fn missing() -> $t {
                enosys();
                -1
            }
        }
    )*};
}
missing_int!(i32, i64, isize);

/// `mode_t` (umask, which cannot fail): the mask glibc's default would be.
impl Missing for u32 {
    fn missing() -> u32 {
        enosys();
        0o022
    }
}

/// `sighandler_t`: SIG_ERR.
impl Missing for usize {
    fn missing() -> usize {
        enosys();
        libc::SIG_ERR
    }
}

impl<T> Missing for *mut T {
    fn missing() -> *mut T {
        enosys();
        std::ptr::null_mut()
    }
}
impl Missing for () {
    fn missing() {
        enosys();
    }
}

/// Declares the originals: a slot each (`slot::name`), a function of the
/// same name and C prototype calling libc's definition, and the families
/// for the FANSTORE_DEBUG report.
macro_rules! originals {
    ($(
        $family:ident {
            $( fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty; )*
        }
    )*) => {
        /// Where each original's address is kept once resolved.
        #[allow(non_upper_case_globals)]
        pub mod slot {
            use super::Slot;
            $($( pub static $name: Slot = Slot::new(concat!(stringify!($name), "\0")); )*)*
        }

        $($(
            #[allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
            #[inline]
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                match slot::$name.get() {
                    Some(p) => {
                        // SAFETY: p is the address dlsym returned for the libc
                        // symbol of this name, whose C prototype is this signature.
                        let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(p) };
                        // SAFETY: arguments forwarded under the caller's contract.
                        unsafe { f($($arg),*) }
                    }
                    None => <$ret as Missing>::missing(),
                }
            }
        )*)*

        /// Each family's originals (one file of `crate::hooks` each).
        pub static FAMILIES: &[(&str, &[&Slot])] = &[$( (stringify!($family), &[$(&slot::$name),*]) ),*];
    };
}

// C types of the prototypes below that the libc crate lacks.

/// scandir's filter and comparison functions.
pub type Filter = Option<unsafe extern "C" fn(*const dirent) -> c_int>;
pub type Compar = Option<unsafe extern "C" fn(*mut *const dirent, *mut *const dirent) -> c_int>;

/// glibc's glob_t, including the GLOB_ALTDIRFUNC members.
#[repr(C)]
pub struct GlobT {
    pub gl_pathc: size_t,
    pub gl_pathv: *mut *mut c_char,
    pub gl_offs: size_t,
    pub gl_flags: c_int,
    pub gl_closedir: Option<unsafe extern "C" fn(*mut c_void)>,
    pub gl_readdir: Option<unsafe extern "C" fn(*mut c_void) -> *mut dirent>,
    pub gl_opendir: Option<unsafe extern "C" fn(*const c_char) -> *mut c_void>,
    pub gl_lstat: Option<unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int>,
    pub gl_stat: Option<unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int>,
}

/// glob's error callback.
pub type ErrFunc = Option<unsafe extern "C" fn(*const c_char, c_int) -> c_int>;

/// struct FTW, nftw's fourth callback argument.
#[repr(C)]
pub struct Ftw {
    pub base: c_int,
    pub level: c_int,
}

pub type NftwFn = unsafe extern "C" fn(*const c_char, *const libc::stat, c_int, *mut Ftw) -> c_int;
pub type FtwFn = unsafe extern "C" fn(*const c_char, *const libc::stat, c_int) -> c_int;

originals! {
    open {
        fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
        fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
        fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
        fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
        fn __open_2(path: *const c_char, flags: c_int) -> c_int;
        fn __open64_2(path: *const c_char, flags: c_int) -> c_int;
        fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
        fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
        fn creat(path: *const c_char, mode: mode_t) -> c_int;
        fn creat64(path: *const c_char, mode: mode_t) -> c_int;
    }
    stdio {
        fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE;
        fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE;
        fn freopen(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE;
        fn freopen64(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE;
        fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE;
        fn fclose(stream: *mut FILE) -> c_int;
    }
    stat {
        fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int;
        fn stat64(path: *const c_char, buf: *mut libc::stat) -> c_int;
        fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int;
        fn lstat64(path: *const c_char, buf: *mut libc::stat) -> c_int;
        fn fstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int;
        fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int;
        fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int;
        fn fstat64(fd: c_int, buf: *mut libc::stat) -> c_int;
        fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut libc::statx) -> c_int;
        fn __xstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int;
        fn __xstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int;
        fn __lxstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int;
        fn __lxstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int;
        fn __fxstat(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int;
        fn __fxstat64(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int;
        fn __fxstatat(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int;
        fn __fxstatat64(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int;
    }
    meta {
        fn access(path: *const c_char, mode: c_int) -> c_int;
        fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int;
        fn euidaccess(path: *const c_char, mode: c_int) -> c_int;
        fn eaccess(path: *const c_char, mode: c_int) -> c_int;
        fn readlink(path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t;
        fn readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t;
        fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char;
        fn canonicalize_file_name(path: *const c_char) -> *mut c_char;
        fn getxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
        fn lgetxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
        fn fgetxattr(fd: c_int, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
        fn listxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t;
        fn llistxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t;
        fn flistxattr(fd: c_int, list: *mut c_char, size: size_t) -> ssize_t;
        fn statfs(path: *const c_char, buf: *mut libc::statfs) -> c_int;
        fn statfs64(path: *const c_char, buf: *mut libc::statfs) -> c_int;
        fn fstatfs(fd: c_int, buf: *mut libc::statfs) -> c_int;
        fn fstatfs64(fd: c_int, buf: *mut libc::statfs) -> c_int;
        fn statvfs(path: *const c_char, buf: *mut libc::statvfs) -> c_int;
        fn statvfs64(path: *const c_char, buf: *mut libc::statvfs) -> c_int;
        fn fstatvfs(fd: c_int, buf: *mut libc::statvfs) -> c_int;
        fn fstatvfs64(fd: c_int, buf: *mut libc::statvfs) -> c_int;
    }
    dir {
        fn opendir(path: *const c_char) -> *mut DIR;
        fn fdopendir(fd: c_int) -> *mut DIR;
        fn readdir(d: *mut DIR) -> *mut dirent;
        fn readdir64(d: *mut DIR) -> *mut dirent64;
        fn readdir_r(d: *mut DIR, entry: *mut dirent, result: *mut *mut dirent) -> c_int;
        fn readdir64_r(d: *mut DIR, entry: *mut dirent64, result: *mut *mut dirent64) -> c_int;
        fn closedir(d: *mut DIR) -> c_int;
        fn rewinddir(d: *mut DIR) -> ();
        fn seekdir(d: *mut DIR, loc: c_long) -> ();
        fn telldir(d: *mut DIR) -> c_long;
        fn dirfd(d: *mut DIR) -> c_int;
        fn scandir(path: *const c_char, namelist: *mut *mut *mut dirent, filter: Filter, compar: Compar) -> c_int;
        fn scandir64(path: *const c_char, namelist: *mut *mut *mut dirent, filter: Filter, compar: Compar) -> c_int;
        fn scandirat(dirfd: c_int, path: *const c_char, namelist: *mut *mut *mut dirent, filter: Filter, compar: Compar) -> c_int;
        fn scandirat64(dirfd: c_int, path: *const c_char, namelist: *mut *mut *mut dirent, filter: Filter, compar: Compar) -> c_int;
        fn getdents64(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t;
    }
    cwd {
        fn chdir(path: *const c_char) -> c_int;
        fn fchdir(fd: c_int) -> c_int;
        fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char;
        fn get_current_dir_name() -> *mut c_char;
    }
    fd {
        fn close(fd: c_int) -> c_int;
        fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
        fn closefrom(lowfd: c_int) -> ();
        fn dup(fd: c_int) -> c_int;
        fn dup2(old: c_int, new: c_int) -> c_int;
        fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
        fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
        fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t;
        fn lseek64(fd: c_int, off: off_t, whence: c_int) -> off_t;
        fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
    }
    lock {
        fn flock(fd: c_int, op: c_int) -> c_int;
        fn lockf(fd: c_int, cmd: c_int, len: off_t) -> c_int;
        fn lockf64(fd: c_int, cmd: c_int, len: off_t) -> c_int;
    }
    attr {
        fn truncate(path: *const c_char, len: off_t) -> c_int;
        fn truncate64(path: *const c_char, len: off_t) -> c_int;
        fn chmod(path: *const c_char, mode: mode_t) -> c_int;
        fn fchmod(fd: c_int, mode: mode_t) -> c_int;
        fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int;
        fn chown(path: *const c_char, uid: uid_t, gid: gid_t) -> c_int;
        fn lchown(path: *const c_char, uid: uid_t, gid: gid_t) -> c_int;
        fn fchown(fd: c_int, uid: uid_t, gid: gid_t) -> c_int;
        fn fchownat(dirfd: c_int, path: *const c_char, uid: uid_t, gid: gid_t, flags: c_int) -> c_int;
        fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int;
        fn utimes(path: *const c_char, times: *const libc::timeval) -> c_int;
        fn lutimes(path: *const c_char, times: *const libc::timeval) -> c_int;
        fn futimesat(dirfd: c_int, path: *const c_char, times: *const libc::timeval) -> c_int;
        fn utimensat(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int;
        fn futimens(fd: c_int, times: *const libc::timespec) -> c_int;
    }
    xattr {
        fn setxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
        fn lsetxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
        fn fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
        fn removexattr(path: *const c_char, name: *const c_char) -> c_int;
        fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int;
        fn fremovexattr(fd: c_int, name: *const c_char) -> c_int;
    }
    unlink {
        fn unlink(path: *const c_char) -> c_int;
        fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
        fn rmdir(path: *const c_char) -> c_int;
        fn remove(path: *const c_char) -> c_int;
    }
    mknod {
        fn mkdir(path: *const c_char, mode: mode_t) -> c_int;
        fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
        fn mknod(path: *const c_char, mode: mode_t, dev: dev_t) -> c_int;
        fn mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: dev_t) -> c_int;
        fn mkfifo(path: *const c_char, mode: mode_t) -> c_int;
        fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
        fn symlink(target: *const c_char, linkpath: *const c_char) -> c_int;
        fn symlinkat(target: *const c_char, dirfd: c_int, linkpath: *const c_char) -> c_int;
    }
    rename {
        fn rename(old: *const c_char, new: *const c_char) -> c_int;
        fn renameat(d1: c_int, old: *const c_char, d2: c_int, new: *const c_char) -> c_int;
        fn renameat2(d1: c_int, old: *const c_char, d2: c_int, new: *const c_char, flags: c_uint) -> c_int;
        fn link(old: *const c_char, new: *const c_char) -> c_int;
        fn linkat(d1: c_int, old: *const c_char, d2: c_int, new: *const c_char, flags: c_int) -> c_int;
    }
    tempname {
        fn mkstemp(template: *mut c_char) -> c_int;
        fn mkstemp64(template: *mut c_char) -> c_int;
        fn mkostemp(template: *mut c_char, flags: c_int) -> c_int;
        fn mkostemp64(template: *mut c_char, flags: c_int) -> c_int;
        fn mkstemps(template: *mut c_char, suffixlen: c_int) -> c_int;
        fn mkstemps64(template: *mut c_char, suffixlen: c_int) -> c_int;
        fn mkostemps(template: *mut c_char, suffixlen: c_int, flags: c_int) -> c_int;
        fn mkostemps64(template: *mut c_char, suffixlen: c_int, flags: c_int) -> c_int;
        fn mkdtemp(template: *mut c_char) -> *mut c_char;
    }
    exec {
        fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
        fn execv(path: *const c_char, argv: *const *const c_char) -> c_int;
        fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
        fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
        fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
        fn posix_spawn(pid: *mut pid_t, path: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
        fn posix_spawnp(pid: *mut pid_t, file: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
        fn _exit(status: c_int) -> ();
        fn _Exit(status: c_int) -> ();
    }
    walk {
        fn glob(pattern: *const c_char, flags: c_int, errfunc: ErrFunc, g: *mut GlobT) -> c_int;
        fn glob64(pattern: *const c_char, flags: c_int, errfunc: ErrFunc, g: *mut GlobT) -> c_int;
        fn nftw(path: *const c_char, f: Option<NftwFn>, nopenfd: c_int, flags: c_int) -> c_int;
        fn nftw64(path: *const c_char, f: Option<NftwFn>, nopenfd: c_int, flags: c_int) -> c_int;
        fn ftw(path: *const c_char, f: Option<FtwFn>, nopenfd: c_int) -> c_int;
        fn ftw64(path: *const c_char, f: Option<FtwFn>, nopenfd: c_int) -> c_int;
    }
    thread {
        fn pthread_create(thread: *mut pthread_t, attr: *const pthread_attr_t, routine: *mut c_void, arg: *mut c_void) -> c_int;
    }
    signal {
        fn sigaction(sig: c_int, act: *const libc::sigaction, oact: *mut libc::sigaction) -> c_int;
        fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t;
        fn bsd_signal(sig: c_int, handler: sighandler_t) -> sighandler_t;
        fn sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t;
        fn __sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t;
        fn sigprocmask(how: c_int, set: *const sigset_t, oset: *mut sigset_t) -> c_int;
        fn pthread_sigmask(how: c_int, set: *const sigset_t, oset: *mut sigset_t) -> c_int;
    }
    syscall {
        fn syscall(nr: c_long, a1: c_long, a2: c_long, a3: c_long, a4: c_long, a5: c_long, a6: c_long) -> c_long;
    }
    inotify {
        fn inotify_init() -> c_int;
        fn inotify_init1(flags: c_int) -> c_int;
        fn inotify_add_watch(fd: c_int, path: *const c_char, mask: u32) -> c_int;
        fn inotify_rm_watch(fd: c_int, wd: c_int) -> c_int;
    }
    umask {
        fn umask(mask: mode_t) -> mode_t;
    }
    socket {
        fn bind(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int;
        fn connect(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int;
        fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> ssize_t;
        fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t;
    }
    zerocopy {
        fn sendfile(out_fd: c_int, in_fd: c_int, offset: *mut off_t, count: size_t) -> ssize_t;
        fn sendfile64(out_fd: c_int, in_fd: c_int, offset: *mut off64_t, count: size_t) -> ssize_t;
        fn splice(fd_in: c_int, off_in: *mut loff_t, fd_out: c_int, off_out: *mut loff_t, len: size_t, flags: c_uint) -> ssize_t;
        fn vmsplice(fd: c_int, iov: *const libc::iovec, nr_segs: size_t, flags: c_uint) -> ssize_t;
        fn copy_file_range(fd_in: c_int, off_in: *mut loff_t, fd_out: c_int, off_out: *mut loff_t, len: size_t, flags: c_uint) -> ssize_t;
    }
    bytes {
        fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t;
        fn pwrite(fd: c_int, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t;
        fn pwrite64(fd: c_int, buf: *const c_void, count: size_t, offset: off64_t) -> ssize_t;
        fn writev(fd: c_int, iov: *const libc::iovec, iovcnt: c_int) -> ssize_t;
        fn pwritev(fd: c_int, iov: *const libc::iovec, iovcnt: c_int, offset: off_t) -> ssize_t;
        fn pwritev64(fd: c_int, iov: *const libc::iovec, iovcnt: c_int, offset: off64_t) -> ssize_t;
        fn pwritev2(fd: c_int, iov: *const libc::iovec, iovcnt: c_int, offset: off_t, flags: c_int) -> ssize_t;
        fn pwritev64v2(fd: c_int, iov: *const libc::iovec, iovcnt: c_int, offset: off64_t, flags: c_int) -> ssize_t;
        fn ftruncate(fd: c_int, length: off_t) -> c_int;
        fn ftruncate64(fd: c_int, length: off64_t) -> c_int;
        fn fallocate(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int;
        fn fallocate64(fd: c_int, mode: c_int, offset: off64_t, len: off64_t) -> c_int;
        fn posix_fallocate(fd: c_int, offset: off_t, len: off_t) -> c_int;
        fn posix_fallocate64(fd: c_int, offset: off64_t, len: off64_t) -> c_int;
        fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: off_t) -> *mut c_void;
        fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: off64_t) -> *mut c_void;
    }
}

/// FANSTORE_DEBUG=1: which symbols this library hooks and whether each original resolved.
pub fn report_symbols() {
    for (fam, slots) in FAMILIES {
        let mut line = [0u8; 900];
        let mut len = 0;
        let mut missing = 0;
        for s in slots.iter() {
            let ok = s.probe();
            if !ok {
                missing += 1;
            }
            for part in [s.name().as_bytes(), if ok { b" " } else { b"(MISSING) " }] {
                let n = part.len().min(line.len() - len);
                line[len..len + n].copy_from_slice(&part[..n]);
                len += n;
            }
        }
        crate::debug::emit(format_args!("hooked {fam} [{} symbols, {missing} missing]: {}", slots.len(), B(&line[..len])));
    }
}
