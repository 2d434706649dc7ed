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
pub(crate) fn drop_held(dedup: Option<&crate::outputs::dedup::Dedup>, journal: &HeldJournal, out: &std::path::Path, id: u64) {
    if !dedup.is_some_and(|d| d.drop_output(id)) {
        let _ = std::fs::remove_file(out.join(id.to_string()));
    }
    journal.drop_output(id);
}
