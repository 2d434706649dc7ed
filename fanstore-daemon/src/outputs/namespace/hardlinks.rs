//! Hard links (LINK): several names for one file.
//!
//! A file that was never linked keeps everything in its name's record, so
//! the common path (create, stat, open, unlink of a file with one name)
//! pays nothing for links. Its first `link` moves the record to a shared
//! record at a key no path can be ([`wire::linked_key`]: placed by the
//! hash of that key like any record) with a link count, and turns every
//! name into a pointer to it ([`wire::LINKED_HOLDER`]):
//!
//! ```text
//!  name a ──┐                       owner of "/inode/<rank>/<seq>"
//!  name b ──┴─> (LINKED_HOLDER, id)  ─> the file's record: bytes (holder, id),
//!                                      size, mode, owner, times, nlink
//! ```
//!
//! - A lookup of a linked name costs one more lookup (`get_record`).
//! - chmod/chown/utime of any name (SETATTR) and a new version written
//!   through any name (COMMIT's PUT) reach the shared record: the name's
//!   owner answers EMLINK and the caller asks the shared record's owner.
//! - unlink or a rename over a name takes one from the count; the bytes go
//!   with the last name (`drop_data`). A rename moves the pointer.
//!
//! Not kept across a kill -9 of the holder's daemon: recovery registers
//! each held file again under the name its sidecar has (one name).

use super::owner::mop;
use crate::caller::Caller;
use crate::outputs::names::{now_ns, Looked};
use crate::outputs::Outputs;
use fanstore_core::wire::{self, OutRecord};
use std::sync::atomic::Ordering::Relaxed;

impl Outputs {
    /// LINK: `to` becomes another name of output `from` (its last
    /// component not followed, as link(2)). EEXIST if `to` exists; EPERM
    /// for a directory or a symlink; EROFS for an input.
    pub fn out_link(&self, from: &[u8], to: &[u8], caller: &Caller) -> Result<(), i32> {
        if self.rank.view.lookup(from).is_some() {
            return Err(libc::EROFS);
        }
        let from = self.real_entry(from)?;
        if self.rank.view.lookup(&from).is_some() {
            return Err(libc::EROFS);
        }
        let (to, dir) = self.new_name(to)?;
        let raw = match self.meta_at(&from, mop::GET, 0, from.clone()) {
            Ok(r) => OutRecord::decode(&r.payload).ok_or(libc::EIO)?,
            Err(libc::ENOENT) => return Err(self.missing_errno(&from)),
            Err(e) => return Err(e),
        };
        if raw.is_dir() || raw.is_link() {
            return Err(libc::EPERM);
        }
        super::access::may_add_in(caller, dir.as_ref())?;
        if let Ok(Looked::Output { .. }) = self.lookup(&to, false) {
            return Err(libc::EEXIST);
        }
        let (name, kind) = if raw.is_linked_name() {
            // One more name of a file already linked.
            let key = raw.linked_key();
            let shared = self.meta_at(&key, mop::LINK_ADJ, 1, key.clone())?;
            (raw, OutRecord::decode(&shared.payload).ok_or(libc::EIO)?.kind())
        } else {
            // Its first link: the record moves to a shared one with two names.
            let seq = self.out_seq.fetch_add(1, Relaxed);
            let key = wire::linked_key(self.rank.id.rank, seq);
            let shared = OutRecord { nlink: 2, ctime_ns: now_ns(), ..raw };
            self.meta_at(&key, mop::PUT, wire::COMMIT_EXCL, put_payload(&key, &shared))?;
            let name = OutRecord { holder: wire::LINKED_HOLDER, id: seq, sum: u64::from(self.rank.id.rank), nlink: 0, ..raw };
            // The old name points at it now (its bytes stay: no drop).
            if let Err(e) = self.meta_at(&from, mop::PUT, super::owner::PUT_OVER_LINK, put_payload(&from, &name)) {
                let _ = self.meta_at(&key, mop::LINK_ADJ, -2i64 as u64, key.clone());
                return Err(e);
            }
            (name, raw.kind())
        };
        if let Err(e) = self.meta_at(&to, mop::PUT, wire::COMMIT_EXCL, put_payload(&to, &name)) {
            let key = name.linked_key();
            let _ = self.meta_at(&key, mop::LINK_ADJ, -1i64 as u64, key.clone());
            return Err(e);
        }
        self.link(&to, kind, true)
    }
}

/// A PUT payload: `rec` then `path`.
fn put_payload(path: &[u8], rec: &OutRecord) -> Vec<u8> {
    let mut p = Vec::with_capacity(OutRecord::LEN + path.len());
    rec.encode_into(&mut p);
    p.extend_from_slice(path);
    p
}
