//! Writers of the checkpoint formats for tests, written from the format
//! specifications (safetensors, PyTorch's inline_container zip layout,
//! numpy's .npy/.npz), plus a deterministic random generator.
#![allow(dead_code)]

use fanstore_ckpt::CheckpointStore;
use std::path::Path;

/// A checkpoint store opened in a new temporary directory, which is removed
/// when the returned guard drops.
pub fn temp_store() -> (tempfile::TempDir, CheckpointStore) {
    let d = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(d.path()).unwrap();
    (d, store)
}

/// xorshift64: deterministic test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// A tensor for the writers.
#[derive(Clone)]
pub struct T {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

pub fn t(name: &str, dtype: &'static str, shape: &[u64], data: Vec<u8>) -> T {
    T { name: name.into(), dtype, shape: shape.to_vec(), data }
}

/// Options of the safetensors writer.
#[derive(Clone, Copy, Default)]
pub struct StOpts {
    /// Write the header keys in reverse data order (the spec fixes no order).
    pub reverse_keys: bool,
    /// Bytes of padding between tensors (the spec does not forbid gaps).
    pub gap: usize,
    pub metadata: bool,
}

/// A safetensors file: u64 LE header length, JSON header padded with spaces
/// to a multiple of 8, then the tensors' bytes in the given order.
pub fn safetensors(tensors: &[T], o: StOpts) -> Vec<u8> {
    let mut entries = Vec::new();
    let mut off = 0usize;
    for t in tensors {
        let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        entries.push(format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            fanstore_ckpt::render::json_str(t.name.as_bytes()),
            t.dtype,
            shape.join(","),
            off,
            off + t.data.len()
        ));
        off += t.data.len() + o.gap;
    }
    if o.reverse_keys {
        entries.reverse();
    }
    if o.metadata {
        entries.insert(0, "\"__metadata__\":{\"format\":\"pt\",\"step\":\"\\u0031\"}".into());
    }
    let mut header = format!("{{{}}}", entries.join(",")).into_bytes();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(&header);
    for t in tensors {
        b.extend_from_slice(&t.data);
        b.extend(std::iter::repeat_n(0xAAu8, o.gap));
    }
    b
}

/// A .npy file (v1 unless the header needs more, as numpy does; `major` forces it).
pub fn npy(descr: &str, shape: &[u64], data: &[u8], major: u8) -> Vec<u8> {
    let shape_txt = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!("({})", shape.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_txt}, }}");
    fanstore_ckpt::split::npy_file(major, &dict, data)
}

pub fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
        }
    }
    !c
}

/// Options of the zip writer.
#[derive(Clone, Copy, Debug)]
pub struct ZipOpts {
    /// Align each payload with PyTorch's "FB" extra-field padding (0: none).
    pub align: usize,
    /// Write data descriptors (flag bit 3) after each payload.
    pub descriptors: bool,
    /// Write ZIP64 extras and the ZIP64 end records even for small files.
    pub zip64: bool,
    /// Compute CRCs (PyTorch may write zero).
    pub crc: bool,
}

impl Default for ZipOpts {
    fn default() -> Self {
        ZipOpts { align: 64, descriptors: false, zip64: false, crc: false }
    }
}

/// One member: name, payload as stored, method (0 stored, 8 deflated: the
/// payload must then already be deflated; only its bytes matter here).
pub struct Member<'a> {
    pub name: String,
    pub data: &'a [u8],
    pub method: u16,
    pub usize: u64,
}

pub fn stored<'a>(name: &str, data: &'a [u8]) -> Member<'a> {
    Member { name: name.into(), data, method: 0, usize: data.len() as u64 }
}

/// The ZIP64 extra field (id 1) holding `values`, u64 each: sizes and, in
/// the central directory, the local header's offset.
fn zip64_extra(values: &[u64]) -> Vec<u8> {
    let mut x = Vec::new();
    x.extend_from_slice(&1u16.to_le_bytes());
    x.extend_from_slice(&(8 * values.len() as u16).to_le_bytes());
    for v in values {
        x.extend_from_slice(&v.to_le_bytes());
    }
    x
}

/// A zip archive laid out like PyTorch's PyTorchStreamWriter (miniz):
/// local header, name, [ZIP64 extra], "FB" padding so the payload starts on
/// an `align` boundary, payload, [data descriptor]; then the central
/// directory, [ZIP64 end record + locator], end record.
pub fn zip(members: &[Member], o: ZipOpts) -> Vec<u8> {
    let mut b = Vec::new();
    let mut central = Vec::new();
    for m in members {
        let lho = b.len() as u64;
        let csize = m.data.len() as u64;
        let big = o.zip64 || csize >= 0xFFFF_FFFF || lho >= 0xFFFF_FFFF;
        let crc = if o.crc { crc32(m.data) } else { 0 };
        let flags: u16 = if o.descriptors { 8 } else { 0 };
        let mut extra = if big { zip64_extra(&[m.usize, csize]) } else { Vec::new() };
        if o.align > 0 {
            let start = lho as usize + 30 + m.name.len() + extra.len() + 4;
            let pad = (o.align - start % o.align) % o.align;
            extra.extend_from_slice(b"FB");
            extra.extend_from_slice(&(pad as u16).to_le_bytes());
            extra.extend(std::iter::repeat_n(b'Z', pad));
        }
        let (l_csize, l_usize) = if big {
            (0xFFFF_FFFFu32, 0xFFFF_FFFFu32)
        } else if o.descriptors {
            (0, 0)
        } else {
            (csize as u32, m.usize as u32)
        };
        b.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        b.extend_from_slice(&(if big { 45u16 } else { 20 }).to_le_bytes());
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&m.method.to_le_bytes());
        b.extend_from_slice(&[0u8; 4]); // time, date
        b.extend_from_slice(&(if o.descriptors { 0 } else { crc }).to_le_bytes());
        b.extend_from_slice(&l_csize.to_le_bytes());
        b.extend_from_slice(&l_usize.to_le_bytes());
        b.extend_from_slice(&(m.name.len() as u16).to_le_bytes());
        b.extend_from_slice(&(extra.len() as u16).to_le_bytes());
        b.extend_from_slice(m.name.as_bytes());
        b.extend_from_slice(&extra);
        if o.align > 0 {
            assert_eq!(b.len() % o.align, 0);
        }
        b.extend_from_slice(m.data);
        if o.descriptors {
            b.extend_from_slice(&0x0807_4b50u32.to_le_bytes());
            b.extend_from_slice(&crc.to_le_bytes());
            if big {
                b.extend_from_slice(&csize.to_le_bytes());
                b.extend_from_slice(&m.usize.to_le_bytes());
            } else {
                b.extend_from_slice(&(csize as u32).to_le_bytes());
                b.extend_from_slice(&(m.usize as u32).to_le_bytes());
            }
        }
        // central directory header
        let cx = if big { zip64_extra(&[m.usize, csize, lho]) } else { Vec::new() };
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&(if big { 45u16 } else { 20 }).to_le_bytes());
        central.extend_from_slice(&(if big { 45u16 } else { 20 }).to_le_bytes());
        central.extend_from_slice(&flags.to_le_bytes());
        central.extend_from_slice(&m.method.to_le_bytes());
        central.extend_from_slice(&[0u8; 4]);
        central.extend_from_slice(&crc.to_le_bytes());
        let (c32, u32_, o32) = if big { (u32::MAX, u32::MAX, u32::MAX) } else { (csize as u32, m.usize as u32, lho as u32) };
        central.extend_from_slice(&c32.to_le_bytes());
        central.extend_from_slice(&u32_.to_le_bytes());
        central.extend_from_slice(&(m.name.len() as u16).to_le_bytes());
        central.extend_from_slice(&(cx.len() as u16).to_le_bytes());
        central.extend_from_slice(&0u16.to_le_bytes()); // comment
        central.extend_from_slice(&0u16.to_le_bytes()); // disk
        central.extend_from_slice(&0u16.to_le_bytes()); // internal attrs
        central.extend_from_slice(&0u32.to_le_bytes()); // external attrs
        central.extend_from_slice(&o32.to_le_bytes());
        central.extend_from_slice(m.name.as_bytes());
        central.extend_from_slice(&cx);
    }
    let cd_off = b.len() as u64;
    let cd_len = central.len() as u64;
    b.extend_from_slice(&central);
    let n = members.len() as u64;
    if o.zip64 {
        let rec = b.len() as u64;
        b.extend_from_slice(&0x0606_4b50u32.to_le_bytes());
        b.extend_from_slice(&44u64.to_le_bytes());
        b.extend_from_slice(&45u16.to_le_bytes());
        b.extend_from_slice(&45u16.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
        b.extend_from_slice(&cd_len.to_le_bytes());
        b.extend_from_slice(&cd_off.to_le_bytes());
        b.extend_from_slice(&0x0706_4b50u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&rec.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
    }
    b.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    let n16 = if o.zip64 { 0xFFFF } else { n as u16 };
    b.extend_from_slice(&n16.to_le_bytes());
    b.extend_from_slice(&n16.to_le_bytes());
    let (l32, o32) = if o.zip64 { (u32::MAX, u32::MAX) } else { (cd_len as u32, cd_off as u32) };
    b.extend_from_slice(&l32.to_le_bytes());
    b.extend_from_slice(&o32.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b
}

/// A torch.save-like archive: `<dir>/data.pkl`, `<dir>/byteorder`,
/// `<dir>/data/<i>` storages, `<dir>/version`, `<dir>/.data/serialization_id`.
/// Its data.pkl is not a pickle, so storages keep their entry names.
pub fn torch_zip(dir: &str, storages: &[Vec<u8>], o: ZipOpts) -> Vec<u8> {
    let mut pkl = b"not a pickle: ".to_vec();
    for s in storages {
        pkl.extend_from_slice(format!("{} ", s.len()).as_bytes());
    }
    torch_zip_with_pkl(dir, &pkl, storages, o)
}

/// As [`torch_zip`], with the given data.pkl.
pub fn torch_zip_with_pkl(dir: &str, pkl: &[u8], storages: &[Vec<u8>], o: ZipOpts) -> Vec<u8> {
    let sid = b"00000000000000012345";
    let names: Vec<String> = (0..storages.len()).map(|i| format!("{dir}/data/{i}")).collect();
    let mut members = vec![stored(&format!("{dir}/data.pkl"), pkl), stored(&format!("{dir}/byteorder"), b"little")];
    for (i, s) in storages.iter().enumerate() {
        members.push(stored(&names[i], s));
    }
    members.push(stored(&format!("{dir}/version"), b"3\n"));
    members.push(stored(&format!("{dir}/.data/serialization_id"), sid));
    zip(&members, o)
}

/// An HDF5-like unknown binary: a fixed superblock then chunks of `payload`.
pub fn unknown_binary(payload: &[u8]) -> Vec<u8> {
    let mut b = b"\x89HDF\r\n\x1a\n".to_vec();
    b.extend_from_slice(&[0u8; 88]);
    b.extend_from_slice(payload);
    b
}

/// Sum of the sizes of every regular file under `dir`.
pub fn bytes_on_disk(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        if m.is_dir() {
            n += bytes_on_disk(&e.path());
        } else {
            n += m.len();
        }
    }
    n
}

/// Copies the directory tree `from` to `to` (snapshots of a store taken
/// in the middle of an operation, as a crash there would leave it).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}
