//! Progress reporting: an indicatif bar on a terminal, plain periodic lines
//! (every [`PLAIN_INTERVAL`]) otherwise, nothing when asked for quiet.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How often a plain progress line is printed by default.
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

/// Counters shared with the plain-line ticker thread.
struct Counters {
    files: AtomicU64,
    bytes: AtomicU64,
    done: Mutex<bool>,
    wake: Condvar,
}

/// Progress of one phase measured in files and bytes.
pub struct Progress {
    bar: Option<ProgressBar>,
    counters: Arc<Counters>,
    ticker: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    pub fn new(mode: ProgressMode, interval: Duration, label: &'static str, total_files: u64, total_bytes: u64) -> Progress {
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
        let counters = Arc::new(Counters { files: AtomicU64::new(0), bytes: AtomicU64::new(0), done: Mutex::new(false), wake: Condvar::new() });
        // Plain lines come from a ticker, so they keep coming while one huge file is packed.
        let ticker = (mode == ProgressMode::Plain).then(|| {
            let c = counters.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut done = c.done.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    let (guard, _) = c.wake.wait_timeout(done, interval).unwrap_or_else(|p| p.into_inner());
                    done = guard;
                    if *done {
                        return;
                    }
                    let (files, bytes) = (c.files.load(Ordering::Relaxed), c.bytes.load(Ordering::Relaxed));
                    let secs = start.elapsed().as_secs_f64().max(1e-9);
                    let pct = if total_bytes == 0 { 100.0 } else { bytes as f64 * 100.0 / total_bytes as f64 };
                    eprintln!(
                        "fanstore-prep: {label}: {files}/{total_files} files, {:.1}/{:.1} MB ({pct:.0}%), {:.1} MB/s, {secs:.0} s",
                        bytes as f64 / 1e6,
                        total_bytes as f64 / 1e6,
                        bytes as f64 / 1e6 / secs,
                    );
                }
            })
        });
        Progress { bar, counters, ticker }
    }

    /// Records `files` more files and `bytes` more bytes done.
    pub fn advance(&mut self, files: u64, bytes: u64) {
        self.counters.files.fetch_add(files, Ordering::Relaxed);
        let now = self.counters.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if let Some(b) = &self.bar {
            b.set_position(now);
        }
    }

    /// Clears the bar, stops the ticker.
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        if let Some(t) = self.ticker.take() {
            *self.counters.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
            self.counters.wake.notify_all();
            let _ = t.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A counter of walked entries, printed like [`Progress`].
pub struct ScanProgress {
    spinner: Option<ProgressBar>,
    plain: bool,
    interval: Duration,
    last_line: Instant,
}

impl ScanProgress {
    pub fn new(mode: ProgressMode, interval: Duration) -> ScanProgress {
        let mode = mode.resolve();
        let spinner = (mode == ProgressMode::Bar).then(|| {
            let s = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            s.set_style(ProgressStyle::with_template("{spinner} scanning: {pos} entries").unwrap_or_else(|_| ProgressStyle::default_spinner()));
            s
        });
        ScanProgress { spinner, plain: mode == ProgressMode::Plain, interval, last_line: Instant::now() }
    }

    pub fn update(&mut self, entries: usize) {
        if let Some(s) = &self.spinner {
            s.set_position(entries as u64);
        } else if self.plain && self.last_line.elapsed() >= self.interval {
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
