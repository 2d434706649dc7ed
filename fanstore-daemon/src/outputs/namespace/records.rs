//! The records a rank owns: a map from path to record, mirrored into the
//! node's shared-memory record table ([`fanstore_core::record_table`]) on
//! every change, so that the node's clients can answer a stat, or open an
//! output this node holds, without a message. Every change goes through
//! these methods (the map is private), under the metadata lock that
//! serialises the table's one writer.

use fanstore_core::record_table::RecordTable;
use fanstore_core::wire::OutRecord;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Default)]
pub struct Records {
    map: HashMap<Vec<u8>, OutRecord>,
    table: Option<Arc<RecordTable>>,
}

impl Records {
    /// From now on, publish every record in `table` (those already held first).
    pub fn publish_to(&mut self, table: Arc<RecordTable>) {
        for (p, r) in &self.map {
            table.put(p, r);
        }
        self.table = Some(table);
    }

    pub fn get(&self, path: &[u8]) -> Option<&OutRecord> {
        self.map.get(path)
    }

    pub fn insert(&mut self, path: Vec<u8>, rec: OutRecord) -> Option<OutRecord> {
        if let Some(t) = &self.table {
            t.put(&path, &rec);
        }
        self.map.insert(path, rec)
    }

    pub fn remove(&mut self, path: &[u8]) -> Option<OutRecord> {
        let old = self.map.remove(path);
        if let (Some(t), Some(_)) = (&self.table, &old) {
            t.remove(path);
        }
        old
    }

    /// Changes the record of `path` with `f` (None if there is none) and
    /// publishes the result.
    pub fn update<R>(&mut self, path: &[u8], f: impl FnOnce(&mut OutRecord) -> R) -> Option<R> {
        let r = self.map.get_mut(path)?;
        let out = f(r);
        if let Some(t) = &self.table {
            t.put(path, r);
        }
        Some(out)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Vec<u8>, &OutRecord)> {
        self.map.iter()
    }

    pub fn keys(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.map.keys()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanstore_core::record_table::{Found, RecordView};

    /// Every way a record changes reaches the table.
    #[test]
    fn every_change_is_published() {
        let d = tempfile::tempdir().unwrap();
        let t = Arc::new(RecordTable::create(&d.path().join("t.records"), 64, 0, 0o600).unwrap());
        let mut r = Records::default();
        let rec = OutRecord { mode: libc::S_IFREG | 0o644, id: 1, ..Default::default() };
        r.insert(b"before".to_vec(), rec);
        r.publish_to(t.clone());
        let v = RecordView::parse(t.bytes(), 0).unwrap();
        assert_eq!(v.get(b"before"), Found::Live(rec));
        r.insert(b"a".to_vec(), rec);
        assert_eq!(v.get(b"a"), Found::Live(rec));
        r.update(b"a", |x| x.size = 9);
        assert_eq!(v.get(b"a"), Found::Live(OutRecord { size: 9, ..rec }));
        r.remove(b"a");
        assert_eq!(v.get(b"a"), Found::Unknown);
        assert_eq!(r.update(b"a", |x| x.size = 1), None);
    }
}
