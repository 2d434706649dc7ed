//! The frame every FanStore file format starts with, checked in one place.
//!
//! All six formats (two here, four in `fanstore-ckpt`) open with the same
//! frame: a magic naming the format, a version, the format's own fields, and
//! an xxh3 of everything before it. All integers are little-endian.
//!
//! ```text
//! header of L bytes
//!   0..8       magic: "FANST", two letters naming the format, "\0"
//!   8..12      version u32
//!  12..L-8     the format's own fields (see its module)
//! L-8..L       xxh3 of header bytes 0..L-8
//!
//! format      magic        version: L        module
//! manifest    "FANSTMF\0"  1: 184            fanstore_core::manifest
//! partition   "FANSTPT\0"  1: 64             fanstore_core::partition
//! catalog     "FANSTCK\0"  1: 72             fanstore_ckpt::catalog
//! recipe      "FANSTRC\0"  1: 176            fanstore_ckpt::recipe
//! pack        "FANSTPK\0"  1: 40             fanstore_ckpt::pack
//! unit        "FANSTUN\0"  1: 72, 2: 128     fanstore_ckpt::unit
//! ```
//!
//! A format describes its frame as a [`FormatHeader`] constant, declares the
//! offsets of its own fields from [`FIELDS_OFFSET`] with [`layout!`], writes
//! its header with [`FormatHeader::seal`] and reads it back through
//! [`FormatHeader::check`],
//! which refuses, in this order and naming the file and the format:
//!
//! 1. a magic of another kind, as soon as the first 8 bytes are there (a
//!    short file of another kind is named as such, not as truncated);
//! 2. a file too short to hold the version (`needs` the shortest header);
//! 3. a version this build does not read (the one found and the newest read);
//! 4. a file too short for the header of its version;
//! 5. a header whose xxh3 does not match.

use crate::checksum::xxh3;
use crate::error::FormatError;
use crate::le::{put_u32, put_u64, u32_at, u64_at};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Where the magic starts.
pub const MAGIC_OFFSET: usize = 0;
/// Bytes of the magic.
pub const MAGIC_LEN: usize = 8;
/// Where the version (u32) starts.
pub const VERSION_OFFSET: usize = MAGIC_OFFSET + MAGIC_LEN;
/// Bytes of the version.
pub const VERSION_LEN: usize = 4;
/// Where a format's own fields start.
pub const FIELDS_OFFSET: usize = VERSION_OFFSET + VERSION_LEN;
/// Bytes of the header checksum, the last field of every header.
pub const CHECKSUM_LEN: usize = 8;

/// Declares the offsets of consecutive fields as `usize` constants, each
/// field starting where the one before it ends.
///
/// `layout! { START; A: 4, B: 8 => END }` declares `A = START`,
/// `B = A + 4` and `END = B + 8`: each name is the offset of a field and the
/// number after it the field's length in bytes; the name after `=>` is the
/// offset just past the last field (the next field's, or the length of the
/// record). Each name may carry doc comments and a visibility. Every format
/// of the workspace spells its header and record layouts with it, under the
/// byte diagram at the top of its module.
#[doc(hidden)]
#[macro_export]
macro_rules! format_layout {
    ($start:expr; $($(#[$m:meta])* $vis:vis $name:ident : $len:expr),+ => $(#[$em:meta])* $evis:vis $end:ident) => {
        $crate::format_layout!(@at $start; $($(#[$m])* $vis $name: $len),+ => $(#[$em])* $evis $end);
    };
    (@at $at:expr; $(#[$m:meta])* $vis:vis $name:ident : $len:expr, $($rest:tt)+) => {
        $(#[$m])* $vis const $name: usize = $at;
        $crate::format_layout!(@at $name + $len; $($rest)+);
    };
    (@at $at:expr; $(#[$m:meta])* $vis:vis $name:ident : $len:expr => $(#[$em:meta])* $evis:vis $end:ident) => {
        $(#[$m])* $vis const $name: usize = $at;
        $(#[$em])* $evis const $end: usize = $name + $len;
    };
}
#[doc(inline)]
pub use format_layout as layout;

/// Declares an enum whose variants are written as numbers (a field of a
/// file or a message), with the function that reads one back and, when
/// every variant is given a name, `name()`.
///
/// ```
/// fanstore_core::format::coded_enum! {
///     /// A colour as stored.
///     #[derive(Debug, Clone, Copy, PartialEq, Eq)]
///     pub enum Colour: u8, from_u8 {
///         Red = 1 => "red",
///         Blue = 2 => "blue",
///     }
/// }
/// assert_eq!(Colour::from_u8(2), Some(Colour::Blue));
/// assert_eq!(Colour::from_u8(3), None);
/// assert_eq!((Colour::Red as u8, Colour::Red.name()), (1, "red"));
/// ```
///
/// The enum is `#[repr]` of the code's type, so `variant as u8` (or `u32`)
/// is its code; `from` returns `None` for a code no variant has.
#[doc(hidden)]
#[macro_export]
macro_rules! format_coded_enum {
    (
        $(#[$m:meta])*
        $vis:vis enum $name:ident: $repr:ident, $from:ident {
            $($(#[$vm:meta])* $variant:ident = $value:literal => $text:literal),+ $(,)?
        }
    ) => {
        $crate::format_coded_enum! {
            $(#[$m])*
            $vis enum $name: $repr, $from { $($(#[$vm])* $variant = $value),+ }
        }
        impl $name {
            /// The variant's name as reports print it.
            $vis fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }
    };
    (
        $(#[$m:meta])*
        $vis:vis enum $name:ident: $repr:ident, $from:ident {
            $($(#[$vm:meta])* $variant:ident = $value:literal),+ $(,)?
        }
    ) => {
        $(#[$m])*
        #[repr($repr)]
        $vis enum $name {
            $($(#[$vm])* $variant = $value,)+
        }
        impl $name {
            /// The variant whose code is `v`; `None` for a code no variant has.
            $vis fn $from(v: $repr) -> Option<$name> {
                match v {
                    $($value => Some($name::$variant),)+
                    _ => None,
                }
            }
        }
    };
}
#[doc(inline)]
pub use format_coded_enum as coded_enum;

/// One version of a format's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderVersion {
    pub version: u32,
    /// Bytes of the whole header, its checksum included.
    pub len: usize,
}

impl HeaderVersion {
    /// Where this header's checksum starts: it covers the bytes before it.
    pub const fn checksum_offset(&self) -> usize {
        self.len - CHECKSUM_LEN
    }
}

/// The frame of one file format: what it is called in errors, its magic,
/// and the header versions this build reads.
#[derive(Debug)]
pub struct FormatHeader {
    /// The format's name in errors: "not a FanStore {what}", "{what} header".
    pub what: &'static str,
    pub magic: [u8; MAGIC_LEN],
    /// Oldest first; the last is the version this build writes.
    pub versions: &'static [HeaderVersion],
}

impl FormatHeader {
    /// The version this build writes.
    pub const fn current(&self) -> HeaderVersion {
        self.versions[self.versions.len() - 1]
    }

    /// Writes the magic, the current version and the checksum into the
    /// first [`current`](Self::current)`().len` bytes of `bytes`, whose own
    /// fields are already set.
    pub fn seal(&self, bytes: &mut [u8]) {
        let current = self.current();
        bytes[MAGIC_OFFSET..MAGIC_OFFSET + MAGIC_LEN].copy_from_slice(&self.magic);
        put_u32(bytes, VERSION_OFFSET, current.version);
        put_checksum(bytes, current);
    }

    /// Checks the frame of `bytes`, the start of `file` (all of it when the
    /// file is shorter than a header), and returns the version found; the
    /// header's bytes are then `bytes[..version.len]`.
    pub fn check(&self, file: &Path, bytes: &[u8]) -> Result<HeaderVersion, FormatError> {
        let truncated = |needed: usize| FormatError::Truncated {
            file: file.into(),
            entry: format!("{} header", self.what),
            offset: 0,
            needed: needed as u64,
            len: bytes.len() as u64,
        };
        if bytes.len() >= MAGIC_OFFSET + MAGIC_LEN && bytes[MAGIC_OFFSET..MAGIC_OFFSET + MAGIC_LEN] != self.magic {
            return Err(FormatError::BadMagic { file: file.into(), what: self.what });
        }
        if bytes.len() < FIELDS_OFFSET {
            let shortest = self.versions.iter().map(|v| v.len).min().unwrap_or(FIELDS_OFFSET);
            return Err(truncated(shortest));
        }
        let found = u32_at(bytes, VERSION_OFFSET);
        let Some(&version) = self.versions.iter().find(|v| v.version == found) else {
            return Err(FormatError::UnsupportedVersion {
                file: file.into(),
                what: self.what,
                found,
                supported: self.current().version,
            });
        };
        if bytes.len() < version.len {
            return Err(truncated(version.len));
        }
        let sum_off = version.checksum_offset();
        let entry = || format!("{} header", self.what);
        FormatError::check_xxh3(file, entry, 0, &bytes[..sum_off], u64_at(bytes, sum_off))?;
        Ok(version)
    }
}

/// Writes the xxh3 of the header's first bytes into its checksum field.
fn put_checksum(bytes: &mut [u8], version: HeaderVersion) {
    let sum_off = version.checksum_offset();
    let sum = xxh3(&bytes[..sum_off]);
    put_u64(bytes, sum_off, sum);
}

/// Reads from `input` until `buf` is full or the input ends, and returns the
/// bytes read: a header is read this way so that a short file reaches
/// [`FormatHeader::check`] and is refused as truncated, not as an I/O error.
pub fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// [`read_full`] from `offset` of `file`, leaving its cursor alone (pread).
pub fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    read_full(&mut PositionalReader { file, offset }, buf)
}

/// Reads a file from an offset of its own, as `pread` does.
struct PositionalReader<'a> {
    file: &'a File,
    offset: u64,
}

impl Read for PositionalReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.offset)?;
        self.offset += n as u64;
        Ok(n)
    }
}

/// Helpers for the tests of every format, here and in `fanstore-ckpt`.
#[doc(hidden)]
pub mod testing {
    use super::*;
    use std::fmt::Display;

    /// Recomputes the checksum of the `header_len`-byte header at the start
    /// of `bytes`, after a test changed one of its fields on purpose, so that
    /// the reader gets past the checksum to the field. A file shorter than
    /// the header is left alone.
    pub fn reseal(bytes: &mut [u8], header_len: usize) {
        if bytes.len() >= header_len {
            put_checksum(bytes, HeaderVersion { version: 0, len: header_len });
        }
    }

    /// Recomputes the xxh3 of every section listed in the section table of
    /// `count` entries { offset u64, length u64, xxh3 u64 } at
    /// `table_offset` (the manifest's and the recipe's), skipping sections
    /// that do not lie within `bytes`. Call [`reseal`] after it.
    pub fn reseal_sections(bytes: &mut [u8], table_offset: usize, count: usize) {
        const ENTRY_LEN: usize = 24;
        if bytes.len() < table_offset + count * ENTRY_LEN {
            return;
        }
        for i in 0..count {
            let e = table_offset + i * ENTRY_LEN;
            let (off, len) = (u64_at(bytes, e) as usize, u64_at(bytes, e + 8) as usize);
            if off.checked_add(len).is_some_and(|end| end <= bytes.len()) {
                let sum = xxh3(&bytes[off..off + len]);
                put_u64(bytes, e + 16, sum);
            }
        }
    }

    /// `count` copies of `good` (not empty), each with 1 to `max_bytes`
    /// bytes set to other values and, one copy in eight, then cut short:
    /// the inputs of the tests that damaged bytes are refused and never
    /// panic the reader. The copies come from a fixed xorshift sequence,
    /// the same on every run. Reseal a framed file's copy before decoding
    /// it, to reach the fields behind the header checksum.
    pub fn mutated_copies(good: &[u8], count: usize, max_bytes: u64) -> impl Iterator<Item = Vec<u8>> + '_ {
        let mut x = 0x2545f4914f6cdd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..count).map(move |_| {
            let mut b = good.to_vec();
            for _ in 0..1 + next() % max_bytes {
                let i = (next() % b.len() as u64) as usize;
                b[i] = next() as u8;
            }
            if next() % 8 == 0 {
                b.truncate((next() % b.len() as u64) as usize);
            }
            b
        })
    }

    /// Damages each field of the frame of `good` (a valid file of format
    /// `header` at the current version, named `file_name`) one at a time and
    /// asserts that `decode` refuses it with the error that names the file,
    /// the format and the fault: every magic byte, a version byte, an
    /// unknown version (resealed), a byte of the own fields and of the
    /// checksum, and truncations.
    pub fn assert_header_faults_named<T, E: Display>(
        header: &FormatHeader,
        file_name: &str,
        good: &[u8],
        decode: impl Fn(&[u8]) -> Result<T, E>,
    ) {
        let current = header.current();
        let what = header.what;
        let refused = |bytes: &[u8], case: &str| match decode(bytes) {
            Ok(_) => panic!("{what}, {case}: accepted"),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(file_name), "{what}, {case}: the file is not named: {e}");
                e
            }
        };
        assert!(decode(good).is_ok(), "{what}: the good file is refused");
        for i in MAGIC_OFFSET..MAGIC_OFFSET + MAGIC_LEN {
            let mut b = good.to_vec();
            b[i] ^= 0x20;
            let e = refused(&b, &format!("magic byte {i}"));
            assert!(e.contains(&format!("not a FanStore {what} (bad magic at offset 0)")), "{what}: {e}");
        }
        let e = refused(b"NOTFANST", "a short file of another kind");
        assert!(e.contains(&format!("not a FanStore {what}")), "{what}: {e}");
        let mut b = good.to_vec();
        b[VERSION_OFFSET + 1] ^= 0x01;
        let e = refused(&b, "version byte");
        let found = current.version ^ 0x100;
        assert!(e.contains(&format!("unsupported {what} format version {found}")), "{what}: {e}");
        let unknown = header.versions.iter().map(|v| v.version).max().unwrap_or(0) + 1;
        let mut b = good.to_vec();
        put_u32(&mut b, VERSION_OFFSET, unknown);
        reseal(&mut b, current.len);
        let e = refused(&b, "unknown version, resealed");
        let expected = format!("unsupported {what} format version {unknown} (this build reads version {})", current.version);
        assert!(e.contains(&expected), "{what}: {e}");
        for (i, field) in [(FIELDS_OFFSET, "own field"), (current.checksum_offset() + 3, "checksum")] {
            let mut b = good.to_vec();
            b[i] ^= 0x04;
            let e = refused(&b, &format!("{field} byte {i}"));
            assert!(e.contains(&format!("checksum mismatch in {what} header at offset 0")), "{what}: {e}");
        }
        let shortest = header.versions.iter().map(|v| v.len).min().unwrap_or(FIELDS_OFFSET);
        for (len, needed) in [(current.len - 1, current.len), (FIELDS_OFFSET - 1, shortest), (0, shortest)] {
            let e = refused(&good[..len], &format!("truncated to {len} bytes"));
            let expected = format!("truncated: {what} header at offset 0 needs {needed} bytes, file has {len}");
            assert!(e.contains(&expected), "{what}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_VERSIONS: FormatHeader = FormatHeader {
        what: "sample",
        magic: *b"FANSTSA\0",
        versions: &[HeaderVersion { version: 1, len: 24 }, HeaderVersion { version: 2, len: 32 }],
    };

    fn sample(version: HeaderVersion) -> Vec<u8> {
        let mut b = vec![0xa5u8; version.len];
        b[..MAGIC_LEN].copy_from_slice(&TWO_VERSIONS.magic);
        put_u32(&mut b, VERSION_OFFSET, version.version);
        testing::reseal(&mut b, version.len);
        b
    }

    #[test]
    fn seal_writes_the_frame_that_check_accepts() {
        let mut b = vec![0x5au8; 40];
        TWO_VERSIONS.seal(&mut b);
        assert_eq!(&b[..8], b"FANSTSA\0");
        assert_eq!(u32_at(&b, VERSION_OFFSET), 2);
        assert_eq!(u64_at(&b, 24), xxh3(&b[..24]));
        assert_eq!(&b[32..], &[0x5a; 8], "past the header nothing is written");
        assert_eq!(TWO_VERSIONS.check(Path::new("f"), &b).unwrap(), TWO_VERSIONS.current());
    }

    #[test]
    fn every_version_read_is_checked_at_its_own_length() {
        let v1 = TWO_VERSIONS.versions[0];
        let b = sample(v1);
        assert_eq!(TWO_VERSIONS.check(Path::new("f"), &b).unwrap(), v1);
        let e = TWO_VERSIONS.check(Path::new("f"), &b[..20]).unwrap_err().to_string();
        assert_eq!(e, "f: truncated: sample header at offset 0 needs 24 bytes, file has 20");
    }

    #[test]
    fn every_frame_fault_is_named() {
        let good = sample(TWO_VERSIONS.current());
        testing::assert_header_faults_named(&TWO_VERSIONS, "dir/x.fss", &good, |b| {
            TWO_VERSIONS.check(Path::new("dir/x.fss"), b)
        });
        let e = TWO_VERSIONS.check(Path::new("f"), b"FANSTPT\0").unwrap_err();
        assert!(matches!(e, FormatError::BadMagic { what: "sample", .. }));
        assert_eq!(e.to_string(), "f: not a FanStore sample (bad magic at offset 0)");
    }

    #[test]
    fn read_full_reads_to_the_end_and_read_full_at_from_an_offset() {
        struct Trickle<'a>(&'a [u8], bool);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.1 = !self.1;
                if self.1 {
                    return Err(io::ErrorKind::Interrupted.into());
                }
                let n = buf.len().min(self.0.len()).min(3);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut buf = [0u8; 16];
        assert_eq!(read_full(&mut Trickle(b"0123456789", false), &mut buf).unwrap(), 10);
        assert_eq!(&buf[..10], b"0123456789");
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        let f = File::open(&p).unwrap();
        assert_eq!(read_full_at(&f, &mut buf, 4).unwrap(), 6);
        assert_eq!(&buf[..6], b"456789");
        assert_eq!(read_full_at(&f, &mut buf[..2], 1).unwrap(), 2);
        assert_eq!(&buf[..2], b"12");
    }
}
