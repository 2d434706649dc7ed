//! Parsing of sizes given on the command line.

/// Parses a byte count: a number with an optional binary suffix
/// (`K`, `M`, `G`, `T`, optionally followed by `iB` or `B`; case-insensitive).
/// `256M` is 256 MiB; a plain number is bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a size (examples: 1048576, 64K, 256M, 2G)"))?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("'{s}': unknown size suffix '{suffix}' (use K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("'{s}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
