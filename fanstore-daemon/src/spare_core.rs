//! Waiting, for a bounded time, until the host has a core to spare.
//!
//! A checkpoint committed from parts is stored after its writer has the
//! reply ([`crate::outputs::ckpt_put`]); the store commit (the new units
//! encoded against their last versions, the recipe, the catalog) is
//! background work the writer does not wait for. Started at the reply, the
//! commits of a DCP save, one per node, took the cores from the ranks still
//! laying out their shards: 4 ranks on 4 daemons of one 2-core host saved
//! in 141 ms (median of 9 saves) with the commits started at the reply,
//! in 78 ms with them held until the save had returned.
//!
//! So such work first waits until fewer threads are runnable on the host
//! than it has CPUs (the running count of `/proc/loadavg`, the waiting
//! thread included), polled every 2 ms, and never longer than it is told:
//! on a host kept busy the work is only delayed by that bound, and what
//! waits for it (a read of that checkpoint, the writer's next request)
//! waits that much longer at most.
//!
//! ```
//! use fanstore_daemon::spare_core::running_in_loadavg;
//! assert_eq!(running_in_loadavg("0.52 0.58 0.59 3/345 12345\n"), Some(3));
//! assert_eq!(running_in_loadavg("garbage"), None);
//! ```

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// How long a checkpoint's store commit waits at most for a spare core.
pub const COMMIT_WAIT_MAX: Duration = Duration::from_millis(250);
const POLL: Duration = Duration::from_millis(2);
/// How long a core must stay spare: a rank's short waits in a save's
/// collectives leave one for a millisecond or two.
const QUIET: Duration = Duration::from_millis(10);

/// The runnable threads of the host, from the text of `/proc/loadavg`
/// ("0.52 0.58 0.59 3/345 12345": 3).
pub fn running_in_loadavg(text: &str) -> Option<usize> {
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
}

/// Waits until fewer threads than CPUs are runnable on the host besides
/// this one, or `max` passed; returns how long it waited. Returns at once
/// when the count cannot be read.
pub fn wait(max: Duration) -> Duration {
    let started = Instant::now();
    let Ok(file) = std::fs::File::open("/proc/loadavg") else { return Duration::ZERO };
    // SAFETY: sysconf only reads a system setting.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let Ok(cpus) = usize::try_from(cpus) else { return Duration::ZERO };
    let mut buf = [0u8; 128];
    let mut spare_since: Option<Instant> = None;
    loop {
        let Ok(n) = file.read_at(&mut buf, 0) else { break };
        let Some(running) = std::str::from_utf8(&buf[..n]).ok().and_then(running_in_loadavg) else { break };
        let now = Instant::now();
        if running > cpus {
            spare_since = None;
        } else if now.duration_since(*spare_since.get_or_insert(now)) >= QUIET {
            break;
        }
        if started.elapsed() >= max {
            break;
        }
        std::thread::sleep(POLL);
    }
    started.elapsed()
}
