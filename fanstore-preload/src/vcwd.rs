//! The virtual cwd: after chdir("/fanstore/x") relative paths resolve
//! under its node ([`vcwd`], read by the prefix test and the classification
//! of `paths.rs`) and the real cwd moves to a stand-in directory, empty and
//! read-only, so a relative path that escapes the hooks (a raw syscall, a
//! child program) finds nothing instead of unrelated real files. A program
//! exec'd from a stand-in finds its virtual cwd again once its state is
//! loaded ([`recover`], run by the first look at the virtual cwd).

use crate::lookup::{self, RealDir};
use crate::state::{self, State};
use fanstore_core::path::MAX_PATH;
use libc::c_int;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Virtual cwd: 0 when the cwd is real, else directory node id + 1.
static VCWD: AtomicU64 = AtomicU64::new(0);
/// A virtual cwd inherited through exec was looked for ([`recover`]).
static RECOVERED: AtomicBool = AtomicBool::new(false);

/// The virtual cwd's node, if the cwd is virtual.
#[inline]
pub fn vcwd() -> Option<u32> {
    recovered();
    match VCWD.load(Ordering::Acquire) {
        0 => None,
        v => Some((v - 1) as u32),
    }
}

/// Sets the virtual cwd as it is (see [`replace_vcwd`] for a move).
pub fn set_vcwd(node: Option<u32>) {
    recovered();
    VCWD.store(node.map_or(0, |n| n as u64 + 1), Ordering::Release);
}

/// Before the virtual cwd is first read or set with a loaded state: the one
/// inherited through exec is restored. Until the state loads, this takes
/// no lock and allocates nothing.
#[inline]
fn recovered() {
    if !RECOVERED.load(Ordering::Acquire) {
        recover_once();
    }
}

#[cold]
fn recover_once() {
    // Library code: our own calls must not reach the hooks (getcwd reads
    // the virtual cwd outside the guard).
    let _g = crate::guard::Guard::enter();
    state::once_loaded(&RECOVERED, recover);
}

/// chdir into output directory `rel`: the virtual cwd holds a slot of its own
/// for the path (released when the cwd moves on).
/// Through symlinks: the cwd is the real directory (getcwd shows it).
pub fn enter_output(st: &State, rel: &[u8]) -> Result<c_int, c_int> {
    let real = match lookup::real_dir(st, rel)? {
        RealDir::Output(p) => p,
        RealDir::Input(n) => {
            enter(st, n.id());
            return Ok(0);
        }
    };
    let node = crate::outputs::track_dir(&real).ok_or(libc::EMFILE)?;
    enter(st, node);
    Ok(0)
}

/// `<local dir>/.client/cwd`: the parent of the cwd stand-ins.
fn cwd_root(st: &State) -> Vec<u8> {
    let mut p = st.local_dir.clone();
    p.push(b'/');
    p.extend_from_slice(state::CLIENT_DIR.as_bytes());
    p.extend_from_slice(b"/cwd");
    p
}

/// The real directory standing for virtual cwd `node`:
/// `<local dir>/.client/cwd/<dataset id>-<node>`, empty and read-only. A program
/// exec'd from here (a shell's child after `cd /fanstore/x`) finds its
/// virtual cwd again from its real one at initialisation.
/// For an output directory (`OUT_DIR` slot) the name is `<dataset id>-o<path in
/// hex>`, when that fits a file name (paths up to 120 bytes).
fn cwd_dir(st: &State, node: u32) -> Option<CString> {
    let mut p = cwd_root(st);
    let parent = CString::new(p.clone()).ok()?;
    if node & crate::outputs::OUT_DIR != 0 {
        let mut rel = [0u8; MAX_PATH];
        let n = crate::outputs::path_into(node, &mut rel)?;
        if n > 120 {
            return None;
        }
        p.extend_from_slice(format!("/{:016x}-o", st.dataset_id).as_bytes());
        for b in &rel[..n] {
            p.extend_from_slice(format!("{b:02x}").as_bytes());
        }
    } else {
        p.extend_from_slice(format!("/{:016x}-{node}", st.dataset_id).as_bytes());
    }
    let dir = CString::new(p).ok()?;
    // SAFETY: NUL-terminated paths; EEXIST is fine.
    unsafe {
        crate::real::mkdir(parent.as_ptr(), 0o700);
        // (0555: a program that drops root keeps this cwd and opens ".")
        crate::real::mkdir(dir.as_ptr(), 0o555);
    }
    Some(dir)
}

/// Makes `node` the virtual cwd and moves the real cwd to its stand-in
/// (or to the empty directory if that cannot be made).
pub fn enter(st: &State, node: u32) {
    let dir = cwd_dir(st, node);
    let p = dir.as_deref().unwrap_or(&st.empty_dir);
    // SAFETY: NUL-terminated path.
    if unsafe { crate::real::chdir(p.as_ptr()) } != 0 {
        // SAFETY: as above.
        unsafe { crate::real::chdir(st.empty_dir.as_ptr()) };
    }
    replace_vcwd(Some(node));
}

/// Moves the virtual cwd, releasing the output-directory slot of the old one.
pub fn replace_vcwd(node: Option<u32>) {
    let old = vcwd();
    set_vcwd(node);
    if let Some(o) = old.filter(|&o| o & crate::outputs::OUT_DIR != 0 && Some(o) != node) {
        crate::outputs::release_dir(o);
    }
}

/// Once the state is loaded: a real cwd that is one of our stand-ins restores the virtual cwd.
fn recover(st: &State) {
    let mut buf = [0u8; MAX_PATH];
    // SAFETY: buf is writable for its length.
    if unsafe { crate::real::getcwd(buf.as_mut_ptr().cast(), buf.len()) }.is_null() {
        return;
    }
    let cwd = &buf[..buf.iter().position(|&b| b == 0).unwrap_or(0)];
    let mut prefix = cwd_root(st);
    prefix.push(b'/');
    let Some(name) = cwd.strip_prefix(prefix.as_slice()) else { return };
    let Some((ds, node)) = std::str::from_utf8(name).ok().and_then(|s| s.split_once('-')) else { return };
    if let (Ok(ds), Some(hex)) = (u64::from_str_radix(ds, 16), node.strip_prefix('o')) {
        let rel: Option<Vec<u8>> =
            (0..hex.len() / 2).map(|i| hex.get(2 * i..2 * i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect();
        if let Some(rel) = rel.filter(|_| ds == st.dataset_id) {
            if enter_output(st, &rel).is_ok() {
                crate::dlog!("virtual cwd restored from the real cwd: output directory {}", crate::debug::B(&rel));
            }
        }
        return;
    }
    let (Ok(ds), Ok(node)) = (u64::from_str_radix(ds, 16), node.parse::<u32>()) else { return };
    if ds == st.dataset_id && st.view.node(node).is_some_and(|n| n.is_dir()) {
        replace_vcwd(Some(node));
        crate::dlog!("virtual cwd restored from the real cwd: node {}", node);
    }
}
