//! Lineage and space queries, answered from the catalog and the owner maps
//! (never from unit data, except [`CheckpointStore::verify`]). Every report
//! renders as a text table (`to_table`) and as JSON (`to_json`).

use crate::codec::Encoding;
use crate::error::{CkptError, Result};
use crate::recipe::RecipePiece;
use crate::render::{self, array, Obj};
use crate::split::Format;
use crate::store::CheckpointStore;
use crate::unit::{self, Hash};
use fanstore_core::checksum::StreamingChecksum;
use std::collections::HashMap;

/// A checkpoint referred to by a report: id, path (current, or last if
/// deleted) and whether it is still live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CkptRef {
    pub id: u64,
    pub path: Vec<u8>,
    pub live: bool,
}

impl CkptRef {
    fn label(&self) -> String {
        if self.live {
            format!("#{} {}", self.id, render::text(&self.path))
        } else {
            format!("#{} {} (deleted)", self.id, render::text(&self.path))
        }
    }
    fn json(&self) -> String {
        Obj::new().num("id", self.id).str("path", &self.path).bool("live", self.live).end()
    }
}

fn opt_json(r: &Option<CkptRef>) -> String {
    r.as_ref().map_or_else(|| "null".to_string(), CkptRef::json)
}

impl CheckpointStore {
    fn ckpt_ref(&self, id: u64) -> Option<CkptRef> {
        self.entry(id).map(|e| CkptRef { id, path: e.path.clone(), live: e.live })
    }

    fn live_id(&self, path: &[u8]) -> Result<u64> {
        self.id_of(path).ok_or_else(|| CkptError::not_found(path))
    }

    /// Live checkpoints under `dir` (all of them for an empty dir or "/").
    pub fn ls(&self, dir: &[u8]) -> LsReport {
        let dir = trim_slashes(dir);
        let mut rows = Vec::new();
        for e in self.entries().iter().filter(|e| e.live) {
            let p = trim_slashes(&e.path);
            let under = dir.is_empty() || p == dir || (p.starts_with(dir) && p.get(dir.len()) == Some(&b'/'));
            if !under {
                continue;
            }
            rows.push(LsRow {
                ckpt: CkptRef { id: e.id, path: e.path.clone(), live: true },
                format: e.format,
                logical: e.logical,
                new_bytes: e.new_bytes,
                tensors: e.tensors,
                parent: if e.parent == 0 { None } else { self.ckpt_ref(e.parent) },
            });
        }
        rows.sort_by(|a, b| a.ckpt.path.cmp(&b.ckpt.path));
        LsReport { rows }
    }

    /// The chain of ancestors of the checkpoint at `path`, nearest first
    /// (through deleted checkpoints, whose catalog tombstones keep their parent).
    pub fn log(&self, path: &[u8]) -> Result<LogReport> {
        let id = self.live_id(path)?;
        let mut chain = Vec::new();
        let mut cur = self.entry(id).map_or(0, |e| e.parent);
        let mut prev = id;
        // Parents are always earlier (smaller ids), so the walk ends.
        while cur != 0 && cur < prev {
            let Some(e) = self.entry(cur) else { break };
            chain.push(LogRow {
                ckpt: CkptRef { id: cur, path: e.path.clone(), live: e.live },
                logical: e.logical,
                new_bytes: e.new_bytes,
            });
            prev = cur;
            cur = e.parent;
        }
        Ok(LogReport { ckpt: CkptRef { id, path: path.to_vec(), live: true }, chain })
    }

    /// Per tensor of the checkpoint at `path`: its owner (the checkpoint that
    /// first stored that exact content).
    pub fn owners(&self, path: &[u8]) -> Result<OwnersReport> {
        let id = self.live_id(path)?;
        let rows = self
            .tensors(id)
            .unwrap_or(&[])
            .iter()
            .map(|t| OwnerRow {
                name: t.name.clone(),
                dtype: t.dtype.clone(),
                shape: t.shape.clone(),
                len: t.len,
                hash: t.hash,
                owner: self.ckpt_ref(t.owner).unwrap_or(CkptRef { id: t.owner, path: Vec::new(), live: false }),
            })
            .collect();
        Ok(OwnersReport { ckpt: CkptRef { id, path: path.to_vec(), live: true }, rows })
    }

    /// Tensors added, removed, changed and unchanged from `a` to `b`, by name.
    pub fn diff(&self, a: &[u8], b: &[u8]) -> Result<DiffReport> {
        let (ia, ib) = (self.live_id(a)?, self.live_id(b)?);
        let ta = self.tensors(ia).unwrap_or(&[]);
        let tb = self.tensors(ib).unwrap_or(&[]);
        let mut in_a: HashMap<&[u8], (Hash, u64)> = HashMap::new();
        for t in ta {
            in_a.entry(&t.name).or_insert((t.hash, t.len));
        }
        let mut rows = Vec::new();
        let mut seen_b = std::collections::HashSet::new();
        for t in tb {
            if !seen_b.insert(&t.name[..]) {
                continue;
            }
            let (status, a_len) = match in_a.get(&t.name[..]) {
                None => (DiffStatus::Added, None),
                Some(&(h, l)) if h == t.hash => (DiffStatus::Unchanged, Some(l)),
                Some(&(_, l)) => (DiffStatus::Changed, Some(l)),
            };
            rows.push(DiffRow { name: t.name.clone(), status, a_len, b_len: Some(t.len) });
        }
        let mut seen_a = std::collections::HashSet::new();
        for t in ta {
            if seen_a.insert(&t.name[..]) && !seen_b.contains(&t.name[..]) {
                rows.push(DiffRow { name: t.name.clone(), status: DiffStatus::Removed, a_len: Some(t.len), b_len: None });
            }
        }
        Ok(DiffReport {
            a: CkptRef { id: ia, path: a.to_vec(), live: true },
            b: CkptRef { id: ib, path: b.to_vec(), live: true },
            rows,
        })
    }

    /// Logical bytes of the live checkpoints against the bytes the store
    /// occupies (every file in its directory), and where the saving comes
    /// from: deduplication, deltas, compression.
    pub fn du(&self) -> DuReport {
        let live: Vec<_> = self.entries().iter().filter(|e| e.live).collect();
        let mut d = DuReport {
            checkpoints: live.len() as u64,
            deleted: (self.entries().len() - live.len()) as u64,
            logical: live.iter().map(|e| e.logical).sum(),
            units: self.units.len() as u64,
            recipes: live.iter().map(|e| e.recipe_len).sum(),
            catalog: self.catalog_len,
            glue: self.live.values().map(|l| l.glue_len).sum(),
            hot: self.hot.iter().filter(|h| !h.in_store).map(|h| (*h.bytes).as_ref().len() as u64).sum(),
            ..DuReport::default()
        };
        (d.packs, d.pack_dead) = self.packs().usage();
        for u in self.units.values() {
            // A unit whose header was never read counts as a raw file.
            // An external unit: its record, and its payload in an extent.
            let file = match (u.file_len, u.encoding) {
                (0, _) => u.len + unit::HEADER_LEN as u64,
                (n, Encoding::External) => n + u.len,
                (n, _) => n,
            };
            d.unit_payload += u.len;
            d.unit_files += file;
            if u.refs > 0 {
                d.referenced += u.len;
            }
            match u.encoding {
                Encoding::Delta => {
                    d.delta_payload += u.len;
                    d.delta_files += file;
                }
                Encoding::Grouped => {
                    d.grouped_payload += u.len;
                    d.grouped_files += file;
                }
                Encoding::Raw | Encoding::External => {}
            }
        }
        d
    }

    /// Recomputes every unit's blake3 and xxh3 and every checkpoint's
    /// whole-file checksum (all live checkpoints, or the one at `path`).
    /// Problems name the checkpoints and tensors they affect.
    pub fn verify(&self, path: Option<&[u8]>) -> Result<VerifyReport> {
        let ids: Vec<u64> = match path {
            Some(p) => vec![self.live_id(p)?],
            None => self.live.keys().copied().collect(),
        };
        let mut report = VerifyReport::default();
        let mut unit_ok: HashMap<Hash, Option<String>> = HashMap::new();
        for id in ids {
            let ck = self.ckpt_ref(id).unwrap_or(CkptRef { id, path: Vec::new(), live: true });
            report.checkpoints += 1;
            let r = match self.load_recipe(id, true) {
                Ok(r) => r,
                Err(e) => {
                    report.problems.push(VerifyProblem { ckpt: ck, tensor: None, unit: None, problem: e.to_string() });
                    continue;
                }
            };
            let mut sum = StreamingChecksum::new();
            let mut whole = true;
            for p in &r.pieces {
                match *p {
                    RecipePiece::Glue { off, len } => sum.update(&r.glue[off as usize..(off + len) as usize]),
                    RecipePiece::Unit { index } => {
                        let t = &r.tensors[index as usize];
                        let first = !unit_ok.contains_key(&t.hash);
                        if unit_ok.get(&t.hash).is_some_and(|e| e.is_some()) {
                            whole = false;
                        } else {
                            // blake3 once per unit; the stream is needed per checkpoint.
                            match self.unit_bytes(&t.hash, t.len, first) {
                                Ok(u) => {
                                    sum.update(&u);
                                    if first {
                                        report.units += 1;
                                        report.unit_bytes += t.len;
                                        unit_ok.insert(t.hash, None);
                                    }
                                }
                                Err(e) => {
                                    unit_ok.insert(t.hash, Some(e.to_string()));
                                    whole = false;
                                }
                            }
                        }
                        if let Some(Some(e)) = unit_ok.get(&t.hash) {
                            report.problems.push(VerifyProblem {
                                ckpt: ck.clone(),
                                tensor: Some(t.name.clone()),
                                unit: Some(t.hash),
                                problem: e.clone(),
                            });
                        }
                    }
                }
            }
            if whole && sum.digest() != r.file_xxh3 {
                report.problems.push(VerifyProblem {
                    ckpt: ck,
                    tensor: None,
                    unit: None,
                    problem: CkptError::FileChecksum {
                        path: render::text(&self.entry(id).map_or(Vec::new(), |e| e.path.clone())),
                        stored: r.file_xxh3,
                        computed: sum.digest(),
                    }
                    .to_string(),
                });
            }
        }
        Ok(report)
    }
}

fn trim_slashes(p: &[u8]) -> &[u8] {
    let mut p = p;
    while let [b'/', rest @ ..] = p {
        p = rest;
    }
    while let [rest @ .., b'/'] = p {
        p = rest;
    }
    p
}

/// One row of [`LsReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LsRow {
    pub ckpt: CkptRef,
    pub format: Format,
    pub logical: u64,
    /// Bytes this checkpoint added to the store when committed.
    pub new_bytes: u64,
    pub tensors: u64,
    pub parent: Option<CkptRef>,
}

/// `fanstore ckpt ls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LsReport {
    pub rows: Vec<LsRow>,
}

impl LsReport {
    pub fn to_table(&self) -> String {
        let head = ["id", "path", "format", "units", "logical", "stored new", "dedup", "parent"];
        let row = |r: &LsRow| {
            vec![
                r.ckpt.id.to_string(),
                render::text(&r.ckpt.path),
                r.format.name().into(),
                r.tensors.to_string(),
                render::bytes(r.logical),
                render::bytes(r.new_bytes),
                render::ratio(r.logical, r.new_bytes),
                r.parent.as_ref().map_or_else(|| "-".into(), CkptRef::label),
            ]
        };
        render::table_of(&head, &self.rows, row, &[0, 3, 4, 5, 6])
    }
    pub fn to_json(&self) -> String {
        array(self.rows.iter().map(|r| {
            Obj::new()
                .num("id", r.ckpt.id)
                .str("path", &r.ckpt.path)
                .str("format", r.format.name().as_bytes())
                .num("units", r.tensors)
                .num("logical_bytes", r.logical)
                .num("stored_new_bytes", r.new_bytes)
                .float("dedup_ratio", if r.new_bytes == 0 { f64::INFINITY } else { r.logical as f64 / r.new_bytes as f64 })
                .raw("parent", &opt_json(&r.parent))
                .end()
        }))
    }
}

/// One ancestor in a [`LogReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRow {
    pub ckpt: CkptRef,
    pub logical: u64,
    pub new_bytes: u64,
}

/// `fanstore ckpt log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogReport {
    pub ckpt: CkptRef,
    /// Parent first, then its parent, ...
    pub chain: Vec<LogRow>,
}

impl LogReport {
    /// Ancestor ids, nearest first.
    pub fn ids(&self) -> Vec<u64> {
        self.chain.iter().map(|r| r.ckpt.id).collect()
    }
    pub fn to_table(&self) -> String {
        let mut rows = vec![vec!["0".into(), self.ckpt.label(), String::new(), String::new()]];
        for (i, r) in self.chain.iter().enumerate() {
            rows.push(vec![(i + 1).to_string(), r.ckpt.label(), render::bytes(r.logical), render::bytes(r.new_bytes)]);
        }
        render::table(&["depth", "checkpoint", "logical", "stored new"], &rows, &[0, 2, 3])
    }
    pub fn to_json(&self) -> String {
        rows_json(
            &self.ckpt,
            "ancestors",
            self.chain.iter().map(|r| {
                Obj::new()
                    .num("id", r.ckpt.id)
                    .str("path", &r.ckpt.path)
                    .bool("live", r.ckpt.live)
                    .num("logical_bytes", r.logical)
                    .num("stored_new_bytes", r.new_bytes)
                    .end()
            }),
        )
    }
}

/// One tensor of an [`OwnersReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRow {
    pub name: Vec<u8>,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub len: u64,
    pub hash: Hash,
    pub owner: CkptRef,
}

/// `fanstore ckpt owners`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnersReport {
    pub ckpt: CkptRef,
    pub rows: Vec<OwnerRow>,
}

/// The JSON of a report of rows about one checkpoint:
/// `{"checkpoint": {..}, "<key>": [rows]}`.
fn rows_json(ckpt: &CkptRef, key: &str, rows: impl Iterator<Item = String>) -> String {
    Obj::new().raw("checkpoint", &ckpt.json()).raw(key, &array(rows)).end()
}

fn shape_text(s: &[u64]) -> String {
    format!("[{}]", s.iter().map(u64::to_string).collect::<Vec<_>>().join(","))
}

impl OwnersReport {
    pub fn to_table(&self) -> String {
        let row = |r: &OwnerRow| {
            vec![
                render::text(&r.name),
                r.dtype.clone(),
                shape_text(&r.shape),
                render::bytes(r.len),
                unit::hex(&r.hash)[..12].to_string(),
                r.owner.label(),
            ]
        };
        render::table_of(&["tensor", "dtype", "shape", "size", "unit", "owner"], &self.rows, row, &[3])
    }
    pub fn to_json(&self) -> String {
        rows_json(
            &self.ckpt,
            "tensors",
            self.rows.iter().map(|r| {
                Obj::new()
                    .str("name", &r.name)
                    .str("dtype", r.dtype.as_bytes())
                    .raw("shape", &array(r.shape.iter().map(u64::to_string)))
                    .num("bytes", r.len)
                    .str("blake3", unit::hex(&r.hash).as_bytes())
                    .raw("owner", &r.owner.json())
                    .end()
            }),
        )
    }
}

/// How a tensor differs between two checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiffStatus {
    Added,
    Removed,
    Changed,
    Unchanged,
}

impl DiffStatus {
    pub fn name(self) -> &'static str {
        match self {
            DiffStatus::Added => "added",
            DiffStatus::Removed => "removed",
            DiffStatus::Changed => "changed",
            DiffStatus::Unchanged => "unchanged",
        }
    }
}

/// One tensor of a [`DiffReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffRow {
    pub name: Vec<u8>,
    pub status: DiffStatus,
    pub a_len: Option<u64>,
    pub b_len: Option<u64>,
}

/// `fanstore ckpt diff A B`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffReport {
    pub a: CkptRef,
    pub b: CkptRef,
    /// Tensors of B in B's order, then tensors only in A.
    pub rows: Vec<DiffRow>,
}

impl DiffReport {
    /// (tensor count, bytes) with `status`: bytes in B, or in A for removed ones.
    pub fn total(&self, status: DiffStatus) -> (usize, u64) {
        self.rows
            .iter()
            .filter(|r| r.status == status)
            .fold((0, 0), |(n, b), r| (n + 1, b + r.b_len.or(r.a_len).unwrap_or(0)))
    }
    pub fn names(&self, status: DiffStatus) -> Vec<&[u8]> {
        self.rows.iter().filter(|r| r.status == status).map(|r| &r.name[..]).collect()
    }
    pub fn to_table(&self) -> String {
        let mut out = format!("{} -> {}\n", self.a.label(), self.b.label());
        let rows: Vec<Vec<String>> = [DiffStatus::Added, DiffStatus::Removed, DiffStatus::Changed, DiffStatus::Unchanged]
            .iter()
            .map(|&s| {
                let (n, b) = self.total(s);
                vec![s.name().into(), n.to_string(), render::bytes(b)]
            })
            .collect();
        out.push_str(&render::table(&["status", "tensors", "bytes"], &rows, &[1, 2]));
        let changed: Vec<Vec<String>> = self
            .rows
            .iter()
            .filter(|r| r.status != DiffStatus::Unchanged)
            .map(|r| {
                vec![
                    r.status.name().into(),
                    render::text(&r.name),
                    r.a_len.map_or_else(|| "-".into(), render::bytes),
                    r.b_len.map_or_else(|| "-".into(), render::bytes),
                ]
            })
            .collect();
        if !changed.is_empty() {
            out.push('\n');
            out.push_str(&render::table(&["status", "tensor", "bytes in A", "bytes in B"], &changed, &[2, 3]));
        }
        out
    }
    pub fn to_json(&self) -> String {
        let mut totals = Obj::new();
        for s in [DiffStatus::Added, DiffStatus::Removed, DiffStatus::Changed, DiffStatus::Unchanged] {
            let (n, b) = self.total(s);
            totals = totals.raw(s.name(), &Obj::new().num("tensors", n).num("bytes", b).end());
        }
        let num = |v: Option<u64>| v.map_or_else(|| "null".to_string(), |v| v.to_string());
        Obj::new()
            .raw("a", &self.a.json())
            .raw("b", &self.b.json())
            .raw("totals", &totals.end())
            .raw(
                "tensors",
                &array(self.rows.iter().map(|r| {
                    Obj::new()
                        .str("name", &r.name)
                        .str("status", r.status.name().as_bytes())
                        .raw("bytes_a", &num(r.a_len))
                        .raw("bytes_b", &num(r.b_len))
                        .end()
                })),
            )
            .end()
    }
}

/// `fanstore ckpt du`: logical against physical bytes, and the saving
/// split by where it comes from. With D = deduplication (logical bytes no
/// stored unit or glue byte accounts for twice), T = deltas and C =
/// compression (payload minus file bytes of the delta and of the grouped
/// units): physical = logical - D - T - C + overhead (unit headers, dead pack bytes,
/// recipes' metadata, the catalog, and bases kept only for deltas).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DuReport {
    pub checkpoints: u64,
    /// Tombstones kept for lineage.
    pub deleted: u64,
    /// Bytes of every live checkpoint as a plain file.
    pub logical: u64,
    pub units: u64,
    /// Decoded bytes of every stored unit (bases kept for deltas included).
    pub unit_payload: u64,
    /// Units as stored: their records in packs or unit files (headers and encoded bodies).
    pub unit_files: u64,
    /// Recipe files (owner maps and glue).
    pub recipes: u64,
    pub catalog: u64,
    /// Glue bytes of the live recipes.
    pub glue: u64,
    /// Decoded bytes of the units live recipes refer to (each once).
    pub referenced: u64,
    pub delta_payload: u64,
    pub delta_files: u64,
    pub grouped_payload: u64,
    pub grouped_files: u64,
    /// Bytes of the hot copies (committed files kept whole to serve reads)
    /// that live outside the store directory, in the caller's files (a
    /// file the store adopted as an extent is not counted again).
    pub hot: u64,
    /// Pack files and extent files.
    pub packs: u64,
    /// Bytes of pack files that hold no live unit: pack headers, records of
    /// freed units (until their pack is compacted), and of failed commits;
    /// and bytes of extent files no live unit lies in (a checkpoint's
    /// header, tensors it shares with other checkpoints, freed units).
    pub pack_dead: u64,
}

/// The numeric fields of a [`DuReport`] as its JSON names them, in order
/// (the CLI adds the ranks' reports up field by field).
pub const DU_FIELDS: [&str; 17] = [
    "checkpoints",
    "deleted",
    "logical_bytes",
    "units",
    "unit_payload_bytes",
    "unit_file_bytes",
    "recipe_bytes",
    "catalog_bytes",
    "glue_bytes",
    "referenced_unit_bytes",
    "delta_payload_bytes",
    "delta_file_bytes",
    "grouped_payload_bytes",
    "grouped_file_bytes",
    "hot_copy_bytes",
    "packs",
    "pack_dead_bytes",
];

fn ratio_or_inf(a: u64, b: u64) -> f64 {
    if b == 0 {
        f64::INFINITY
    } else {
        a as f64 / b as f64
    }
}

impl DuReport {
    /// Every byte of every file in the store directory.
    pub fn physical(&self) -> u64 {
        self.unit_files + self.pack_dead + self.recipes + self.catalog
    }
    /// Bytes saved by storing each unit and glue byte once.
    pub fn saved_by_dedup(&self) -> u64 {
        self.logical.saturating_sub(self.referenced + self.glue)
    }
    /// Bytes saved by storing changed tensors as deltas.
    pub fn saved_by_delta(&self) -> u64 {
        self.delta_payload.saturating_sub(self.delta_files)
    }
    /// Bytes saved by byte-grouped compression of full units.
    pub fn saved_by_compression(&self) -> u64 {
        self.grouped_payload.saturating_sub(self.grouped_files)
    }
    /// What the store costs beyond the payload bytes it must keep.
    pub fn overhead(&self) -> i128 {
        self.physical() as i128 + (self.saved_by_dedup() + self.saved_by_delta() + self.saved_by_compression()) as i128
            - self.logical as i128
    }
    /// The fields in [`DU_FIELDS`] order.
    pub fn fields(&self) -> [u64; 17] {
        [
            self.checkpoints,
            self.deleted,
            self.logical,
            self.units,
            self.unit_payload,
            self.unit_files,
            self.recipes,
            self.catalog,
            self.glue,
            self.referenced,
            self.delta_payload,
            self.delta_files,
            self.grouped_payload,
            self.grouped_files,
            self.hot,
            self.packs,
            self.pack_dead,
        ]
    }
    pub fn from_fields(n: &[u64; 17]) -> DuReport {
        DuReport {
            checkpoints: n[0],
            deleted: n[1],
            logical: n[2],
            units: n[3],
            unit_payload: n[4],
            unit_files: n[5],
            recipes: n[6],
            catalog: n[7],
            glue: n[8],
            referenced: n[9],
            delta_payload: n[10],
            delta_files: n[11],
            grouped_payload: n[12],
            grouped_files: n[13],
            hot: n[14],
            packs: n[15],
            pack_dead: n[16],
        }
    }
    pub fn to_table(&self) -> String {
        let pct = |b: u64| if self.logical == 0 { "-".to_string() } else { format!("{:.1}%", 100.0 * b as f64 / self.logical as f64) };
        let rows = vec![
            vec!["live checkpoints".into(), self.checkpoints.to_string(), String::new()],
            vec!["deleted (tombstones)".into(), self.deleted.to_string(), String::new()],
            vec!["logical".into(), format!("{} ({} B)", render::bytes(self.logical), self.logical), "100%".into()],
            vec!["saved by dedup".into(), render::bytes(self.saved_by_dedup()), pct(self.saved_by_dedup())],
            vec!["saved by deltas".into(), render::bytes(self.saved_by_delta()), pct(self.saved_by_delta())],
            vec!["saved by compression".into(), render::bytes(self.saved_by_compression()), pct(self.saved_by_compression())],
            vec!["units".into(), self.units.to_string(), String::new()],
            vec!["unit payload".into(), render::bytes(self.unit_payload), String::new()],
            vec!["unit records".into(), render::bytes(self.unit_files), String::new()],
            vec!["packs and extents, dead bytes".into(), format!("{}, {}", self.packs, render::bytes(self.pack_dead)), String::new()],
            vec!["recipes".into(), render::bytes(self.recipes), String::new()],
            vec!["catalog".into(), render::bytes(self.catalog), String::new()],
            vec!["physical (stored)".into(), format!("{} ({} B)", render::bytes(self.physical()), self.physical()), pct(self.physical())],
            vec!["dedup ratio".into(), render::ratio(self.logical, self.physical()), String::new()],
            vec!["hot copies (outside)".into(), render::bytes(self.hot), String::new()],
        ];
        render::table(&["", "", "% of logical"], &rows, &[])
    }
    pub fn to_json(&self) -> String {
        let mut o = Obj::new();
        for (name, v) in DU_FIELDS.iter().zip(self.fields()) {
            o = o.num(name, v);
        }
        o.num("physical_bytes", self.physical())
            .num("saved_by_dedup_bytes", self.saved_by_dedup())
            .num("saved_by_delta_bytes", self.saved_by_delta())
            .num("saved_by_compression_bytes", self.saved_by_compression())
            .float("dedup_ratio", ratio_or_inf(self.logical, self.physical()))
            .end()
    }
}

/// One fault found by [`CheckpointStore::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyProblem {
    pub ckpt: CkptRef,
    /// The tensor whose unit is damaged (None: the recipe or the whole file).
    pub tensor: Option<Vec<u8>>,
    pub unit: Option<Hash>,
    pub problem: String,
}

/// `fanstore ckpt verify`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VerifyReport {
    pub checkpoints: u64,
    /// Distinct units whose blake3 and xxh3 were recomputed and matched.
    pub units: u64,
    pub unit_bytes: u64,
    pub problems: Vec<VerifyProblem>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
    /// Ids of the checkpoints with a problem, ascending, once each.
    pub fn affected(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.problems.iter().map(|p| p.ckpt.id).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
    pub fn to_table(&self) -> String {
        let mut out = format!(
            "verified {} checkpoints, {} units ({}): {}\n",
            self.checkpoints,
            self.units,
            render::bytes(self.unit_bytes),
            if self.ok() { "OK".to_string() } else { format!("{} problems", self.problems.len()) }
        );
        if !self.ok() {
            let row = |p: &VerifyProblem| {
                vec![p.ckpt.label(), p.tensor.as_deref().map_or_else(|| "-".into(), render::text), p.problem.clone()]
            };
            out.push_str(&render::table_of(&["checkpoint", "tensor", "problem"], &self.problems, row, &[]));
        }
        out
    }
    pub fn to_json(&self) -> String {
        Obj::new()
            .bool("ok", self.ok())
            .num("checkpoints", self.checkpoints)
            .num("units", self.units)
            .num("unit_bytes", self.unit_bytes)
            .raw(
                "problems",
                &array(self.problems.iter().map(|p| {
                    let o = Obj::new().raw("checkpoint", &p.ckpt.json());
                    let o = match &p.tensor {
                        Some(t) => o.str("tensor", t),
                        None => o.null("tensor"),
                    };
                    let o = match &p.unit {
                        Some(h) => o.str("unit", unit::hex(h).as_bytes()),
                        None => o.null("unit"),
                    };
                    o.str("problem", p.problem.as_bytes()).end()
                })),
            )
            .end()
    }
}
