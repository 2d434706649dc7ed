//! Which trapped system calls are served by the hooks, and how.
//!
//! A file call (path or fd) goes to the exported hook of the same libc name,
//! which already decides prefix vs libc (its libc call runs inside libc's
//! range, so it does not trap again); its `-1` + errno becomes `-errno`.
//! Everything else is re-issued unchanged. Calls that cannot simply be
//! re-issued from inside a signal handler are adapted: fork-like clones
//! (our fork handlers run around them, the child is re-armed), thread-like
//! clones (a new stack would start the child inside this handler: ENOSYS),
//! and rt_sigreturn through the program's own restorer.

use super::{raw, signals};
use crate::hooks::{attr, cwd, dir, fd, inotify, meta, mknod, open, rename, socket, stat, unlink};
use libc::{c_char, c_int, c_uint, c_ulong, c_void, mode_t, off_t, size_t};

/// `-1` + errno (a hook's failure) to `-errno` (the kernel's).
#[inline]
fn sys(r: i64) -> i64 {
    if r == -1 {
        // SAFETY: errno is this thread's.
        -(unsafe { *libc::__errno_location() } as i64)
    } else {
        r
    }
}

/// Serves trapped call `nr`; `None` when the context was replaced (rax
/// must not be written).
///
/// # Safety
/// `nr` and `a` are the program's own trapped system call; the pointers in
/// `a` are whatever the program passed, with the kernel's contract.
pub unsafe fn call(nr: i64, a: [u64; 6], ip: usize, uc: &mut libc::ucontext_t) -> Option<i64> {
    // The dynamic loader's own calls (dlopen: openat, mmap, fstat, close)
    // never concern the mount: re-issue without entering any hook.
    if super::in_ldso(ip) {
        // SAFETY: the program's call, re-issued with the selector at ALLOW.
        return Some(unsafe { raw::syscall6(nr, a) });
    }
    // SAFETY (whole block): the program's own call and arguments; re-issued
    // with the selector at ALLOW, or adapted as each function says.
    let r = unsafe {
        match nr {
            libc::SYS_rt_sigaction => signals::raw_sigaction(a),
            libc::SYS_rt_sigprocmask => signals::raw_sigprocmask(a),
            libc::SYS_rt_sigreturn => {
                sigreturn(uc);
                return None;
            }
            libc::SYS_fork | libc::SYS_vfork => fork_like(libc::SYS_fork, [0; 6]),
            libc::SYS_clone => clone(a),
            libc::SYS_clone3 => clone3(a),
            _ => match file_call(nr, a) {
                Some(r) => r,
                None => raw::syscall6(nr, a),
            },
        }
    };
    Some(r)
}

/// A file system call served by the hook of the same name: its result (a
/// value or -errno), or `None` when `nr` is not one of them (or is openat2
/// outside the mount): the caller issues it itself. Also used by the
/// `syscall()` symbol hook (hooks/syscall.rs).
///
/// # Safety
/// `nr` and `a` are a system call and its arguments as the program passed
/// them, with the kernel's contract.
pub unsafe fn file_call(nr: i64, a: [u64; 6]) -> Option<i64> {
    let p = |k: usize| a[k] as *const c_char;
    let i = |k: usize| a[k] as c_int;
    // SAFETY (whole block): each hook gets the arguments of the system call
    // of the same name, whose kernel prototype matches the libc function's
    // (LP64: struct stat, statx, statfs and linux_dirent64 are the kernel's
    // layouts); the pointers are the program's, as it passed them.
    let r = unsafe {
        match nr {
            libc::SYS_open => sys(open::open(p(0), i(1), a[2] as mode_t) as i64),
            libc::SYS_creat => sys(open::creat(p(0), a[1] as mode_t) as i64),
            libc::SYS_openat => sys(open::openat(i(0), p(1), i(2), a[3] as mode_t) as i64),
            libc::SYS_openat2 => return openat2(a),
            libc::SYS_close => sys(fd::close(i(0)) as i64),
            libc::SYS_close_range => sys(fd::close_range(a[0] as c_uint, a[1] as c_uint, i(2)) as i64),
            libc::SYS_dup => sys(fd::dup(i(0)) as i64),
            libc::SYS_dup2 => sys(fd::dup2(i(0), i(1)) as i64),
            libc::SYS_dup3 => sys(fd::dup3(i(0), i(1), i(2)) as i64),
            libc::SYS_fcntl => sys(fd::fcntl(i(0), i(1), a[2] as c_ulong) as i64),
            libc::SYS_flock => sys(crate::hooks::lock::flock(i(0), i(1)) as i64),
            libc::SYS_lseek => sys(fd::lseek(i(0), a[1] as off_t, i(2))),
            libc::SYS_stat => sys(stat::stat(p(0), a[1] as *mut libc::stat) as i64),
            libc::SYS_lstat => sys(stat::lstat(p(0), a[1] as *mut libc::stat) as i64),
            libc::SYS_fstat => sys(stat::fstat(i(0), a[1] as *mut libc::stat) as i64),
            libc::SYS_newfstatat => sys(stat::fstatat(i(0), p(1), a[2] as *mut libc::stat, i(3)) as i64),
            libc::SYS_statx => sys(stat::statx(i(0), p(1), i(2), a[3] as c_uint, a[4] as *mut libc::statx) as i64),
            libc::SYS_access => sys(meta::access(p(0), i(1)) as i64),
            libc::SYS_faccessat => sys(meta::faccessat(i(0), p(1), i(2), 0) as i64),
            libc::SYS_faccessat2 => sys(meta::faccessat(i(0), p(1), i(2), i(3)) as i64),
            libc::SYS_readlink => sys(meta::readlink(p(0), a[1] as *mut c_char, a[2] as size_t) as i64),
            libc::SYS_readlinkat => sys(meta::readlinkat(i(0), p(1), a[2] as *mut c_char, a[3] as size_t) as i64),
            libc::SYS_getxattr => sys(meta::getxattr(p(0), p(1), a[2] as *mut c_void, a[3] as size_t) as i64),
            libc::SYS_lgetxattr => sys(meta::lgetxattr(p(0), p(1), a[2] as *mut c_void, a[3] as size_t) as i64),
            libc::SYS_listxattr => sys(meta::listxattr(p(0), a[1] as *mut c_char, a[2] as size_t) as i64),
            libc::SYS_llistxattr => sys(meta::llistxattr(p(0), a[1] as *mut c_char, a[2] as size_t) as i64),
            libc::SYS_statfs => sys(meta::statfs(p(0), a[1] as *mut libc::statfs) as i64),
            libc::SYS_fstatfs => sys(meta::fstatfs(i(0), a[1] as *mut libc::statfs) as i64),
            libc::SYS_getdents64 => sys(dir::getdents64(i(0), a[1] as *mut c_void, a[2] as size_t) as i64),
            libc::SYS_chdir => sys(cwd::chdir(p(0)) as i64),
            libc::SYS_fchdir => sys(cwd::fchdir(i(0)) as i64),
            libc::SYS_getcwd => getcwd(a),
            libc::SYS_truncate => sys(attr::truncate(p(0), a[1] as off_t) as i64),
            libc::SYS_rename => sys(rename::rename(p(0), p(1)) as i64),
            libc::SYS_renameat => sys(rename::renameat(i(0), p(1), i(2), p(3)) as i64),
            libc::SYS_renameat2 => sys(rename::renameat2(i(0), p(1), i(2), p(3), a[4] as c_uint) as i64),
            libc::SYS_unlink => sys(unlink::unlink(p(0)) as i64),
            libc::SYS_unlinkat => sys(unlink::unlinkat(i(0), p(1), i(2)) as i64),
            libc::SYS_mkdir => sys(mknod::mkdir(p(0), a[1] as mode_t) as i64),
            libc::SYS_mkdirat => sys(mknod::mkdirat(i(0), p(1), a[2] as mode_t) as i64),
            libc::SYS_rmdir => sys(unlink::rmdir(p(0)) as i64),
            libc::SYS_link => sys(rename::link(p(0), p(1)) as i64),
            libc::SYS_linkat => sys(rename::linkat(i(0), p(1), i(2), p(3), i(4)) as i64),
            libc::SYS_symlink => sys(mknod::symlink(p(0), p(1)) as i64),
            libc::SYS_symlinkat => sys(mknod::symlinkat(p(0), i(1), p(2)) as i64),
            libc::SYS_mknod => sys(mknod::mknod(p(0), a[1] as mode_t, a[2] as libc::dev_t) as i64),
            libc::SYS_mknodat => sys(mknod::mknodat(i(0), p(1), a[2] as mode_t, a[3] as libc::dev_t) as i64),
            // A unix socket address under the mount (Go's net package binds
            // and connects with raw calls); any other goes to the kernel.
            libc::SYS_bind => sys(socket::bind(i(0), a[1] as *const libc::sockaddr, a[2] as libc::socklen_t) as i64),
            libc::SYS_connect => sys(socket::connect(i(0), a[1] as *const libc::sockaddr, a[2] as libc::socklen_t) as i64),
            libc::SYS_sendto => sys(socket::sendto(i(0), a[1] as *const c_void, a[2] as size_t, i(3), a[4] as *const libc::sockaddr, a[5] as libc::socklen_t) as i64),
            libc::SYS_sendmsg => sys(socket::sendmsg(i(0), a[1] as *const libc::msghdr, i(2)) as i64),
            libc::SYS_chmod => sys(attr::chmod(p(0), a[1] as mode_t) as i64),
            libc::SYS_fchmod => sys(attr::fchmod(i(0), a[1] as mode_t) as i64),
            libc::SYS_fchmodat => sys(attr::fchmodat(i(0), p(1), a[2] as mode_t, 0) as i64),
            libc::SYS_chown => sys(attr::chown(p(0), a[1] as libc::uid_t, a[2] as libc::gid_t) as i64),
            libc::SYS_lchown => sys(attr::lchown(p(0), a[1] as libc::uid_t, a[2] as libc::gid_t) as i64),
            libc::SYS_fchown => sys(attr::fchown(i(0), a[1] as libc::uid_t, a[2] as libc::gid_t) as i64),
            libc::SYS_fchownat => sys(attr::fchownat(i(0), p(1), a[2] as libc::uid_t, a[3] as libc::gid_t, i(4)) as i64),
            libc::SYS_utimensat => sys(attr::utimensat(i(0), p(1), a[2] as *const libc::timespec, i(3)) as i64),
            libc::SYS_inotify_init => sys(inotify::inotify_init() as i64),
            libc::SYS_inotify_init1 => sys(inotify::inotify_init1(i(0)) as i64),
            libc::SYS_inotify_add_watch => sys(inotify::inotify_add_watch(i(0), p(1), a[2] as u32) as i64),
            libc::SYS_inotify_rm_watch => sys(inotify::inotify_rm_watch(i(0), i(1)) as i64),
            // Never fails; the library keeps the new mask (hooks/umask.rs).
            libc::SYS_umask => crate::hooks::umask::umask(a[0] as mode_t) as i64,
            // Issued by the caller as they are; only the page reuse of
            // crate::memfd_pool needs to know (hooks/zerocopy.rs).
            libc::SYS_sendfile | libc::SYS_splice => {
                let (from, to) = if nr == libc::SYS_sendfile { (1, 0) } else { (0, 2) };
                crate::ops::fd::pages_lent(i(from));
                return copied_first(i(to));
            }
            // Issued by the caller as they are, once an output fd they
            // change has its writable copy (crate::ops::lazy_copy).
            libc::SYS_write | libc::SYS_pwrite64 | libc::SYS_writev | libc::SYS_pwritev | libc::SYS_pwritev2
            | libc::SYS_ftruncate | libc::SYS_fallocate => return copied_first(i(0)),
            libc::SYS_copy_file_range => return copied_first(i(2)),
            libc::SYS_mmap if crate::hooks::bytes::maps_shared(i(3), i(4)) => return copied_first(i(4)),
            libc::SYS_vmsplice | libc::SYS_io_uring_setup => {
                crate::memfd_pool::turn_off();
                return None;
            }
            _ => return None,
        }
    };
    Some(r)
}

/// A call that changes `fd`'s file, issued by the caller (None) once a
/// lazy output fd has its copy; the copy's failure as -errno.
fn copied_first(fd: c_int) -> Option<i64> {
    match crate::ops::lazy_copy::before_write(fd) {
        Ok(()) => None,
        Err(e) => Some(-(e as i64)),
    }
}

/// openat2: under the mount it is openat with how.flags and how.mode
/// (`resolve` restrictions are not applied to virtual paths); elsewhere the
/// kernel's own call, unchanged.
unsafe fn openat2(a: [u64; 6]) -> Option<i64> {
    let (dirfd, path, how, size) = (a[0] as c_int, a[1] as *const c_char, a[2] as *const u64, a[3] as usize);
    // A path the program cannot read goes to the kernel, which answers EFAULT.
    if !crate::user_mem::cstr(path) {
        return None;
    }
    // SAFETY: path is the program's string, readable up to its NUL (checked above).
    let ours = unsafe { crate::paths::maybe_ours(dirfd, path) };
    if !ours || how.is_null() || size < 24 {
        return None;
    }
    // SAFETY: struct open_how starts with u64 flags, u64 mode (size >= 24).
    let (flags, mode) = unsafe { (how.read_unaligned(), how.add(1).read_unaligned()) };
    // SAFETY: the openat hook with the program's own arguments.
    Some(sys(unsafe { open::openat(dirfd, path, flags as c_int, mode as mode_t) } as i64))
}

/// getcwd(2) returns the length including the NUL, not the buffer.
unsafe fn getcwd(a: [u64; 6]) -> i64 {
    let (buf, size) = (a[0] as *mut c_char, a[1] as size_t);
    if buf.is_null() {
        return -(libc::EFAULT as i64);
    }
    // SAFETY: the program's buffer of `size` bytes.
    let r = unsafe { cwd::getcwd(buf, size) };
    if r.is_null() {
        return sys(-1);
    }
    // SAFETY: getcwd succeeded: buf holds a NUL-terminated path.
    (unsafe { libc::strlen(buf) } + 1) as i64
}

/// A raw fork: our locks are taken around it as pthread_atfork would, and
/// the child (which the kernel did not arm) is armed.
unsafe fn fork_like(nr: i64, a: [u64; 6]) -> i64 {
    crate::fork_prepare();
    // SAFETY: a fork-like call with no new stack: the child returns from this
    // handler on its copy of the stack, exactly like the parent.
    let r = unsafe { raw::syscall6(nr, a) };
    if r == 0 {
        // Arms the child too (the kernel did not).
        crate::fork_child();
    } else {
        crate::fork_parent();
    }
    r
}

/// clone(flags, stack, ...): without a new stack it is a fork (a shared
/// address space without a new stack, raw vfork's way, becomes a plain fork:
/// a child sharing this handler's stack frame would destroy it); with a new
/// stack the child would start inside this handler: refused with ENOSYS.
unsafe fn clone(mut a: [u64; 6]) -> i64 {
    if a[1] != 0 {
        return -(libc::ENOSYS as i64);
    }
    a[0] &= !((libc::CLONE_VM | libc::CLONE_VFORK) as u64);
    // SAFETY: as in fork_like.
    unsafe { fork_like(libc::SYS_clone, a) }
}

/// clone3(args, size): the same rules as clone, on a copy of the arguments.
unsafe fn clone3(a: [u64; 6]) -> i64 {
    let (args, size) = (a[0] as *const u8, a[1] as usize);
    // struct clone_args: flags at 0, stack at 40, stack_size at 48.
    if args.is_null() || !(64..=256).contains(&size) {
        return -(libc::EINVAL as i64);
    }
    let mut copy = [0u64; 32];
    // SAFETY: the program's struct of `size` bytes (<= 256 = copy's size).
    unsafe { std::ptr::copy_nonoverlapping(args, copy.as_mut_ptr() as *mut u8, size) };
    if copy[5] != 0 {
        return -(libc::ENOSYS as i64);
    }
    copy[0] &= !((libc::CLONE_VM | libc::CLONE_VFORK) as u64);
    let b = [copy.as_ptr() as u64, size as u64, 0, 0, 0, 0];
    // SAFETY: as in fork_like.
    unsafe { fork_like(libc::SYS_clone3, b) }
}

/// rt_sigreturn from the program's own restorer (Go sets one): its frame's
/// ucontext is at the trapped rsp. Copying the kernel's part of it (up to
/// and including the 8-byte signal mask) over ours makes our own return
/// restore the program's context, FP state pointer included.
fn sigreturn(uc: &mut libc::ucontext_t) {
    const KERNEL_PART: usize = std::mem::offset_of!(libc::ucontext_t, uc_sigmask) + 8;
    let theirs = uc.uc_mcontext.gregs[libc::REG_RSP as usize] as usize as *const u8;
    // SAFETY: the program's signal frame lies at its rsp (above this
    // handler's own frame, so the two do not overlap); we copy the kernel's
    // struct ucontext, which glibc's ucontext_t starts with.
    unsafe { std::ptr::copy_nonoverlapping(theirs, uc as *mut libc::ucontext_t as *mut u8, KERNEL_PART) };
}
