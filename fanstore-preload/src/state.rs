//! Lazy initialisation: configuration from the environment, the daemon's
//! node state, and the shared-memory index mapped read-only.
//!
//! Nothing happens at load time. The first hooked call (with the thread's
//! guard held, so our own file reads go straight to libc) reads the
//! environment and tries to load the state; a process that starts before its
//! daemon is ready retries at most once a second, and only when it touches a
//! path under the mount. Everything built here is leaked: it lives as long
//! as the process and is shared read-only by all threads (and by fork
//! children, which inherit it).

use crate::lock::Locked;
use fanstore_core::manifest::{IndexView, Verify};
use fanstore_core::runtime::{self, NodeState, Status};
use fanstore_core::record_table::RecordView;
use fanstore_core::tiers::{self, TierView};
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// The default mount prefix.
pub const DEFAULT_MOUNT: &[u8] = b"/fanstore";

/// Settings read once from the environment.
pub struct Config {
    pub rt: PathBuf,
    pub mount_env: Option<Vec<u8>>,
    pub node: Option<u32>,
    /// Socket send/receive timeout for each daemon exchange.
    pub timeout_ms: u64,
}

/// The mount prefix, normalised (absolute, no trailing '/').
pub struct Mount {
    pub path: Vec<u8>,
}

impl Mount {
    /// The mount without its leading '/' (empty for "/").
    #[inline]
    pub fn tail(&self) -> &[u8] {
        &self.path[1..]
    }
}

/// Everything a loaded client knows about its daemon and dataset.
pub struct State {
    pub view: IndexView<'static>,
    pub rank: u32,
    pub dataset_id: u64,
    pub daemon_pid: u64,
    pub local_dir: Vec<u8>,
    pub local_parts: Vec<bool>,
    /// Which files this node can open directly ([`fanstore_core::tiers`]);
    /// None if the map could not be used (every open then asks the daemon).
    pub tiers: Option<TierView<'static>>,
    /// The records of outputs the daemon owns ([`fanstore_core::record_table`]);
    /// None if the table could not be used (every output lookup then asks the daemon).
    pub records: Option<RecordView<'static>>,
    /// `<local dir>/out/`, where this node's outputs are held (an output
    /// whose record names this rank as holder is `out_dir` + its id).
    pub out_dir: Vec<u8>,
    /// The daemon's copy directory (files of tier `TIER_COPY`).
    pub copy_dir: Vec<u8>,
    /// The daemon's NodeState flags (`fanstore_core::runtime::FLAG_*`).
    pub flags: u32,
    pub sock_path: Vec<u8>,
    /// A real, empty, read-only directory: the real fd behind every virtual directory fd.
    pub empty_dir: CString,
    /// Where new outputs are made as unnamed files (O_TMPFILE needs write
    /// permission on the directory): `<local dir>/.client/tmp`.
    pub tmp_dir: CString,
    pub empty_ino: u64,
    pub uid: u32,
    pub gid: u32,
}

static INIT: Locked<()> = Locked::new(());
static INIT_DONE: AtomicBool = AtomicBool::new(false);
static CONFIG: AtomicPtr<Config> = AtomicPtr::new(std::ptr::null_mut());
static MOUNT: AtomicPtr<Mount> = AtomicPtr::new(std::ptr::null_mut());
static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());
static LAST_TRY_MS: AtomicU64 = AtomicU64::new(0);

/// Fork prepare: no thread may be half-way through initialisation.
pub fn fork_lock() {
    INIT.lock();
}
pub fn fork_unlock() {
    INIT.unlock();
}

fn now_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

fn env(name: &CStr) -> Option<Vec<u8>> {
    // SAFETY: name is NUL-terminated; getenv returns null or a NUL-terminated
    // string that we copy at once.
    unsafe {
        let p = libc::getenv(name.as_ptr());
        (!p.is_null()).then(|| CStr::from_ptr(p).to_bytes().to_vec())
    }
}

fn normalise_mount(m: &[u8]) -> Option<Vec<u8>> {
    if m.first() != Some(&b'/') {
        return None;
    }
    let mut buf = vec![0u8; m.len() + 2];
    let n = fanstore_core::path::normalize_into(b"/", m, &mut buf)?;
    buf.truncate(n.len);
    Some(buf)
}

fn set_mount(path: Vec<u8>) {
    let new = Box::into_raw(Box::new(Mount { path }));
    // The old value is leaked on purpose: another thread may still read it.
    MOUNT.store(new, Ordering::Release);
}

/// Reads the environment and makes the first attempt to load the state.
#[inline]
pub fn ensure_init() {
    if !INIT_DONE.load(Ordering::Acquire) && !IN_INIT.with(|f| f.get()) {
        init_slow();
    }
}

thread_local! {
    /// This thread is initialising: nested calls must not take INIT again.
    static IN_INIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cold]
fn init_slow() {
    // SAFETY: errno is thread-local; we restore it so that the call that
    // triggered initialisation sees the errno it would have seen.
    let saved = unsafe { *libc::__errno_location() };
    INIT.lock();
    IN_INIT.with(|f| f.set(true));
    if !INIT_DONE.load(Ordering::Acquire) {
        let debug = env(c"FANSTORE_DEBUG").is_some_and(|v| !v.is_empty() && v != b"0");
        crate::debug::set_enabled(debug);
        let mount_env = env(c"FANSTORE_MOUNT").and_then(|m| normalise_mount(&m));
        let cfg = Config {
            rt: env(c"FANSTORE_RUNTIME_DIR")
                .map(|v| PathBuf::from(std::ffi::OsStr::from_bytes(&v)))
                .unwrap_or_else(runtime::runtime_dir),
            node: env(c"FANSTORE_NODE").and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok()),
            timeout_ms: env(c"FANSTORE_TIMEOUT_MS")
                .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok())
                .unwrap_or(5000),
            mount_env: mount_env.clone(),
        };
        set_mount(mount_env.unwrap_or_else(|| DEFAULT_MOUNT.to_vec()));
        CONFIG.store(Box::into_raw(Box::new(cfg)), Ordering::Release);
        if debug {
            crate::real::report_symbols();
        }
        load_locked();
        INIT_DONE.store(true, Ordering::Release);
    }
    IN_INIT.with(|f| f.set(false));
    INIT.unlock();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// Called with INIT held: one attempt to find and map the daemon's index.
fn load_locked() {
    LAST_TRY_MS.store(now_ms(), Ordering::Relaxed);
    // SAFETY: CONFIG is set before the first call and never freed.
    let Some(cfg) = (unsafe { CONFIG.load(Ordering::Acquire).as_ref() }) else { return };
    match load(cfg) {
        Ok(st) => {
            if cfg.mount_env.is_none() {
                if let Some(m) = st.1 {
                    set_mount(m);
                }
            }
            let st = Box::into_raw(Box::new(st.0));
            STATE.store(st, Ordering::Release);
            // SAFETY: just stored, never freed.
            let s = unsafe { &*st };
            crate::dlog!(
                "index mapped: rank {} dataset {:016x} nodes {} mount {} socket {}",
                s.rank,
                s.dataset_id,
                s.view.node_count(),
                crate::debug::B(&mount_raw().path),
                crate::debug::B(&s.sock_path)
            );
        }
        Err(e) => crate::dlog!("no index yet ({}): paths under the mount give ENOENT", e),
    }
}

fn load(cfg: &Config) -> Result<(State, Option<Vec<u8>>), String> {
    let ns = match cfg.node {
        Some(k) => {
            let p = runtime::state_path(&cfg.rt, k);
            NodeState::read(&p).map_err(|e| format!("FANSTORE_NODE={k}: {e}"))?
        }
        None => {
            let host = runtime::hostname();
            runtime::list_states(&cfg.rt)
                .into_iter()
                .find(|s| s.status == Status::Ready && s.hostname == host)
                .ok_or_else(|| format!("no ready daemon for this host in {}", cfg.rt.display()))?
        }
    };
    if ns.status != Status::Ready {
        return Err(format!("daemon rank {} is {:?}", ns.rank, ns.status));
    }
    let ipath = Path::new(std::ffi::OsStr::from_bytes(&ns.index_path));
    let f = std::fs::File::open(ipath).map_err(|e| format!("{}: {e}", ipath.display()))?;
    let len = f.metadata().map_err(|e| format!("{}: {e}", ipath.display()))?.len() as usize;
    if len == 0 {
        return Err(format!("{}: empty index", ipath.display()));
    }
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh read-only shared mapping of a file we hold open; the
    // daemon publishes the index once and never modifies it in place.
    let p = unsafe { crate::real::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return Err(format!("{}: mmap failed", ipath.display()));
    }
    // SAFETY: the mapping is `len` readable bytes and is never unmapped.
    let bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
    let view = IndexView::parse(ipath, bytes, Verify::Header).map_err(|e| e.to_string())?;
    if view.dataset_id() != ns.dataset_id {
        return Err(format!("index dataset {:x} differs from daemon's {:x}", view.dataset_id(), ns.dataset_id));
    }
    let tiers = map_tiers(&ns.index_path, view.dataset_id(), u64::from(view.node_count()));
    let records = map_records(&ns.index_path, ns.rank);
    let out_dir = [&ns.local_dir[..], b"/out/"].concat();
    let client_dir = Path::new(std::ffi::OsStr::from_bytes(&ns.local_dir)).join(CLIENT_DIR);
    let (empty_dir, empty_ino) = make_empty_dir(&client_dir)?;
    let tmp_dir = make_tmp_dir(&client_dir);
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mount = if ns.mount.is_empty() { None } else { normalise_mount(&ns.mount) };
    let sock = runtime::socket_path(&cfg.rt, ns.rank);
    let st = State {
        view,
        rank: ns.rank,
        dataset_id: ns.dataset_id,
        daemon_pid: ns.pid,
        local_dir: ns.local_dir,
        local_parts: ns.local_partitions,
        tiers,
        records,
        out_dir,
        copy_dir: tiers::copy_dir(&ns.index_path),
        flags: ns.flags,
        sock_path: sock.as_os_str().as_bytes().to_vec(),
        empty_dir,
        empty_ino,
        tmp_dir,
        uid,
        gid,
    };
    Ok((st, mount))
}

/// Maps the daemon's record table read-only (never unmapped); None, with a
/// debug line, if it is missing or damaged.
fn map_records(index_path: &[u8], rank: u32) -> Option<RecordView<'static>> {
    let p = fanstore_core::record_table::table_path(index_path);
    let path = Path::new(std::ffi::OsStr::from_bytes(&p));
    let bytes = map_shared(path, "record table", "every output lookup asks the daemon")?;
    match RecordView::parse(bytes, rank) {
        Ok(v) => Some(v),
        Err(e) => {
            crate::dlog!("{}: {}: every output lookup asks the daemon", path.display(), e);
            None
        }
    }
}

/// Maps the daemon's tier map read-only (never unmapped); None, with a debug
/// line, if it is missing or does not match the index.
fn map_tiers(index_path: &[u8], dataset_id: u64, nodes: u64) -> Option<TierView<'static>> {
    let p = tiers::tier_map_path(index_path);
    let path = Path::new(std::ffi::OsStr::from_bytes(&p));
    let bytes = map_shared(path, "tier map", "every open asks the daemon")?;
    match TierView::parse(bytes, dataset_id, nodes) {
        Ok(v) => Some(v),
        Err(e) => {
            crate::dlog!("{}: {}: every open asks the daemon", path.display(), e);
            None
        }
    }
}

/// A read-only shared mapping of the whole of `path` (a file of the daemon
/// that it never resizes and changes only through atomics), never
/// unmapped; None, with a debug line, if it cannot be mapped.
fn map_shared(path: &Path, what: &str, fallback: &str) -> Option<&'static [u8]> {
    use std::os::fd::AsRawFd;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => {
            crate::dlog!("no {what} {} ({}): {fallback}", path.display(), e);
            return None;
        }
    };
    let len = f.metadata().ok()?.len() as usize;
    if len == 0 {
        return None;
    }
    // SAFETY: a fresh read-only shared mapping of a file we hold open; the
    // daemon never resizes it and changes its bytes only atomically.
    let m = unsafe { crate::real::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
    if m == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the mapping is `len` readable bytes and is never unmapped.
    Some(unsafe { std::slice::from_raw_parts(m as *const u8, len) })
}

/// Where clients keep their stand-in directories: inside the rank's local
/// directory, which the daemon removes (recursively) when it stops.
pub const CLIENT_DIR: &str = ".client";

/// `<client dir>/tmp`, made 0700 if missing (a daemon run by root makes it
/// 01777 for every user), for new outputs' unnamed files: the read-only
/// empty directory refuses O_TMPFILE to anyone but root.
fn make_tmp_dir(client_dir: &Path) -> CString {
    use std::os::unix::fs::DirBuilderExt;
    let d = client_dir.join("tmp");
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&d);
    CString::new(d.as_os_str().as_bytes()).unwrap_or_default()
}

fn make_empty_dir(client_dir: &Path) -> Result<(CString, u64), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let _ = std::fs::DirBuilder::new().mode(0o700).create(client_dir);
    let candidates = [client_dir.join("empty"), std::env::temp_dir().join(format!("fanstore-empty-{uid}"))];
    for d in candidates {
        // Readable by every user (a root daemon serves them all): an empty
        // directory, the real fd behind every virtual directory fd.
        let _ = std::fs::DirBuilder::new().mode(0o555).create(&d);
        if let Ok(m) = std::fs::metadata(&d) {
            if m.is_dir() {
                let c = CString::new(d.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
                return Ok((c, m.ino()));
            }
        }
    }
    Err("cannot create an empty directory for virtual directory fds".into())
}

fn mount_raw() -> &'static Mount {
    // SAFETY: set before any state is loaded, never freed.
    unsafe { &*MOUNT.load(Ordering::Acquire) }
}

/// The mount prefix (initialising on first use).
#[inline]
pub fn mount() -> &'static Mount {
    ensure_init();
    // SAFETY: set during initialisation, never freed (replaced values leak).
    unsafe { &*MOUNT.load(Ordering::Acquire) }
}

/// The loaded state, retrying the load at most once a second while absent.
pub fn state() -> Option<&'static State> {
    ensure_init();
    let p = STATE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: published once, never freed.
        return Some(unsafe { &*p });
    }
    if now_ms().saturating_sub(LAST_TRY_MS.load(Ordering::Relaxed)) < 1000 {
        return None;
    }
    if IN_INIT.with(|f| f.get()) {
        return None;
    }
    INIT.lock();
    IN_INIT.with(|f| f.set(true));
    if STATE.load(Ordering::Acquire).is_null() {
        load_locked();
    }
    IN_INIT.with(|f| f.set(false));
    INIT.unlock();
    // SAFETY: as above.
    unsafe { STATE.load(Ordering::Acquire).as_ref() }
}

/// The state if already loaded (no initialisation, no retry).
#[inline]
pub fn current() -> Option<&'static State> {
    // SAFETY: published once, never freed.
    unsafe { STATE.load(Ordering::Acquire).as_ref() }
}

/// Runs `f` once per process with the loaded state: the first time this is
/// called after the state is loaded, with the initialisation lock held as
/// initialisation itself holds it (so never beside initialisation, another
/// such `f` or a fork), keeping the caller's errno. `done` records that `f`
/// ran. Nothing happens while no state is loaded, nor in a call nested in
/// initialisation or in an `f` (the caller then sees things as they are).
/// The upper floors' own set-up from the state (the virtual cwd inherited
/// through exec, `vcwd.rs`) runs through this, so this module calls nothing above it.
pub fn once_loaded(done: &AtomicBool, f: impl FnOnce(&'static State)) {
    if done.load(Ordering::Acquire) {
        return;
    }
    let Some(st) = current() else { return };
    if IN_INIT.with(|f| f.get()) {
        return;
    }
    // SAFETY: errno is thread-local; restored below, as init_slow does.
    let saved = unsafe { *libc::__errno_location() };
    INIT.lock();
    IN_INIT.with(|f| f.set(true));
    if !done.load(Ordering::Acquire) {
        f(st);
        done.store(true, Ordering::Release);
    }
    IN_INIT.with(|f| f.set(false));
    INIT.unlock();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

pub fn config() -> Option<&'static Config> {
    // SAFETY: published once, never freed.
    unsafe { CONFIG.load(Ordering::Acquire).as_ref() }
}

/// Installs a state directly (unit tests).
#[cfg(test)]
pub fn install_for_test(st: State, mount_path: &[u8]) {
    INIT.lock();
    INIT_DONE.store(true, Ordering::Release);
    set_mount(mount_path.to_vec());
    STATE.store(Box::into_raw(Box::new(st)), Ordering::Release);
    INIT.unlock();
}
