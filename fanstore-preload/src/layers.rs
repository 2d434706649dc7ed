//! The layering rule, checked on the crate's own sources (`cargo test`).
//!
//! Floors, each importing only its own and the ones below:
//! - entry: `lib.rs` (the constructor, the fork handlers), `hooks/` (the
//!   exported libc symbols) and `sud/` (raw system calls trapped by
//!   syscall user dispatch, served through the same hooks): the ways in;
//! - `ops/`: the safe logic, answering with an `Outcome`, itself in tiers
//!   of its own ([`OPS`]), bottom up:
//!   - shared: `mod.rs` (`Outcome`, the lookups every module uses) and
//!     what inputs and outputs share (`attr.rs`: the device number, statx,
//!     `Attr`; `open_base.rs`: `wants_write`, the fd of an input directory);
//!   - output names: `namespace.rs` (the daemon's answers about outputs);
//!   - output bytes: `out.rs` (opening, creating, truncating outputs),
//!     `special.rs` (FIFOs and unix sockets: their real objects);
//!   - dispatchers: `open.rs`, `stat.rs`, `write.rs` (an input's answer,
//!     else the output modules');
//!   - calls: every other family (directories, fds, stdio, walks...);
//! - ground: every other file, in floors of its own ([`GROUND`]), bottom up:
//!   - base: what needs no process state (the originals in `real.rs`,
//!     errno, the re-entrancy guard and `catch`, debug logging, the lock,
//!     raw syscalls, the fd table, the probes of the program's pointers);
//!   - state: `state.rs`, lazy initialisation and the index mapping, which
//!     knows nothing above it (the virtual cwd sets itself up through
//!     `state::once_loaded`);
//!   - daemon: what a loaded state reaches (the daemon client and its
//!     memfd pool, the local partition copies, the O_EXCL markers, the
//!     decode hints);
//!   - names: names the index does not hold (lookups through the daemon,
//!     the outputs being written, those carried across exec);
//!   - cwd: the virtual cwd (`vcwd.rs`);
//!   - paths: the classification of paths (`paths.rs`, which resolves ".."
//!     through the lookups and reads the virtual cwd) and the file locks.
//!
//! A reference is any `crate::name` in code (a `use` or a path, grouped
//! `use crate::{a, b}` included, and `super::` that reaches the crate
//! root); comments and literals are skipped. `name` is a module (its file's floor), a
//! `#[macro_export]` macro (the floor of the file defining it), or an item
//! of the crate root (entry). A file that names something above its floor
//! fails the test, unless listed in [`EXCEPTIONS`]; so does a ground file
//! missing from [`GROUND`].
//!
//! Within `ops/`, a reference is `super::name` (outside inline modules)
//! or `crate::ops::name` in a file of ops/, and in `ops/mod.rs` any
//! `name::` path, `name` being a file of ops/: a file naming one of a
//! higher tier fails, and so does an ops file missing from [`OPS`].

use std::path::Path;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Floor {
    Base,
    State,
    Daemon,
    Names,
    Cwd,
    Paths,
    Ops,
    Entry,
}

/// The floor of every ground file (a top-level file other than lib.rs).
const GROUND: &[(&str, Floor)] = &[
    ("debug.rs", Floor::Base),
    ("errno.rs", Floor::Base),
    ("fd_table.rs", Floor::Base),
    ("guard.rs", Floor::Base),
    ("layers.rs", Floor::Base),
    ("lock.rs", Floor::Base),
    ("real.rs", Floor::Base),
    ("unhooked.rs", Floor::Base),
    ("user_mem.rs", Floor::Base),
    ("state.rs", Floor::State),
    ("client.rs", Floor::Daemon),
    ("memfd_pool.rs", Floor::Daemon),
    ("parts.rs", Floor::Daemon),
    ("pending.rs", Floor::Daemon),
    ("warm.rs", Floor::Daemon),
    ("exec_outputs.rs", Floor::Names),
    ("lookup.rs", Floor::Names),
    ("outputs.rs", Floor::Names),
    ("vcwd.rs", Floor::Cwd),
    ("locks.rs", Floor::Paths),
    ("paths.rs", Floor::Paths),
];

/// The tiers of `ops/`, bottom up (see the module comment).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum OpsTier {
    Shared,
    OutNames,
    OutBytes,
    Dispatch,
    Calls,
}

/// The tier of every file under ops/.
const OPS: &[(&str, OpsTier)] = &[
    ("mod.rs", OpsTier::Shared),
    ("attr.rs", OpsTier::Shared),
    ("open_base.rs", OpsTier::Shared),
    ("namespace.rs", OpsTier::OutNames),
    ("out.rs", OpsTier::OutBytes),
    ("out_file.rs", OpsTier::OutBytes),
    ("lazy_copy.rs", OpsTier::OutBytes),
    ("special.rs", OpsTier::OutBytes),
    ("open.rs", OpsTier::Dispatch),
    ("stat.rs", OpsTier::Dispatch),
    ("write.rs", OpsTier::Dispatch),
    ("cwd.rs", OpsTier::Calls),
    ("dir.rs", OpsTier::Calls),
    ("dirstream.rs", OpsTier::Calls),
    ("fd.rs", OpsTier::Calls),
    ("inotify.rs", OpsTier::Calls),
    ("lock.rs", OpsTier::Calls),
    ("meta.rs", OpsTier::Calls),
    ("stdio.rs", OpsTier::Calls),
    ("tempname.rs", OpsTier::Calls),
    ("testing.rs", OpsTier::Calls),
    ("walk.rs", OpsTier::Calls),
];

/// The tier of a file under src/ (None: not in ops/, or not in [`OPS`]).
fn ops_tier(rel: &str) -> Option<OpsTier> {
    let name = rel.strip_prefix("ops/")?;
    OPS.iter().find(|(f, _)| *f == name).map(|&(_, t)| t)
}

/// (file under src/, name it may reach above its floor, why). None today.
const EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// The floor of a source file, by its path under src/ (a ground file
/// missing from [`GROUND`] is on the base floor; a test requires the entry).
fn floor_of_file(rel: &str) -> Floor {
    if rel == "lib.rs" || rel.starts_with("hooks/") || rel.starts_with("sud/") {
        Floor::Entry
    } else if rel.starts_with("ops/") {
        Floor::Ops
    } else {
        GROUND.iter().find(|(f, _)| *f == rel).map_or(Floor::Base, |&(_, fl)| fl)
    }
}

struct Source {
    rel: String,
    /// The text with comments blanked out.
    code: String,
}

fn read_sources(dir: &Path, base: &Path, out: &mut Vec<Source>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("src/ is readable").flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            read_sources(&p, base, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&p).expect("a source file is readable");
            let rel = p.strip_prefix(base).expect("under src/").to_string_lossy().into_owned();
            out.push(Source { rel, code: code_only(&text) });
        }
    }
}

/// `text` as code only: `//` and `/* */` comments removed, the contents
/// of string and character literals blanked (lines are kept).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |c: u8| if c == b'\n' { b'\n' } else { b' ' };
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    out.push(blank(b[i]));
                    i += 1;
                }
                i += 2;
            }
            b'"' => {
                out.push(b'"');
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    let n = if b[i] == b'\\' { 2 } else { 1 };
                    for &c in &b[i..(i + n).min(b.len())] {
                        out.push(blank(c));
                    }
                    i += n;
                }
                out.push(b'"');
                i += 1;
            }
            b'\'' => {
                // A character literal ('x', '\n', '\u{..}'), or a lifetime.
                let end = if b.get(i + 1) == Some(&b'\\') {
                    b[i + 2..].iter().position(|&c| c == b'\'').map(|k| i + 2 + k)
                } else {
                    let len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                    (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 1 + len)
                };
                match end {
                    Some(e) => {
                        out.push(b'\'');
                        out.resize(out.len() + (e - i - 1), b' ');
                        out.push(b'\'');
                        i = e + 1;
                    }
                    None => {
                        out.push(b'\'');
                        i += 1;
                    }
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The byte ranges of the bodies of inline modules (`mod name { .. }`).
fn inline_mods(code: &str) -> Vec<(usize, usize)> {
    let b = code.as_bytes();
    let mut ranges = Vec::new();
    for (i, _) in code.match_indices("mod ") {
        if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
            continue;
        }
        let name = ident_at(&code[i + 4..]);
        let after = code[i + 4 + name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        let mut depth = 0;
        for (k, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        ranges.push((open, open + k));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    ranges
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The names a path names right after its prefix (`after` starts there):
/// its first ident, or the first ident of each top-level member of a
/// `{..}` group; a macro with its `!`.
fn names_after(after: &str, names: &mut Vec<String>) {
    if let Some(group) = after.strip_prefix('{') {
        // Top-level members of the group: the first ident of each.
        let mut depth = 0;
        let mut start = true;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => start = true,
                c if start && (c.is_ascii_alphabetic() || c == '_') => {
                    names.push(ident_at(&group[i..]).to_string());
                    start = false;
                }
                _ => {}
            }
        }
    } else {
        let id = ident_at(after);
        if !id.is_empty() {
            // A macro is named with its `!`.
            let bang = after[id.len()..].starts_with('!');
            names.push(if bang { format!("{id}!") } else { id.to_string() });
        }
    }
}

/// The names a file reaches from the crate root: `crate::name`, the
/// members of `crate::{...}`, and `super::name` where `super` is the root.
fn root_names(src: &Source) -> Vec<String> {
    let code = &src.code;
    let mut names = Vec::new();
    let mut push_at = |after: &str| names_after(after, &mut names);
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().last().unwrap_or(' ');
        // `$crate::` (inside a macro) is the crate root too.
        if before.is_ascii_alphanumeric() || before == '_' {
            continue;
        }
        push_at(&code[i + "crate::".len()..]);
    }
    // `super::` means the root in a top-level file and in a directory's
    // mod.rs, outside the inline modules they hold.
    let super_is_root = !src.rel.contains('/') || src.rel.ends_with("/mod.rs");
    if super_is_root {
        let inner = inline_mods(code);
        for (i, _) in code.match_indices("super::") {
            let before = code[..i].chars().last().unwrap_or(' ');
            if before.is_ascii_alphanumeric() || before == '_' || inner.iter().any(|&(a, b)| a < i && i < b) {
                continue;
            }
            push_at(&code[i + "super::".len()..]);
        }
    }
    names
}

/// The floor of what `crate::name` names.
fn floor_of_name(name: &str, sources: &[Source]) -> Floor {
    if let Some(mac) = name.strip_suffix('!') {
        let def = format!("macro_rules! {mac}");
        if let Some(s) = sources.iter().find(|s| s.code.contains(&def)) {
            return floor_of_file(&s.rel);
        }
        return Floor::Entry;
    }
    for file in [format!("{name}.rs"), format!("{name}/mod.rs")] {
        if sources.iter().any(|s| s.rel == file) {
            return floor_of_file(&file);
        }
    }
    // An item of lib.rs (the fork handlers, the constructor).
    Floor::Entry
}

/// Every (file of `check`, name) whose name lies above the file's floor,
/// the names resolved among `all`.
fn upward(check: &[Source], all: &[Source]) -> Vec<(String, String)> {
    let mut bad = Vec::new();
    for s in check {
        let floor = floor_of_file(&s.rel);
        let mut names = root_names(s);
        names.sort();
        names.dedup();
        for n in names {
            if floor_of_name(&n, all) > floor {
                bad.push((s.rel.clone(), n));
            }
        }
    }
    bad
}

/// The files of ops/ (as `ops/name.rs`) that a file of ops/ names:
/// `crate::ops::name` anywhere; `super::name` outside the inline modules
/// (where `super` is the file's own module); in `ops/mod.rs`, whose
/// modules are its children, any `name::` outside them. Names that are no
/// file of ops/ (items of `ops/mod.rs`: `Outcome`, `resolve`...) are left out.
fn ops_names(src: &Source, all: &[Source]) -> Vec<String> {
    if !src.rel.starts_with("ops/") {
        return Vec::new();
    }
    let code = &src.code;
    let inner = inline_mods(code);
    let outside = |i: usize| !inner.iter().any(|&(a, b)| a < i && i < b);
    // Where `prefix` starts a path (not the tail of a longer one), and
    // outside the inline modules unless `anywhere`.
    let starts = |prefix: &str, anywhere: bool| -> Vec<usize> {
        code.match_indices(prefix)
            .map(|(i, _)| i)
            .filter(|&i| {
                let before = code[..i].chars().last().unwrap_or(' ');
                !(before.is_ascii_alphanumeric() || before == '_' || before == ':') && (anywhere || outside(i))
            })
            .collect()
    };
    let mut names = Vec::new();
    for i in starts("crate::ops::", true) {
        names_after(&code[i + "crate::ops::".len()..], &mut names);
    }
    if src.rel == "ops/mod.rs" {
        for s in all {
            if let Some(name) = s.rel.strip_prefix("ops/").and_then(|r| r.strip_suffix(".rs")) {
                if !starts(&format!("{name}::"), false).is_empty() {
                    names.push(name.to_string());
                }
            }
        }
    } else {
        for i in starts("super::", false) {
            names_after(&code[i + "super::".len()..], &mut names);
        }
    }
    let mut files: Vec<String> = names
        .into_iter()
        .map(|n| format!("ops/{n}.rs"))
        .filter(|f| f != &src.rel && all.iter().any(|s| s.rel == *f))
        .collect();
    files.sort();
    files.dedup();
    files
}

/// Every (file of `check` under ops/, ops file it names) whose tier lies
/// above the file's, the names resolved among `all`.
fn upward_in_ops(check: &[Source], all: &[Source]) -> Vec<(String, String)> {
    let mut bad = Vec::new();
    for s in check {
        let Some(tier) = ops_tier(&s.rel) else { continue };
        for f in ops_names(s, all) {
            if ops_tier(&f).is_some_and(|t| t > tier) {
                bad.push((s.rel.clone(), f));
            }
        }
    }
    bad
}

fn sources() -> Vec<Source> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut v = Vec::new();
    read_sources(&base, &base, &mut v);
    v
}

/// No file imports from a floor above its own: ground never names `ops`,
/// `hooks`, `sud` or the crate root's items, nor a ground floor above its
/// own (state never names the virtual cwd, lookups never name paths, ...);
/// ops never names `hooks` or `sud`.
#[test]
fn imports_point_down() {
    let srcs = sources();
    assert!(srcs.len() > 40, "the sources were not found");
    let bad: Vec<_> = upward(&srcs, &srcs)
        .into_iter()
        .filter(|(f, n)| !EXCEPTIONS.iter().any(|(ef, en, _)| ef == f && en == n))
        .collect();
    assert!(bad.is_empty(), "imports pointing up (file, name): {bad:?}; see the floors in src/layers.rs");
}

/// Within ops/, no file names one of a higher tier: the output modules
/// (`namespace`, `out`) never name the dispatchers (`open`, `stat`,
/// `write`), and what they share (`attr`, `open_base`) names none of them.
#[test]
fn ops_imports_point_down() {
    let srcs = sources();
    let bad = upward_in_ops(&srcs, &srcs);
    assert!(bad.is_empty(), "ops imports pointing up (file, ops file it names): {bad:?}; see the tiers in src/layers.rs");
}

/// Every file of ops/ has its tier in [`OPS`], and every entry there is a file.
#[test]
fn every_ops_file_has_a_tier() {
    let srcs = sources();
    let ops: Vec<&str> = srcs.iter().filter_map(|s| s.rel.strip_prefix("ops/")).collect();
    let missing: Vec<_> = ops.iter().filter(|r| !OPS.iter().any(|(f, _)| f == *r)).collect();
    assert!(missing.is_empty(), "ops files with no tier: {missing:?}; place them in OPS (src/layers.rs)");
    let stale: Vec<_> = OPS.iter().filter(|(f, _)| !ops.contains(f)).collect();
    assert!(stale.is_empty(), "OPS names files that do not exist: {stale:?}");
}

/// The ops checker finds what it must.
#[test]
fn the_checker_sees_upward_ops_imports() {
    let fake = |rel: &str, code: &str| Source { rel: rel.into(), code: code_only(code) };
    let fakes = vec![
        // The cycle that was: the output modules reaching the dispatchers.
        fake(
            "ops/namespace.rs",
            "use super::{resolve, write::Attr};\nfn f() { libc::makedev(super::stat::DEV_MAJOR, 0); }\n// super::open\nmod tests { use super::out; }\n",
        ),
        fake("ops/out.rs", "use super::namespace::lookup;\nuse crate::ops::{attr, open::wants_write};\n"),
        fake("ops/attr.rs", "use super::Outcome;\nfn g() { crate::ops::out::fd_stat(0, t); }\n"),
        fake("ops/mod.rs", "pub mod stat;\npub use crate::lookup::Node;\nfn h() { stat::statx_from(s); }\nmod tests { use super::*; fn t() { write::unlink(v); } }\n"),
        // Downward or level: allowed.
        fake("ops/write.rs", "use super::{attr::Attr, namespace, out, Outcome};\nfn k() { super::open_base::wants_write(0); }\n"),
        fake("ops/dir.rs", "use super::dirstream::VDir;\nuse crate::ops::open_base::open_dir;\n"),
    ];
    let mut bad = upward_in_ops(&fakes, &sources());
    bad.sort();
    let want: Vec<(String, String)> = [
        ("ops/attr.rs", "ops/out.rs"),
        ("ops/mod.rs", "ops/stat.rs"),
        ("ops/namespace.rs", "ops/stat.rs"),
        ("ops/namespace.rs", "ops/write.rs"),
        ("ops/out.rs", "ops/open.rs"),
    ]
    .iter()
    .map(|(f, n)| (f.to_string(), n.to_string()))
    .collect();
    assert_eq!(bad, want);
}

/// Every ground file has its floor in [`GROUND`], and every entry there is a file.
#[test]
fn every_ground_file_has_a_floor() {
    let srcs = sources();
    let ground: Vec<&str> = srcs.iter().map(|s| s.rel.as_str()).filter(|r| !r.contains('/') && *r != "lib.rs").collect();
    let missing: Vec<_> = ground.iter().filter(|r| !GROUND.iter().any(|(f, _)| f == *r)).collect();
    assert!(missing.is_empty(), "ground files with no floor: {missing:?}; place them in GROUND (src/layers.rs)");
    let stale: Vec<_> = GROUND.iter().filter(|(f, _)| !ground.contains(f)).collect();
    assert!(stale.is_empty(), "GROUND names files that do not exist: {stale:?}");
}

/// The checker itself finds what it must (so that a passing test means something).
#[test]
fn the_checker_sees_upward_imports() {
    let fake = |rel: &str, code: &str| Source { rel: rel.into(), code: code_only(code) };
    let fakes = vec![
        fake("fake_ground.rs", "use crate::{fd_table, ops::Outcome};\nfn f() { crate::hooks::cbytes(p); }\n"),
        fake(
            "fake_ground2.rs",
            "// crate::ops in a comment\nfn g() { super::fork_child(); crate::dlog!(\"crate::ops {}\", '{'); }\nmod t { use super::x; }\n",
        ),
        fake("ops/fake_ops.rs", "use super::resolve;\nuse crate::sud::on;\nuse crate::real;\n"),
        // Within the ground: the cycle that was (state -> vcwd, parts), and more.
        fake("state.rs", "use crate::lock::Locked;\nfn h() { crate::vcwd::recover(s); crate::parts::PartMaps::new(0); }\n"),
        fake("lookup.rs", "use crate::{client, paths::vcwd, state};\n"),
        fake("vcwd.rs", "use crate::{lookup, outputs, paths};\n"),
        // The same floor is allowed (scripts/import_graph.py --check finds cycles).
        fake("outputs.rs", "use crate::pending;\nuse crate::exec_outputs;\n"),
    ];
    let mut bad = upward(&fakes, &sources());
    bad.sort();
    let want: Vec<(String, String)> = [
        ("fake_ground.rs", "hooks"),
        ("fake_ground.rs", "ops"),
        ("fake_ground2.rs", "fork_child"),
        ("lookup.rs", "paths"),
        ("ops/fake_ops.rs", "sud"),
        ("state.rs", "parts"),
        ("state.rs", "vcwd"),
        ("vcwd.rs", "paths"),
    ]
    .iter()
    .map(|(f, n)| (f.to_string(), n.to_string()))
    .collect();
    assert_eq!(bad, want);
}
