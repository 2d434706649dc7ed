//! Outputs being written, carried across exec.
//!
//! An output is committed when its last fd in the process that tracks it
//! closes, or at that process's exit. exec replaces the process image and
//! with it the library's tables, while the fds stay open: bash runs
//! `cmd > /fanstore/out/log` by forking, opening the file in the child and
//! exec'ing `cmd`, which then wrote an unnamed file that nobody committed.
//!
//! So the exec hooks ([`crate::hooks::exec`]) put the outputs whose fds the
//! new image inherits into its environment, as one variable:
//!
//! ```text
//! FANSTORE_EXEC_OUTPUTS=<entry>;<entry>;...
//! entry = slot,fd,pid,excl,mode,dev,ino,path-in-hex
//! ```
//!
//! `slot` groups the fds of one output (`cmd > log 2>&1`), `pid` is the
//! process that created it (0: none of the new image's ancestors since the
//! last exec), `dev`/`ino` identify the file, so that an entry
//! that reached an unrelated process (through a program without the
//! library in between) names no other file of it. The library's
//! constructor in the new image adopts them and removes the variable.
//!
//! The new image commits each at its last close there. Its own (bash's
//! child opened it before the exec) as any output. Its parent's (a child
//! started by posix_spawn, or exec'd after vfork with the parent's file as
//! its stdout) late (COMMIT_LATE): the parent commits at its own last
//! close, maybe while the child still writes (`Popen(cmd, stdout=open(..))`
//! closes its file at once), and the daemon stores the child's commit as a
//! new version only if the current one came from this same file then;
//! a child that ends first leaves the whole file to its parent's commit.
//! An exec also closes the outputs whose fds are close-on-exec: those whose
//! last fd this was are committed first, as a close would.

use crate::fd_table::{self, Tracked};
use libc::c_int;
use std::io::Write;

/// The variable's name, with the `=`.
pub const VAR: &[u8] = b"FANSTORE_EXEC_OUTPUTS=";

/// An exec's new image keeps no more than this many bytes of entries (the
/// kernel refuses an environment string over 128 KiB).
const MAX_LEN: usize = 120 << 10;

fn file_id(fd: c_int) -> Option<(u64, u64)> {
    Some(crate::outputs::file_id(fd)).filter(|&f| f != (0, 0))
}

/// Before an exec (`exec`: this image ends) or a spawn (the caller goes on):
/// the variable, `NAME=value` and a NUL, for the new image's environment;
/// None when no output fd is inherited. An exec first commits the outputs
/// whose last fd it closes (close-on-exec).
pub fn entries(exec: bool) -> Option<Vec<u8>> {
    let max = crate::outputs::max_fd();
    if max < 0 || !fd_table::any() {
        return None;
    }
    let mut out = VAR.to_vec();
    let mut path = [0u8; fanstore_core::path::MAX_PATH];
    for fd in 0..=max.max(2) {
        let tracked = match fd_table::get(fd) {
            Some(Tracked::Output(idx)) => Some(idx),
            // A vfork child (Python's subprocess) dup2s an output onto its
            // stdin, stdout or stderr without tracking the copy (the tables
            // are its parent's, [`fd_table::borrowed`]) and may close the
            // original: such an fd is the output whose file it is.
            None if fd <= 2 => None,
            _ => continue,
        };
        // SAFETY: fcntl query on an fd number; no pointers.
        let flags = unsafe { crate::real::fcntl(fd, libc::F_GETFD, 0) };
        if flags < 0 {
            continue;
        }
        let idx = match tracked {
            Some(idx) => idx,
            None if flags & libc::FD_CLOEXEC == 0 => match file_id(fd).and_then(crate::outputs::slot_of_file) {
                Some(idx) => idx,
                None => continue,
            },
            None => continue,
        };
        if flags & libc::FD_CLOEXEC != 0 {
            if exec {
                let _g = crate::guard::Guard::enter();
                let _ = crate::outputs::closing(fd, idx);
            }
            continue;
        }
        // An fd still waiting for its copy (the exec hook copies them all
        // first, except in a vfork child): passed on as the read-only fd it
        // is, never as an output (the new image would commit the committed
        // file itself).
        if fd_table::is_lazy(fd) {
            continue;
        }
        let (Some((pid, excl, mode)), Some(n), Some((dev, ino))) = (crate::outputs::slot_info(idx), crate::outputs::path_into(idx, &mut path), file_id(fd)) else {
            continue;
        };
        let start = out.len();
        let _ = write!(out, "{idx},{fd},{pid},{},{mode},{dev},{ino},", u8::from(excl));
        for b in &path[..n] {
            let _ = write!(out, "{b:02x}");
        }
        out.push(b';');
        if out.len() > MAX_LEN {
            crate::debug::emit(format_args!("exec: too many outputs open to carry over; {} is not", crate::debug::B(&path[..n])));
            out.truncate(start);
            break;
        }
    }
    if out.len() == VAR.len() {
        return None;
    }
    out.push(0);
    Some(out)
}

/// One entry of the variable.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    slot: u32,
    fd: c_int,
    pid: i32,
    excl: bool,
    mode: u32,
    dev: u64,
    ino: u64,
    path: Vec<u8>,
}

fn parse(e: &[u8]) -> Option<Entry> {
    let f: Vec<&[u8]> = e.splitn(8, |&c| c == b',').collect();
    let num = |i: usize| std::str::from_utf8(f.get(i)?).ok()?.parse::<u64>().ok();
    let hex = f.get(7)?;
    if hex.len() % 2 != 0 || hex.is_empty() {
        return None;
    }
    let path = hex
        .chunks(2)
        .map(|c| std::str::from_utf8(c).ok().and_then(|s| u8::from_str_radix(s, 16).ok()))
        .collect::<Option<Vec<u8>>>()?;
    Some(Entry {
        slot: u32::try_from(num(0)?).ok()?,
        fd: c_int::try_from(num(1)?).ok()?,
        pid: i32::try_from(num(2)?).ok()?,
        excl: num(3)? != 0,
        mode: u32::try_from(num(4)?).ok()?,
        dev: num(5)?,
        ino: num(6)?,
        path,
    })
}

/// In the constructor: adopts the outputs an exec carried over, and removes
/// the variable from the environment (children get it from the exec hooks).
pub fn adopt_inherited() {
    let name = c"FANSTORE_EXEC_OUTPUTS";
    // SAFETY: getenv with a NUL-terminated name; the value is copied before
    // the environment changes.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return;
    }
    // SAFETY: getenv returned a NUL-terminated string.
    let value = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes().to_vec();
    // SAFETY: unsetenv with a NUL-terminated name.
    unsafe { libc::unsetenv(name.as_ptr()) };
    let mut slots: Vec<(u32, u32)> = Vec::new();
    for e in value.split(|&c| c == b';').filter(|e| !e.is_empty()).filter_map(parse) {
        // (No log here: FANSTORE_DEBUG is read later, at the first call.)
        if file_id(e.fd) != Some((e.dev, e.ino)) || fd_table::get(e.fd).is_some() {
            continue;
        }
        match slots.iter().find(|(old, _)| *old == e.slot) {
            Some(&(_, new)) => {
                if fd_table::set(e.fd, Tracked::Output(new)) {
                    crate::outputs::add_ref(e.fd, new);
                }
            }
            None => {
                if let Some(new) = crate::outputs::adopt(e.fd, &e.path, e.excl, e.mode, e.pid) {
                    slots.push((e.slot, new));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_and_a_damaged_one_is_skipped() {
        let e = parse(b"3,1,4242,1,33188,2049,123456,6f75742f6c6f67").expect("entry");
        assert_eq!(e, Entry { slot: 3, fd: 1, pid: 4242, excl: true, mode: 33188, dev: 2049, ino: 123456, path: b"out/log".to_vec() });
        assert_eq!(parse(b"3,1,4242,1,33188,2049,123456,6f7"), None, "odd hex");
        assert_eq!(parse(b"3,1,4242,1,33188,2049,123456,zz"), None, "not hex");
        assert_eq!(parse(b"3,1,4242,1,33188,2049,123456"), None, "no path");
        assert_eq!(parse(b"3,-1,4242,1,33188,2049,123456,61"), None, "negative fd");
        assert_eq!(parse(b"x,1,4242,1,33188,2049,123456,61"), None, "not a number");
    }
}
