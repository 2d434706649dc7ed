//! Command-line arguments of `fanstore-daemon`, and size parsing.

use std::path::PathBuf;

/// `fanstore-daemon`: one per node, under any MPI launcher or alone (MPI singleton).
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "fanstore-daemon", version, about)]
pub struct DaemonArgs {
    /// The dataset directory written by `fanstore-prep` (manifest.fsm + part-*.fsp).
    #[arg(long)]
    pub data: PathBuf,
    /// Node-local directory (SSD). Rank R extracts into DIR/rank-R, created
    /// by the daemon and removed at stop unless --keep-local. Rank R of a
    /// second job refuses to start while a running daemon holds
    /// DIR/rank-R.lock (give each job its own DIR).
    #[arg(long)]
    pub local: PathBuf,
    /// Where the dataset appears to clients.
    #[arg(long, default_value = "/fanstore")]
    pub mount: String,
    /// Copies of every (non-replicated) partition across ranks.
    #[arg(long, default_value_t = 1)]
    pub replication: u32,
    /// Memory budget of the node's cache of decompressed / remote files (e.g. 512M, 2G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub cache_mem: u64,
    /// Disk budget of the node copies made in the background (decompressed
    /// files of 64 KiB or more that a client decoded itself, or the prefill
    /// made), kept in the local directory while its file system keeps 5%
    /// free: they read back faster from the local file system than from
    /// shared memory. 0: such copies go to the copy directory in memory
    /// (also what a local dir on tmpfs gets).
    #[arg(long, default_value = "32G", value_parser = parse_size)]
    pub cache_disk: u64,
    /// Memory kept for reuse from copies the cache does not keep (files
    /// past --cache-mem, or all of them with --cache-mem 0), and again from
    /// copies it evicted: once their readers closed them, the next such
    /// copy is written into their pages instead of fresh ones (up to SIZE
    /// bytes of each kind). 0: never.
    #[arg(long, default_value = "32M", value_parser = parse_size)]
    pub copy_spares: u64,
    /// Runtime directory (sockets, state files). Default: $FANSTORE_RUNTIME_DIR,
    /// else $TMPDIR/fanstore-UID-JOB (or under /tmp).
    #[arg(long)]
    pub runtime_dir: Option<PathBuf>,
    /// Keep the extracted files in the local directory at stop.
    #[arg(long)]
    pub keep_local: bool,
    /// Directory (shared file system) that outputs are drained to at stop and
    /// loaded from at start (see `fanstore_daemon::outputs::persist`). One running
    /// job per DIR: a job started while another holds DIR/meta/lease
    /// refuses to start (fanstore_daemon::outputs::persist_lease).
    #[arg(long)]
    pub persist: Option<PathBuf>,
    /// Tensor-level dedup of outputs: `on` commits every output of at least
    /// --dedup-min bytes into the node's checkpoint store (safetensors,
    /// torch.save zips, .npy/.npz split into tensors; anything else into
    /// content-defined chunks); `off` keeps every output a plain file.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub dedup: String,
    /// Outputs smaller than this stay plain files (logs, small samples).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub dedup_min: u64,
    /// Bytes of committed checkpoint files the store keeps as hot copies
    /// (the newest commits of the node, the newest always): opens of them
    /// are served from that file with no rebuild, and the next checkpoint
    /// finds its delta bases there. They are the files the programs wrote
    /// (unnamed files on the local disk), so they cost disk space, not
    /// memory; older ones are dropped past this total, and all but the
    /// newest when the local disk has less than a twentieth free. 0: none.
    /// A local dir in memory (tmpfs) keeps only the newest.
    #[arg(long, default_value = "16G", value_parser = parse_size)]
    pub ckpt_hot_size: u64,
    /// At most this many hot copies: each holds an fd and a mapping in the
    /// daemon, so a job writing many small outputs (64 KiB and more go to
    /// the store) does not pile up thousands of them.
    #[arg(long, default_value_t = 64)]
    pub ckpt_hot: usize,
    /// fsync every output before its close returns (power-loss safety of the
    /// local copy; without it a closed output survives a killed daemon or
    /// program, not a crash of the node's kernel).
    #[arg(long)]
    pub fsync_outputs: bool,
    /// Unnamed files kept made ahead for new outputs of the daemon's own
    /// user, handed out with the lookup before a creation, so the inode a
    /// creation costs is paid off the program's path (0: none; clients
    /// make their own files).
    #[arg(long, default_value_t = 32)]
    pub files_ahead: usize,
    /// Seconds before a remote read with no answer fails with EIO (a holder
    /// that is gone or hung); larger payloads get 1 extra second per 64 MiB.
    #[arg(long, default_value_t = 10.0)]
    pub remote_timeout: f64,
    /// Seconds to wait for every rank to finish loading.
    #[arg(long, default_value_t = 3600.0)]
    pub load_timeout: f64,
    /// After ready, copy small local files (under 64 KiB) and compressed
    /// ones (decompressed; to the local disk within --cache-disk when of
    /// 64 KiB or more) in the background, at low priority, up to this many
    /// bytes (default: half of --cache-mem), so that their first open by any
    /// process is already a plain open; 0 turns it off.
    #[arg(long, value_parser = parse_size)]
    pub prefill_mem: Option<u64>,
    /// After ready, extract the large uncompressed local files (64 KiB or
    /// more, the ones an OPEN extracts to the local directory) in the
    /// background, at low priority, up to this many bytes ('auto', the
    /// default: half of the local file system's free space at ready, none
    /// when the local directory is in memory (tmpfs); 0 turns it off), while
    /// the local file system keeps a twentieth free: the
    /// first epoch then opens plain files instead of extracting each one in
    /// its OPEN.
    #[arg(long, default_value = "auto", value_parser = parse_extract_ahead)]
    pub extract_ahead: ExtractAhead,
    /// Where several daemons of the job run on one host (a job tried on one
    /// machine, or two ranks on a node), `auto` keeps each daemon's threads
    /// on its own share of the CPUs it may use, as separate nodes would be,
    /// one CPU each where there are more daemons than CPUs
    /// (src/cpu_share.rs; a remote 128 KiB read 90 µs instead of 124-182
    /// here); not when the launcher bound the ranks already. `off` leaves
    /// them to the scheduler. One daemon per host (a cluster job) is never
    /// bound.
    #[arg(long, default_value = "auto", value_parser = ["auto", "off"])]
    pub share_cpus: String,
    /// After ready, fetch whole remote partitions from their holders in the
    /// background (large MPI messages, verified like a loaded partition)
    /// into the local directory, up to this many bytes ('all': every remote
    /// partition), while the local file system keeps 5% free: later reads of
    /// their files are local. Default 0 (off): remote files are fetched one
    /// by one when opened.
    #[arg(long, default_value = "0", value_parser = parse_size_or_all)]
    pub prefetch_remote: u64,
    /// Fetch a remote partition whole (in the background, as
    /// --prefetch-remote does: large MPI messages, verified, into the local
    /// directory while the local file system keeps 5% free) once its files
    /// are read from its holder, so that its other files and later epochs
    /// are read locally. 'auto' (default): once this node's remote reads of
    /// its files have taken as long as fetching it whole would (each read
    /// counted as the bytes the bulk transfer moves in its round trip, at
    /// least its own), so the whole fetch never costs more than the reads
    /// already paid, within half of the local file system's free space at
    /// start. SIZE or 'all': on the first read of
    /// one of its files, up to SIZE bytes in all. 0 or 'off': never; every
    /// remote file is fetched alone whenever it is opened and not cached.
    #[arg(long, default_value = "auto", value_parser = parse_replicate_on_read)]
    pub replicate_on_read: ReplicateOnRead,
    /// When a node opens remote files in the manifest's order (a directory
    /// read in order), fetch its next remote files this many bytes ahead
    /// of the reader (at most 64 files), several at once, into the copy
    /// directory (within --cache-mem): the reader then opens them with no
    /// round trip. 0 turns it off.
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    pub read_ahead: u64,
    /// Loader threads (default: available cores).
    #[arg(long)]
    pub load_threads: Option<usize>,
    /// Largest MPI message of a remote payload; larger payloads cross in
    /// pieces. Must be equal on every rank (testing knob).
    #[arg(long, default_value = "1G", value_parser = parse_size, hide = true)]
    pub mpi_piece: u64,
    /// Payloads of at least twice this size cross in pieces of this size, so
    /// their checksum is computed while they arrive (0: off). Must be equal
    /// on every rank (tuning knob).
    #[arg(long, default_value = "1M", value_parser = parse_size, hide = true)]
    pub mpi_pipeline: u64,
    /// Messages of at most this size cross UCX eagerly (straight into the
    /// receive the requester posted before it asked), larger ones by
    /// rendezvous: sets UCX_RNDV_THRESH to one byte more before MPI starts,
    /// unless UCX_RNDV_THRESH is set in the environment; 0 leaves UCX's
    /// choice. Over TCP, UCX's own threshold sends a 128 KiB file by
    /// rendezvous, whose extra handshake needs both ranks' progress threads
    /// awake (bench/remote_profile.py). MPI libraries without UCX ignore it.
    #[arg(long, default_value = "256K", value_parser = parse_size)]
    pub ucx_eager_max: u64,
    /// Microseconds the communication thread keeps polling after activity
    /// before it sleeps (0: it sleeps as soon as it has nothing in hand; a
    /// peer's message or a command wakes it through its fds). It polls only
    /// while no runnable thread of the node waits for a CPU behind one that
    /// does not yield (`--comm-spin-while free-cpu`, comm/spin.rs); on the
    /// same terms it also polls for as long as a payload over 256 KiB
    /// crosses, which takes the transport many rounds (comm/mod.rs has the
    /// side-by-side figures). Side by side (2 ranks and 4 on
    /// 2 vCPUs, fresh jobs): one reader's remote 128 KiB OPEN+read 64
    /// against 173 µs (daemon CPU per file 129 against 159 µs); 4 daemons,
    /// 4 readers, 2 MiB and the training reader on 4 ranks within this
    /// machine's noise of 0. Polling with no such check cost those 5-12%.
    /// Tuning knob.
    #[arg(long, default_value_t = 200, hide = true)]
    pub comm_spin_us: u64,
    /// With `--comm-spin-us`: `free-cpu` polls only while no runnable
    /// thread of the node waits for a CPU (/proc/loadavg; comm/spin.rs),
    /// `always` whether or not threads wait. Tuning knob.
    #[arg(long, default_value = "free-cpu", value_parser = ["free-cpu", "always"], hide = true)]
    pub comm_spin_while: String,
    /// How the idle communication thread waits: `fds` sleeps on a doorbell
    /// and the MPI library's epoll fds (woken by a peer's message), `nap`
    /// naps on its command channel only (the behaviour before; a transport
    /// in flight is then polled without pause). Tuning knob for
    /// bench/train_nodes.py's side-by-side rows.
    #[arg(long, default_value = "fds", value_parser = ["fds", "nap"], hide = true)]
    pub comm_sleep: String,
    /// With `--comm-sleep fds`: microseconds a sleep lasts at least while
    /// MPI's epoll fds are trusted to announce every message (a timer that
    /// fires costs ~35 µs of CPU here, an fd wake-up ~4 µs); 0: every sleep
    /// is a 10-50 µs nap during a burst, as before. Tuning knob for the
    /// side-by-side rows of bench/remote_profile.py and bench/train_nodes.py.
    #[arg(long, default_value_t = 2000, hide = true)]
    pub comm_fd_bound_us: u64,
    /// Who posts a remote read's MPI receives and request: `server`, the
    /// server thread that needs it, where MPI granted MPI_THREAD_MULTIPLE
    /// (the communication thread adopts the posted fetch without a wake-up
    /// of its own), or `comm`, the communication thread (the behaviour
    /// before). Tuning knob for bench/remote_profile.py's side-by-side rows.
    #[arg(long, default_value = "server", value_parser = ["server", "comm"], hide = true)]
    pub fetch_post: String,
}

/// Parses `123`, `64K`, `512M`, `2G`, `1T` (binary units; optional `iB`/`B` suffix).
/// A size, or `all` (no limit).
pub fn parse_size_or_all(s: &str) -> Result<u64, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(u64::MAX);
    }
    parse_size(s)
}

/// How much the background extraction after ready may write (`--extract-ahead`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtractAhead {
    /// Half of the local file system's free space at ready.
    Auto,
    /// At most this many bytes (0: off).
    Upto(u64),
}

impl ExtractAhead {
    /// The byte budget, given the local file system's free bytes at ready
    /// and whether it is memory (tmpfs, as on a diskless node: there `auto`
    /// extracts nothing ahead, since every extracted byte would be a second
    /// copy in RAM of bytes the partition copy holds).
    pub fn budget(self, free: u64, in_memory: bool) -> u64 {
        match self {
            ExtractAhead::Auto if in_memory => 0,
            ExtractAhead::Auto => free / 2,
            ExtractAhead::Upto(n) => n,
        }
    }
}

pub fn parse_extract_ahead(s: &str) -> Result<ExtractAhead, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(ExtractAhead::Auto);
    }
    parse_size(s).map(ExtractAhead::Upto)
}

/// When a remote partition is fetched whole because its files are read
/// (`--replicate-on-read`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicateOnRead {
    /// Never.
    Off,
    /// Once the node has read from holders as many bytes of it as it holds.
    Auto,
    /// On the first remote read of one of its files, up to this many bytes in all.
    FirstRead(u64),
}

/// Parses `auto`, `off`, `all` or a size (0 is `off`).
pub fn parse_replicate_on_read(s: &str) -> Result<ReplicateOnRead, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(ReplicateOnRead::Auto),
        "off" => Ok(ReplicateOnRead::Off),
        _ => match parse_size_or_all(s)? {
            0 => Ok(ReplicateOnRead::Off),
            n => Ok(ReplicateOnRead::FirstRead(n)),
        },
    }
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("bad size unit in '{s}' (use K, M, G or T)")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("bad size '{s}'"))?;
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("size '{s}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::{parse_extract_ahead, parse_replicate_on_read, parse_size, ExtractAhead, ReplicateOnRead};

    #[test]
    fn sizes() {
        assert_eq!(parse_size("123"), Ok(123));
        assert_eq!(parse_size("128K"), Ok(128 << 10));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("8m"), Ok(8 << 20));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn extract_ahead_values() {
        assert_eq!(parse_extract_ahead("auto"), Ok(ExtractAhead::Auto));
        assert_eq!(parse_extract_ahead("0"), Ok(ExtractAhead::Upto(0)));
        assert_eq!(parse_extract_ahead("3G"), Ok(ExtractAhead::Upto(3 << 30)));
        assert!(parse_extract_ahead("lots").is_err());
        assert_eq!(ExtractAhead::Auto.budget(10 << 30, false), 5 << 30);
        assert_eq!(ExtractAhead::Auto.budget(10 << 30, true), 0);
        assert_eq!(ExtractAhead::Upto(7).budget(10 << 30, true), 7);
    }

    #[test]
    fn replicate_on_read_values() {
        assert_eq!(parse_replicate_on_read("auto"), Ok(ReplicateOnRead::Auto));
        assert_eq!(parse_replicate_on_read("off"), Ok(ReplicateOnRead::Off));
        assert_eq!(parse_replicate_on_read("0"), Ok(ReplicateOnRead::Off));
        assert_eq!(parse_replicate_on_read("ALL"), Ok(ReplicateOnRead::FirstRead(u64::MAX)));
        assert_eq!(parse_replicate_on_read("2G"), Ok(ReplicateOnRead::FirstRead(2 << 30)));
        assert!(parse_replicate_on_read("sometimes").is_err());
    }
}
