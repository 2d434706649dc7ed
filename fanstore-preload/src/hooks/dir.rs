//! Directory streams and getdents64. A `DIR *` for a virtual directory is a
//! `VDir` (see ops/dirstream.rs); every stream function checks its magic first
//! and hands glibc's own streams to glibc untouched.

use super::{fd_hook, path_hook};
use crate::ops::dirstream::VDir;
use crate::guard::{self, catch};
use crate::ops::{self, Outcome, VPath};
use crate::real::{self, Compar, Filter};
use crate::state;
use libc::{c_char, c_int, c_long, c_void, dirent, dirent64, size_t, ssize_t, DIR};

fn vdir<'a>(d: *mut DIR) -> Option<&'a mut VDir> {
    // A bad pointer is glibc's stream, untouched.
    if !crate::user_mem::readable(d, 8) {
        return None;
    }
    // SAFETY: d is a live DIR * (stream function contract) with 8 readable
    // bytes (probed); when the magic matches it is a VDir we allocated and
    // nobody else aliases it.
    unsafe { VDir::is_ours(d as *const c_void).then(|| &mut *(d as *mut VDir)) }
}

fn next(d: &mut VDir) -> *mut dirent64 {
    let Some(st) = state::current() else { return std::ptr::null_mut() };
    catch(|| d.next(st).map_or(std::ptr::null_mut(), |e| e as *mut dirent64), std::ptr::null_mut())
}

fn readdir_r_common(d: &mut VDir, entry: *mut dirent64, result: *mut *mut dirent64) -> c_int {
    if !crate::user_mem::writable_one(entry) || !crate::user_mem::writable_one(result) {
        return libc::EFAULT;
    }
    let e = next(d);
    // SAFETY: entry has room for a full dirent, result is writable (probed).
    unsafe {
        if e.is_null() {
            *result = std::ptr::null_mut();
        } else {
            std::ptr::copy_nonoverlapping(e, entry, 1);
            *result = entry;
        }
    }
    0
}

/// scandir over a virtual directory: entries malloc'd one by one, the array
/// too (the caller frees both), filter and sort run as user code.
unsafe fn scandir_virtual(vp: &VPath, namelist: *mut *mut *mut dirent, filter: Filter, compar: Compar) -> Outcome<c_int> {
    if !crate::user_mem::writable_one(namelist) {
        return Outcome::Errno(libc::EFAULT);
    }
    let n = match ops::resolve(vp.st, vp.rel, true, true) {
        Ok(n) => n,
        Err(e) => return Outcome::Errno(e),
    };
    let mut list: Vec<*mut dirent> = Vec::new();
    let mut failed = false;
    ops::dir::for_each_entry(vp.st, n.id(), |e| {
        if failed {
            return;
        }
        let ep = e as *const dirent64 as *const dirent;
        // SAFETY: user filter called with a valid dirent, as scandir does.
        let keep = filter.is_none_or(|f| guard::outside(|| unsafe { f(ep) }) != 0);
        if keep {
            let len = e.d_reclen as usize;
            // SAFETY: allocate and copy `len` bytes of the record (len <= size_of dirent64).
            unsafe {
                let p = libc::malloc(len) as *mut u8;
                if p.is_null() {
                    failed = true;
                    return;
                }
                std::ptr::copy_nonoverlapping(e as *const dirent64 as *const u8, p, len);
                list.push(p as *mut dirent);
            }
        }
    });
    // SAFETY: an array of list.len() pointers, allocated with malloc as the caller will free() it.
    unsafe {
        let arr = libc::malloc(list.len().max(1) * std::mem::size_of::<*mut dirent>()) as *mut *mut dirent;
        if failed || arr.is_null() {
            for p in list {
                libc::free(p.cast());
            }
            libc::free(arr.cast());
            return Outcome::Errno(libc::ENOMEM);
        }
        std::ptr::copy_nonoverlapping(list.as_ptr(), arr, list.len());
        if let Some(c) = compar {
            let c: unsafe extern "C" fn(*const c_void, *const c_void) -> c_int = std::mem::transmute(c);
            guard::outside(|| libc::qsort(arr.cast(), list.len(), std::mem::size_of::<*mut dirent>(), Some(c)));
        }
        *namelist = arr;
    }
    Outcome::Handled(list.len() as c_int)
}

crate::hooks! {
    fn opendir(path: *const c_char) -> *mut DIR {
        path_hook("opendir", libc::AT_FDCWD, path, std::ptr::null_mut(),
            |vp| match ops::dir::opendir(vp) {
                Outcome::Handled(d) => Outcome::Handled(Box::into_raw(d) as *mut DIR),
                other => other.map_none(),
            },
            |p| real::opendir(p))
    }
    fn fdopendir(fd: c_int) -> *mut DIR {
        fd_hook("fdopendir", fd, std::ptr::null_mut(),
            |t| match ops::dir::fdopendir(fd, t) {
                Outcome::Handled(d) => Outcome::Handled(Box::into_raw(d) as *mut DIR),
                other => other.map_none(),
            },
            || real::fdopendir(fd))
    }
    fn readdir(d: *mut DIR) -> *mut dirent {
        match vdir(d) {
            Some(v) => next(v) as *mut dirent,
            None => real::readdir(d),
        }
    }
    fn readdir64(d: *mut DIR) -> *mut dirent64 {
        match vdir(d) {
            Some(v) => next(v),
            None => real::readdir64(d),
        }
    }
    fn readdir_r(d: *mut DIR, entry: *mut dirent, result: *mut *mut dirent) -> c_int {
        match vdir(d) {
            Some(v) => readdir_r_common(v, entry.cast(), result.cast()),
            None => real::readdir_r(d, entry, result),
        }
    }
    fn readdir64_r(d: *mut DIR, entry: *mut dirent64, result: *mut *mut dirent64) -> c_int {
        match vdir(d) {
            Some(v) => readdir_r_common(v, entry, result),
            None => real::readdir64_r(d, entry, result),
        }
    }
    fn closedir(d: *mut DIR) -> c_int {
        if vdir(d).is_some() {
            crate::dlog!("closedir(virtual)");
            return ops::dir::closedir(Box::from_raw(d as *mut VDir));
        }
        real::closedir(d)
    }
    fn rewinddir(d: *mut DIR) -> () {
        match vdir(d) {
            Some(v) => v.seek(0),
            None => real::rewinddir(d),
        }
    }
    fn seekdir(d: *mut DIR, loc: c_long) -> () {
        match vdir(d) {
            Some(v) => v.seek(loc.max(0) as u64),
            None => real::seekdir(d, loc),
        }
    }
    fn telldir(d: *mut DIR) -> c_long {
        match vdir(d) {
            Some(v) => v.pos as c_long,
            None => real::telldir(d),
        }
    }
    fn dirfd(d: *mut DIR) -> c_int {
        match vdir(d) {
            Some(v) => v.fd,
            None => real::dirfd(d),
        }
    }
    fn scandir(path: *const c_char, namelist: *mut *mut *mut dirent, filter: Filter, compar: Compar) -> c_int {
        path_hook("scandir", libc::AT_FDCWD, path, -1,
            |vp| scandir_virtual(vp, namelist, filter, compar),
            |p| real::scandir(p, namelist, filter, compar))
    }
    fn scandir64(path: *const c_char, namelist: *mut *mut *mut dirent, filter: Filter, compar: Compar) -> c_int {
        path_hook("scandir64", libc::AT_FDCWD, path, -1,
            |vp| scandir_virtual(vp, namelist, filter, compar),
            |p| real::scandir64(p, namelist, filter, compar))
    }
    fn scandirat(dirfd: c_int, path: *const c_char, namelist: *mut *mut *mut dirent, filter: Filter, compar: Compar) -> c_int {
        path_hook("scandirat", dirfd, path, -1,
            |vp| scandir_virtual(vp, namelist, filter, compar),
            |p| real::scandirat(dirfd, p, namelist, filter, compar))
    }
    fn scandirat64(dirfd: c_int, path: *const c_char, namelist: *mut *mut *mut dirent, filter: Filter, compar: Compar) -> c_int {
        path_hook("scandirat64", dirfd, path, -1,
            |vp| scandir_virtual(vp, namelist, filter, compar),
            |p| real::scandirat64(dirfd, p, namelist, filter, compar))
    }
    fn getdents64(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
        fd_hook("getdents64", fd, -1,
            |t| {
                // As the kernel: the entries that fit before the first
                // page that cannot be written, EFAULT when none does.
                let ok = crate::user_mem::writable_prefix(buf, count);
                // SAFETY: buf is writable for `ok` bytes (probed).
                let b = if ok == 0 { &mut [][..] } else { std::slice::from_raw_parts_mut(buf as *mut u8, ok) };
                match ops::dir::getdents64(fd, t, b) {
                    Outcome::Errno(libc::EINVAL) if ok < count => Outcome::Errno(libc::EFAULT),
                    other => other,
                }
            },
            || real::getdents64(fd, buf, count))
    }
}
