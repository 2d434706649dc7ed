//! Progress reporting: an indicatif bar on a terminal, plain periodic lines
//! (every [`PLAIN_INTERVAL`]) otherwise, nothing when asked for quiet.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// How often a plain progress line is printed.
pub const PLAIN_INTERVAL: Duration = Duration::from_secs(2);

/// Where progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, plain lines otherwise.
    #[default]
    Auto,
    /// Always the indicatif bar.
    Bar,
    /// Always plain lines.
    Plain,
    /// No progress output (the summary is still printed).
    Off,
}

impl ProgressMode {
    fn resolve(self) -> ProgressMode {
        match self {
            ProgressMode::Auto if std::io::stderr().is_terminal() => ProgressMode::Bar,
            ProgressMode::Auto => ProgressMode::Plain,
            m => m,
        }
    }
}

/// Progress of one phase measured in files and bytes.
pub struct Progress {
    label: &'static str,
    bar: Option<ProgressBar>,
    plain: bool,
    start: Instant,
    last_line: Instant,
    total_files: u64,
    total_bytes: u64,
    files: u64,
    bytes: u64,
}

impl Progress {
    pub fn new(mode: ProgressMode, label: &'static str, total_files: u64, total_bytes: u64) -> Progress {
        let mode = mode.resolve();
        let bar = (mode == ProgressMode::Bar).then(|| {
            let b = ProgressBar::with_draw_target(Some(total_bytes), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{msg:>8} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            b.set_style(style);
            b.set_message(label);
            b
        });
        let now = Instant::now();
        Progress {
            label,
            bar,
            plain: mode == ProgressMode::Plain,
            start: now,
            last_line: now,
            total_files,
            total_bytes,
            files: 0,
            bytes: 0,
        }
    }

    /// Records `files` more files and `bytes` more bytes done.
    pub fn advance(&mut self, files: u64, bytes: u64) {
        self.files += files;
        self.bytes += bytes;
        if let Some(b) = &self.bar {
            b.set_position(self.bytes);
        } else if self.plain && self.last_line.elapsed() >= PLAIN_INTERVAL {
            self.last_line = Instant::now();
            self.print_line();
        }
    }

    fn print_line(&self) {
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let pct = if self.total_bytes == 0 { 100.0 } else { self.bytes as f64 * 100.0 / self.total_bytes as f64 };
        eprintln!(
            "fanstore-prep: {}: {}/{} files, {:.1}/{:.1} MB ({pct:.0}%), {:.1} MB/s, {:.0} s",
            self.label,
            self.files,
            self.total_files,
            self.bytes as f64 / 1e6,
            self.total_bytes as f64 / 1e6,
            self.bytes as f64 / 1e6 / secs,
            secs
        );
    }

    /// Clears the bar.
    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// A counter of walked entries, printed like [`Progress`].
pub struct ScanProgress {
    spinner: Option<ProgressBar>,
    plain: bool,
    last_line: Instant,
}

impl ScanProgress {
    pub fn new(mode: ProgressMode) -> ScanProgress {
        let mode = mode.resolve();
        let spinner = (mode == ProgressMode::Bar).then(|| {
            let s = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            s.set_style(ProgressStyle::with_template("{spinner} scanning: {pos} entries").unwrap_or_else(|_| ProgressStyle::default_spinner()));
            s
        });
        ScanProgress { spinner, plain: mode == ProgressMode::Plain, last_line: Instant::now() }
    }

    pub fn update(&mut self, entries: usize) {
        if let Some(s) = &self.spinner {
            s.set_position(entries as u64);
        } else if self.plain && self.last_line.elapsed() >= PLAIN_INTERVAL {
            self.last_line = Instant::now();
            eprintln!("fanstore-prep: scanning: {entries} entries");
        }
    }

    pub fn finish(self) {
        if let Some(s) = self.spinner {
            s.finish_and_clear();
        }
    }
}
