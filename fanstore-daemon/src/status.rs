//! Counters of one daemon rank, the STATUS text that reports them, and the
//! table `fanstore status` prints from the texts of every rank.
//!
//! The STATUS reply payload is UTF-8 text, one `key=value` per line, in a
//! fixed order (see [`Snapshot::render`]); unknown keys are ignored by readers.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Event counters, updated lock-free by every thread of the daemon.
#[derive(Debug, Default)]
pub struct Counters {
    /// OPEN requests answered with an fd.
    pub opens: AtomicU64,
    /// ... of which were local uncompressed files (the extracted file itself).
    pub opens_local: AtomicU64,
    /// Remote reads this rank asked another rank for.
    pub remote_sent: AtomicU64,
    /// Remote reads that failed (timeout, holder error, checksum).
    pub remote_failed: AtomicU64,
    /// Remote reads this rank answered for others.
    pub remote_served: AtomicU64,
    pub remote_bytes_in: AtomicU64,
    pub remote_bytes_out: AtomicU64,
    /// Requests answered with an error other than ENOENT/ESTALE, and refused peers.
    pub errors: AtomicU64,
    /// Outputs committed through this rank.
    pub outputs: AtomicU64,
    /// Client connections accepted.
    pub clients: AtomicU64,
    /// Times the rank ran out of file descriptors (EMFILE/ENFILE) and shed cached fds.
    pub fd_pressure: AtomicU64,
}

/// What loading this rank's partitions did.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct LoadReport {
    pub partitions: u64,
    pub files: u64,
    /// Partition bytes read from the shared file system.
    pub bytes_read: u64,
    /// Bytes written to the local directory (stored sizes).
    pub bytes_local: u64,
    pub seconds: f64,
}

impl LoadReport {
    pub fn mbps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes_read as f64 / self.seconds / 1e6
        } else {
            0.0
        }
    }
}

/// Everything a STATUS reply carries.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub rank: u32,
    pub nranks: u32,
    pub host: String,
    pub pid: u32,
    pub status: String,
    pub threading: String,
    pub load: LoadReport,
    pub opens: u64,
    pub opens_local: u64,
    pub remote_sent: u64,
    pub remote_failed: u64,
    pub remote_served: u64,
    pub remote_bytes_in: u64,
    pub remote_bytes_out: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    pub cache_bytes: u64,
    pub cache_entries: u64,
    pub errors: u64,
    pub clients: u64,
    pub fd_pressure: u64,
}

impl Counters {
    pub fn fill(&self, s: &mut Snapshot) {
        s.opens = self.opens.load(Relaxed);
        s.opens_local = self.opens_local.load(Relaxed);
        s.remote_sent = self.remote_sent.load(Relaxed);
        s.remote_failed = self.remote_failed.load(Relaxed);
        s.remote_served = self.remote_served.load(Relaxed);
        s.remote_bytes_in = self.remote_bytes_in.load(Relaxed);
        s.remote_bytes_out = self.remote_bytes_out.load(Relaxed);
        s.errors = self.errors.load(Relaxed);
        s.clients = self.clients.load(Relaxed);
        s.fd_pressure = self.fd_pressure.load(Relaxed);
    }
}

impl Snapshot {
    /// The STATUS text.
    pub fn render(&self) -> String {
        let l = &self.load;
        format!(
            "rank={}\nnranks={}\nhost={}\npid={}\nstatus={}\nmpi_threading={}\npartitions={}\nfiles={}\n\
             bytes_local={}\nbytes_read={}\nload_seconds={:.3}\nload_mbps={:.1}\nopens={}\nopens_local={}\n\
             remote_sent={}\nremote_failed={}\nremote_served={}\nremote_bytes_in={}\nremote_bytes_out={}\n\
             cache_hits={}\ncache_misses={}\ncache_evictions={}\ncache_bytes={}\ncache_entries={}\nerrors={}\nclients={}\nfd_pressure={}\n",
            self.rank,
            self.nranks,
            self.host,
            self.pid,
            self.status,
            self.threading,
            l.partitions,
            l.files,
            l.bytes_local,
            l.bytes_read,
            l.seconds,
            l.mbps(),
            self.opens,
            self.opens_local,
            self.remote_sent,
            self.remote_failed,
            self.remote_served,
            self.remote_bytes_in,
            self.remote_bytes_out,
            self.cache_hits,
            self.cache_misses,
            self.cache_evictions,
            self.cache_bytes,
            self.cache_entries,
            self.errors,
            self.clients,
            self.fd_pressure,
        )
    }
}

/// `key=value` lines as pairs, in order; lines without `=` are skipped.
pub fn parse(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Human-readable bytes (KiB/MiB/GiB).
pub fn human_bytes(v: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = v as f64;
    let mut i = 0;
    while x >= 1024.0 && i + 1 < U.len() {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v} B")
    } else {
        format!("{x:.1} {}", U[i])
    }
}

/// The columns of `fanstore status`: header and the STATUS key each shows.
const COLUMNS: [(&str, &str); 15] = [
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
    ("hits", "cache_hits"),
    ("misses", "cache_misses"),
    ("evictions", "cache_evictions"),
    ("errors", "errors"),
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
                        ("bytes_local", Ok(b)) => human_bytes(b),
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
    fn render_parse_and_table() {
        let s = Snapshot {
            rank: 2,
            nranks: 4,
            host: "n1".into(),
            status: "ready".into(),
            load: LoadReport { partitions: 3, files: 10, bytes_read: 2_000_000, bytes_local: 3 << 20, seconds: 0.5 },
            cache_hits: 7,
            ..Default::default()
        };
        let kv = parse(&s.render());
        let get = |k: &str| kv.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone()).unwrap();
        assert_eq!(get("rank"), "2");
        assert_eq!(get("load_mbps"), "4.0");
        assert_eq!(get("cache_hits"), "7");
        let t = table(&[(2, Some(kv)), (3, None)]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].contains("load MB/s") && lines[1].contains("3.0 MiB") && lines[2].contains("unreachable"), "{t}");
    }

    #[test]
    fn bytes() {
        assert_eq!(human_bytes(5), "5 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(8 << 30), "8.0 GiB");
    }
}
