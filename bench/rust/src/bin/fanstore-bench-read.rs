//! Benchmark client for `bench/remote_read.sh`: reads files through a daemon
//! the way a training process does (OPEN over the socket, then read every
//! byte from the fd it gets), and prints per-size medians.
//!
//! ```text
//! fanstore-bench-read --socket node-0.sock --dataset ID [--iters N] [--warmup N] SIZE=ID,ID,... ...
//! ```
//! For each group it prints one line:
//! `read size=<bytes> iters=<n> open_us=<median OPEN round trip, fd in hand>
//!  total_us=<median OPEN + read of all bytes> mbps=<size / total>`.
//! `--each`: then also `each size=<bytes> total_us=<t1>,<t2>,...`, every
//! timed read in the order read (what a median hides: a slow start).
use anyhow::Context;
use fanstore_core::wire::{op, Request};
use fanstore_core::client::Client;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;

fn main() -> anyhow::Result<()> {
    let mut socket = None;
    let mut dataset = None;
    let (mut iters, mut warmup, mut buf_offset) = (50usize, 5usize, 0usize);
    let mut each = false;
    let mut groups: Vec<(u64, Vec<u64>)> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--socket" => socket = Some(val()?),
            "--dataset" => dataset = Some(val()?.parse::<u64>()?),
            "--iters" => iters = val()?.parse()?,
            "--warmup" => warmup = val()?.parse()?,
            "--each" => each = true,
            "--buf-offset" => buf_offset = val()?.parse::<usize>()?,
            g => {
                let (size, ids) = g.split_once('=').context("groups are SIZE=ID,ID,...")?;
                let ids = ids.split(',').map(str::parse).collect::<Result<Vec<u64>, _>>()?;
                anyhow::ensure!(!ids.is_empty(), "group {g} has no ids");
                groups.push((fanstore_daemon::args::parse_size(size).map_err(anyhow::Error::msg)?, ids));
            }
        }
    }
    let socket = socket.context("--socket is required")?;
    let dataset = dataset.context("--dataset is required")?;
    let mut c = Client::connect(socket.as_ref(), Duration::from_secs(60))?;
    anyhow::ensure!(buf_offset < PAGE, "--buf-offset must be below {PAGE}");
    let mut backing = Vec::new();
    let mut rid = 0u64;
    for (size, ids) in groups {
        backing.resize(size as usize + 2 * PAGE, 0u8);
        let start = (PAGE - backing.as_ptr() as usize % PAGE) % PAGE + buf_offset;
        let buf = &mut backing[start..start + size as usize];
        let (mut opens, mut totals) = (Vec::new(), Vec::new());
        for i in 0..warmup + iters {
            let id = ids[i % ids.len()];
            rid += 1;
            let t = Instant::now();
            let (rep, fd) = c.call(&Request::new(op::OPEN, rid, id, dataset))?;
            let t_open = t.elapsed();
            anyhow::ensure!(rep.errno == 0, "OPEN {id}: errno {}", rep.errno);
            let f = std::fs::File::from(fd.context("OPEN reply without an fd")?);
            f.read_exact_at(buf, 0)?;
            let t_total = t.elapsed();
            drop(f);
            if i >= warmup {
                opens.push(t_open.as_secs_f64());
                totals.push(t_total.as_secs_f64());
            }
        }
        let in_order: Vec<String> = totals.iter().map(|t| format!("{:.0}", t * 1e6)).collect();
        opens.sort_by(f64::total_cmp);
        totals.sort_by(f64::total_cmp);
        let (o, t) = (opens[opens.len() / 2], totals[totals.len() / 2]);
        println!(
            "read size={size} iters={iters} open_us={:.1} total_us={:.1} mbps={:.1}",
            o * 1e6,
            t * 1e6,
            size as f64 / t / 1e6
        );
        if each {
            println!("each size={size} total_us={}", in_order.join(","));
        }
    }
    Ok(())
}
