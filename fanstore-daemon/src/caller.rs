//! Who asks: the credentials of a client connection, and the kernel's
//! permission rules applied with them to an output's record.
//!
//! The server takes a connection's caller from the socket when it accepts
//! it (SO_PEERCRED: the effective uid and gid at `connect`; the groups
//! from `/proc/<pid>/status`), so no request carries credentials a client
//! could forge. The library opens a new connection when its effective ids
//! change (a program that drops privileges after its first call).
//!
//! ```
//! use fanstore_daemon::caller::{Caller, Access};
//! use fanstore_core::wire::OutRecord;
//! let rec = OutRecord { mode: libc::S_IFREG | 0o640, uid: 1000, gid: 100, ..Default::default() };
//! let member = Caller { uid: 2000, gid: 2000, groups: vec![100] };
//! assert!(member.may(&rec, Access::READ));
//! assert!(!member.may(&rec, Access::WRITE));
//! assert!(Caller::root().may(&rec, Access::WRITE));
//! ```

use fanstore_core::wire::OutRecord;

/// True if this daemon serves the processes of every uid on its node (it
/// runs as root, as a file system mounted by root does): its runtime
/// directory, socket and index are then open to them (0755, 0666, 0644),
/// and every request is checked with its caller's credentials. A daemon
/// run by any other user serves only that user (0700, 0600, 0600).
pub fn serves_every_user() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The mode of a file or directory others must reach when
/// [`serves_every_user`]: `open` then, else `private`.
pub fn shared_mode(open: u32, private: u32) -> u32 {
    if serves_every_user() {
        open
    } else {
        private
    }
}

/// The credentials of one client connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

/// The permission bits asked for (`R_OK`, `W_OK`, `X_OK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    pub const READ: Access = Access(4);
    pub const WRITE: Access = Access(2);
    pub const SEARCH: Access = Access(1);
    /// Write and search: what adding or removing a name in a directory needs.
    pub const CHANGE_DIR: Access = Access(3);
}

impl Caller {
    /// Root: what the daemon's own work (recovery, internal directories) acts as.
    pub fn root() -> Caller {
        Caller { uid: 0, gid: 0, groups: Vec::new() }
    }

    /// The daemon process itself.
    pub fn this_process() -> Caller {
        // SAFETY: geteuid and getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Caller { uid, gid, groups: Vec::new() }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// True if `gid` is the caller's effective gid or one of its groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// True if the caller owns `rec` or is root: what chmod, chown of the
    /// group, and setting explicit times need.
    pub fn owns(&self, rec: &OutRecord) -> bool {
        self.is_root() || self.uid == rec.uid
    }

    /// The kernel's `generic_permission` for `rec`: root may read and write
    /// anything and search a directory or run a file with any `x` bit; every
    /// other caller gets the owner's, the group's or the others' bits, the
    /// first class it belongs to.
    pub fn may(&self, rec: &OutRecord, want: Access) -> bool {
        rec.allows(self.uid, |g| self.in_group(g), want.0)
    }

    /// The sticky-directory rule for removing or renaming `victim` out of
    /// `dir`: in a directory with S_ISVTX only root, the directory's owner
    /// or the victim's owner may.
    pub fn may_remove_from(&self, dir: &OutRecord, victim: &OutRecord) -> bool {
        dir.mode & libc::S_ISVTX == 0 || self.is_root() || self.uid == dir.uid || self.uid == victim.uid
    }

    /// chown's rule: root may give a file to anyone; its owner may keep the
    /// owner (`uid` unchanged or `u32::MAX`) and change the group to one of
    /// its own. EPERM otherwise.
    pub fn may_chown(&self, rec: &OutRecord, uid: u32, gid: u32) -> bool {
        // Nothing to change (-1, -1): anyone may, as on Linux.
        if self.is_root() || (uid == u32::MAX && gid == u32::MAX) {
            return true;
        }
        self.uid == rec.uid && (uid == u32::MAX || uid == rec.uid) && (gid == u32::MAX || gid == rec.gid || self.in_group(gid))
    }

    /// The groups of process `pid`: the "Groups:" line of its
    /// /proc/PID/status (empty if it cannot be read: the effective gid
    /// still counts).
    pub fn groups_of(pid: i32) -> Vec<u32> {
        std::fs::read(format!("/proc/{pid}/status")).map(|s| groups_line(&s)).unwrap_or_default()
    }
}

/// The numbers of the "Groups:" line of a /proc/PID/status text.
fn groups_line(status: &[u8]) -> Vec<u32> {
    let Some(line) = status.split(|&b| b == b'\n').find_map(|l| l.strip_prefix(b"Groups:")) else { return Vec::new() };
    line.split(|b| b.is_ascii_whitespace()).filter_map(|w| std::str::from_utf8(w).ok()?.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(mode: u32, uid: u32, gid: u32) -> OutRecord {
        OutRecord { mode, uid, gid, ..Default::default() }
    }

    #[test]
    fn owner_group_and_others_each_get_their_own_bits() {
        let f = rec(libc::S_IFREG | 0o460, 10, 20);
        let owner = Caller { uid: 10, gid: 20, groups: vec![] };
        // The owner class decides even when the group class would allow more.
        assert!(owner.may(&f, Access::READ) && !owner.may(&f, Access::WRITE));
        let member = Caller { uid: 11, gid: 99, groups: vec![20] };
        assert!(member.may(&f, Access(6)) && !member.may(&f, Access::SEARCH));
        let other = Caller { uid: 12, gid: 12, groups: vec![] };
        assert!(!other.may(&f, Access::READ));
    }

    #[test]
    fn root_reads_and_writes_anything_but_runs_only_what_has_an_x_bit() {
        let root = Caller::root();
        assert!(root.may(&rec(libc::S_IFREG, 5, 5), Access(6)));
        assert!(!root.may(&rec(libc::S_IFREG | 0o600, 5, 5), Access::SEARCH));
        assert!(root.may(&rec(libc::S_IFREG | 0o001, 5, 5), Access::SEARCH));
        assert!(root.may(&rec(libc::S_IFDIR, 5, 5), Access::SEARCH));
    }

    #[test]
    fn sticky_directories_and_chown_rules() {
        let dir = rec(libc::S_IFDIR | 0o1777, 1, 1);
        let theirs = rec(libc::S_IFREG | 0o644, 2, 2);
        let me = Caller { uid: 3, gid: 3, groups: vec![7] };
        assert!(!me.may_remove_from(&dir, &theirs));
        assert!(me.may_remove_from(&rec(libc::S_IFDIR | 0o777, 1, 1), &theirs));
        assert!(Caller { uid: 2, gid: 2, groups: vec![] }.may_remove_from(&dir, &theirs));
        let mine = rec(libc::S_IFREG | 0o644, 3, 3);
        assert!(me.may_chown(&mine, u32::MAX, 7));
        assert!(me.may_chown(&mine, 3, u32::MAX));
        assert!(!me.may_chown(&mine, 4, u32::MAX), "giving a file away");
        assert!(!me.may_chown(&mine, u32::MAX, 8), "a group it is not in");
        assert!(!me.may_chown(&theirs, u32::MAX, 7), "not the owner");
        assert!(Caller::root().may_chown(&theirs, 9, 9));
        assert!(me.may_chown(&theirs, u32::MAX, u32::MAX), "chown(-1, -1) changes nothing");
    }

    #[test]
    fn groups_from_proc_status() {
        assert_eq!(groups_line(b"Name:\tx\nGroups:\t4 24 27 \nNgid:\t0\n"), vec![4, 24, 27]);
        assert_eq!(groups_line(b"Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(groups_line(b"Name:\tx\n"), Vec::<u32>::new());
        let own = groups_line(&std::fs::read("/proc/self/status").unwrap());
        assert_eq!(Caller::groups_of(std::process::id() as i32), own);
        assert_eq!(Caller::groups_of(-5), Vec::<u32>::new(), "no such process");
    }
}
