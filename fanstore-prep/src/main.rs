//! The `fanstore-prep` command line: pack, verify, ls, extract.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use fanstore_core::codec::Compression;
use fanstore_prep::assign::PartitionCount;
use fanstore_prep::pack::{pack, PackOptions};
use fanstore_prep::progress::ProgressMode;
use fanstore_prep::{extract, ls, units, verify};
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "fanstore-prep", version, about = "Packs a directory tree into a FanStore dataset (partitions + manifest), and verifies, lists and extracts datasets.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Packs the tree under --input into the dataset directory --output.
    Pack(PackArgs),
    /// Checks every checksum and the manifest against the partitions; exits 1 naming each fault.
    Verify {
        /// The dataset directory.
        dataset: PathBuf,
    },
    /// Lists a directory of the dataset (or one entry) like `ls -l`; times are UTC.
    Ls {
        /// The dataset directory.
        dataset: PathBuf,
        /// Path inside the dataset (default: the root).
        path: Option<OsString>,
    },
    /// Restores the dataset as a directory tree: bytes, modes, times, symlinks; sparse where zero.
    Extract {
        /// The dataset directory.
        dataset: PathBuf,
        /// Destination directory (created; if it exists it must be empty).
        #[arg(long)]
        to: PathBuf,
    },
}

#[derive(Args)]
struct PackArgs {
    /// The directory tree to pack.
    #[arg(long)]
    input: PathBuf,
    /// The dataset directory to create (must not hold a dataset already).
    #[arg(long)]
    output: PathBuf,
    /// Exactly N regular partitions (default: one per 256 MiB of file bytes).
    #[arg(long, value_name = "N", conflicts_with = "partition_size")]
    partitions: Option<u32>,
    /// Partitions of about SIZE bytes of files each (e.g. 512M, 2G).
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size)]
    partition_size: Option<u64>,
    /// Payload compression: none, lz4, zstd or zstd:LEVEL (1-22). Files that do not shrink are stored raw.
    #[arg(long, value_name = "CODEC", default_value = "none", value_parser = Compression::parse)]
    compress: Compression,
    /// A directory (relative to --input) whose files go to partitions that every node loads. Repeatable.
    #[arg(long = "replicate-dir", value_name = "REL")]
    replicate_dirs: Vec<PathBuf>,
    /// Worker threads that read and compress (default: all cores).
    #[arg(long, value_name = "T", value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
    /// Warn about and leave out files and directories that cannot be read.
    #[arg(long)]
    skip_unreadable: bool,
    /// Warn about and leave out fifos, sockets and devices.
    #[arg(long)]
    skip_special: bool,
    /// Progress output: auto (bar on a terminal, plain lines otherwise), bar, plain, off.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    progress: ProgressMode,
    /// Seconds between plain progress lines.
    #[arg(long, value_name = "SECS", default_value_t = 2.0, value_parser = parse_interval)]
    progress_interval: f64,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format(|buf, record| {
            let level = record.level().as_str().to_ascii_lowercase();
            writeln!(buf, "fanstore-prep: {level}: {}", record.args())
        })
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fanstore-prep: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Pack(a) => {
            let partitions = match (a.partitions, a.partition_size) {
                (Some(n), _) => PartitionCount::Count(n),
                (None, Some(s)) => PartitionCount::Size(s),
                (None, None) => PartitionCount::Auto,
            };
            let threads = match a.threads {
                Some(t) => t as usize,
                None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            };
            let opts = PackOptions {
                input: a.input,
                output: a.output,
                partitions,
                compression: a.compress,
                replicate_dirs: a.replicate_dirs,
                threads,
                skip_unreadable: a.skip_unreadable,
                skip_special: a.skip_special,
                progress: a.progress,
                progress_interval: std::time::Duration::from_secs_f64(a.progress_interval),
            };
            let summary = pack(&opts).context("pack failed")?;
            writeln!(Stdout, "{summary}")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify { dataset } => {
            let r = verify::verify(&dataset);
            if r.faults.is_empty() {
                writeln!(
                    Stdout,
                    "OK {}: {} files ({:.1} MB), {} directories, {} symlinks, {} partitions ({} replicated), {:.1} MB read, dataset id {:#018x}",
                    dataset.display(),
                    r.files,
                    r.bytes as f64 / 1e6,
                    r.directories,
                    r.symlinks,
                    r.partitions,
                    r.replicated_partitions,
                    r.bytes_read as f64 / 1e6,
                    r.dataset_id
                )?;
                Ok(ExitCode::SUCCESS)
            } else {
                for f in &r.faults {
                    eprintln!("fanstore-prep: fault: {f}");
                }
                eprintln!("fanstore-prep: verify {}: {} fault(s)", dataset.display(), r.faults.len());
                Ok(ExitCode::FAILURE)
            }
        }
        Command::Ls { dataset, path } => {
            let path = path.unwrap_or_default();
            let mut out = std::io::BufWriter::with_capacity(64 << 10, Stdout);
            ls::ls(&dataset, path.as_bytes(), &mut out)?;
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Extract { dataset, to } => {
            let summary = extract::extract(&dataset, &to)?;
            writeln!(Stdout, "{summary}")?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Standard output that behaves like coreutils when its reader goes away
/// (`fanstore-prep ls DS | head`): the process ends quietly, killed by
/// SIGPIPE as `ls` would be, instead of reporting "Broken pipe". Rust
/// ignores SIGPIPE, so a closed pipe shows up here as EPIPE. Only standard
/// output gets this treatment: a broken pipe anywhere else is an error.
struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        quiet_if_reader_gone(std::io::stdout().lock().write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        quiet_if_reader_gone(std::io::stdout().lock().flush())
    }
}

fn quiet_if_reader_gone<T>(r: std::io::Result<T>) -> std::io::Result<T> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => die_of_sigpipe(),
        other => other,
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
