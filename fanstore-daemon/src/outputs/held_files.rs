//! The files a rank keeps in `out/` for each output it holds: the bytes
//! (`out/<id>`) and the sidecar (`out/<id>.rec`) that names the output for
//! recovery after a kill; renaming and dropping them at the holder's end of
//! HOLDER_RENAME and HOLDER_DROP. Below both the namespace (which sends
//! those) and [`crate::outputs::held`] (which writes the files).

use fanstore_core::wire::OutRecord;

/// The errno for a failed write of an output's file: ENOSPC and EDQUOT as
/// they are, anything else EIO.
pub(crate) fn io_errno(e: &std::io::Error) -> i32 {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => libc::ENOSPC,
        Some(libc::EDQUOT) => libc::EDQUOT,
        _ => libc::EIO,
    }
}
/// Writes `out/<id>.rec`, the sidecar naming a held output for recovery
/// after a kill (a temporary file renamed into place; fsynced with `fsync`).
pub(crate) fn write_sidecar_in(out: &std::path::Path, path: &[u8], rec: &OutRecord, fsync: bool) -> Result<(), i32> {
    let file = out.join(format!("{}.rec", rec.id));
    let tmp = out.join(format!("{}.rec.tmp", rec.id));
    let res = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&crate::outputs::persist::encode_index(&[(path.to_vec(), *rec)]))?;
        if fsync {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &file)
    })();
    res.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_errno(&e)
    })
}

/// HOLDER_RENAME at the holder: output `id` is now named `path`, in its
/// checkpoint store (if there) and in its sidecar, so a restart after a
/// kill registers it under the new name.
pub(crate) fn rename_held(dedup: Option<&crate::outputs::dedup::Dedup>, out: &std::path::Path, id: u64, path: &[u8], fsync: bool) {
    if let Some(d) = dedup {
        d.rename_output(id, path);
    }
    let file = out.join(format!("{id}.rec"));
    let Ok(bytes) = std::fs::read(&file) else { return };
    let Some(rec) = crate::outputs::persist::decode_index(&file, &bytes).ok().and_then(|v| v.first().map(|(_, r)| *r)) else { return };
    if let Err(e) = write_sidecar_in(out, path, &rec, fsync) {
        log::warn!("rewriting {}: errno {e}", file.display());
    }
}

/// HOLDER_DROP at the holder (or a replaced output held here): deletes
/// what this rank holds of output `id`, its plain file and sidecar, or its
/// checkpoint.
pub(crate) fn drop_held(dedup: Option<&crate::outputs::dedup::Dedup>, out: &std::path::Path, id: u64) {
    if !dedup.is_some_and(|d| d.drop_output(id)) {
        let _ = std::fs::remove_file(out.join(id.to_string()));
    }
    let _ = std::fs::remove_file(out.join(format!("{id}.rec")));
}
