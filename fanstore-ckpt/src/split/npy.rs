//! .npy: numpy's single-array format.
//!
//! ```text
//!  0..6    magic "\x93NUMPY"
//!  6       major version (1, 2 or 3)     7   minor version
//!  v1:  8..10  header length H (u16 LE)   10..10+H  header
//!  v2/v3: 8..12 header length H (u32 LE)  12..12+H  header
//!  header: a Python dict literal, padded with spaces, ending in '\n':
//!          {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
//!  then:   the array data, to the end of the file (one unit)
//! ```
//!
//! The dict is parsed minimally: strings, ints, True/False/None, tuples and
//! lists (a structured dtype's `descr` is a list; its source text is kept).
//! It must have `descr`, `fortran_order` and `shape`; anything else refuses
//! the file (the caller falls back to chunking).

use super::{Format, Piece, Split, UnitMeta};

pub(super) const MAGIC: &[u8] = b"\x93NUMPY";
const MAX_DEPTH: usize = 32;

/// A parsed .npy header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    pub major: u8,
    pub minor: u8,
    /// Where the array data starts (the length of magic + version + length + header).
    pub data_offset: usize,
    /// The dtype string, or the source text of a structured dtype's list.
    pub descr: String,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
}

/// Parses the header of the .npy bytes `b` (which may be longer than the header).
pub fn parse_npy_header(b: &[u8]) -> Option<NpyHeader> {
    if !b.starts_with(MAGIC) {
        return None;
    }
    let (major, minor) = (*b.get(6)?, *b.get(7)?);
    let (hlen, hstart): (usize, usize) = match major {
        1 => (fanstore_core::le::get_u16(b, 8)? as usize, 10),
        2 | 3 => (usize::try_from(fanstore_core::le::get_u32(b, 8)?).ok()?, 12),
        _ => return None,
    };
    let data_offset = hstart.checked_add(hlen)?;
    let text = b.get(hstart..data_offset)?;
    let mut p = Lit { b: text, pos: 0 };
    let dict = p.dict()?;
    p.ws();
    if p.pos != text.len() {
        return None;
    }
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    for (k, v) in dict {
        let slot_taken = match k.as_slice() {
            b"descr" => descr.replace(v).is_some(),
            b"fortran_order" => fortran.replace(v).is_some(),
            b"shape" => shape.replace(v).is_some(),
            _ => return None,
        };
        if slot_taken {
            return None;
        }
    }
    let descr = match descr? {
        Lit0::Str(s) => String::from_utf8(s).ok()?,
        Lit0::Other(r) => String::from_utf8(text[r].to_vec()).ok()?,
        _ => return None,
    };
    let fortran_order = match fortran? {
        Lit0::Bool(v) => v,
        _ => return None,
    };
    let shape = match shape? {
        Lit0::Tuple(v) => v,
        _ => return None,
    };
    Some(NpyHeader { major, minor, data_offset, descr, fortran_order, shape })
}

pub(super) fn split(bytes: &[u8]) -> Option<Split> {
    let h = parse_npy_header(bytes)?;
    let meta = UnitMeta { name: b"array".to_vec(), dtype: h.descr, shape: h.shape };
    let mut pieces = vec![Piece::Glue(0..h.data_offset)];
    pieces.push(Piece::Unit(h.data_offset..bytes.len(), meta));
    Some(Split { format: Format::Npy, pieces })
}

/// The values of the header dict that matter; everything else is `Other`
/// with its source range.
enum Lit0 {
    Str(Vec<u8>),
    Bool(bool),
    Tuple(Vec<u64>),
    Other(std::ops::Range<usize>),
}

struct Lit<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Lit<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn dict(&mut self) -> Option<Vec<(Vec<u8>, Lit0)>> {
        if !self.eat(b'{') {
            return None;
        }
        let mut out = Vec::new();
        loop {
            if self.eat(b'}') {
                return Some(out);
            }
            self.ws();
            let k = self.string()?;
            if !self.eat(b':') {
                return None;
            }
            let v = self.value(0)?;
            out.push((k, v));
            if !self.eat(b',') {
                return if self.eat(b'}') { Some(out) } else { None };
            }
        }
    }

    fn string(&mut self) -> Option<Vec<u8>> {
        let q = self.peek().filter(|&c| c == b'\'' || c == b'"')?;
        self.pos += 1;
        let mut s = Vec::new();
        loop {
            let c = self.peek()?;
            self.pos += 1;
            match c {
                _ if c == q => return Some(s),
                b'\\' => {
                    s.push(self.peek()?);
                    self.pos += 1;
                }
                b'\n' => return None,
                _ => s.push(c),
            }
        }
    }

    fn word(&mut self) -> &[u8] {
        let start = self.pos;
        while let Some(b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_') = self.peek() {
            self.pos += 1;
        }
        &self.b[start..self.pos]
    }

    fn value(&mut self, depth: usize) -> Option<Lit0> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        let start = self.pos;
        match self.peek()? {
            b'\'' | b'"' => self.string().map(Lit0::Str),
            b'(' | b'[' => {
                let close = if self.peek() == Some(b'(') { b')' } else { b']' };
                self.pos += 1;
                let mut ints = Some(Vec::new());
                loop {
                    if self.eat(close) {
                        break;
                    }
                    match self.value(depth + 1)? {
                        Lit0::Other(r) if close == b')' => {
                            let n = std::str::from_utf8(&self.b[r]).ok().and_then(|t| t.parse::<u64>().ok());
                            match (n, ints.as_mut()) {
                                (Some(n), Some(v)) => v.push(n),
                                _ => ints = None,
                            }
                        }
                        _ => ints = None,
                    }
                    if !self.eat(b',') {
                        if self.eat(close) {
                            break;
                        }
                        return None;
                    }
                }
                match ints {
                    Some(v) if close == b')' => Some(Lit0::Tuple(v)),
                    _ => Some(Lit0::Other(start..self.pos)),
                }
            }
            b'-' | b'0'..=b'9' => {
                if self.peek() == Some(b'-') {
                    self.pos += 1;
                }
                let w = self.word();
                if w.is_empty() || !w.iter().all(u8::is_ascii_digit) {
                    return None;
                }
                Some(Lit0::Other(start..self.pos))
            }
            _ => match self.word() {
                b"True" => Some(Lit0::Bool(true)),
                b"False" => Some(Lit0::Bool(false)),
                b"None" => Some(Lit0::Other(start..self.pos)),
                _ => None,
            },
        }
    }
}

/// A .npy file of format version `major` (1, 2 or 3) whose header is the
/// dict text `dict`, then `data`: the header padded with spaces and a
/// newline to a multiple of 64 bytes, as numpy writes it. For the tests,
/// here and in `tests/`.
#[doc(hidden)]
pub fn npy_file(major: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&[major, 0]);
    let mut h = dict.as_bytes().to_vec();
    let pre = if major == 1 { 10 } else { 12 };
    while !(pre + h.len() + 1).is_multiple_of(64) {
        h.push(b' ');
    }
    h.push(b'\n');
    if major == 1 {
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    } else {
        b.extend_from_slice(&(h.len() as u32).to_le_bytes());
    }
    b.extend_from_slice(&h);
    b.extend_from_slice(data);
    b
}

#[cfg(test)]
mod tests {
    use super::npy_file as npy;
    use super::*;

    #[test]
    fn headers_of_every_version() {
        for major in [1, 2, 3] {
            let f = npy(major, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", &[7u8; 24]);
            let h = parse_npy_header(&f).unwrap();
            assert_eq!((h.major, h.descr.as_str(), h.fortran_order, h.shape.as_slice()), (major, "<f4", false, &[2u64, 3][..]));
            assert_eq!(h.data_offset, f.len() - 24);
            assert_eq!(h.data_offset % 64, 0);
            let s = split(&f).unwrap();
            assert!(s.check_cover(f.len()));
            assert_eq!(s.pieces[1].range(), &(h.data_offset..f.len()));
        }
        let f = npy(1, "{'descr': [('a', '<i4'), ('b', '<f8', (2,))], 'fortran_order': True, 'shape': (5,), }", b"");
        let h = parse_npy_header(&f).unwrap();
        assert_eq!(h.descr, "[('a', '<i4'), ('b', '<f8', (2,))]");
        assert_eq!(h.shape, vec![5]);
        let f = npy(1, "{'descr': '|O', 'fortran_order': False, 'shape': (), }", b"pickle");
        assert_eq!(parse_npy_header(&f).unwrap().shape, Vec::<u64>::new());
    }

    #[test]
    fn bad_headers_are_refused() {
        for d in [
            "{'descr': '<f4', 'fortran_order': False}",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': [1]}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} junk",
            "{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}",
            "{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}",
            "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",
        ] {
            assert!(parse_npy_header(&npy(1, d, b"1234")).is_none(), "{d}");
        }
        let mut f = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", b"1234");
        f[6] = 4;
        assert!(parse_npy_header(&f).is_none());
        f[6] = 1;
        f[8] = 0xff; // header length beyond EOF
        assert!(parse_npy_header(&f).is_none());
        let deep = format!("{{'descr': {}{}, 'fortran_order': False, 'shape': (1,)}}", "[".repeat(100), "]".repeat(100));
        assert!(parse_npy_header(&npy(1, &deep, b"")).is_none());
    }
}
