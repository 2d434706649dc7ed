//! Best-ancestor matching (`fanstore ckpt match`, EvoStore's query): given
//! a model's tensors, the stored checkpoints ranked by the longest prefix of
//! those tensors (in file order) that they hold equal by name, shape and
//! content, then by how many of them they hold, then by those tensors'
//! bytes. Used to warm-start a new architecture from the closest stored one;
//! answered from owner maps only, never from unit data.
//!
//! A query travels to every daemon as a key list:
//!
//! ```text
//! 0..4    key count K (u32)
//! K keys, back to back:
//!   name length N (u32), N name bytes, ndim D (u16), D x u64 shape,
//!   32-byte blake3 of the tensor's bytes, u64 byte length
//! ```

use crate::error::{CkptError, Result};
use crate::query::CkptRef;
use crate::render::{self, array, Obj};
use crate::split::{self, CdcParams, Piece};
use crate::store::CheckpointStore;
use crate::unit::{self, Hash};
use std::collections::HashMap;

/// One tensor of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorKey {
    pub name: Vec<u8>,
    pub shape: Vec<u64>,
    pub hash: Hash,
    pub len: u64,
}

/// The named tensors of a checkpoint file, in file order (unnamed pieces:
/// chunks of unknown formats, are left out).
pub fn keys_of_file(bytes: &[u8], cdc: &CdcParams) -> Vec<TensorKey> {
    split::split(bytes, cdc)
        .pieces
        .into_iter()
        .filter_map(|p| match p {
            Piece::Unit(r, m) if !m.name.is_empty() => {
                Some(TensorKey { name: m.name, shape: m.shape, hash: unit::hash(&bytes[r.clone()]), len: r.len() as u64 })
            }
            _ => None,
        })
        .collect()
}

/// Encodes keys for the wire (see the module doc).
pub fn encode_keys(keys: &[TensorKey]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for k in keys {
        b.extend_from_slice(&(k.name.len() as u32).to_le_bytes());
        b.extend_from_slice(&k.name);
        b.extend_from_slice(&(k.shape.len().min(u16::MAX as usize) as u16).to_le_bytes());
        for d in k.shape.iter().take(u16::MAX as usize) {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&k.hash);
        b.extend_from_slice(&k.len.to_le_bytes());
    }
    b
}

/// Decodes a key list; every length is checked against the input.
pub fn decode_keys(b: &[u8]) -> Result<Vec<TensorKey>> {
    let bad = |at: usize, what: &str| CkptError::Invalid(format!("match query: {what} at byte {at}"));
    let mut at = 0usize;
    let mut take = |n: usize, what: &str| -> Result<&[u8]> {
        let end = at.checked_add(n).filter(|&e| e <= b.len()).ok_or_else(|| bad(at, what))?;
        let s = &b[at..end];
        at = end;
        Ok(s)
    };
    let le = |s: &[u8]| s.iter().rev().fold(0u64, |a, &x| (a << 8) | x as u64);
    let count = le(take(4, "key count")?);
    let mut keys = Vec::with_capacity(count.min(1 << 16) as usize);
    for _ in 0..count {
        let n = le(take(4, "name length")?) as usize;
        let name = take(n, "name")?.to_vec();
        let ndim = le(take(2, "ndim")?) as usize;
        let shape = take(ndim.checked_mul(8).ok_or_else(|| bad(0, "shape"))?, "shape")?.chunks_exact(8).map(le).collect();
        let mut hash = [0u8; 32];
        hash.copy_from_slice(take(32, "hash")?);
        let len = le(take(8, "length")?);
        keys.push(TensorKey { name, shape, hash, len });
    }
    if at != b.len() {
        return Err(bad(at, "trailing bytes"));
    }
    Ok(keys)
}

/// One stored checkpoint and how well it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchRow {
    pub ckpt: CkptRef,
    /// Leading query tensors it holds equal (name, shape, content).
    pub prefix: u64,
    /// Query tensors it holds equal, anywhere.
    pub shared: u64,
    pub shared_bytes: u64,
    /// Its own tensor count.
    pub tensors: u64,
}

impl MatchRow {
    /// The ranking: longest prefix, then most shared tensors, then bytes,
    /// then the most recent.
    pub fn rank_key(&self) -> (u64, u64, u64, u64) {
        (self.prefix, self.shared, self.shared_bytes, self.ckpt.id)
    }
}

/// `fanstore ckpt match`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchReport {
    pub query_tensors: u64,
    /// Best first; checkpoints sharing no tensor are left out.
    pub rows: Vec<MatchRow>,
}

impl CheckpointStore {
    /// The tensors of the live checkpoint at `path` as query keys.
    pub fn keys_of(&self, path: &[u8]) -> Result<Vec<TensorKey>> {
        let id = self.id_of(path).ok_or_else(|| CkptError::not_found(path))?;
        Ok(self
            .tensors(id)
            .unwrap_or(&[])
            .iter()
            .map(|t| TensorKey { name: t.name.clone(), shape: t.shape.clone(), hash: t.hash, len: t.len })
            .collect())
    }

    /// Ranks the live checkpoints (but the one at `exclude`) against `query`.
    pub fn best_match(&self, query: &[TensorKey], exclude: Option<&[u8]>) -> MatchReport {
        let skip = exclude.and_then(|p| self.id_of(p));
        let mut rows = Vec::new();
        for e in self.entries().iter().filter(|e| e.live && Some(e.id) != skip) {
            let ts = self.tensors(e.id).unwrap_or(&[]);
            let mut by_name: HashMap<&[u8], (&[u64], &Hash)> = HashMap::with_capacity(ts.len());
            for t in ts {
                by_name.entry(&t.name).or_insert((&t.shape, &t.hash));
            }
            let equal = |k: &TensorKey| by_name.get(&k.name[..]).is_some_and(|(s, h)| *s == &k.shape[..] && **h == k.hash);
            let prefix = query.iter().take_while(|k| equal(k)).count() as u64;
            let (mut shared, mut bytes) = (0u64, 0u64);
            for k in query.iter().filter(|k| equal(k)) {
                shared += 1;
                bytes += k.len;
            }
            if shared > 0 {
                rows.push(MatchRow {
                    ckpt: CkptRef { id: e.id, path: e.path.clone(), live: true },
                    prefix,
                    shared,
                    shared_bytes: bytes,
                    tensors: ts.len() as u64,
                });
            }
        }
        rows.sort_by_key(|r| std::cmp::Reverse(r.rank_key()));
        MatchReport { query_tensors: query.len() as u64, rows }
    }
}

impl MatchReport {
    pub fn to_table(&self) -> String {
        if self.rows.is_empty() {
            return format!("no stored checkpoint shares any of the {} tensors\n", self.query_tensors);
        }
        let head = ["rank", "id", "checkpoint", "prefix", "shared", "shared bytes", "its tensors"];
        let row = |(i, r): (usize, &MatchRow)| {
            vec![
                (i + 1).to_string(),
                r.ckpt.id.to_string(),
                render::text(&r.ckpt.path),
                format!("{}/{}", r.prefix, self.query_tensors),
                r.shared.to_string(),
                render::bytes(r.shared_bytes),
                r.tensors.to_string(),
            ]
        };
        render::table_of(&head, self.rows.iter().enumerate(), row, &[0, 1, 3, 4, 5, 6])
    }
    pub fn to_json(&self) -> String {
        Obj::new()
            .num("query_tensors", self.query_tensors)
            .raw(
                "matches",
                &array(self.rows.iter().map(|r| {
                    Obj::new()
                        .num("id", r.ckpt.id)
                        .str("path", &r.ckpt.path)
                        .num("prefix", r.prefix)
                        .num("shared", r.shared)
                        .num("shared_bytes", r.shared_bytes)
                        .num("tensors", r.tensors)
                        .end()
                })),
            )
            .end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_damage_is_an_error() {
        let keys = vec![
            TensorKey { name: b"a.weight".to_vec(), shape: vec![3, 4], hash: [7; 32], len: 48 },
            TensorKey { name: Vec::new(), shape: vec![], hash: [1; 32], len: 0 },
        ];
        let b = encode_keys(&keys);
        assert_eq!(decode_keys(&b).unwrap(), keys);
        assert!(decode_keys(&b[..b.len() - 1]).is_err());
        let mut extra = b.clone();
        extra.push(0);
        assert!(decode_keys(&extra).unwrap_err().to_string().contains("trailing"));
        for m in fanstore_core::format::testing::mutated_copies(&b, 5000, 1) {
            let _ = decode_keys(&m);
        }
        assert!(decode_keys(&[0xff, 0xff, 0xff, 0xff]).is_err());
    }
}
