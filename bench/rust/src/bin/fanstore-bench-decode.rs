//! Benchmark for `bench/read_bench.py`: the decode-bound ceiling of reading
//! compressed files. Every partition of a dataset is read into memory first;
//! then THREADS threads split the files whose path starts with PREFIX and, for
//! each, decompress its payload from that memory copy into a reused buffer
//! and read every byte of the result, ROUNDS times. No file system, no
//! daemon, no checksum: what an in-process reader with the whole dataset in
//! memory would pay to get the bytes.
//!
//! With `--into-memfd`, each decoded file is then written into a new memfd
//! and read back from it before the memfd is closed: the least any reader
//! pays that must hand the program a real kernel fd holding the file's
//! bytes (FanStore's rule), with no daemon and no message.
//!
//! With `--copy-out`, each decoded file is copied into a reused 1 MiB buffer,
//! a piece at a time, before its bytes are read: the copy a read(2) of a
//! file holding the bytes makes, without the system call. With
//! `--checksum`, each payload's xxh3 is computed before it is decoded (with
//! the prefetching `xxh3_cold`), as every FanStore read checks it.
//!
//! ```text
//! fanstore-bench-decode --data DIR --prefix PATH [--threads N] [--rounds R] [--checksum]
//!                       [--into-memfd | --copy-out]
//! ```
//! Prints `decode files=<n> bytes=<decoded bytes per round> seconds=<median
//! round> mbps=<decoded MB/s>`.
use anyhow::Context;
use fanstore_core::manifest::{IndexView, Manifest, NodeKind, Verify};
use std::path::PathBuf;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let (mut data, mut prefix, mut threads, mut rounds, mut memfd, mut copy_out, mut checksum) =
        (None, String::new(), 1usize, 3usize, false, false, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--data" => data = Some(PathBuf::from(val()?)),
            "--prefix" => prefix = val()?,
            "--threads" => threads = val()?.parse()?,
            "--rounds" => rounds = val()?.parse()?,
            "--into-memfd" => memfd = true,
            "--copy-out" => copy_out = true,
            "--checksum" => checksum = true,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    anyhow::ensure!(!(memfd && copy_out), "--into-memfd and --copy-out exclude each other");
    let data = data.context("--data is required")?;
    let m = Manifest::open(&data.join("manifest.fsm"))?;
    let view = IndexView::parse(m.path(), m.bytes(), Verify::Header)?;
    let parts: Vec<Vec<u8>> = (0..view.partition_count())
        .map(|p| {
            let f = data.join(fanstore_core::partition::file_name(p));
            std::fs::read(&f).with_context(|| format!("reading {}", f.display()))
        })
        .collect::<anyhow::Result<_>>()?;
    let files: Vec<_> = view
        .nodes()
        .filter(|n| n.kind() == Some(NodeKind::File) && n.path().starts_with(prefix.as_bytes()))
        .map(|n| (n.partition() as usize, n.payload_offset() as usize, n.stored_len() as usize, n.codec(), n.size()))
        .collect();
    anyhow::ensure!(!files.is_empty(), "no file under '{prefix}'");
    let bytes: u64 = files.iter().map(|f| f.4).sum();
    let threads = threads.max(1);
    let mut times = Vec::new();
    let mut sink = 0u64;
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        sink ^= std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|k| {
                    let (files, parts) = (&files, &parts);
                    s.spawn(move || -> anyhow::Result<u64> {
                        let mut out: Vec<u8> = Vec::new();
                        let mut back: Vec<u8> = Vec::new();
                        let mut acc = 0u64;
                        for &(p, off, len, codec, size) in files.iter().skip(k).step_by(threads) {
                            let stored = parts[p].get(off..off + len).context("payload past the partition's end")?;
                            if checksum {
                                acc ^= fanstore_core::checksum::xxh3_cold(stored);
                            }
                            out.resize(size as usize, 0);
                            fanstore_core::codec::decompress_into(codec, stored, &mut out)?;
                            if copy_out {
                                back.resize(1 << 20, 0);
                                for piece in out.chunks(1 << 20) {
                                    back[..piece.len()].copy_from_slice(piece);
                                    acc = acc.wrapping_add(read_all(std::hint::black_box(&back[..piece.len()])));
                                }
                                continue;
                            }
                            let bytes: &[u8] = if memfd {
                                back.resize(out.len(), 0);
                                through_memfd(&out, &mut back)?;
                                &back
                            } else {
                                &out
                            };
                            acc = acc.wrapping_add(read_all(bytes));
                        }
                        Ok(acc)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("a thread panicked"))?).try_fold(0u64, |a, r| r.map(|v| a ^ v))
        })?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    println!(
        "decode files={} bytes={bytes} seconds={med:.6} mbps={:.1} sink={}",
        files.len(),
        bytes as f64 / med / 1e6,
        sink & 1
    );
    Ok(())
}

/// Reads every byte, as a reader of the file would, at the speed of the
/// memory: an XOR of every 8-byte word (vectorized), so that the ceiling is
/// the decode's and not this loop's.
fn read_all(bytes: &[u8]) -> u64 {
    let words = bytes.chunks_exact(8);
    let tail = words.remainder().iter().fold(0u64, |a, &b| a.rotate_left(8) ^ b as u64);
    words.fold(0u64, |a, w| a ^ u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])) ^ tail
}

/// Writes `bytes` into a new memfd, reads them back into `back`, closes it.
fn through_memfd(bytes: &[u8], back: &mut [u8]) -> anyhow::Result<()> {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::FileExt;
    // SAFETY: a NUL-terminated name and valid flags; the fd returned is ours.
    let fd = unsafe { libc::memfd_create(c"bench".as_ptr(), libc::MFD_CLOEXEC) };
    anyhow::ensure!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a fresh fd nothing else owns.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.write_all_at(bytes, 0)?;
    f.read_exact_at(back, 0)?;
    Ok(())
}
