//! ftw/nftw over the virtual tree. glibc's own implementations call its
//! internal opendir/stat, which no preload library can intercept, so for a
//! start path under the mount we walk the index ourselves, with glibc's
//! semantics: pre-order FTW_D (or post-order FTW_DP with FTW_DEPTH), FTW_F,
//! FTW_SL/FTW_SLN, FTW_PHYS, FTW_CHDIR, FTW_ACTIONRETVAL, each directory
//! visited once, the callback's path built from the caller's start path.

use super::stat::stat_of;
use super::{is_symlink, resolve, Node, Outcome, VPath};
use crate::guard;
use crate::vcwd::{set_vcwd, vcwd};
use crate::state::State;
use libc::{c_char, c_int};
use std::collections::HashSet;

pub const FTW_F: c_int = 0;
pub const FTW_D: c_int = 1;
pub const FTW_NS: c_int = 3;
pub const FTW_SL: c_int = 4;
pub const FTW_DP: c_int = 5;
pub const FTW_SLN: c_int = 6;

pub const FTW_PHYS: c_int = 1;
pub const FTW_MOUNT: c_int = 2;
pub const FTW_CHDIR: c_int = 4;
pub const FTW_DEPTH: c_int = 8;
pub const FTW_ACTIONRETVAL: c_int = 16;

pub const FTW_CONTINUE: c_int = 0;
pub const FTW_STOP: c_int = 1;
pub const FTW_SKIP_SUBTREE: c_int = 2;
pub const FTW_SKIP_SIBLINGS: c_int = 3;

pub use crate::real::{Ftw, FtwFn, NftwFn};

#[derive(Clone, Copy)]
pub enum Callback {
    Nftw(NftwFn),
    Ftw(FtwFn),
}

enum Flow {
    Continue,
    SkipSubtree,
    SkipSiblings,
    Stop(c_int),
}

struct Walk {
    st: &'static State,
    cb: Callback,
    flags: c_int,
    /// The path handed to the callback, NUL-terminated when called.
    path: Vec<u8>,
    seen: HashSet<u32>,
}

impl Walk {
    fn call(&mut self, node: Option<&Node>, flag: c_int, base: usize, level: c_int) -> Flow {
        // SAFETY: plain data, zero is valid (FTW_NS entries get a zeroed stat).
        let s = node.map_or_else(|| unsafe { std::mem::zeroed() }, |n| stat_of(self.st, n));
        self.path.push(0);
        let p = self.path.as_ptr() as *const c_char;
        let mut ftw = Ftw { base: base as c_int, level };
        let cb = self.cb;
        // The callback is user code: its own file calls must see the hooks.
        let r = guard::outside(|| match cb {
            // SAFETY: p is a NUL-terminated path, s and ftw live across the call,
            // as the callback's C prototype requires.
            Callback::Nftw(f) => unsafe { f(p, &s, flag, &mut ftw) },
            // SAFETY: as above.
            Callback::Ftw(f) => unsafe { f(p, &s, flag) },
        });
        self.path.pop();
        if self.flags & FTW_ACTIONRETVAL != 0 {
            match r {
                FTW_STOP => Flow::Stop(FTW_STOP),
                FTW_SKIP_SUBTREE => Flow::SkipSubtree,
                FTW_SKIP_SIBLINGS => Flow::SkipSiblings,
                _ => Flow::Continue,
            }
        } else if r != 0 {
            Flow::Stop(r)
        } else {
            Flow::Continue
        }
    }

    /// Reports `dir` and its subtree; `dir` is already resolved to a directory.
    fn dir(&mut self, dir: Node, base: usize, level: c_int) -> Flow {
        if !self.seen.insert(dir.id()) {
            return Flow::Continue;
        }
        if self.flags & FTW_DEPTH == 0 {
            match self.call(Some(&dir), FTW_D, base, level) {
                Flow::Continue => {}
                Flow::SkipSubtree => return Flow::Continue,
                other => return other,
            }
        }
        let saved_cwd = vcwd();
        if self.flags & FTW_CHDIR != 0 {
            set_vcwd(Some(dir.id()));
        }
        let len = self.path.len();
        let mut flow = Flow::Continue;
        for c in self.st.view.children(dir) {
            self.path.truncate(len);
            if self.path.last() != Some(&b'/') {
                self.path.push(b'/');
            }
            let cbase = self.path.len();
            self.path.extend_from_slice(c.name());
            match self.entry(c, cbase, level + 1) {
                Flow::Continue | Flow::SkipSubtree => {}
                Flow::SkipSiblings => break,
                stop @ Flow::Stop(_) => {
                    flow = stop;
                    break;
                }
            }
        }
        self.path.truncate(len);
        if self.flags & FTW_CHDIR != 0 {
            set_vcwd(saved_cwd);
        }
        if let Flow::Stop(_) = flow {
            return flow;
        }
        if self.flags & FTW_DEPTH != 0 {
            return match self.call(Some(&dir), FTW_DP, base, level) {
                Flow::Stop(r) => Flow::Stop(r),
                // SKIP_SIBLINGS from a post-order call still skips the siblings.
                Flow::SkipSiblings => Flow::SkipSiblings,
                _ => Flow::Continue,
            };
        }
        Flow::Continue
    }

    fn entry(&mut self, n: Node, base: usize, level: c_int) -> Flow {
        if is_symlink(&n) {
            if self.flags & FTW_PHYS != 0 {
                return self.call(Some(&n), FTW_SL, base, level);
            }
            return match resolve(self.st, n.path(), false, true) {
                Ok(t) if t.is_dir() => self.dir(t, base, level),
                Ok(t) => self.call(Some(&t), FTW_F, base, level),
                Err(_) => self.call(Some(&n), FTW_SLN, base, level),
            };
        }
        if n.is_dir() {
            self.dir(n, base, level)
        } else {
            self.call(Some(&n), FTW_F, base, level)
        }
    }
}

/// nftw/ftw from `start` (the caller's path bytes), which names `vp`.
pub fn walk(vp: &VPath, start: &[u8], cb: Callback, flags: c_int) -> Outcome<c_int> {
    let phys = flags & FTW_PHYS != 0;
    let root = match resolve(vp.st, vp.rel, vp.must_be_dir, !phys) {
        Ok(n) => n,
        Err(e) => {
            // A dangling symlink as the start point is reported, like glibc does.
            if let (false, Ok(l)) = (phys, resolve(vp.st, vp.rel, false, false)) {
                if is_symlink(&l) {
                    let mut w = Walk { st: vp.st, cb, flags, path: start.to_vec(), seen: HashSet::new() };
                    return Outcome::Handled(match w.call(Some(&l), FTW_SLN, 0, 0) {
                        Flow::Stop(r) => r,
                        _ => 0,
                    });
                }
            }
            return Outcome::Errno(e);
        }
    };
    let mut path = start.to_vec();
    while path.len() > 1 && path.last() == Some(&b'/') {
        path.pop();
    }
    let base = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let base = if path.len() == 1 { 0 } else { base };
    let mut w = Walk { st: vp.st, cb, flags, path, seen: HashSet::new() };
    let flow = if root.is_dir() {
        w.dir(root, base, 0)
    } else if is_symlink(&root) {
        w.call(Some(&root), FTW_SL, base, 0)
    } else {
        w.call(Some(&root), FTW_F, base, 0)
    };
    Outcome::Handled(match flow {
        Flow::Stop(r) => r,
        _ => 0,
    })
}
