//! Text tables and JSON for the query reports (hand-written: no serde).

/// `s` as a JSON string literal. Names are bytes: invalid UTF-8 is replaced
/// by U+FFFD; quotes, backslashes and control characters are escaped.
pub fn json_str(s: &[u8]) -> String {
    let text = String::from_utf8_lossy(s);
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON object built member by member.
pub struct Obj(String);

impl Obj {
    pub fn new() -> Obj {
        Obj(String::from("{"))
    }
    fn key(&mut self, k: &str) {
        if self.0.len() > 1 {
            self.0.push(',');
        }
        self.0.push_str(&json_str(k.as_bytes()));
        self.0.push(':');
    }
    pub fn str(mut self, k: &str, v: &[u8]) -> Obj {
        self.key(k);
        self.0.push_str(&json_str(v));
        self
    }
    pub fn num(mut self, k: &str, v: impl std::fmt::Display) -> Obj {
        self.key(k);
        self.0.push_str(&v.to_string());
        self
    }
    /// A float, or null when it is not finite.
    pub fn float(mut self, k: &str, v: f64) -> Obj {
        self.key(k);
        if v.is_finite() {
            self.0.push_str(&format!("{v:.4}"));
        } else {
            self.0.push_str("null");
        }
        self
    }
    pub fn bool(mut self, k: &str, v: bool) -> Obj {
        self.key(k);
        self.0.push_str(if v { "true" } else { "false" });
        self
    }
    pub fn null(mut self, k: &str) -> Obj {
        self.key(k);
        self.0.push_str("null");
        self
    }
    /// A member whose value is already JSON.
    pub fn raw(mut self, k: &str, json: &str) -> Obj {
        self.key(k);
        self.0.push_str(json);
        self
    }
    pub fn end(mut self) -> String {
        self.0.push('}');
        self.0
    }
}

impl Default for Obj {
    fn default() -> Self {
        Obj::new()
    }
}

/// A JSON array of already-encoded values.
pub fn array(items: impl IntoIterator<Item = String>) -> String {
    let v: Vec<String> = items.into_iter().collect();
    format!("[{}]", v.join(","))
}

/// Human-readable bytes (binary units, up to PiB).
pub fn bytes(n: u64) -> String {
    fanstore_core::status::bytes_in_units(n, &["B", "KiB", "MiB", "GiB", "TiB", "PiB"])
}

/// A ratio `a / b` for display ("-" when b is 0).
pub fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "-".into()
    } else {
        format!("{:.2}x", a as f64 / b as f64)
    }
}

/// [`table`] of one row per item of `items`, made by `row`.
pub fn table_of<T>(
    head: &[&str],
    items: impl IntoIterator<Item = T>,
    row: impl FnMut(T) -> Vec<String>,
    right: &[usize],
) -> String {
    let rows: Vec<Vec<String>> = items.into_iter().map(row).collect();
    table(head, &rows, right)
}

/// A left-aligned text table; columns listed in `right` are right-aligned.
pub fn table(head: &[&str], rows: &[Vec<String>], right: &[usize]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i] - c.chars().count();
            if i > 0 {
                s.push_str("  ");
            }
            if right.contains(&i) {
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            } else {
                s.push_str(c);
                if i + 1 < cells.len() {
                    s.push_str(&" ".repeat(pad));
                }
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(head.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// Bytes as display text (lossy UTF-8).
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json;

    #[test]
    fn json_strings_escape_and_reparse() {
        for s in [&b"plain"[..], b"q\"b\\s/", b"\x00\x01\x1f\x7f\n\t", "é😀".as_bytes(), b"bad\xff utf8"] {
            let enc = json_str(s);
            let v = json::parse(enc.as_bytes(), json::Limits::default()).unwrap();
            assert_eq!(v.as_str().unwrap(), String::from_utf8_lossy(s));
        }
        let o = Obj::new().str("n\"ame", b"x").num("a", 3).float("r", f64::NAN).bool("b", true).null("z").raw("l", &array(["1".into(), "2".into()])).end();
        let v = json::parse(o.as_bytes(), json::Limits::default()).unwrap();
        assert_eq!(v.get("n\"ame").unwrap().as_str(), Some("x"));
        assert_eq!(v.get("l").unwrap().as_array().unwrap().len(), 2);
        assert_eq!(v.get("r"), Some(&json::Value::Null));
    }

    #[test]
    fn tables_align() {
        let t = table(&["name", "size"], &[vec!["a".into(), "1".into()], vec!["long".into(), "100".into()]], &[1]);
        assert_eq!(t, "name  size\na        1\nlong   100\n");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(ratio(3, 2), "1.50x");
    }
}
