//! The daemon as a single-node MPI singleton (no launcher): load, index,
//! NodeState, and every wire op, against a dataset built in the test.

use fanstore_core::codec::Compression;
use fanstore_core::manifest::{IndexView, NodeKind, Verify};
use fanstore_core::runtime::{self, NodeState, Status};
use fanstore_core::wire::{self, op, Reply, Request};
use fanstore_daemon::testkit::{self, TestFile};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn connect(path: &Path) -> OwnedFd {
    // SAFETY: plain socket creation, checked below.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(raw >= 0);
    // SAFETY: raw is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: zeroed sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as _;
    for (d, s) in addr.sun_path.iter_mut().zip(path.as_os_str().as_encoded_bytes()) {
        *d = *s as _;
    }
    // SAFETY: addr is a valid sockaddr_un.
    let r = unsafe { libc::connect(fd.as_raw_fd(), &addr as *const _ as *const _, std::mem::size_of_val(&addr) as _) };
    assert_eq!(r, 0, "connect {}: {}", path.display(), std::io::Error::last_os_error());
    fd
}

fn call(fd: &OwnedFd, req: &Request) -> (Reply, Option<OwnedFd>) {
    wire::send_msg(fd.as_raw_fd(), &req.encode(), None).unwrap();
    let mut buf = vec![0u8; wire::MAX_MESSAGE];
    let (n, f) = wire::recv_msg(fd.as_raw_fd(), &mut buf).unwrap();
    (Reply::decode(&buf[..n]).unwrap(), f)
}

struct Daemon(Child);
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_ready(rt: &Path) -> NodeState {
    let t = Instant::now();
    loop {
        if let Ok(s) = NodeState::read(&runtime::state_path(rt, 0)) {
            if s.status == Status::Ready {
                return s;
            }
            assert_ne!(s.status, Status::Failed);
        }
        assert!(t.elapsed() < Duration::from_secs(60), "daemon not ready");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn singleton_serves_every_file_and_stops_clean() {
    let tmp = tempfile::Builder::new().prefix("fsd").tempdir_in("/tmp").unwrap();
    let data = tmp.path().join("ds");
    let mut files = Vec::new();
    for (i, size) in [0usize, 1, 100, 4096, 100_000, 3 << 20].iter().enumerate() {
        files.push(TestFile { path: format!("a/f{i}.bin"), bytes: testkit::pattern(*size, i as u64) });
    }
    files.push(TestFile { path: "zeros".into(), bytes: vec![0u8; 1 << 20] });
    files.push(TestFile { path: "val/x".into(), bytes: testkit::pattern(5000, 99) });
    testkit::build(&data, 0xfeed, &files, 3, Compression::parse("zstd").unwrap(), Some("val"));
    let rt = tmp.path().join("rt");
    let local = tmp.path().join("local");
    let child = Command::new(env!("CARGO_BIN_EXE_fanstore-daemon"))
        .args(["--data", data.to_str().unwrap(), "--local", local.to_str().unwrap()])
        .args(["--runtime-dir", rt.to_str().unwrap(), "--cache-mem", "2M"])
        .env_remove("PMI_RANK")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut d = Daemon(child);
    let st = wait_ready(&rt);
    assert_eq!((st.rank, st.nranks, st.dataset_id), (0, 1, 0xfeed));
    assert!(st.local_partitions.iter().all(|&b| b));
    // Private to the daemon's user; open to every uid when root runs it
    // (it then serves them all, with their permission checks).
    let every = fanstore_daemon::caller::serves_every_user();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&rt), if every { 0o755 } else { 0o700 });
    let sock = runtime::socket_path(&rt, 0);
    assert_eq!(mode(&sock), if every { 0o666 } else { 0o600 });
    let index_path = std::path::PathBuf::from(String::from_utf8(st.index_path.clone()).unwrap());
    assert_eq!(mode(&index_path), if every { 0o644 } else { 0o600 });
    let index = std::fs::read(&index_path).unwrap();
    let view = IndexView::parse(&index_path, &index, Verify::Full).unwrap();

    let c = connect(&sock);
    let (r, _) = call(&c, &Request::new(op::PING, 1, 0, 0));
    assert_eq!((r.errno, r.id), (0, 1));
    for (i, f) in files.iter().enumerate() {
        let n = view.lookup(f.path.as_bytes()).unwrap();
        for round in 0..2 {
            let (r, fd) = call(&c, &Request::new(op::OPEN, i as u64, n.id() as u64, 0xfeed));
            assert_eq!(r.errno, 0, "{}", f.path);
            assert_eq!(r.flags & wire::FLAG_FD, wire::FLAG_FD);
            let mut got = Vec::new();
            let mut file = std::fs::File::from(fd.unwrap());
            use std::os::unix::fs::FileExt;
            got.resize(f.bytes.len() + 1, 0);
            let k = file.read_at(&mut got, 0).unwrap();
            let mut rest = Vec::new();
            if k < f.bytes.len() {
                got.truncate(k);
                let mut off = k as u64;
                loop {
                    let mut b = vec![0u8; 1 << 20];
                    let m = file.read_at(&mut b, off).unwrap();
                    if m == 0 {
                        break;
                    }
                    rest.extend_from_slice(&b[..m]);
                    off += m as u64;
                }
            } else {
                got.truncate(k);
            }
            got.extend_from_slice(&rest);
            assert_eq!(got.len(), f.bytes.len(), "{} round {round}", f.path);
            assert!(got == f.bytes, "{} round {round}", f.path);
            let _ = file.read(&mut [0u8; 1]);
        }
    }
    // Errors: a directory, a bad id, a stale dataset id.
    let dir = view.lookup(b"a").unwrap();
    assert_eq!(dir.kind(), Some(NodeKind::Dir));
    assert_eq!(call(&c, &Request::new(op::OPEN, 2, dir.id() as u64, 0xfeed)).0.errno, libc::ENOENT);
    assert_eq!(call(&c, &Request::new(op::OPEN, 3, 1 << 40, 0xfeed)).0.errno, libc::ENOENT);
    assert_eq!(call(&c, &Request::new(op::OPEN, 4, 1, 0xbad)).0.errno, libc::ESTALE);
    assert_eq!(call(&c, &Request::new(99, 5, 0, 0)).0.errno, libc::EINVAL);
    let (r, _) = call(&c, &Request::new(op::STATUS, 6, 0, 0));
    let text = String::from_utf8(r.payload).unwrap();
    assert!(text.contains("status=ready") && text.contains("partitions=4"), "{text}");

    let (r, _) = call(&c, &Request::new(op::STOP, 7, 0, 0));
    assert_eq!(r.errno, 0);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = d.0.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "daemon did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    assert!(!index_path.exists(), "shm index left behind");
    assert!(!rt.exists(), "runtime dir left behind");
    assert!(!local.exists(), "local dir left behind");
}
