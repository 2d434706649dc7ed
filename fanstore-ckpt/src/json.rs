//! A small strict JSON parser (RFC 8259) for safetensors headers.
//!
//! Strict: UTF-8 input only, no trailing commas, no comments, no leading
//! zeros, no control characters in strings, no lone surrogates in `\u`
//! escapes, nothing but whitespace after the value. Bounded: the caller's
//! input size limit, a nesting depth limit (no stack overflow on `[[[[...`)
//! and a value count limit. Strings without escapes borrow from the input.
//! Duplicate object keys are kept in order; callers decide (safetensors
//! refuses them).

use std::borrow::Cow;

/// A parsed JSON value borrowing from the input.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Null,
    Bool(bool),
    /// The number's text, already checked against the JSON grammar.
    Number(&'a str),
    String(Cow<'a, str>),
    Array(Vec<Value<'a>>),
    /// Members in input order (duplicates kept).
    Object(Vec<(Cow<'a, str>, Value<'a>)>),
}

impl<'a> Value<'a> {
    /// The number as an exact unsigned integer (no sign, fraction or exponent).
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Number(t) if t.bytes().all(|c| c.is_ascii_digit()) => t.parse().ok(),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value<'a>]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    pub fn as_object(&self) -> Option<&[(Cow<'a, str>, Value<'a>)]> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }
    /// The first member named `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        self.as_object()?.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// Bounds on what [`parse`] accepts.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest input in bytes.
    pub max_len: usize,
    /// Deepest nesting of arrays and objects.
    pub max_depth: usize,
    /// Most values (of any kind) in one document.
    pub max_values: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // The safetensors specification caps its header at 100 MB.
        Limits { max_len: 100_000_000, max_depth: 64, max_values: 10_000_000 }
    }
}

/// Why a document was refused, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("JSON error at byte {offset}: {problem}")]
pub struct JsonError {
    pub offset: usize,
    pub problem: &'static str,
}

/// Parses one JSON document (surrounding whitespace allowed).
pub fn parse(input: &[u8], limits: Limits) -> Result<Value<'_>, JsonError> {
    if input.len() > limits.max_len {
        return Err(JsonError { offset: limits.max_len, problem: "document longer than the limit" });
    }
    let text = std::str::from_utf8(input)
        .map_err(|e| JsonError { offset: e.valid_up_to(), problem: "invalid UTF-8" })?;
    let mut p = Parser { s: text, b: input, pos: 0, limits, values: 0 };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.pos != input.len() {
        return p.err("trailing characters after the document");
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a str,
    b: &'a [u8],
    pos: usize,
    limits: Limits,
    values: usize,
}

impl<'a> Parser<'a> {
    fn err<T>(&self, problem: &'static str) -> Result<T, JsonError> {
        Err(JsonError { offset: self.pos, problem })
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn expect(&mut self, c: u8, problem: &'static str) -> Result<(), JsonError> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            self.err(problem)
        }
    }

    fn literal(&mut self, word: &'static str, v: Value<'a>) -> Result<Value<'a>, JsonError> {
        if self.b[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(v)
        } else {
            self.err("invalid literal")
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value<'a>, JsonError> {
        self.values += 1;
        if self.values > self.limits.max_values {
            return self.err("more values than the limit");
        }
        match self.peek() {
            None => self.err("unexpected end of input"),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => self.err("unexpected character"),
        }
    }

    /// The elements of the object or array that starts at `pos`, up to its
    /// `close` byte, each read by `element` (from before its leading white
    /// space), separated by commas; `after` is the fault of anything else
    /// after an element.
    fn elements<T>(
        &mut self,
        depth: usize,
        close: u8,
        after: &'static str,
        mut element: impl FnMut(&mut Self) -> Result<T, JsonError>,
    ) -> Result<Vec<T>, JsonError> {
        if depth > self.limits.max_depth {
            return self.err("nesting deeper than the limit");
        }
        self.pos += 1;
        let mut items = Vec::new();
        self.ws();
        if self.peek() == Some(close) {
            self.pos += 1;
            return Ok(items);
        }
        loop {
            items.push(element(self)?);
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(c) if c == close => {
                    self.pos += 1;
                    return Ok(items);
                }
                _ => return self.err(after),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value<'a>, JsonError> {
        let members = self.elements(depth, b'}', "expected ',' or '}'", |p| {
            p.ws();
            if p.peek() != Some(b'"') {
                return p.err("expected a string key");
            }
            let k = p.string()?;
            p.ws();
            p.expect(b':', "expected ':' after a key")?;
            p.ws();
            Ok((k, p.value(depth)?))
        })?;
        Ok(Value::Object(members))
    }

    fn array(&mut self, depth: usize) -> Result<Value<'a>, JsonError> {
        let items = self.elements(depth, b']', "expected ',' or ']'", |p| {
            p.ws();
            p.value(depth)
        })?;
        Ok(Value::Array(items))
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<Value<'a>, JsonError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return self.err("leading zero in a number");
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return self.err("expected a digit"),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return self.err("expected a digit after '.'");
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return self.err("expected a digit in the exponent");
            }
        }
        Ok(Value::Number(&self.s[start..self.pos]))
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let Some(h) = self.b.get(self.pos..self.pos + 4) else {
            return self.err("truncated \\u escape");
        };
        let mut v = 0u32;
        for &c in h {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return self.err("bad hex digit in \\u escape"),
            };
            v = v * 16 + d as u32;
        }
        self.pos += 4;
        Ok(v)
    }

    /// Parses a string starting at the opening quote.
    fn string(&mut self) -> Result<Cow<'a, str>, JsonError> {
        self.pos += 1;
        let start = self.pos;
        // Fast path: no escapes.
        loop {
            match self.peek() {
                None => return self.err("unterminated string"),
                Some(b'"') => {
                    let s = &self.s[start..self.pos];
                    self.pos += 1;
                    return Ok(Cow::Borrowed(s));
                }
                Some(b'\\') => break,
                Some(c) if c < 0x20 => return self.err("control character in a string"),
                Some(_) => self.pos += 1,
            }
        }
        let mut out = String::from(&self.s[start..self.pos]);
        loop {
            match self.peek() {
                None => return self.err("unterminated string"),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(Cow::Owned(out));
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let Some(e) = self.peek() else { return self.err("unterminated escape") };
                    self.pos += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let cp = if (0xD800..0xDC00).contains(&hi) {
                                if !self.b[self.pos..].starts_with(b"\\u") {
                                    return self.err("high surrogate without a low surrogate");
                                }
                                self.pos += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return self.err("high surrogate without a low surrogate");
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else if (0xDC00..0xE000).contains(&hi) {
                                return self.err("lone low surrogate");
                            } else {
                                hi
                            };
                            match char::from_u32(cp) {
                                Some(c) => out.push(c),
                                None => return self.err("invalid code point"),
                            }
                        }
                        _ => {
                            self.pos -= 1;
                            return self.err("invalid escape");
                        }
                    }
                }
                Some(c) if c < 0x20 => return self.err("control character in a string"),
                Some(_) => {
                    // Copy a run of plain characters at once (the input is valid UTF-8
                    // and the run ends at an ASCII byte, so the slice is on char boundaries).
                    let run = self.pos;
                    while let Some(c) = self.peek() {
                        if c == b'"' || c == b'\\' || c < 0x20 {
                            break;
                        }
                        self.pos += 1;
                    }
                    out.push_str(&self.s[run..self.pos]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Value<'_>, JsonError> {
        parse(s.as_bytes(), Limits::default())
    }

    #[test]
    fn accepts_the_grammar() {
        let v = p(r#" {"a": [1, -0.5e+3, true, false, null, "x\"y\\\/\b\f\n\r\t\u00e9\ud83d\ude00"], "b": {}, "c": []} "#).unwrap();
        let a = v.get("a").unwrap().as_array().unwrap();
        assert_eq!(a[0].as_u64(), Some(1));
        assert_eq!(a[1], Value::Number("-0.5e+3"));
        assert_eq!(a[1].as_u64(), None);
        assert_eq!(a[5].as_str(), Some("x\"y\\/\u{8}\u{c}\n\r\t\u{e9}\u{1F600}"));
        assert_eq!(v.get("b"), Some(&Value::Object(vec![])));
        assert_eq!(p("18446744073709551615").unwrap().as_u64(), Some(u64::MAX));
        assert_eq!(p("18446744073709551616").unwrap().as_u64(), None);
        assert!(matches!(p("\"plain\"").unwrap(), Value::String(Cow::Borrowed("plain"))));
    }

    #[test]
    fn refuses_what_json_does_not_allow() {
        for bad in [
            "", " ", "[1,]", "{\"a\":1,}", "01", "1.", ".5", "-", "1e", "+1", "[1 2]", "{\"a\" 1}", "{1:2}",
            "\"a", "\"\\x\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\t\"", "tru", "nul",
            "[] []", "{\"a\":1}x", "'a'", "NaN", "[\"\\u12\"]",
        ] {
            assert!(p(bad).is_err(), "accepted {bad:?}");
        }
        assert_eq!(parse(b"\"\xff\"", Limits::default()).unwrap_err().problem, "invalid UTF-8");
    }

    #[test]
    fn limits_hold() {
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert_eq!(p(&deep).unwrap_err().problem, "nesting deeper than the limit");
        let ok = "[".repeat(64) + &"]".repeat(64);
        assert!(p(&ok).is_ok());
        let l = Limits { max_len: 4, ..Limits::default() };
        assert!(parse(b"[1,2]", l).is_err());
        let l = Limits { max_values: 3, ..Limits::default() };
        assert!(parse(b"[1,2]", l).is_ok());
        assert!(parse(b"[1,2,3]", l).is_err());
        // Deep nesting far past the limit returns an error, not a stack overflow.
        let very = "[".repeat(1_000_000);
        assert!(p(&very).is_err());
    }

    #[test]
    fn mutated_documents_never_panic() {
        let base = br#"{"__metadata__":{"format":"pt"},"w\u00e9":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[],"data_offsets":[24,26]},"n":[null,true,false,-1.5e-3,"\ud83d\ude00"]}"#;
        let mut x = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabet = b"{}[]\",:\\u0123456789abcdefE+-. \ttruefalsenull\x00\x1f\x7f\xc3\xa9\xff";
        let (mut ok, mut bad) = (0, 0);
        for _ in 0..20_000 {
            let mut b = base.to_vec();
            for _ in 0..1 + next() % 3 {
                let i = (next() % b.len() as u64) as usize;
                match next() % 3 {
                    0 => b[i] = alphabet[(next() % alphabet.len() as u64) as usize],
                    1 => {
                        b.remove(i);
                    }
                    _ => b.insert(i, alphabet[(next() % alphabet.len() as u64) as usize]),
                }
            }
            match parse(&b, Limits::default()) {
                Ok(v) => {
                    ok += 1;
                    // An accepted document is valid UTF-8 and re-parses to the same value.
                    let again = parse(&b, Limits::default()).unwrap();
                    assert_eq!(v, again);
                }
                Err(e) => {
                    bad += 1;
                    assert!(e.offset <= b.len());
                }
            }
        }
        assert!(ok > 100 && bad > 100, "ok {ok} bad {bad}");
    }
}
