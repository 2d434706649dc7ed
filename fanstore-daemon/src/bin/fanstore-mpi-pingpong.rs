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
//! `--nonblocking`: the calls the daemon's communication thread makes
//! instead of blocking ones (rank 0: MPI_Irecv of the reply, MPI_Isend of the
//! request, MPI_Testsome until both complete; rank 1: MPI_Iprobe of any tag,
//! the probed MPI_Recv, MPI_Isend of the reply, MPI_Testsome), polling
//! without pause: shows what the pattern costs apart from thread hand-offs.
//! `--ucx-eager-max SIZE` (default 256K, as the daemon's): the same UCX
//! eager/rendezvous threshold the daemon sets, so both cross the same way.
use mpi::traits::*;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut iters = 50usize;
    let mut warmup = 5usize;
    let mut sizes = Vec::new();
    let mut fresh = false;
    let mut nonblocking = false;
    let mut eager_max = 256u64 << 10;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iters" => iters = args.next().ok_or_else(|| anyhow::anyhow!("--iters needs a value"))?.parse()?,
            "--fresh-memfd" => fresh = true,
            "--nonblocking" => nonblocking = true,
            "--ucx-eager-max" => {
                let v = args.next().ok_or_else(|| anyhow::anyhow!("--ucx-eager-max needs a value"))?;
                eager_max = fanstore_daemon::args::parse_size(&v).map_err(anyhow::Error::msg)?;
            }
            "--warmup" => warmup = args.next().ok_or_else(|| anyhow::anyhow!("--warmup needs a value"))?.parse()?,
            s => sizes.push(fanstore_daemon::args::parse_size(s).map_err(anyhow::Error::msg)?),
        }
    }
    anyhow::ensure!(!sizes.is_empty(), "usage: fanstore-mpi-pingpong [--iters N] [--warmup N] SIZE...");
    fanstore_daemon::comm::raw::set_ucx_eager_max(eager_max);
    let (universe, _threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)
        .ok_or_else(|| anyhow::anyhow!("MPI was already initialised"))?;
    let world = universe.world();
    anyhow::ensure!(world.size() >= 2, "run under mpiexec -n 2 (or more)");
    let rank = world.rank();
    let comm = fanstore_daemon::comm::raw::Comm::dup_world().map_err(|e| anyhow::anyhow!("{e}"))?;
    for &size in &sizes {
        let size = usize::try_from(size)?;
        let mut reply = vec![0u8; size];
        let mut req = [0u8; 16];
        let mut times = Vec::with_capacity(iters);
        if rank == 1 {
            reply.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        }
        for i in 0..warmup + iters {
            if nonblocking {
                let t = Instant::now();
                nonblocking_round(&comm, &mut req, &mut reply)?;
                if rank == 0 && i >= warmup {
                    times.push(t.elapsed().as_secs_f64());
                }
                continue;
            }
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
                if fresh { "-fresh-memfd" } else if nonblocking { "-nonblocking" } else { "" },
                med * 1e6,
                size as f64 / med / 1e6
            );
        }
        world.barrier();
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    drop(comm);
    fanstore_daemon::comm::raw::finalize(universe, std::time::Duration::from_secs(10), 0, || ());
    Ok(())
}

/// One request/reply with the communication thread's nonblocking calls.
fn nonblocking_round(comm: &fanstore_daemon::comm::raw::Comm, req: &mut [u8; 16], reply: &mut [u8]) -> anyhow::Result<()> {
    let mpi = |e: fanstore_daemon::comm::raw::MpiError| anyhow::anyhow!("{e}");
    let mut reqs = Vec::new();
    let mut done = Vec::new();
    if comm.rank == 0 {
        // SAFETY: `reply` and `req` outlive both requests, which complete before this returns.
        unsafe {
            reqs.push(comm.irecv(reply.as_mut_ptr(), reply.len(), 1, 2).map_err(mpi)?);
            reqs.push(comm.isend(req.as_ptr(), req.len(), 1, 1).map_err(mpi)?);
        }
    } else if comm.rank == 1 {
        loop {
            match comm.iprobe_any().map_err(mpi)? {
                Some((src, 1, _)) => {
                    comm.recv_probed(&mut req[..], src, 1).map_err(mpi)?;
                    break;
                }
                Some((_, tag, _)) => anyhow::bail!("unexpected tag {tag}"),
                None => {}
            }
        }
        // SAFETY: `reply` outlives the request, which completes before this returns.
        reqs.push(unsafe { comm.isend(reply.as_ptr(), reply.len(), 0, 2) }.map_err(mpi)?);
    } else {
        return Ok(());
    }
    let mut left = reqs.len();
    while left > 0 {
        done.clear();
        comm.testsome(&mut reqs, &mut done).map_err(mpi)?;
        left -= done.len();
    }
    Ok(())
}
