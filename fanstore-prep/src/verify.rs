//! `verify`: checks a dataset completely and reports every fault found.
//!
//! 1. The manifest opens with full verification (header, every section
//!    checksum, every node's references). A missing manifest is a fault:
//!    the directory is not a dataset, or its pack did not finish.
//! 2. Every partition of the manifest's table exists as `part-NNNNNN.fsp`,
//!    its header decodes (magic, version, checksum) and agrees with the
//!    table: id, flags, dataset id, entry count, file length, header checksum.
//!    A partition file the table does not list is a fault.
//! 3. Every entry is read in full: entry header checksum, payload checksum,
//!    and compressed payloads are decompressed to check their length. Raw
//!    payloads are streamed, so huge files need no memory.
//! 4. Manifest against partitions: each entry is referenced by exactly one
//!    file node, whose path hash, size, stored length, codec, checksum and
//!    replicated flag match the entry; each file node points at an entry.

use fanstore_core::checksum::{xxh3, StreamingChecksum};
use fanstore_core::codec::{self, Codec};
use fanstore_core::manifest::{self, IndexView, Manifest, NodeKind, PartitionInfo, NODE_FLAG_REPLICATED};
use fanstore_core::partition::{self, EntryHeader, PartitionHeader, ENTRY_HEADER_LEN, FLAG_REPLICATED, HEADER_LEN};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// One thing wrong with a dataset; the message names the file, the entry and the offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault(pub String);

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What `verify` found.
#[derive(Debug, Default)]
pub struct VerifyReport {
    pub faults: Vec<Fault>,
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub partitions: u32,
    pub replicated_partitions: u32,
    /// Logical bytes of all files.
    pub bytes: u64,
    /// Bytes of partition files read.
    pub bytes_read: u64,
    pub dataset_id: u64,
}

impl VerifyReport {
    fn fault(&mut self, msg: String) {
        self.faults.push(Fault(msg));
    }
}

/// A file node as the partition scan needs it.
struct FileRef<'a> {
    path: &'a [u8],
    size: u64,
    stored_len: u64,
    codec: Codec,
    checksum: u64,
    replicated: bool,
    seen: bool,
}

/// Verifies the dataset in `dir`.
pub fn verify(dir: &Path) -> VerifyReport {
    let mut report = VerifyReport::default();
    let manifest_path = dir.join(manifest::FILE_NAME);
    if !manifest_path.exists() {
        report.fault(format!(
            "{}: missing: {} is not a FanStore dataset, or its pack did not finish",
            manifest_path.display(),
            dir.display()
        ));
        return report;
    }
    let m = match Manifest::open(&manifest_path) {
        Ok(m) => m,
        Err(e) => {
            report.fault(e.to_string());
            return report;
        }
    };
    let view = m.view();
    report.dataset_id = view.dataset_id();

    // (partition id, payload offset) -> file node.
    let mut refs: HashMap<(u32, u64), FileRef<'_>> = HashMap::new();
    for n in view.nodes() {
        match n.kind() {
            Some(NodeKind::Dir) if n.id() != 0 => report.directories += 1,
            Some(NodeKind::Symlink) => report.symlinks += 1,
            Some(NodeKind::File) => {
                report.files += 1;
                report.bytes += n.size();
                let r = FileRef {
                    path: n.path(),
                    size: n.size(),
                    stored_len: n.stored_len(),
                    codec: n.codec(),
                    checksum: n.checksum(),
                    replicated: n.flags() & NODE_FLAG_REPLICATED != 0,
                    seen: false,
                };
                if let Some(other) = refs.insert((n.partition(), n.payload_offset()), r) {
                    report.fault(format!(
                        "{}: files '{}' and '{}' both point at partition {} offset {}",
                        manifest_path.display(),
                        lossy(other.path),
                        lossy(n.path()),
                        n.partition(),
                        n.payload_offset()
                    ));
                }
            }
            _ => {}
        }
    }

    let listed: Vec<PartitionInfo> = view.partitions().collect();
    report.partitions = listed.len() as u32;
    report.replicated_partitions = listed.iter().filter(|p| p.replicated()).count() as u32;
    for (position, info) in listed.iter().enumerate() {
        if info.id != position as u32 {
            report.fault(format!(
                "{}: partition table entry {position} has id {}, expected {position}",
                manifest_path.display(),
                info.id
            ));
        }
        let path = dir.join(partition::file_name(info.id));
        check_partition(&path, info, &view, &mut refs, &mut report);
    }
    check_stray_partitions(dir, &listed, &mut report);

    let mut missing: Vec<((u32, u64), &[u8])> = refs.iter().filter(|(_, r)| !r.seen).map(|(k, r)| (*k, r.path)).collect();
    missing.sort_by_key(|(_, path)| *path);
    for ((part, off), path) in missing {
        report.fault(format!(
            "{}: file '{}' points at partition {part} offset {off}, where no entry of the partition starts",
            manifest_path.display(),
            lossy(path)
        ));
    }
    report
}

fn lossy(b: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(b)
}

fn check_stray_partitions(dir: &Path, listed: &[PartitionInfo], report: &mut VerifyReport) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut stray: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("part-") && n.ends_with(".fsp"))
        .filter(|n| !listed.iter().any(|p| partition::file_name(p.id) == *n))
        .collect();
    stray.sort();
    for n in stray {
        report.fault(format!("{}: partition file not listed in the manifest", dir.join(n).display()));
    }
}

/// Scans one partition file fully and checks it against the manifest.
fn check_partition(path: &Path, info: &PartitionInfo, view: &IndexView<'_>, refs: &mut HashMap<(u32, u64), FileRef<'_>>, report: &mut VerifyReport) {
    let shown = path.display();
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) => {
            report.fault(format!("{shown}: partition {} listed in the manifest cannot be opened: {e}", info.id));
            return;
        }
    };
    let file_len = match file.metadata() {
        Ok(m) => m.len(),
        Err(e) => {
            report.fault(format!("{shown}: {e}"));
            return;
        }
    };
    let mut input = BufReader::with_capacity(4 << 20, file);
    let mut hb = [0u8; HEADER_LEN];
    let got = read_up_to(&mut input, &mut hb);
    let header = match got.map_err(|e| e.to_string()).and_then(|n| PartitionHeader::decode(path, &hb[..n]).map_err(|e| e.to_string())) {
        Ok(h) => h,
        Err(e) => {
            report.fault(e);
            return;
        }
    };
    let mut mismatch = |what: &str, header_value: String, manifest_value: String| {
        report.fault(format!(
            "{shown}: partition header at offset 0 says {what} {header_value}, the manifest says {manifest_value}"
        ));
    };
    if header.id != info.id {
        mismatch("id", header.id.to_string(), info.id.to_string());
    }
    if header.checksum != info.header_checksum {
        mismatch("header checksum", format!("{:#018x}", header.checksum), format!("{:#018x}", info.header_checksum));
    }
    if header.dataset_id != view.dataset_id() {
        mismatch("dataset id", format!("{:#018x}", header.dataset_id), format!("{:#018x}", view.dataset_id()));
    }
    if header.flags != info.flags {
        mismatch("flags", header.flags.to_string(), info.flags.to_string());
    }
    if header.entry_count != info.entry_count {
        mismatch("entry count", header.entry_count.to_string(), info.entry_count.to_string());
    }
    let header_len = HEADER_LEN as u64 + header.data_len;
    if header_len != info.file_len {
        mismatch("file length", header_len.to_string(), info.file_len.to_string());
    }
    if file_len != header_len {
        report.fault(format!("{shown}: file has {file_len} bytes, its header says {header_len}"));
    }
    report.bytes_read += file_len;

    let replicated = header.flags & FLAG_REPLICATED != 0;
    let mut pos = HEADER_LEN as u64;
    let mut logical = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for k in 0..header.entry_count {
        if pos + ENTRY_HEADER_LEN as u64 > file_len {
            report.fault(format!("{shown}: truncated: entry {k} header at offset {pos} is past the end ({file_len} bytes)"));
            return;
        }
        let mut eb = [0u8; ENTRY_HEADER_LEN];
        if let Err(e) = input.read_exact(&mut eb) {
            report.fault(format!("{shown}: entry {k} header at offset {pos}: {e}"));
            return;
        }
        let eh = match EntryHeader::decode(path, pos, &eb) {
            Ok(h) => h,
            Err(e) => {
                // Without a valid header the next entry cannot be found.
                report.fault(format!("{e} (entry {k}; the rest of the partition is not checked)"));
                return;
            }
        };
        let payload_off = pos + ENTRY_HEADER_LEN as u64;
        if payload_off + eh.stored_len > file_len {
            report.fault(format!(
                "{shown}: truncated: payload of entry {k} at offset {payload_off} needs {} bytes, {} remain",
                eh.stored_len,
                file_len - payload_off
            ));
            return;
        }
        match check_payload(&mut input, &eh, &mut buf) {
            Ok(PayloadCheck::Ok) => {}
            Ok(PayloadCheck::Checksum(computed)) => {
                report.fault(format!(
                    "{shown}: checksum mismatch in payload of entry {k} at offset {payload_off} (stored {:#018x}, computed {computed:#018x})",
                    eh.payload_checksum
                ));
            }
            Ok(PayloadCheck::Decode(e)) => {
                report.fault(format!("{shown}: payload of entry {k} at offset {payload_off} does not decompress: {e}"));
            }
            Err(e) => {
                report.fault(format!("{shown}: payload of entry {k} at offset {payload_off}: {e}"));
                return;
            }
        }
        logical += eh.raw_len;
        match refs.get_mut(&(info.id, payload_off)) {
            None => report.fault(format!(
                "{shown}: entry {k} at offset {pos} (path hash {:#018x}) is not referenced by any file of the manifest",
                eh.path_hash
            )),
            Some(r) => {
                r.seen = true;
                let name = lossy(r.path).into_owned();
                let mut differs = |what: &str, entry: String, node: String| {
                    report.fault(format!(
                        "{shown}: entry {k} at offset {pos}: {what} is {entry}, but the manifest's file '{name}' says {node}"
                    ));
                };
                let path_hash = xxh3(r.path);
                if eh.path_hash != path_hash {
                    differs("path hash", format!("{:#018x}", eh.path_hash), format!("{path_hash:#018x}"));
                }
                if eh.raw_len != r.size {
                    differs("raw length", eh.raw_len.to_string(), r.size.to_string());
                }
                if eh.stored_len != r.stored_len {
                    differs("stored length", eh.stored_len.to_string(), r.stored_len.to_string());
                }
                if eh.codec != r.codec {
                    differs("codec", eh.codec.name().into(), r.codec.name().into());
                }
                if eh.payload_checksum != r.checksum {
                    differs("payload checksum", format!("{:#018x}", eh.payload_checksum), format!("{:#018x}", r.checksum));
                }
                if r.replicated != replicated {
                    differs("replicated flag", replicated.to_string(), r.replicated.to_string());
                }
            }
        }
        pos = payload_off + eh.stored_len;
    }
    if pos != file_len {
        report.fault(format!("{shown}: {} trailing bytes after the last entry at offset {pos}", file_len.saturating_sub(pos)));
    }
    if logical != info.logical_bytes {
        report.fault(format!(
            "{shown}: entries hold {logical} logical bytes, the manifest's partition table says {}",
            info.logical_bytes
        ));
    }
}

enum PayloadCheck {
    Ok,
    Checksum(u64),
    Decode(std::io::Error),
}

/// Reads one payload: raw ones streamed through the checksum, compressed
/// ones in memory and then decompressed to check their length.
fn check_payload(input: &mut impl Read, eh: &EntryHeader, buf: &mut [u8]) -> std::io::Result<PayloadCheck> {
    if eh.codec == Codec::None {
        let mut sum = StreamingChecksum::new();
        let mut left = eh.stored_len;
        while left > 0 {
            let n = buf.len().min(left as usize);
            input.read_exact(&mut buf[..n])?;
            sum.update(&buf[..n]);
            left -= n as u64;
        }
        let computed = sum.digest();
        if computed != eh.payload_checksum {
            return Ok(PayloadCheck::Checksum(computed));
        }
        if eh.raw_len != eh.stored_len {
            return Ok(PayloadCheck::Decode(std::io::Error::other(format!(
                "raw payload of {} bytes, but raw length {}",
                eh.stored_len, eh.raw_len
            ))));
        }
        return Ok(PayloadCheck::Ok);
    }
    let mut payload = vec![0u8; eh.stored_len as usize];
    input.read_exact(&mut payload)?;
    let computed = xxh3(&payload);
    if computed != eh.payload_checksum {
        return Ok(PayloadCheck::Checksum(computed));
    }
    match codec::decompress_to(eh.codec, &payload, eh.raw_len, &mut std::io::sink()) {
        Ok(()) => Ok(PayloadCheck::Ok),
        Err(e) => Ok(PayloadCheck::Decode(e)),
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Where the dataset's manifest lives.
pub fn manifest_path(dir: &Path) -> PathBuf {
    dir.join(manifest::FILE_NAME)
}
