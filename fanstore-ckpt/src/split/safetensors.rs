//! safetensors: `N` (u64 LE), an `N`-byte JSON header, then the data
//! buffer. Each header key except `__metadata__` names a tensor
//! `{"dtype": str, "shape": [u64...], "data_offsets": [begin, end]}` whose
//! bytes are `8 + N + begin .. 8 + N + end`.
//!
//! ```text
//!  0..8        N, header length (u64 LE)
//!  8..8+N      JSON header (may end in spaces)
//!  8+N..       data buffer: tensors at data_offsets, anything else is glue
//! ```
//!
//! Nothing is assumed beyond that: tensors may come in any order, with gaps
//! or padding between them (kept as glue). Offsets past the end, reversed
//! offsets, overlapping tensors, duplicate keys or a malformed header mean
//! "not safetensors" (the caller falls back to chunking).

use super::{fill_glue, sort_disjoint, Format, Split, UnitMeta};
use crate::json::{self, Limits, Value};

/// The safetensors specification caps the header at 100 MB.
pub const MAX_HEADER: u64 = 100_000_000;

pub(super) fn split(bytes: &[u8]) -> Option<Split> {
    let n = fanstore_core::le::get_u64(bytes, 0)?;
    if !(2..=MAX_HEADER).contains(&n) {
        return None;
    }
    let data_start = 8usize.checked_add(usize::try_from(n).ok()?)?;
    let header = bytes.get(8..data_start)?;
    if header[0] != b'{' {
        return None;
    }
    let root = json::parse(header, Limits { max_len: MAX_HEADER as usize, max_depth: 16, ..Limits::default() }).ok()?;
    let members = root.as_object()?;
    let data_len = bytes.len() - data_start;
    let mut units = Vec::with_capacity(members.len());
    let mut names = std::collections::HashSet::with_capacity(members.len());
    for (key, v) in members {
        if !names.insert(key.as_ref()) {
            return None;
        }
        if key == "__metadata__" {
            // Must be an object of strings per the spec; its content is not ours.
            if !v.as_object()?.iter().all(|(_, s)| matches!(s, Value::String(_))) {
                return None;
            }
            continue;
        }
        let dtype = v.get("dtype")?.as_str()?;
        let shape = v.get("shape")?.as_array()?.iter().map(|d| d.as_u64()).collect::<Option<Vec<u64>>>()?;
        let offs = v.get("data_offsets")?.as_array()?;
        let [b, e] = offs else { return None };
        let (b, e) = (usize::try_from(b.as_u64()?).ok()?, usize::try_from(e.as_u64()?).ok()?);
        if b > e || e > data_len {
            return None;
        }
        units.push((
            data_start + b..data_start + e,
            UnitMeta { name: key.as_bytes().to_vec(), dtype: dtype.to_string(), shape },
        ));
    }
    if !sort_disjoint(&mut units) {
        return None;
    }
    Some(Split { format: Format::Safetensors, pieces: fill_glue(bytes.len(), units) })
}

#[cfg(test)]
mod tests {
    use super::super::Piece;
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn splits_in_offset_order_with_gaps_as_glue() {
        let h = r#"{"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"__metadata__":{"k":"v"},"a":{"dtype":"U8","shape":[2,2],"data_offsets":[0,4]},"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}  "#;
        let f = file(h, b"AAAApppBBBBBtail");
        let s = split(&f).unwrap();
        assert!(s.check_cover(f.len()));
        let ds = 8 + h.len();
        let names: Vec<_> = s
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Unit(r, m) => format!("{}@{}..{}", String::from_utf8_lossy(&m.name), r.start - ds, r.end - ds),
                Piece::Glue(r) => format!("glue{}", r.len()),
            })
            .collect();
        assert_eq!(names, ["glue{}", "a@0..4", "z@4..4", "glue4", "b@8..12", "glue4"].map(|s| s.replace("{}", &ds.to_string())));
        let Piece::Unit(_, m) = &s.pieces[1] else { panic!() };
        assert_eq!((m.dtype.as_str(), m.shape.as_slice()), ("U8", &[2u64, 2][..]));
    }

    #[test]
    fn refuses_malformed_headers() {
        let ok = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
        assert!(split(&file(ok, b"1234")).is_some());
        // truncated data, overlapping, reversed, duplicate, bad types, not an object
        for (h, d) in [
            (ok, &b"123"[..]),
            (r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,6]}}"#, b"123456"),
            (r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,0]}}"#, b"1234"),
            (r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#, b"1234"),
            (r#"{"a":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}}"#, b"1234"),
            (r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0]}}"#, b"1234"),
            (r#"{"a":{"dtype":8,"shape":[4],"data_offsets":[0,4]}}"#, b"1234"),
            (r#"{"__metadata__":{"k":1}}"#, b""),
            (r#"["a"]"#, b""),
        ] {
            assert!(split(&file(h, d)).is_none(), "{h}");
        }
        // header length beyond EOF, and a truncated header
        let mut f = file(ok, b"1234");
        f[0..8].copy_from_slice(&1000u64.to_le_bytes());
        assert!(split(&f).is_none());
        assert!(split(&file(ok, b"1234")[..20]).is_none());
        assert!(split(b"\x05\x00").is_none());
    }
}
