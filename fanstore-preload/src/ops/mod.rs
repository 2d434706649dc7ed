//! Safe implementations of the virtual calls. Hooks classify the path or fd
//! and call these with a [`VPath`] (a path under the mount) or a tracked fd;
//! each returns an [`Outcome`].

use crate::paths::Class;
use libc::c_int;

pub mod attr;
pub mod cwd;
pub mod dir;
pub mod dirstream;
pub mod fd;
pub mod inotify;
pub mod lazy_copy;
pub mod lock;
pub mod meta;
pub mod namespace;
pub mod open;
pub mod open_base;
pub mod out;
pub mod out_file;
pub mod special;
pub mod stat;
pub mod stdio;
pub mod tempname;
pub mod walk;
pub mod write;

/// Lookups of the ground floor that every ops module builds on.
pub use crate::lookup::{is_symlink, parent_of, resolve, Node, MAX_SYMLINKS};
pub use crate::paths::VPath;

/// The three ways a hooked call ends.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// Served by the library: return this value.
    Handled(T),
    /// Not ours after all: call the original.
    Passthrough,
    /// Fail with this errno.
    Errno(c_int),
}

impl<T> Outcome<T> {
    /// Re-types an outcome that carries no value.
    pub fn map_none<U>(self) -> Outcome<U> {
        match self {
            Outcome::Handled(_) => Outcome::Errno(libc::EIO),
            Outcome::Passthrough => Outcome::Passthrough,
            Outcome::Errno(e) => Outcome::Errno(e),
        }
    }

    /// The value of a handled call through `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Handled(v) => Outcome::Handled(f(v)),
            Outcome::Passthrough => Outcome::Passthrough,
            Outcome::Errno(e) => Outcome::Errno(e),
        }
    }
}

impl<T> From<Result<T, c_int>> for Outcome<T> {
    fn from(r: Result<T, c_int>) -> Outcome<T> {
        match r {
            Ok(v) => Outcome::Handled(v),
            Err(e) => Outcome::Errno(e),
        }
    }
}

/// How a call that names two paths (rename, link) ends.
#[derive(Debug, PartialEq, Eq)]
pub enum TwoPaths {
    /// libc's call; a `true` side takes the normalised path its
    /// classification left in its scratch buffer ([`Class::Redirect`]).
    Libc(bool, bool),
    /// Served: 0.
    Done,
    Errno(c_int),
}

/// Decides a call naming two paths from their classifications (a side
/// that cannot be ours is [`Class::Real`]): a lookup error of either side
/// first; libc's call when neither is under the mount; else `virt` with
/// whichever are (passing a call to libc is not an answer here: EROFS).
pub fn two_paths(c1: Class, c2: Class, virt: impl FnOnce(Option<&VPath>, Option<&VPath>) -> Outcome<c_int>) -> TwoPaths {
    if let Class::Err(e) = c1 {
        return TwoPaths::Errno(e);
    }
    if let Class::Err(e) = c2 {
        return TwoPaths::Errno(e);
    }
    let r1 = matches!(c1, Class::Redirect);
    let r2 = matches!(c2, Class::Redirect);
    let v1 = if let Class::Virtual(v) = &c1 { Some(v) } else { None };
    let v2 = if let Class::Virtual(v) = &c2 { Some(v) } else { None };
    if v1.is_none() && v2.is_none() {
        return TwoPaths::Libc(r1, r2);
    }
    match virt(v1, v2) {
        Outcome::Errno(e) => TwoPaths::Errno(e),
        Outcome::Handled(_) => TwoPaths::Done,
        Outcome::Passthrough => TwoPaths::Errno(libc::EROFS),
    }
}

#[cfg(test)]
pub mod testing;

#[cfg(test)]
mod tests {
    use super::testing::install;
    use super::*;
    use crate::state::State;
    use crate::paths::{classify, Class, Scratch};
    use crate::vcwd::set_vcwd;

    fn st() -> &'static State {
        install();
        crate::state::current().unwrap()
    }

    fn path_of(r: Result<Node, c_int>) -> Result<&'static [u8], c_int> {
        r.map(|n| n.path())
    }

    #[test]
    fn resolve_follows_symlinks_inside_the_tree() {
        let s = st();
        assert_eq!(path_of(resolve(s, b"a/link", false, true)), Ok(&b"a/b.txt"[..]));
        assert_eq!(path_of(resolve(s, b"a/link", false, false)), Ok(&b"a/link"[..]));
        assert_eq!(path_of(resolve(s, b"a/up", false, true)), Ok(&b"c"[..]));
        assert_eq!(path_of(resolve(s, b"a/sub/x", false, true)), Ok(&b"a/sub/x"[..]));
        assert_eq!(path_of(resolve(s, b"", true, true)), Ok(&b""[..]));
        assert_eq!(resolve(s, b"loop1", false, true).err(), Some(libc::ELOOP));
        assert_eq!(resolve(s, b"loop1/x", false, false).err(), Some(libc::ELOOP));
        assert_eq!(resolve(s, b"a/b.txt/x", false, true).err(), Some(libc::ENOTDIR));
        assert_eq!(resolve(s, b"a/link/x", false, true).err(), Some(libc::ENOTDIR));
        assert_eq!(resolve(s, b"a/b.txt", true, true).err(), Some(libc::ENOTDIR));
        assert_eq!(resolve(s, b"a/nope", false, true).err(), Some(libc::ENOENT));
        assert_eq!(resolve(s, b"nope/x", false, true).err(), Some(libc::ENOENT));
        assert_eq!(resolve(s, b"out", false, true).err(), Some(libc::ENOENT));
        let long = "y".repeat(300);
        assert_eq!(resolve(s, long.as_bytes(), false, true).err(), Some(libc::ENAMETOOLONG));
    }

    #[test]
    fn create_errnos() {
        let s = st();
        let vp = |rel: &'static [u8]| VPath { st: s, rel, must_be_dir: false, last: crate::paths::Last::Name };
        assert_eq!(write::create_errno(&vp(b"a")), libc::EEXIST);
        assert_eq!(write::create_errno(&vp(b"a/new")), libc::EROFS);
        assert_eq!(write::create_errno(&vp(b"nope/new")), libc::ENOENT);
        assert_eq!(write::create_errno(&vp(b"c/new")), libc::ENOTDIR);
        assert_eq!(open::open(&vp(b"a/b.txt"), libc::O_WRONLY, 0), Outcome::Errno(libc::EROFS));
        assert_eq!(open::open(&vp(b"a"), libc::O_RDWR, 0), Outcome::Errno(libc::EISDIR));
        assert_eq!(open::open(&vp(b"a/b.txt"), libc::O_RDONLY | libc::O_DIRECTORY, 0), Outcome::Errno(libc::ENOTDIR));
        assert_eq!(open::open(&vp(b"a/link"), libc::O_RDONLY | libc::O_NOFOLLOW, 0), Outcome::Errno(libc::ELOOP));
        assert_eq!(open::open(&vp(b"a/b.txt"), libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0), Outcome::Errno(libc::EEXIST));
        assert_eq!(open::open(&vp(b"a/b.txt"), libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY, 0), Outcome::Errno(libc::EROFS));
        assert_eq!(write::unlink(&vp(b"a")), Outcome::Errno(libc::EISDIR));
        assert_eq!(write::rmdir(&vp(b"c")), Outcome::Errno(libc::ENOTDIR));
        assert_eq!(write::rmdir(&vp(b"")), Outcome::Errno(libc::EBUSY));
        assert_eq!(meta::access(&vp(b"c"), libc::W_OK, true), Outcome::Errno(libc::EROFS));
        assert_eq!(meta::access(&vp(b"c"), libc::X_OK, true), Outcome::Errno(libc::EACCES));
        assert_eq!(meta::access(&vp(b"a"), libc::X_OK | libc::R_OK, true), Outcome::Handled(0));
        assert_eq!(meta::readlink(&vp(b"a/link")), Outcome::Handled(std::borrow::Cow::Borrowed(&b"b.txt"[..])));
        assert_eq!(meta::readlink(&vp(b"c")), Outcome::Errno(libc::EINVAL));
    }

    fn class(dirfd: c_int, p: &str) -> Result<(Vec<u8>, bool), String> {
        let mut s = Scratch::new();
        match classify(dirfd, p.as_bytes(), &mut s) {
            Class::Virtual(v) => Ok((v.rel.to_vec(), v.must_be_dir)),
            Class::Real => Err("real".into()),
            Class::Redirect => {
                let n = s.buf.iter().position(|&b| b == 0).unwrap();
                Err(format!("redirect {}", String::from_utf8_lossy(&s.buf[..n])))
            }
            Class::Err(e) => Err(format!("errno {e}")),
        }
    }

    #[test]
    fn classification() {
        st();
        let v = |rel: &str, d: bool| Ok((rel.as_bytes().to_vec(), d));
        assert_eq!(class(libc::AT_FDCWD, "/fst-unit"), v("", false));
        assert_eq!(class(libc::AT_FDCWD, "//fst-unit//a/./b.txt"), v("a/b.txt", false));
        assert_eq!(class(libc::AT_FDCWD, "/fst-unit/a/"), v("a", true));
        assert_eq!(class(libc::AT_FDCWD, "/fst-unitx/a"), Err("real".into()));
        assert_eq!(class(libc::AT_FDCWD, "/tmp/./x"), Err("real".into()));
        assert_eq!(class(libc::AT_FDCWD, "/fst-unit/.."), Err("redirect /".into()));
        assert_eq!(class(libc::AT_FDCWD, "/fst-unit/a/sub/../b.txt"), v("a/b.txt", false));
        assert_eq!(class(libc::AT_FDCWD, "/fst-unit/c/../a"), Err(format!("errno {}", libc::ENOTDIR)));
        assert_eq!(class(libc::AT_FDCWD, "/fst-unit/nope/../a"), Err(format!("errno {}", libc::ENOENT)));
        assert_eq!(class(libc::AT_FDCWD, "/tmp/../fst-unit/c"), v("c", false));
        let long = format!("/fst-unit/{}", "z/".repeat(2100));
        assert_eq!(class(libc::AT_FDCWD, &long), Err(format!("errno {}", libc::ENAMETOOLONG)));
        // A name longer than NAME_MAX: ENAMETOOLONG once the walk reaches
        // it (a file before it is ENOTDIR, a loop ELOOP); 255 bytes is a name.
        let n256 = "n".repeat(256);
        let too_long = Err(format!("errno {}", libc::ENAMETOOLONG));
        assert_eq!(class(libc::AT_FDCWD, &format!("/fst-unit/a/{n256}")), too_long);
        assert_eq!(class(libc::AT_FDCWD, &format!("/fst-unit/a/{n256}/x")), too_long);
        assert_eq!(class(libc::AT_FDCWD, &format!("/fst-unit/a/{n256}/../b.txt")), too_long);
        assert_eq!(class(libc::AT_FDCWD, &format!("/fst-unit/c/{n256}")), Err(format!("errno {}", libc::ENOTDIR)));
        assert_eq!(class(libc::AT_FDCWD, &format!("/fst-unit/loop1/{n256}")), Err(format!("errno {}", libc::ELOOP)));
        let n255 = "n".repeat(255);
        assert_eq!(class(libc::AT_FDCWD, &format!("/fst-unit/a/{n255}")), v(&format!("a/{n255}"), false));
    }

    #[test]
    fn dot_and_dotdot_as_the_last_component() {
        use crate::paths::Last;
        let s = st();
        for (p, last) in [("a/.", Last::Dot), ("a/..//", Last::DotDot), (".", Last::Dot), ("a/x.", Last::Name), ("/", Last::Name), ("a/./b", Last::Name)] {
            assert_eq!(Last::of(p.as_bytes()), last, "{p}");
        }
        let vp = |rel: &'static [u8], last| VPath { st: s, rel, must_be_dir: true, last };
        assert_eq!(write::rmdir(&vp(b"a/sub", Last::Dot)), Outcome::Errno(libc::EINVAL));
        assert_eq!(write::rmdir(&vp(b"a", Last::DotDot)), Outcome::Errno(libc::ENOTEMPTY));
        assert_eq!(write::rmdir(&vp(b"c", Last::Dot)), Outcome::Errno(libc::ENOTDIR));
        assert_eq!(write::unlink(&vp(b"a/sub", Last::Dot)), Outcome::Errno(libc::EISDIR));
        assert_eq!(write::mkdir(&vp(b"a/sub", Last::Dot), 0o755), Outcome::Errno(libc::EEXIST));
        assert_eq!(write::create_errno(&vp(b"c", Last::Dot)), libc::ENOTDIR);
        let name = VPath { st: s, rel: b"x", must_be_dir: false, last: Last::Name };
        assert_eq!(write::rename_paths(Some(&vp(b"a/sub", Last::Dot)), Some(&name), 0), Outcome::Errno(libc::EBUSY));
        assert_eq!(write::rename_paths(Some(&name), Some(&vp(b"a", Last::Dot)), 0), Outcome::Errno(libc::EBUSY));
        assert_eq!(write::rename_paths(Some(&name), Some(&vp(b"a", Last::Dot)), libc::RENAME_NOREPLACE), Outcome::Errno(libc::EEXIST));
        assert_eq!(write::rename_paths(Some(&vp(b"c", Last::Dot)), Some(&name), 0), Outcome::Errno(libc::ENOTDIR));
    }

    #[test]
    fn virtual_cwd_and_dirfd() {
        let s = st();
        let sub = s.view.lookup(b"a/sub").unwrap().id();
        assert_eq!(class(libc::AT_FDCWD, "relative"), Err("real".into()));
        set_vcwd(Some(sub));
        let got = (class(libc::AT_FDCWD, "x"), class(libc::AT_FDCWD, "../b.txt"), class(libc::AT_FDCWD, "../../.."));
        set_vcwd(None);
        assert_eq!(got.0, Ok((b"a/sub/x".to_vec(), false)));
        assert_eq!(got.1, Ok((b"a/b.txt".to_vec(), false)));
        assert_eq!(got.2, Err("redirect /".into()));
        let fd = 100_000;
        crate::fd_table::set(fd, crate::fd_table::Tracked::Dir { node: sub, pos: 0 });
        assert_eq!(class(fd, "x"), Ok((b"a/sub/x".to_vec(), false)));
        assert_eq!(class(fd, "/fst-unit/c"), Ok((b"c".to_vec(), false)));
        crate::fd_table::set(fd, crate::fd_table::Tracked::File(sub));
        assert_eq!(class(fd, "x"), Err(format!("errno {}", libc::ENOTDIR)));
        crate::fd_table::clear(fd);
        assert_eq!(class(fd, "x"), Err("real".into()));
    }

    #[test]
    fn getdents_records() {
        let s = st();
        let a = s.view.lookup(b"a").unwrap().id();
        let fd = 100_001;
        crate::fd_table::set(fd, crate::fd_table::Tracked::Dir { node: a, pos: 0 });
        let mut names = Vec::new();
        let mut buf = [0u8; 64]; // small: forces several calls
        loop {
            let t = crate::fd_table::get(fd).unwrap();
            let Outcome::Handled(n) = dir::getdents64(fd, t, &mut buf) else { panic!() };
            if n == 0 {
                break;
            }
            let mut off = 0;
            while off < n as usize {
                let rl = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
                let name = &buf[off + 19..off + rl];
                names.push(String::from_utf8(name[..name.iter().position(|&b| b == 0).unwrap()].to_vec()).unwrap());
                off += rl;
            }
        }
        assert_eq!(names, [".", "..", "b.txt", "link", "sub", "up"]);
        let t = crate::fd_table::get(fd).unwrap();
        assert_eq!(dir::getdents64(fd, t, &mut [0u8; 8]), Outcome::Handled(0));
        crate::fd_table::set(fd, crate::fd_table::Tracked::Dir { node: a, pos: 0 });
        let t = crate::fd_table::get(fd).unwrap();
        assert_eq!(dir::getdents64(fd, t, &mut [0u8; 8]), Outcome::Errno(libc::EINVAL));
        crate::fd_table::clear(fd);
    }

    #[test]
    fn stat_fields() {
        let s = st();
        let n = s.view.lookup(b"a/b.txt").unwrap();
        let x = stat::stat_of(s, &n);
        assert_eq!((x.st_size, x.st_mode, x.st_ino, x.st_mtime, x.st_mtime_nsec), (5, libc::S_IFREG | 0o644, n.id() as u64 + 1, 1, 123));
        let sx = stat::statx_of(s, &n);
        assert_eq!((sx.stx_size, sx.stx_ino, sx.stx_mtime.tv_nsec), (5, x.st_ino, 123));
        let d = stat::stat_of(s, &s.view.root());
        assert_eq!(d.st_mode & libc::S_IFMT, libc::S_IFDIR);
    }
}
