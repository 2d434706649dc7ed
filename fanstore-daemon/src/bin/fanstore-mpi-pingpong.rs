//! Raw MPI baseline for `bench/remote_read.sh`: the same request/reply
//! pattern a FanStore remote read uses, with nothing else in the way.
//!
//! Rank 0 sends a 16-byte request to rank 1, rank 1 answers with SIZE bytes
//! (pre-filled, in memory), and rank 0 times the round trip. For each size it
//! prints one line: `pingpong size=<bytes> iters=<n> median_us=<t> mbps=<MB/s>`.
//!
//! ```text
//! mpiexec -n 2 fanstore-mpi-pingpong [--iters N] [--warmup N] [--fresh-memfd] SIZE...
//! ```
//! `--fresh-memfd`: rank 0 receives every reply into a new memfd (pages
//! allocated while receiving, as the daemon does) instead of one reused
//! buffer: shows what fresh memory costs on this machine.
use mpi::traits::*;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut iters = 50usize;
    let mut warmup = 5usize;
    let mut sizes = Vec::new();
    let mut fresh = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iters" => iters = args.next().ok_or_else(|| anyhow::anyhow!("--iters needs a value"))?.parse()?,
            "--fresh-memfd" => fresh = true,
            "--warmup" => warmup = args.next().ok_or_else(|| anyhow::anyhow!("--warmup needs a value"))?.parse()?,
            s => sizes.push(fanstore_daemon::args::parse_size(s).map_err(anyhow::Error::msg)?),
        }
    }
    anyhow::ensure!(!sizes.is_empty(), "usage: fanstore-mpi-pingpong [--iters N] [--warmup N] SIZE...");
    let (universe, _threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)
        .ok_or_else(|| anyhow::anyhow!("MPI was already initialised"))?;
    let world = universe.world();
    anyhow::ensure!(world.size() >= 2, "run under mpiexec -n 2 (or more)");
    let rank = world.rank();
    for &size in &sizes {
        let size = usize::try_from(size)?;
        let mut reply = vec![0u8; size];
        let mut req = [0u8; 16];
        let mut times = Vec::with_capacity(iters);
        if rank == 1 {
            reply.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        }
        for i in 0..warmup + iters {
            if rank == 0 {
                let t = Instant::now();
                world.process_at_rank(1).send_with_tag(&req[..], 1);
                if fresh {
                    let mut m = fanstore_daemon::memfd::MemfdBuilder::new_lazy("pingpong", size as u64)?;
                    world.process_at_rank(1).receive_into_with_tag(m.bytes_mut(), 2);
                    drop(m.seal()?);
                } else {
                    world.process_at_rank(1).receive_into_with_tag(&mut reply[..], 2);
                }
                if i >= warmup {
                    times.push(t.elapsed().as_secs_f64());
                }
            } else if rank == 1 {
                world.process_at_rank(0).receive_into_with_tag(&mut req[..], 1);
                world.process_at_rank(0).send_with_tag(&reply[..], 2);
            }
        }
        if rank == 0 {
            times.sort_by(f64::total_cmp);
            let med = times[times.len() / 2];
            println!(
                "pingpong{} size={size} iters={iters} median_us={:.1} mbps={:.1}",
                if fresh { "-fresh-memfd" } else { "" },
                med * 1e6,
                size as f64 / med / 1e6
            );
        }
        world.barrier();
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    fanstore_daemon::comm::raw::finalize(universe, std::time::Duration::from_secs(10), 0);
    Ok(())
}
