//! A hand-made dataset installed as the process state, for unit tests.
//!
//! ```text
//! /fst-unit                 (mount)
//!   a/            b.txt (5 bytes)  sub/  link -> b.txt  up -> ../c
//!   a/sub/x       (1 byte)
//!   c             (3 bytes)
//!   loop1 -> loop2, loop2 -> loop1, out -> /etc/passwd
//! ```

use crate::state::{install_for_test, State};
use fanstore_core::codec::Codec;
use fanstore_core::manifest::{BuildEntry, BuildKind, IndexView, ManifestBuilder, PartitionInfo, Verify};
use std::sync::Once;

pub const MOUNT: &[u8] = b"/fst-unit";

fn e(path: &str, kind: BuildKind, size: u64) -> BuildEntry {
    BuildEntry { path: path.into(), perm: 0o644, size, mtime_ns: 1_000_000_123, atime_ns: 0, ctime_ns: 0, kind }
}
fn file(path: &str, size: u64) -> BuildEntry {
    e(path, BuildKind::File { partition: 0, payload_offset: 0, stored_len: size, codec: Codec::None, checksum: 0, replicated: false }, size)
}
fn link(path: &str, target: &str) -> BuildEntry {
    e(path, BuildKind::Symlink { target: target.into() }, target.len() as u64)
}

pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut b = ManifestBuilder::new(7);
        b.add(e("a", BuildKind::Dir, 0));
        b.add(e("a/sub", BuildKind::Dir, 0));
        b.add(file("a/b.txt", 5));
        b.add(file("a/sub/x", 1));
        b.add(file("c", 3));
        b.add(link("a/link", "b.txt"));
        b.add(link("a/up", "../c"));
        b.add(link("loop1", "loop2"));
        b.add(link("loop2", "loop1"));
        b.add(link("out", "/etc/passwd"));
        b.add_partition(PartitionInfo { id: 0, flags: 0, file_len: 0, entry_count: 2, logical_bytes: 6, header_checksum: 0 });
        let bytes: &'static [u8] = Box::leak(b.finish().unwrap().into_boxed_slice());
        let view = IndexView::parse("unit".as_ref(), bytes, Verify::Full).unwrap();
        let st = State {
            view,
            rank: 0,
            dataset_id: 7,
            daemon_pid: 0,
            local_dir: b"/nonexistent".to_vec(),
            local_parts: vec![false],
            tiers: None,
            records: None,
            out_dir: Vec::new(),
            copy_dir: Vec::new(),
            flags: 0,
            sock_path: b"/nonexistent/sock".to_vec(),
            empty_dir: c"/".into(),
            empty_ino: 2,
            tmp_dir: c"/nonexistent".into(),
            uid: 0,
            gid: 0,
        };
        install_for_test(st, MOUNT);
    });
}
