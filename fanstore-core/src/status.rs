//! The STATUS reply as its readers see it: `key=value` text parsed into
//! pairs, and the table `fanstore status` prints from every rank's text.
//!
//! The daemon writes the text (its `status::Snapshot::render`: one
//! `key=value` per line, in a fixed order); readers ignore keys they do not
//! know, so a newer daemon's text still parses.
//!
//! ```
//! use fanstore_core::status::{parse, table};
//! let kv = parse("rank=0\nhost=n1\nstatus=ready\nbytes_local=3145728\n");
//! let t = table(&[(0, Some(kv)), (1, None)]);
//! assert!(t.lines().nth(1).unwrap().contains("3.0 MiB"));
//! assert!(t.lines().nth(2).unwrap().contains("unreachable"));
//! ```

/// `key=value` lines as pairs, in order; lines without `=` are skipped.
pub fn parse(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Human-readable bytes (KiB/MiB/GiB, up to TiB).
pub fn human_bytes(v: u64) -> String {
    bytes_in_units(v, &["B", "KiB", "MiB", "GiB", "TiB"])
}

/// `v` bytes in the largest of `units` (`"B"` first, then each 1024 times
/// the one before) that keeps the number at 1 or more: one decimal
/// (`1.5 MiB`), or the whole count in the first unit (`12 B`).
pub fn bytes_in_units(v: u64, units: &[&str]) -> String {
    let mut x = v as f64;
    let mut i = 0;
    while x >= 1024.0 && i + 1 < units.len() {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v} B")
    } else {
        format!("{x:.1} {}", units[i])
    }
}

/// The columns of `fanstore status`: header and the STATUS key each shows.
const COLUMNS: [(&str, &str); 23] = [
    ("rank", "rank"),
    ("host", "host"),
    ("status", "status"),
    ("parts", "partitions"),
    ("files", "files"),
    ("local", "bytes_local"),
    ("load s", "load_seconds"),
    ("load MB/s", "load_mbps"),
    ("opens", "opens"),
    ("remote sent", "remote_sent"),
    ("served", "remote_served"),
    ("remote p50 us", "remote_p50_us"),
    ("p99 us", "remote_p99_us"),
    ("remote MB/s", "remote_mbps"),
    ("wake us", "wake_across_us"),
    ("prefetched", "replicated_bytes"),
    ("read ahead", "read_ahead"),
    ("hits", "cache_hits"),
    ("misses", "cache_misses"),
    ("evictions", "cache_evictions"),
    ("errors", "errors"),
    ("cpu s", "cpu_seconds"),
    ("cpus", "cpus"),
];

/// One rank's parsed STATUS text, `None` when it did not answer.
pub type StatusRow = (u32, Option<Vec<(String, String)>>);

/// Renders one row per rank (parsed STATUS texts, or `None` for a rank that
/// did not answer) as an aligned text table.
pub fn table(rows: &[StatusRow]) -> String {
    let mut cells: Vec<Vec<String>> = vec![COLUMNS.iter().map(|c| c.0.to_string()).collect()];
    for (rank, kv) in rows {
        let row = match kv {
            None => {
                let mut r = vec![rank.to_string(), "-".into(), "unreachable".into()];
                r.resize(COLUMNS.len(), "-".into());
                r
            }
            Some(kv) => COLUMNS
                .iter()
                .map(|(_, key)| {
                    let v = kv.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).unwrap_or("-");
                    match (*key, v.parse::<u64>()) {
                        ("bytes_local" | "replicated_bytes", Ok(b)) => human_bytes(b),
                        _ => v.to_string(),
                    }
                })
                .collect(),
        };
        cells.push(row);
    }
    let widths: Vec<usize> = (0..COLUMNS.len()).map(|c| cells.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in &cells {
        let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:>w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_skips_lines_without_a_value_and_trims() {
        assert_eq!(parse("a = 1\nnoise\nb=x=y\n"), vec![("a".into(), "1".into()), ("b".into(), "x=y".into())]);
    }

    #[test]
    fn table_aligns_and_marks_unknown_keys() {
        let kv = parse("rank=2\nhost=n1\nstatus=ready\nbytes_local=3145728\nload_mbps=4.0\nwake_across_us=44.0\ncpus=2-3\n");
        let t = table(&[(2, Some(kv)), (3, None)]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].contains("load MB/s") && lines[1].contains("3.0 MiB") && lines[2].contains("unreachable"), "{t}");
        assert!(lines[0].contains("wake us") && lines[1].contains("44.0"), "{t}");
        assert!(lines[0].ends_with("cpus") && lines[1].ends_with("2-3"), "{t}");
        assert!(lines[1].contains(" - "), "a key the text lacks shows as -: {t}");
    }

    #[test]
    fn bytes() {
        assert_eq!(human_bytes(5), "5 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(8 << 30), "8.0 GiB");
    }
}
