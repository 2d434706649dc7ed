//! The daemon's local partition copies, mapped read-only on first use.
//!
//! The daemon copies every partition its node holds to
//! `<local dir>/parts/part-NNNNNN.fsp` before it reports ready, and never
//! changes a copy while the job runs. A small file of such a partition is
//! served without a message to the daemon: its payload is read from the
//! mapping, verified, decompressed into a memfd (see `ops::open`). Each copy
//! is mapped at most once per process (a race maps twice and unmaps the
//! loser) and never unmapped; no fd stays open. Fork children inherit the
//! mappings.

use crate::state::State;
use std::sync::atomic::{AtomicPtr, Ordering};

/// One slot per partition: the mapping's address, null until mapped.
struct PartMaps {
    maps: Box<[AtomicPtr<u8>]>,
}

/// The slots, made for the state's partition count on first use (the state
/// is loaded once and never replaced); null until then, never freed.
static MAPS: AtomicPtr<PartMaps> = AtomicPtr::new(std::ptr::null_mut());

/// The slots, making them now if needed (a race makes two and drops the loser).
fn maps(st: &State) -> &'static PartMaps {
    let p = MAPS.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: published once below, never freed.
        return unsafe { &*p };
    }
    let n = st.view.partition_count() as usize;
    let fresh = Box::into_raw(Box::new(PartMaps { maps: (0..n).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect() }));
    match MAPS.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just published, never freed.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // SAFETY: `fresh` is our own allocation, never shared; `winner` is published and never freed.
            unsafe {
                drop(Box::from_raw(fresh));
                &*winner
            }
        }
    }
}

/// The bytes of partition `p`'s local copy (`len` bytes, from the index),
/// mapping it now if needed; None if it cannot be mapped.
pub fn partition(st: &State, p: u32, len: u64) -> Option<&'static [u8]> {
    let slot = maps(st).maps.get(p as usize)?;
    let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
    let mut addr = slot.load(Ordering::Acquire);
    if addr.is_null() {
        let fresh = map(st, p, len)?;
        match slot.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => addr = fresh,
            Err(winner) => {
                // SAFETY: `fresh` is our own mapping of `len` bytes, not yet shared.
                unsafe { libc::munmap(fresh.cast(), len) };
                addr = winner;
            }
        }
    }
    // SAFETY: addr is a read-only mapping of `len` bytes that is never unmapped.
    Some(unsafe { std::slice::from_raw_parts(addr, len) })
}

fn map(st: &State, p: u32, len: usize) -> Option<*mut u8> {
    use std::io::Write;
    let mut path = [0u8; 4200];
    let mut w = &mut path[..];
    w.write_all(&st.local_dir).ok()?;
    write!(w, "/parts/part-{p:06}.fsp\0").ok()?;
    // SAFETY: path is NUL-terminated (written above, or the write failed and we returned).
    let fd = unsafe { crate::real::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    let mut sb: libc::stat = unsafe_zeroed();
    // SAFETY: fd is open; sb is a valid out-pointer.
    let ok = unsafe { crate::real::fstat(fd, &mut sb) } == 0 && sb.st_size as u64 == len as u64;
    let addr = if ok {
        // SAFETY: a fresh read-only private mapping of `len` bytes of a file we hold open.
        unsafe { crate::real::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd, 0) }
    } else {
        libc::MAP_FAILED
    };
    // SAFETY: closing our own fd (the mapping stays valid).
    unsafe { crate::real::close(fd) };
    (addr != libc::MAP_FAILED).then_some(addr.cast())
}

fn unsafe_zeroed() -> libc::stat {
    // SAFETY: libc::stat is plain data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}
