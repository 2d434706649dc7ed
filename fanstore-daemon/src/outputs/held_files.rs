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
/// The plain file is unlinked by a background thread ([`unlinker`]), after
/// the journal says the output is gone (a kill in between leaves a file
/// recovery does not register): an unlink on this disk (5-10 µs) was a
/// third of the daemon's part of an `unlink(2)` of an output (perf, mdtest's
/// remove phase).
pub(crate) fn drop_held(dedup: Option<&crate::outputs::dedup::Dedup>, journal: &HeldJournal, out: &std::path::Path, id: u64) {
    let stored = dedup.is_some_and(|d| d.drop_output(id));
    journal.drop_output(id);
    if !stored {
        unlinker::unlink(out.join(id.to_string()));
    }
}

/// The background unlinks of dropped plain files. The thread is woken once
/// per batch, not per file (a wake-up here costs more than the unlink):
/// by the first file queued, then it gathers for a millisecond.
pub(crate) mod unlinker {
    use std::path::PathBuf;
    use std::sync::{Mutex, OnceLock};
    use std::thread::Thread;

    static QUEUE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    /// Held while a batch taken off the queue is being unlinked.
    static BUSY: Mutex<()> = Mutex::new(());
    static THREAD: OnceLock<Option<Thread>> = OnceLock::new();

    fn run() {
        loop {
            std::thread::park();
            loop {
                std::thread::sleep(std::time::Duration::from_millis(1));
                let busy = BUSY.lock().unwrap_or_else(|p| p.into_inner());
                let batch = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(|p| p.into_inner()));
                if batch.is_empty() {
                    break;
                }
                for f in batch {
                    let _ = std::fs::remove_file(f);
                }
                drop(busy);
            }
        }
    }

    /// Unlinks `file` soon, on the unlinker thread (here and now if that
    /// thread cannot be started).
    pub(crate) fn unlink(file: PathBuf) {
        let thread = THREAD.get_or_init(|| match std::thread::Builder::new().name("fanstore-unlink".into()).spawn(run) {
            Ok(h) => Some(h.thread().clone()),
            Err(e) => {
                log::warn!("starting the unlinker thread: {e}; dropped outputs are unlinked on the caller's thread");
                None
            }
        });
        let Some(thread) = thread else {
            let _ = std::fs::remove_file(file);
            return;
        };
        let first = {
            let mut q = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
            q.push(file);
            q.len() == 1
        };
        if first {
            thread.unpark();
        }
    }

    /// Unlinks every file queued so far before it returns (a drain must
    /// not find a dropped output's file).
    pub(crate) fn flush() {
        let _busy = BUSY.lock().unwrap_or_else(|p| p.into_inner());
        let batch = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(|p| p.into_inner()));
        for f in batch {
            let _ = std::fs::remove_file(f);
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
    fn a_dropped_output_leaves_the_journal_at_once_and_its_file_soon() {
        let d = tempfile::tempdir().unwrap();
        let journal = HeldJournal::new(d.path().to_path_buf());
        let (a, b) = (held_file(d.path(), &journal, 7), held_file(d.path(), &journal, 8));
        drop_held(None, &journal, d.path(), 7);
        assert!(journal.get(7).is_none() && journal.get(8).is_some());
        // The unlinker thread gets to it by itself...
        let t0 = std::time::Instant::now();
        while a.exists() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the unlinker never unlinked {}", a.display());
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // ... and a flush does it before it returns.
        drop_held(None, &journal, d.path(), 8);
        unlinker::flush();
        assert!(!b.exists());
    }
}
