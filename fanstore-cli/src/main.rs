//! # fanstore
//!
//! `fanstore` controls the FanStore daemons of a running job: it waits until
//! they are ready, shows their status, stops them, drains their outputs to
//! `--persist`, exports drained outputs as plain files, follows namespace
//! events and answers checkpoint queries. It talks to each rank through its
//! unix socket in the job's runtime directory (or reads what the daemons
//! left on disk), so it needs no MPI: this crate builds with a plain
//! `cargo build --release -p fanstore-cli`, on a login node, in a container
//! or for a Python package.
//!
//! ```text
//! fanstore [--runtime-dir DIR] wait [--timeout S]    until the job is Ready (any rank says so)
//! fanstore [--runtime-dir DIR] status                one table row per rank
//! fanstore [--runtime-dir DIR] stop [--timeout S]    stop every rank, wait until gone
//! fanstore [--runtime-dir DIR] sync                 drain outputs to --persist, keep running
//! fanstore export DIR --to PLAIN_DIR                 drained outputs -> plain files
//! fanstore [--runtime-dir DIR] ckpt ls|log|owners|diff|du|match|verify ...   checkpoint queries
//! fanstore [--runtime-dir DIR] watch PATH... [--recursive] [--json] [--events close,rename,delete,mkdir,rmdir]
//! ```
//!
//! For example, in a job script (scripts/fanstore-job.sbatch does this):
//!
//! ```text
//! $ srun --mpi=pmi2 fanstore-daemon --data /scratch/imagenet.fs --local /tmp/fs &
//! $ fanstore wait --timeout 600
//! fanstore: 4 rank(s) ready
//! $ srun --export=ALL,LD_PRELOAD=libfanstore_preload.so python train.py --data /fanstore/train
//! $ fanstore ckpt du
//! $ fanstore stop
//! fanstore: stopped (via rank 0)
//! ```
//!
//! The checkpoint queries are described in [`fanstore_cli::ckpt_query`],
//! the export in [`fanstore_cli::export`]. The runtime directory defaults
//! to the daemons' own default (`$FANSTORE_RUNTIME_DIR`, else
//! `$TMPDIR/fanstore-<uid>-<job>`).

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use fanstore_core::client::Client;
use fanstore_core::runtime::{self, NodeState, Status};
use fanstore_core::wire::{op, Request};
use fanstore_core::{rank_lock, status};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "fanstore", version, about = "Control a job's FanStore daemons")]
struct Cli {
    /// Runtime directory of the job (default: $FANSTORE_RUNTIME_DIR, else per user and job under $TMPDIR or /tmp).
    #[arg(long, global = true)]
    runtime_dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Wait until every rank has loaded and is ready (exit 1 on failure or timeout).
    Wait {
        #[arg(long, default_value_t = 300.0)]
        timeout: f64,
    },
    /// Print each rank's partitions, files, load time, remote reads, cache and errors.
    Status,
    /// Stop every rank and wait until their sockets and state files are gone.
    Stop {
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
    },
    /// Drain every output to the --persist directory without stopping.
    Sync {
        #[arg(long, default_value_t = 600.0)]
        timeout: f64,
    },
    /// Write the outputs drained to a --persist DIR as plain files under --to.
    Export {
        dir: std::path::PathBuf,
        #[arg(long)]
        to: std::path::PathBuf,
    },
    /// Print each namespace event of the outputs under PATH (close, rename,
    /// delete, mkdir, rmdir) as it happens on any node, until interrupted or
    /// until the daemons stop.
    Watch {
        #[arg(required = true)]
        paths: Vec<String>,
        /// Also every directory below each PATH.
        #[arg(long)]
        recursive: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Only these events (comma-separated): close, rename, delete, mkdir, rmdir.
        #[arg(long, value_delimiter = ',')]
        events: Vec<String>,
    },
    /// Checkpoint queries, answered from recipes and owner maps.
    Ckpt {
        #[command(subcommand)]
        cmd: CkptCmd,
    },
}

#[derive(Subcommand)]
enum CkptCmd {
    /// Checkpoints under DIR (all by default): logical size, new bytes stored, dedup ratio, parent.
    Ls {
        dir: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// The chain of ancestors of PATH, nearest first.
    Log {
        path: String,
        #[arg(long)]
        json: bool,
    },
    /// Per tensor of PATH: the checkpoint that first stored its bytes.
    Owners {
        path: String,
        #[arg(long)]
        json: bool,
    },
    /// Tensors added, removed, changed and unchanged from A to B.
    Diff {
        a: String,
        b: String,
        #[arg(long)]
        json: bool,
    },
    /// Logical vs physical bytes of the checkpoint stores, in all and per rank.
    Du {
        #[arg(long)]
        json: bool,
    },
    /// Stored checkpoints ranked by the longest prefix of TARGET's tensors (in file order) they hold
    /// equal by name, shape and content, then by shared tensors. TARGET: a checkpoint file on a local
    /// file system, or the path of a stored checkpoint (left out of the ranking).
    Match {
        target: String,
        #[arg(long)]
        json: bool,
    },
    /// Recompute every unit hash and whole-file checksum (of PATH, or all); exit 1 on damage.
    Verify {
        path: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

/// `print!` that behaves like coreutils when the reader of standard output
/// goes away (`fanstore status | head -1`): the process ends quietly, killed
/// by SIGPIPE as `ls` would be, instead of printing "Broken pipe" or
/// panicking. Rust ignores SIGPIPE, so a closed pipe shows up as EPIPE here.
macro_rules! out {
    ($($arg:tt)*) => { emit(format_args!($($arg)*)) };
}

/// `println!` with the behaviour of [`out!`].
macro_rules! outln {
    () => { emit(format_args!("\n")) };
    ($($arg:tt)*) => { emit(format_args!("{}\n", format_args!($($arg)*))) };
}

fn emit(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            die_of_sigpipe();
        }
        eprintln!("fanstore: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// Ends the process the way a program that does not ignore SIGPIPE ends
/// when it writes to a closed pipe: killed by the signal, no message.
fn die_of_sigpipe() -> ! {
    // SAFETY: signal() and raise() are async-signal-safe libc calls with
    // valid constant arguments; resetting SIGPIPE to its default action
    // affects only this process, which is about to end.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(128 + libc::SIGPIPE)
}

const TICK: Duration = Duration::from_millis(50);

fn main() {
    let cli = Cli::parse();
    let rt = cli.runtime_dir.clone().unwrap_or_else(runtime::runtime_dir);
    let res = match cli.cmd {
        Cmd::Wait { timeout } => wait(&rt, Duration::from_secs_f64(timeout)),
        Cmd::Status => show_status(&rt),
        Cmd::Stop { timeout } => stop(&rt, Duration::from_secs_f64(timeout)),
        Cmd::Sync { timeout } => sync(&rt, Duration::from_secs_f64(timeout)),
        Cmd::Export { dir, to } => fanstore_cli::export::export(&dir, &to)
            .map(|n| outln!("fanstore: exported {n} files to {}", to.display()))
            .map_err(anyhow::Error::from),
        Cmd::Ckpt { cmd } => ckpt(&rt, cmd),
        Cmd::Watch { paths, recursive, json, events } => watch(&rt, &paths, recursive, json, &events),
    };
    if let Err(e) = res {
        eprintln!("fanstore: {e:#}");
        std::process::exit(1);
    }
}

/// Is the process of a state on this host still there? (Unknown on other hosts: assume yes.)
fn alive(s: &NodeState) -> bool {
    if s.hostname != runtime::hostname() {
        return true;
    }
    pid_alive(s.pid)
}

/// Whether process `pid` of this host exists (one of another user's too).
fn pid_alive(pid: u64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn wait(rt: &Path, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no daemon has published a state yet");
    loop {
        let states = runtime::list_states(rt);
        if let Some(f) = states.iter().find(|s| s.status == Status::Failed) {
            bail!("rank {} failed to start (see the daemon's log); the job is stopping", f.rank);
        }
        if let Some(n) = states.first().map(|s| s.nranks) {
            // A rank reports Ready only after every rank of the job loaded
            // (the daemons agree over MPI first). With a node-local runtime
            // directory a node sees only its own ranks: one live Ready rank
            // is then enough; when every rank's state is here, all of them
            // (so that every socket answers as Ready once this returns).
            let ready = states.iter().filter(|s| s.status == Status::Ready && s.nranks == n && alive(s)).count();
            let visible = states.iter().filter(|s| s.nranks == n).count();
            if ready == n as usize || (visible < n as usize && ready > 0) {
                outln!("fanstore: {n} rank(s) ready");
                return Ok(());
            }
            let gone: Vec<u32> = states.iter().filter(|s| !alive(s)).map(|s| s.rank).collect();
            last = format!("{ready} of {n} ranks ready");
            if !gone.is_empty() {
                last.push_str(&format!("; the process of rank(s) {gone:?} is gone"));
            }
        }
        if Instant::now() >= deadline {
            bail!("timed out after {:.0} s waiting in {}: {last}", timeout.as_secs_f64(), rt.display());
        }
        std::thread::sleep(TICK);
    }
}

fn show_status(rt: &Path) -> anyhow::Result<()> {
    let states = runtime::list_states(rt);
    if states.is_empty() {
        bail!("no FanStore daemon found in {}", rt.display());
    }
    let mut rows = Vec::new();
    for s in &states {
        let text = Client::connect(&runtime::socket_path(rt, s.rank), Duration::from_secs(5))
            .and_then(|mut c| c.call(&Request::new(op::STATUS, 1, 0, 0)))
            .ok()
            .filter(|(r, _)| r.errno == 0)
            .map(|(r, _)| status::parse(&String::from_utf8_lossy(&r.payload)));
        rows.push((s.rank, text));
    }
    out!("{}", status::table(&rows));
    Ok(())
}

/// Files of the job's daemons still in the runtime directory.
fn leftovers(rt: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(rt)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            n.starts_with("node-") && (n.ends_with(".sock") || n.ends_with(".state"))
        })
        .collect()
}

/// SYNC on every rank: first every rank copies the bytes it holds, then
/// every rank writes the records it owns (only those whose bytes arrived).
fn sync(rt: &Path, timeout: Duration) -> anyhow::Result<()> {
    let states = runtime::list_states(rt);
    let live: Vec<&NodeState> = states.iter().filter(|s| s.status == Status::Ready && alive(s)).collect();
    if live.is_empty() {
        bail!("no running daemon in {}", rt.display());
    }
    let mut counts = [0u64; 2];
    for (i, phase) in [fanstore_core::wire::SYNC_DATA, fanstore_core::wire::SYNC_META].into_iter().enumerate() {
        for s in &live {
            let mut c = Client::connect(&runtime::socket_path(rt, s.rank), timeout)
                .with_context(|| format!("connecting to rank {}", s.rank))?;
            let (r, _) = c.call(&Request::new(op::SYNC, 1, phase, 0)).with_context(|| format!("rank {}", s.rank))?;
            if r.errno == libc::EINVAL {
                bail!("rank {} has no --persist directory", s.rank);
            }
            if r.errno != 0 {
                bail!("rank {} failed to sync (errno {}; see its log)", s.rank, r.errno);
            }
            counts[i] += r.value;
        }
    }
    outln!("fanstore: synced {} files, {} records", counts[0], counts[1]);
    Ok(())
}

fn watch(rt: &Path, paths: &[String], recursive: bool, json: bool, events: &[String]) -> anyhow::Result<()> {
    use fanstore_core::watch_client::{parse_events, render, Watcher};
    let kinds = parse_events(events)?;
    let mut w = Watcher::open(rt, paths, recursive)?;
    // Every event from here on is printed (tests and scripts wait for this line).
    eprintln!("fanstore: watching {} path(s) through rank {}", paths.len(), w.rank);
    loop {
        match w.next_event()? {
            None => {
                eprintln!("fanstore: the daemons stopped");
                return Ok(());
            }
            Some(None) => {
                if json {
                    outln!("{{\"event\":\"overflow\"}}");
                } else {
                    outln!("overflow: events were dropped");
                }
            }
            Some(Some(ev)) if kinds.contains(&ev.kind) => outln!("{}", render(&ev, &w.mount, json)),
            Some(Some(_)) => {}
        }
    }
}

fn ckpt(rt: &Path, cmd: CkptCmd) -> anyhow::Result<()> {
    use fanstore_cli::ckpt_query::{self, Query};
    use fanstore_core::client::relative_to_mount as relative;
    let mount = runtime::list_states(rt)
        .first()
        .map(|s| String::from_utf8_lossy(&s.mount).into_owned())
        .unwrap_or_else(|| "/fanstore".into());
    let rel = |p: &str| relative(p, &mount);
    let mut match_json = None;
    let (q, du_json) = match cmd {
        CkptCmd::Match { target, json } => {
            match_json = Some(json);
            let local = Path::new(&target);
            let under_mount = target == mount || target.starts_with(&format!("{}/", mount.trim_end_matches('/')));
            let (keys, exclude) = if !under_mount && local.is_file() {
                let bytes = std::fs::read(local).with_context(|| format!("reading {target}"))?;
                (fanstore_ckpt::matching::keys_of_file(&bytes, &fanstore_ckpt::CdcParams::default()), Vec::new())
            } else {
                let p = rel(&target);
                (ckpt_query::stored_keys(rt, &p)?, p)
            };
            (Query::Match { exclude, keys: fanstore_ckpt::matching::encode_keys(&keys) }, false)
        }
        CkptCmd::Ls { dir, json } => (Query::Ls { dir: dir.as_deref().map(rel).unwrap_or_default(), json }, false),
        CkptCmd::Log { path, json } => (Query::Log { path: rel(&path), json }, false),
        CkptCmd::Owners { path, json } => (Query::Owners { path: rel(&path), json }, false),
        CkptCmd::Diff { a, b, json } => (Query::Diff { a: rel(&a), b: rel(&b), json }, false),
        CkptCmd::Du { json } => (Query::Du, json),
        CkptCmd::Verify { path, json } => (Query::Verify { path: path.as_deref().map(rel), json }, false),
    };
    let report = ckpt_query::run(rt, &q)?;
    if q == Query::Du && !du_json {
        out!("{}", ckpt_query::du_table(&report.text)?);
    } else if match_json == Some(false) {
        out!("{}", ckpt_query::match_table(&report.text)?);
    } else {
        out!("{}", report.text);
        if !report.text.ends_with('\n') {
            outln!();
        }
    }
    if !report.ok {
        bail!("verify found damaged checkpoints (listed above)");
    }
    Ok(())
}

fn stop(rt: &Path, timeout: Duration) -> anyhow::Result<()> {
    let states = runtime::list_states(rt);
    let live: Vec<&NodeState> = states.iter().filter(|s| s.status != Status::Failed && alive(s)).collect();
    let mut asked = None;
    for s in &live {
        let res = Client::connect(&runtime::socket_path(rt, s.rank), Duration::from_secs(5))
            .and_then(|mut c| c.call(&Request::new(op::STOP, 1, 0, 0)));
        if let Ok((r, _)) = res {
            if r.errno == 0 {
                asked = Some(s.rank);
                break;
            }
        }
    }
    if asked.is_none() && !live.is_empty() {
        bail!("no daemon in {} answered STOP", rt.display());
    }
    let deadline = Instant::now() + timeout;
    loop {
        let running: Vec<u32> = runtime::list_states(rt)
            .iter()
            .filter(|s| s.status != Status::Failed && alive(s))
            .map(|s| s.rank)
            .collect();
        if running.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            bail!("timed out after {:.0} s: rank(s) {running:?} still running; left: {:?}", timeout.as_secs_f64(), leftovers(rt));
        }
        std::thread::sleep(TICK);
    }
    // Whatever dead daemons left behind (a failed start, a kill -9): remove it.
    for s in runtime::list_states(rt).iter().filter(|s| !alive(s)) {
        let idx = PathBuf::from(String::from_utf8_lossy(&s.index_path).into_owned());
        if idx.starts_with("/dev/shm") {
            let _ = std::fs::remove_file(idx);
        }
        let _ = std::fs::remove_file(runtime::socket_path(rt, s.rank));
        let _ = std::fs::remove_file(runtime::state_path(rt, s.rank));
        rank_lock::remove_if_unheld(&rank_lock::runtime_lock_path(rt, s.rank));
        let local_dir = PathBuf::from(String::from_utf8_lossy(&s.local_dir).into_owned());
        if let Some(root) = local_dir.parent() {
            rank_lock::remove_if_unheld(&rank_lock::local_lock_path(root, s.rank));
        }
    }
    // Every rank has stopped: the host's polling board goes too (a daemon
    // removes it when it stops, a killed one cannot).
    let _ = std::fs::remove_file(runtime::polling_board_path(rt));
    let _ = std::fs::remove_dir(rt);
    match asked {
        Some(r) => outln!("fanstore: stopped (via rank {r})"),
        None => outln!("fanstore: no running daemon in {}", rt.display()),
    }
    Ok(())
}

