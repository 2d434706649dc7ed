//! `fanstore ckpt ...`: asks every rank's checkpoint store (wire op CKPT)
//! and merges the answers.
//!
//! Each node keeps its own store (the writer's node holds a checkpoint), so
//! a query about one path is answered by the rank whose store has it, and
//! `ls`, `du` and `verify` add up every rank:
//!
//! ```text
//! fanstore ckpt ls [DIR] [--json]     checkpoints under DIR: size, new bytes, dedup ratio, parent
//! fanstore ckpt log PATH [--json]     the chain of ancestors, nearest first
//! fanstore ckpt owners PATH [--json]  per tensor: the checkpoint that first stored its bytes
//! fanstore ckpt diff A B [--json]     tensors added, removed, changed, unchanged
//! fanstore ckpt du [--json]           logical vs physical bytes, per rank and in all
//! fanstore ckpt verify [PATH] [--json]  recompute every unit hash and file checksum (exit 1 on damage)
//! fanstore ckpt match FILE|PATH [--json]  stored checkpoints ranked by the longest equal prefix of tensors
//! ```
//!
//! Paths may carry the mount prefix (`/fanstore/run/ck.pt`) or be relative
//! to it (`run/ck.pt`); reports show them relative to the mount. The query
//! travels as [`fanstore_core::wire::ckpt::Query`]; each daemon answers it
//! from its store (fanstore-daemon's `dedup` module).
//!
//! ```no_run
//! use fanstore_cli::ckpt_query::{self, Query};
//! let rt = fanstore_core::runtime::runtime_dir();
//! let report = ckpt_query::run(&rt, &Query::Du)?;
//! print!("{}", ckpt_query::du_table(&report.text)?);
//! # Ok::<(), fanstore_cli::ckpt_query::QueryError>(())
//! ```

use fanstore_ckpt::json::{self, Value};
use fanstore_ckpt::render;
use fanstore_core::client::{sealed_memfd, Client};
use fanstore_core::runtime::{self, NodeState, Status};
pub use fanstore_core::wire::ckpt::Query;
use fanstore_core::wire::{op, Request};
use std::io::Read;
use std::path::Path;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("no running daemon in {0}")]
    NoDaemon(String),
    #[error("rank {rank}: {problem}")]
    Rank { rank: u32, problem: String },
    #[error("no checkpoint store on any rank (the daemons run with --dedup off)")]
    NoStore,
    #[error("no checkpoint at '{0}' (not an output committed to a checkpoint store)")]
    NotFound(String),
    #[error("'{0}' and '{1}' are not checkpoints of the same node's store")]
    NotTogether(String, String),
    #[error("rank {rank} answered with a malformed report: {problem}")]
    Malformed { rank: u32, problem: String },
}

/// A merged report, and false when verify found damage.
pub struct Report {
    pub text: String,
    pub ok: bool,
}

/// One rank's answer: Ok(text, ok) or the errno.
type RankAnswer = (u32, Result<(String, bool), i32>);

/// The live daemons of the job in `rt`.
fn live_states(rt: &Path) -> Result<Vec<NodeState>, QueryError> {
    let states: Vec<NodeState> = runtime::list_states(rt).into_iter().filter(|s| s.status == Status::Ready).collect();
    if states.is_empty() {
        return Err(QueryError::NoDaemon(rt.display().to_string()));
    }
    Ok(states)
}

/// How long a rank may take to answer a query.
const QUERY_TIMEOUT: Duration = Duration::from_secs(120);

fn ask(rt: &Path, rank: u32, q: &Query) -> Result<RankAnswer, QueryError> {
    let fail = |problem: String| QueryError::Rank { rank, problem };
    let (arg0, arg1, payload) = q.encode();
    // A rank answers once the checkpoints closed before the query are stored
    // (their commits run behind the close): up to seconds per file queued.
    let mut c = Client::connect(&runtime::socket_path(rt, rank), QUERY_TIMEOUT).map_err(|e| fail(e.to_string()))?;
    let mut req = Request::new(op::CKPT, 1, arg0, arg1);
    req.payload = payload;
    let attach = match q.attachment() {
        Some(b) => Some(sealed_memfd("fanstore:query", b).map_err(|e| fail(e.to_string()))?),
        None => None,
    };
    use std::os::fd::AsRawFd;
    let (rep, fd) = c.call_with(&req, attach.as_ref().map(|f| f.as_raw_fd())).map_err(|e| fail(e.to_string()))?;
    if rep.errno != 0 {
        return Ok((rank, Err(rep.errno)));
    }
    let fd = fd.ok_or_else(|| fail("the report came without its fd".into()))?;
    let mut text = String::new();
    std::fs::File::from(fd).read_to_string(&mut text).map_err(|e| fail(format!("reading the report: {e}")))?;
    Ok((rank, Ok((text, rep.value == 0))))
}

fn ask_all(rt: &Path, q: &Query) -> Result<Vec<RankAnswer>, QueryError> {
    let states = live_states(rt)?;
    let mut out = Vec::with_capacity(states.len());
    for s in &states {
        out.push(ask(rt, s.rank, q)?);
    }
    if out.iter().all(|(_, a)| *a == Err(libc::ENOTSUP)) {
        return Err(QueryError::NoStore);
    }
    for (rank, a) in &out {
        if let Err(e) = a {
            if *e != libc::ENOENT && *e != libc::ENOTSUP {
                return Err(QueryError::Rank { rank: *rank, problem: std::io::Error::from_raw_os_error(*e).to_string() });
            }
        }
    }
    Ok(out)
}

fn parsed(rank: u32, text: &str) -> Result<Value<'_>, QueryError> {
    json::parse(text.as_bytes(), json::Limits::default()).map_err(|e| QueryError::Malformed { rank, problem: e.to_string() })
}

/// A JSON value as text (the reports' own syntax: numbers verbatim).
fn to_json(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => (*n).to_string(),
        Value::String(s) => render::json_str(s.as_bytes()),
        Value::Array(a) => render::array(a.iter().map(to_json)),
        Value::Object(members) => {
            let inner: Vec<String> = members.iter().map(|(k, v)| format!("{}:{}", render::json_str(k.as_bytes()), to_json(v))).collect();
            format!("{{{}}}", inner.join(","))
        }
    }
}

/// Runs `q` against the job in `rt` and merges the ranks' answers.
pub fn run(rt: &Path, q: &Query) -> Result<Report, QueryError> {
    match q {
        Query::Ls { json, .. } => ls(rt, q, *json),
        Query::Du => du(rt, q),
        Query::Match { .. } => match_all(rt, q),
        Query::Verify { path: None, json } => verify_all(rt, *json),
        Query::Log { path, .. } | Query::Owners { path, .. } | Query::Verify { path: Some(path), .. } => {
            one(rt, q).map_err(|e| match e {
                QueryError::NotFound(_) => QueryError::NotFound(String::from_utf8_lossy(path).into_owned()),
                e => e,
            })
        }
        Query::Diff { a, b, .. } => one(rt, q).map_err(|e| match e {
            QueryError::NotFound(_) => QueryError::NotTogether(String::from_utf8_lossy(a).into_owned(), String::from_utf8_lossy(b).into_owned()),
            e => e,
        }),
    }
}

/// A query about given checkpoints: the rank whose store has them answers.
fn one(rt: &Path, q: &Query) -> Result<Report, QueryError> {
    let found = ask_all(rt, q)?.into_iter().find_map(|(_, a)| a.ok());
    let (text, ok) = found.ok_or_else(|| QueryError::NotFound(String::new()))?;
    Ok(Report { text, ok })
}

fn ls(rt: &Path, q: &Query, as_json: bool) -> Result<Report, QueryError> {
    let Query::Ls { dir, .. } = q else { unreachable!("ls") };
    let json_q = Query::Ls { dir: dir.clone(), json: true };
    let mut rows = Vec::new();
    let mut ranks_with_rows = Vec::new();
    for (rank, a) in ask_all(rt, &json_q)? {
        let Ok((text, _)) = a else { continue };
        let v = parsed(rank, &text)?;
        let arr = v.as_array().ok_or_else(|| QueryError::Malformed { rank, problem: "ls is not an array".into() })?;
        if !arr.is_empty() {
            ranks_with_rows.push(rank);
        }
        rows.extend(arr.iter().map(to_json));
    }
    if as_json {
        return Ok(Report { text: format!("[{}]\n", rows.join(",")), ok: true });
    }
    let mut text = String::new();
    for &rank in &ranks_with_rows {
        if let (_, Ok((t, _))) = ask(rt, rank, q)? {
            if ranks_with_rows.len() > 1 {
                text.push_str(&format!("rank {rank}:\n"));
            }
            text.push_str(&t);
        }
    }
    if ranks_with_rows.is_empty() {
        text.push_str("no checkpoints\n");
    }
    Ok(Report { text, ok: true })
}

use fanstore_ckpt::query::DU_FIELDS;
/// Fields of a `du` report.
const NF: usize = DU_FIELDS.len();

fn du_report(n: &[u64; NF]) -> fanstore_ckpt::DuReport {
    fanstore_ckpt::DuReport::from_fields(n)
}

fn du(rt: &Path, q: &Query) -> Result<Report, QueryError> {
    let mut total = [0u64; NF];
    let mut per_rank = Vec::new();
    for (rank, a) in ask_all(rt, q)? {
        let Ok((text, _)) = a else { continue };
        let v = parsed(rank, &text)?;
        let mut n = [0u64; NF];
        for (i, f) in DU_FIELDS.iter().enumerate() {
            n[i] = v.get(f).and_then(Value::as_u64).ok_or_else(|| QueryError::Malformed { rank, problem: format!("du has no {f}") })?;
            total[i] += n[i];
        }
        per_rank.push((rank, n));
    }
    Ok(Report { text: du_text(&total, &per_rank), ok: true })
}

fn du_text(total: &[u64; NF], per_rank: &[(u32, [u64; NF])]) -> String {
    let t = du_report(total);
    let ranks: Vec<String> = per_rank
        .iter()
        .map(|(r, n)| {
            let j = du_report(n).to_json();
            format!("{{\"rank\":{r},{}", &j[1..])
        })
        .collect();
    let j = t.to_json();
    format!("{},\"ranks\":{}}}\n", &j[..j.len() - 1], render::array(ranks))
}

/// The table form of `du`: the whole job, then one row per rank.
pub fn du_table(json_text: &str) -> Result<String, QueryError> {
    let v = parsed(0, json_text)?;
    let nums = |o: &Value| -> [u64; NF] {
        let mut n = [0u64; NF];
        for (i, f) in DU_FIELDS.iter().enumerate() {
            n[i] = o.get(f).and_then(Value::as_u64).unwrap_or(0);
        }
        n
    };
    let mut out = du_report(&nums(&v)).to_table();
    if let Some(ranks) = v.get("ranks").and_then(Value::as_array).filter(|r| r.len() > 1) {
        let rows: Vec<Vec<String>> = ranks
            .iter()
            .map(|r| {
                let d = du_report(&nums(r));
                vec![
                    r.get("rank").and_then(Value::as_u64).unwrap_or(0).to_string(),
                    d.checkpoints.to_string(),
                    render::bytes(d.logical),
                    render::bytes(d.physical()),
                    render::ratio(d.logical, d.physical()),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&render::table(&["rank", "checkpoints", "logical", "physical", "dedup"], &rows, &[0, 1, 2, 3, 4]));
    }
    Ok(out)
}

/// The tensors of the stored checkpoint at `path` (from its owner map),
/// as `ckpt match` keys.
pub fn stored_keys(rt: &Path, path: &[u8]) -> Result<Vec<fanstore_ckpt::matching::TensorKey>, QueryError> {
    let rep = run(rt, &Query::Owners { path: path.to_vec(), json: true })?;
    let v = parsed(0, &rep.text)?;
    let bad = |problem: &str| QueryError::Malformed { rank: 0, problem: format!("owners: {problem}") };
    let mut keys = Vec::new();
    for t in v.get("tensors").and_then(Value::as_array).ok_or_else(|| bad("no tensors"))? {
        let name = t.get("name").and_then(Value::as_str).ok_or_else(|| bad("tensor without a name"))?;
        let shape = t.get("shape").and_then(Value::as_array).ok_or_else(|| bad("tensor without a shape"))?;
        let shape: Option<Vec<u64>> = shape.iter().map(Value::as_u64).collect();
        let hash = t.get("blake3").and_then(Value::as_str).and_then(fanstore_ckpt::unit::parse_hex);
        let len = t.get("bytes").and_then(Value::as_u64);
        let (Some(shape), Some(hash), Some(len)) = (shape, hash, len) else { return Err(bad("tensor fields")) };
        keys.push(fanstore_ckpt::matching::TensorKey { name: name.as_bytes().to_vec(), shape, hash, len });
    }
    Ok(keys)
}

/// `ckpt match`: every rank's rows, ranked together (JSON; the CLI makes
/// the table with [`match_table`]).
fn match_all(rt: &Path, q: &Query) -> Result<Report, QueryError> {
    let mut rows: Vec<((u64, u64, u64, u64), String)> = Vec::new();
    let mut query_tensors = 0;
    for (rank, a) in ask_all(rt, q)? {
        let Ok((text, _)) = a else { continue };
        let v = parsed(rank, &text)?;
        query_tensors = v.get("query_tensors").and_then(Value::as_u64).unwrap_or(0);
        for m in v.get("matches").and_then(Value::as_array).unwrap_or(&[]) {
            let n = |f: &str| m.get(f).and_then(Value::as_u64).unwrap_or(0);
            let key = (n("prefix"), n("shared"), n("shared_bytes"), n("id"));
            let j = to_json(m);
            rows.push((key, format!("{{\"rank\":{rank},{}", &j[1..])));
        }
    }
    rows.sort_by(|a, b| b.0.cmp(&a.0));
    let text = format!("{{\"query_tensors\":{query_tensors},\"matches\":[{}]}}\n", rows.into_iter().map(|r| r.1).collect::<Vec<_>>().join(","));
    Ok(Report { text, ok: true })
}

/// The table form of `ckpt match`.
pub fn match_table(json_text: &str) -> Result<String, QueryError> {
    let v = parsed(0, json_text)?;
    let q = v.get("query_tensors").and_then(Value::as_u64).unwrap_or(0);
    let ms = v.get("matches").and_then(Value::as_array).unwrap_or(&[]);
    if ms.is_empty() {
        return Ok(format!("no stored checkpoint shares any of the {q} tensors\n"));
    }
    let rows: Vec<Vec<String>> = ms
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let n = |f: &str| m.get(f).and_then(Value::as_u64).unwrap_or(0);
            vec![
                (i + 1).to_string(),
                n("rank").to_string(),
                m.get("path").and_then(Value::as_str).unwrap_or("").to_string(),
                format!("{}/{q}", n("prefix")),
                n("shared").to_string(),
                render::bytes(n("shared_bytes")),
                n("tensors").to_string(),
            ]
        })
        .collect();
    Ok(render::table(&["#", "rank", "checkpoint", "prefix", "shared", "shared bytes", "its tensors"], &rows, &[0, 1, 3, 4, 5, 6]))
}

fn verify_all(rt: &Path, as_json: bool) -> Result<Report, QueryError> {
    let answers = ask_all(rt, &Query::Verify { path: None, json: true })?;
    let mut ok = true;
    let mut sums = [0u64; 3];
    let mut problems = Vec::new();
    let mut tables = String::new();
    for (rank, a) in answers {
        let Ok((text, rank_ok)) = a else { continue };
        ok &= rank_ok;
        let v = parsed(rank, &text)?;
        for (i, f) in ["checkpoints", "units", "unit_bytes"].iter().enumerate() {
            sums[i] += v.get(f).and_then(Value::as_u64).unwrap_or(0);
        }
        if let Some(p) = v.get("problems").and_then(Value::as_array) {
            problems.extend(p.iter().map(to_json));
        }
        if !as_json {
            if let (_, Ok((t, _))) = ask(rt, rank, &Query::Verify { path: None, json: false })? {
                tables.push_str(&format!("rank {rank}: {t}"));
            }
        }
    }
    let text = if as_json {
        format!(
            "{{\"ok\":{ok},\"checkpoints\":{},\"units\":{},\"unit_bytes\":{},\"problems\":[{}]}}\n",
            sums[0],
            sums[1],
            sums[2],
            problems.join(",")
        )
    } else {
        tables
    };
    Ok(Report { text, ok })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn du_totals_and_ranks() {
        let f = |v: [u64; 8]| {
            let mut n = [0u64; NF];
            n[..8].copy_from_slice(&v);
            n
        };
        let text = du_text(&f([2, 0, 100, 3, 60, 90, 10, 5]), &[(0, f([1, 0, 50, 2, 40, 60, 5, 3])), (1, f([1, 0, 50, 1, 20, 30, 5, 2]))]);
        let v = json::parse(text.as_bytes(), json::Limits::default()).unwrap();
        assert_eq!(v.get("physical_bytes").and_then(Value::as_u64), Some(105));
        let ranks = v.get("ranks").and_then(Value::as_array).unwrap();
        assert_eq!(ranks[1].get("rank").and_then(Value::as_u64), Some(1));
        assert_eq!(ranks[1].get("physical_bytes").and_then(Value::as_u64), Some(37));
        let table = du_table(&text).unwrap();
        assert!(table.contains("physical") && table.contains("rank"), "{table}");
    }

    #[test]
    fn json_values_print_back() {
        let src = r#"{"a":[1,2.5,null,true],"b":"x\"y","c":{}}"#;
        let v = json::parse(src.as_bytes(), json::Limits::default()).unwrap();
        assert_eq!(to_json(&v), src);
    }
}
