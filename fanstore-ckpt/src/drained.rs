//! The checkpoint stores a job drained to `--persist DIR`, read by the next
//! job's daemons (in place) and by `fanstore export`: which checkpoints they
//! hold (from their catalogs, no store opened) and opening one. Where they
//! live is [`fanstore_core::persisted::drained_dir`].

use crate::catalog::{self, Catalog};
use crate::error::CkptError;
use crate::store::CheckpointStore;
use fanstore_core::persisted::{drained_dir, STORE_DIR};
use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// Path -> rank, for every live checkpoint of every store drained to
/// `persist` (an earlier job's ranks).
pub fn persisted_catalogs(persist: &Path) -> Result<HashMap<Vec<u8>, u32>, CkptError> {
    let mut out = HashMap::new();
    let Ok(rd) = std::fs::read_dir(persist.join(STORE_DIR)) else { return Ok(out) };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rank) = name.strip_prefix("rank-").and_then(|r| r.parse::<u32>().ok()) else { continue };
        let file = e.path().join(catalog::FILE_NAME);
        let b = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(CkptError::io(&file, e)),
        };
        for c in Catalog::decode(&file, &b)?.entries.into_iter().filter(|c| c.live) {
            out.insert(c.path, rank);
        }
    }
    Ok(out)
}

/// Opens the store rank `rank` drained to `persist`, waiting (up to 10 s)
/// while another process has it open: a job with fewer ranks reading it in
/// place, and `fanstore export`.
pub fn open_drained(persist: &Path, rank: u32) -> Result<CheckpointStore, CkptError> {
    let dir = drained_dir(persist, rank);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match CheckpointStore::open(&dir) {
            Err(CkptError::Locked { .. }) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            r => return r,
        }
    }
}
