//! The files a rank keeps in `out/` for each output it holds: the bytes
//! (`out/<id>`) and its entry in the held journal
//! ([`crate::outputs::held_journal`]) that names the output for recovery
//! after a kill; renaming and dropping them at the holder's end of
//! HOLDER_RENAME and HOLDER_DROP. Below both the namespace (which sends
//! those) and [`crate::outputs::held`] (which writes the files).

use crate::outputs::held_journal::HeldJournal;

/// HOLDER_RENAME at the holder: output `id` is now named `path`, in its
/// checkpoint store (if there) and in the held journal, so a restart after
/// a kill registers it under the new name.
pub(crate) fn rename_held(dedup: Option<&crate::outputs::dedup::Dedup>, journal: &HeldJournal, id: u64, path: &[u8], fsync: bool) {
    if let Some(d) = dedup {
        d.rename_output(id, path);
    }
    journal.rename(id, path, fsync);
}

/// HOLDER_DROP at the holder (or a replaced output held here): deletes
/// what this rank holds of output `id`, its plain file and sidecar, or its
/// checkpoint.
///
/// The plain file's name goes now (an fd a program holds on it shows
/// `st_nlink` 0 once the unlink returns: pjdfstest unlink/14.t), but the
/// inode is freed off this path: an O_PATH fd of it is taken first and the
/// [`closer`] thread closes it, the last reference, in the background.
/// An unlink that frees the inode cost 5.3 µs here, open and unlink
/// 3.4 µs, the close 4.0 µs (ext4, 100-byte files): the inode's
/// eviction was a third of the daemon's part of an `unlink(2)` of an
/// output (perf, mdtest's remove phase).
pub(crate) fn drop_held(dedup: Option<&crate::outputs::dedup::Dedup>, journal: &HeldJournal, out: &std::path::Path, id: u64) {
    if !dedup.is_some_and(|d| d.drop_output(id)) {
        let file = out.join(id.to_string());
        // O_PATH: a reference to the inode, not an open of the file (a
        // FIFO's open would block, a device's have effects).
        let last = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_NOFOLLOW).open(&file).ok()
        };
        let _ = std::fs::remove_file(&file);
        if let Some(f) = last {
            closer::close_later(f);
        }
    }
    journal.drop_output(id);
}

/// Closes the last fds of dropped plain files in the background. The
/// thread is woken once per batch, not per file (a wake-up here costs
/// more than the close): by the first file queued, then it gathers for a
/// millisecond.
pub(crate) mod closer {
    use std::fs::File;
    use std::sync::{Mutex, OnceLock};
    use std::thread::Thread;

    static QUEUE: Mutex<Vec<File>> = Mutex::new(Vec::new());
    static THREAD: OnceLock<Option<Thread>> = OnceLock::new();
    /// At most this many fds wait (the daemon's fd limit is shared):
    /// [`crate::fdlimit::closer_entries`] of the limit at the first drop.
    static MAX_WAITING: OnceLock<usize> = OnceLock::new();

    fn run() {
        loop {
            std::thread::park();
            loop {
                std::thread::sleep(std::time::Duration::from_millis(1));
                let batch = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(|p| p.into_inner()));
                if batch.is_empty() {
                    break;
                }
                drop(batch);
            }
        }
    }

    /// Closes `f` soon, on the closer thread (here and now if that thread
    /// cannot be started or too many wait).
    pub(crate) fn close_later(f: File) {
        let thread = THREAD.get_or_init(|| match std::thread::Builder::new().name("fanstore-close".into()).spawn(run) {
            Ok(h) => Some(h.thread().clone()),
            Err(e) => {
                log::warn!("starting the closer thread: {e}; dropped outputs are freed on the caller's thread");
                None
            }
        });
        let Some(thread) = thread else { return };
        let first = {
            let mut q = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
            if q.len() >= *MAX_WAITING.get_or_init(|| crate::fdlimit::closer_entries(crate::fdlimit::nofile())) {
                return; // `f` is closed here
            }
            q.push(f);
            q.len() == 1
        };
        if first {
            thread.unpark();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanstore_core::wire::OutRecord;

    fn held_file(dir: &std::path::Path, journal: &HeldJournal, id: u64) -> std::path::PathBuf {
        let f = dir.join(id.to_string());
        std::fs::write(&f, b"bytes").unwrap();
        journal.set(format!("p{id}").as_bytes(), &OutRecord { id, size: 5, mode: libc::S_IFREG | 0o644, ..Default::default() }, false).unwrap();
        f
    }

    #[test]
    fn a_dropped_output_leaves_the_journal_and_its_name_at_once() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let journal = HeldJournal::new(d.path().to_path_buf());
        let (a, b) = (held_file(d.path(), &journal, 7), held_file(d.path(), &journal, 8));
        let open = std::fs::File::open(&a).unwrap();
        drop_held(None, &journal, d.path(), 7);
        assert!(journal.get(7).is_none() && journal.get(8).is_some());
        assert!(!a.exists() && b.exists());
        assert_eq!(open.metadata().unwrap().nlink(), 0, "an fd on a dropped output shows it unlinked");
    }

    #[test]
    fn dropping_a_fifo_does_not_open_it() {
        let d = tempfile::tempdir().unwrap();
        let journal = std::sync::Arc::new(HeldJournal::new(d.path().to_path_buf()));
        let fifo = d.path().join("9");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let (j, dir) = (journal.clone(), d.path().to_path_buf());
        std::thread::spawn(move || {
            drop_held(None, &j, &dir, 9);
            let _ = tx.send(());
        });
        // (An open of a FIFO with no writer blocks for good.)
        assert!(rx.recv_timeout(std::time::Duration::from_secs(10)).is_ok(), "dropping a FIFO blocked");
        assert!(!fifo.exists());
    }
}
