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
//! `--idle-before SECS`: every rank sleeps SECS before each size's warm-up
//! and timed round trips: the raw pattern after the idle a daemon job meets
//! between a reader's bursts (a VM's vCPUs halt and the host may park them).
//! `--ucx-eager-max SIZE` (default 256K, as the daemon's): the same UCX
//! eager/rendezvous threshold the daemon sets, so both cross the same way.
//!
//! `--all-pairs` (any number of ranks): the traffic of the multi-node read
//! with nothing of FanStore in it. Every rank is a reader and a holder at
//! once: it asks the other ranks in turn for SIZE bytes, one request in
//! flight (a reader reading files one after another), while it answers the
//! others' requests, all with the communication thread's nonblocking calls
//! polled without pause. Rank 0 prints
//! `allpairs size=<bytes> ranks=<n> iters=<per rank> mbps=<MB/s>`: the bytes
//! every rank received over the slowest rank's seconds, the transport's
//! aggregate limit for that pattern on these cores. With `--verify` each
//! requester also computes the xxh3 of every reply and copies it into a
//! second buffer (the checksum FanStore computes of every remote payload and
//! the copy a reader's read(2) makes): the least work a remote read must do
//! on top of the transport.
use mpi::traits::*;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut iters = 50usize;
    let mut warmup = 5usize;
    let mut sizes = Vec::new();
    let mut fresh = false;
    let mut nonblocking = false;
    let mut eager_max = 256u64 << 10;
    let mut all_pairs = false;
    let mut verify = false;
    let mut idle_before = 0f64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iters" => iters = args.next().ok_or_else(|| anyhow::anyhow!("--iters needs a value"))?.parse()?,
            "--fresh-memfd" => fresh = true,
            "--nonblocking" => nonblocking = true,
            "--all-pairs" => all_pairs = true,
            "--verify" => verify = true,
            "--ucx-eager-max" => {
                let v = args.next().ok_or_else(|| anyhow::anyhow!("--ucx-eager-max needs a value"))?;
                eager_max = fanstore_daemon::args::parse_size(&v).map_err(anyhow::Error::msg)?;
            }
            "--idle-before" => {
                idle_before = args.next().ok_or_else(|| anyhow::anyhow!("--idle-before needs a value"))?.parse()?;
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
    if all_pairs {
        for &size in &sizes {
            let size = usize::try_from(size)?;
            all_pairs_round(&comm, size, warmup.max(1), verify)?;
            world.barrier();
            let t = Instant::now();
            all_pairs_round(&comm, size, iters, verify)?;
            let secs = t.elapsed().as_secs_f64();
            let mut slowest = 0f64;
            world.all_reduce_into(&secs, &mut slowest, mpi::collective::SystemOperation::max());
            if rank == 0 {
                let bytes = (size * iters) as f64 * f64::from(world.size());
                println!(
                    "allpairs{} size={size} ranks={} iters={iters} mbps={:.1}",
                    if verify { "-verify" } else { "" },
                    world.size(),
                    bytes / slowest / 1e6
                );
            }
            world.barrier();
        }
        use std::io::Write;
        std::io::stdout().flush()?;
        drop(comm);
        fanstore_daemon::comm::raw::finalize(universe, std::time::Duration::from_secs(10), 0, || ());
        return Ok(());
    }
    for &size in &sizes {
        let size = usize::try_from(size)?;
        let mut reply = vec![0u8; size];
        let mut req = [0u8; 16];
        let mut times = Vec::with_capacity(iters);
        if rank == 1 {
            reply.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        }
        if idle_before > 0.0 {
            world.barrier();
            std::thread::sleep(std::time::Duration::from_secs_f64(idle_before));
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

const TAG_ASK: i32 = 1;
const TAG_REPLY: i32 = 2;
/// "I asked for everything I wanted": a rank serves until every peer said so.
const TAG_FINISHED: i32 = 3;

/// `iters` requests of `size` bytes from this rank to the others in turn,
/// one in flight, while answering theirs, until every rank finished asking.
fn all_pairs_round(comm: &fanstore_daemon::comm::raw::Comm, size: usize, iters: usize, verify: bool) -> anyhow::Result<()> {
    use fanstore_daemon::comm::raw::Request;
    let mpi = |e: fanstore_daemon::comm::raw::MpiError| anyhow::anyhow!("{e}");
    let (me, n) = (comm.rank, comm.size);
    anyhow::ensure!(n >= 2, "--all-pairs needs 2 ranks or more");
    let payload: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut inbox = vec![0u8; size];
    let mut copy = vec![0u8; if verify { size } else { 0 }];
    let ask = [0u8; 16];
    let mut asked_buf = [0u8; 16];
    let finished = [0u8; 4];
    let mut sent = 0usize;
    // The request and reply in flight: (reply receive, request send) with how many are left.
    let mut mine: Vec<Request> = Vec::new();
    let mut mine_left = 0usize;
    // Replies and notices this rank sends (their buffers are `payload` and `finished`, alive throughout).
    let mut out: Vec<Request> = Vec::new();
    let mut peers_finished = 0u32;
    let mut told = false;
    let mut done = Vec::new();
    let mut sink = 0u64;
    loop {
        // More ranks than cores here: a round that moved nothing gives the
        // core to a rank that has work (pure spinning starves the holders).
        let mut moved = false;
        if mine_left == 0 && sent < iters {
            let peer = (me + 1 + (sent as u32 % (n - 1))) % n;
            // SAFETY: `inbox` and `ask` outlive the requests: this function
            // completes both (mine_left reaches 0) before it returns.
            unsafe {
                mine = vec![comm.irecv(inbox.as_mut_ptr(), size, peer, TAG_REPLY).map_err(mpi)?,
                            comm.isend(ask.as_ptr(), ask.len(), peer, TAG_ASK).map_err(mpi)?];
            }
            mine_left = 2;
            moved = true;
        }
        if sent == iters && mine_left == 0 && !told {
            for peer in (0..n).filter(|&p| p != me) {
                // SAFETY: `finished` outlives the sends, completed below before returning.
                out.push(unsafe { comm.isend(finished.as_ptr(), finished.len(), peer, TAG_FINISHED) }.map_err(mpi)?);
            }
            told = true;
        }
        while let Some((src, tag, len)) = comm.iprobe_any().map_err(mpi)? {
            moved = true;
            match tag {
                TAG_ASK => {
                    comm.recv_probed(&mut asked_buf[..len.min(16)], src, TAG_ASK).map_err(mpi)?;
                    // SAFETY: `payload` is never written and outlives the send.
                    out.push(unsafe { comm.isend(payload.as_ptr(), size, src, TAG_REPLY) }.map_err(mpi)?);
                }
                TAG_FINISHED => {
                    let mut b = [0u8; 4];
                    comm.recv_probed(&mut b, src, TAG_FINISHED).map_err(mpi)?;
                    peers_finished += 1;
                }
                t => anyhow::bail!("unexpected tag {t} from rank {src}"),
            }
        }
        if mine_left > 0 {
            done.clear();
            comm.testsome(&mut mine, &mut done).map_err(mpi)?;
            mine_left -= done.len();
            moved |= !done.is_empty();
            if mine_left == 0 {
                sent += 1;
                if verify {
                    sink ^= fanstore_core::checksum::xxh3(&inbox);
                    copy.copy_from_slice(&inbox);
                    sink ^= u64::from(copy[size / 2]);
                }
            }
        }
        if !out.is_empty() {
            done.clear();
            comm.testsome(&mut out, &mut done).map_err(mpi)?;
            moved |= !done.is_empty();
            let mut gone: Vec<usize> = done.iter().map(|d| d.index).collect();
            gone.sort_unstable();
            for i in gone.into_iter().rev() {
                out.swap_remove(i);
            }
        }
        if told && peers_finished == n - 1 && out.is_empty() {
            std::hint::black_box(sink);
            return Ok(());
        }
        if !moved {
            std::thread::yield_now();
        }
    }
}
