//! `fanstore watch PATH... [--recursive] [--json] [--events LIST]`: one
//! line (or JSON object) per namespace event of the outputs under PATH, as
//! the node's daemon delivers them (its `watch` module; the events are
//! [`crate::watchev`]), until interrupted or until the daemons stop.
//!
//! ```no_run
//! use fanstore_core::watch_client::{render, Watcher};
//! let mut w = Watcher::open(&fanstore_core::runtime::runtime_dir(), &["/fanstore/ckpt".into()], true)?;
//! while let Some(ev) = w.next_event()? {
//!     match ev {
//!         Some(ev) => println!("{}", render(&ev, &w.mount, false)),
//!         None => println!("overflow: events were dropped"),
//!     }
//! }
//! # Ok::<(), fanstore_core::watch_client::WatchError>(())
//! ```

use crate::client::{relative_to_mount, Client};
use crate::runtime::{self, NodeState, Status};
use crate::watchev::{Kind, NsEvent, IN_ALL_EVENTS, WATCH_RECURSIVE};
use crate::wire::{self, op, Reply, Request};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("no running daemon in {0}")]
    NoDaemon(String),
    #[error("FANSTORE_NODE={0}: no such running rank")]
    NoNode(u32),
    #[error("connecting to rank {0}: {1}")]
    Connect(u32, std::io::Error),
    #[error("{0}: {1}")]
    Watch(String, std::io::Error),
    #[error("unknown event '{0}' (expected close, rename, delete, mkdir, rmdir)")]
    Event(String),
    #[error("reading events: {0}")]
    Read(std::io::Error),
}

/// Event kinds by their names in `--events` and in the output.
pub fn parse_events(list: &[String]) -> Result<Vec<Kind>, WatchError> {
    let all = [Kind::Close, Kind::Rename, Kind::Delete, Kind::Mkdir, Kind::Rmdir];
    if list.is_empty() {
        return Ok(all.to_vec());
    }
    list.iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
        .map(|s| all.iter().copied().find(|k| k.name() == s.trim()).ok_or_else(|| WatchError::Event(s.to_string())))
        .collect()
}

fn abs(mount: &str, rel: &[u8]) -> String {
    let rel = String::from_utf8_lossy(rel);
    if rel.is_empty() {
        mount.to_string()
    } else {
        format!("{}/{rel}", mount.trim_end_matches('/'))
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// One output line for `ev` (no newline).
pub fn render(ev: &NsEvent, mount: &str, json: bool) -> String {
    let time = ev.time_ns as f64 / 1e9;
    let (path, from) = match ev.kind {
        Kind::Rename => (abs(mount, &ev.to), Some(abs(mount, &ev.path))),
        _ => (abs(mount, &ev.path), None),
    };
    if json {
        let mut s = format!(
            "{{\"event\":\"{}\",\"path\":{},\"node\":{},\"size\":{},\"time\":{time:.6},\"dir\":{},\"seq\":{}",
            ev.kind.name(),
            json_str(&path),
            ev.node,
            ev.size,
            ev.is_dir,
            ev.seq
        );
        if let Some(f) = &from {
            s.push_str(&format!(",\"from\":{},\"cookie\":{}", json_str(f), ev.cookie));
        }
        if ev.replaced {
            s.push_str(",\"replaced\":true");
        }
        s.push('}');
        s
    } else {
        let what = match &from {
            Some(f) => format!("{f} -> {path}"),
            None => path,
        };
        let kind = if ev.is_dir && ev.kind == Kind::Rename { "rename-dir" } else { ev.kind.name() };
        format!("{time:.6} node={} {kind} {what} size={}", ev.node, ev.size)
    }
}

/// The rank this command talks to: FANSTORE_NODE, else the lowest-rank
/// running daemon of this host, else the lowest running rank.
fn pick(rt: &Path) -> Result<NodeState, WatchError> {
    let states: Vec<NodeState> = runtime::list_states(rt).into_iter().filter(|s| s.status == Status::Ready).collect();
    if let Some(k) = std::env::var("FANSTORE_NODE").ok().and_then(|v| v.trim().parse::<u32>().ok()) {
        return states.into_iter().find(|s| s.rank == k).ok_or(WatchError::NoNode(k));
    }
    let host = runtime::hostname();
    let mut mine: Vec<NodeState> = states.iter().filter(|s| s.hostname == host).cloned().collect();
    if mine.is_empty() {
        mine = states;
    }
    mine.sort_by_key(|s| s.rank);
    mine.into_iter().next().ok_or_else(|| WatchError::NoDaemon(rt.display().to_string()))
}

/// A watcher connection with its watches registered.
pub struct Watcher {
    fd: OwnedFd,
    pub mount: String,
    /// The rank delivering the events.
    pub rank: u32,
    buf: Vec<u8>,
}

impl Watcher {
    /// Registers a watch on each of `paths` (absolute under the mount, or
    /// relative to it) with the node's daemon.
    pub fn open(rt: &Path, paths: &[String], recursive: bool) -> Result<Watcher, WatchError> {
        let st = pick(rt)?;
        let mount = String::from_utf8_lossy(&st.mount).into_owned();
        let mut c = Client::connect(&runtime::socket_path(rt, st.rank), Duration::from_secs(30)).map_err(|e| WatchError::Connect(st.rank, e))?;
        for (i, p) in paths.iter().enumerate() {
            let mut req = Request::new(op::WATCH_ADD, i as u64 + 1, i as u64 + 1, u64::from(IN_ALL_EVENTS) | if recursive { WATCH_RECURSIVE } else { 0 });
            req.payload = relative_to_mount(p, &mount);
            let (rep, _) = c.call(&req).map_err(|e| WatchError::Watch(p.clone(), e))?;
            if rep.errno != 0 {
                return Err(WatchError::Watch(p.clone(), std::io::Error::from_raw_os_error(rep.errno)));
            }
        }
        let fd = c.into_fd();
        let tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
        // SAFETY: tv is a valid timeval of the size given; zero: no timeout (block).
        unsafe {
            libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&tv as *const libc::timeval).cast(), std::mem::size_of_val(&tv) as libc::socklen_t)
        };
        Ok(Watcher { fd, mount, rank: st.rank, buf: vec![0u8; wire::MAX_MESSAGE] })
    }

    /// The next event (blocking). Ok(None): the daemon went away (stopped);
    /// Ok(Some(None)): the daemon dropped events (the reader fell behind).
    pub fn next_event(&mut self) -> Result<Option<Option<NsEvent>>, WatchError> {
        loop {
            let (n, _) = wire::recv_msg(self.fd.as_raw_fd(), &mut self.buf).map_err(WatchError::Read)?;
            if n == 0 {
                return Ok(None);
            }
            let rep = Reply::decode(&self.buf[..n]).map_err(|e| WatchError::Read(std::io::Error::other(e)))?;
            if rep.op != op::WATCH_EVENT {
                continue;
            }
            if rep.value == 1 {
                return Ok(Some(None));
            }
            if let Some(ev) = NsEvent::decode(&rep.payload) {
                return Ok(Some(Some(ev)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_json() {
        let ev = NsEvent {
            kind: Kind::Rename,
            is_dir: false,
            replaced: true,
            node: 3,
            cookie: 7,
            size: 10,
            time_ns: 1_500_000_000,
            seq: 4,
            holder: 3,
            id: 1,
            sum: 2,
            path: b"ck/a\"b.tmp".to_vec(),
            to: b"ck/a".to_vec(),
        };
        assert_eq!(render(&ev, "/fanstore", false), "1.500000 node=3 rename /fanstore/ck/a\"b.tmp -> /fanstore/ck/a size=10");
        assert_eq!(
            render(&ev, "/fanstore", true),
            "{\"event\":\"rename\",\"path\":\"/fanstore/ck/a\",\"node\":3,\"size\":10,\"time\":1.500000,\"dir\":false,\"seq\":4,\"from\":\"/fanstore/ck/a\\\"b.tmp\",\"cookie\":7,\"replaced\":true}"
        );
        assert_eq!(parse_events(&["close,rename".into()]).unwrap(), vec![Kind::Close, Kind::Rename]);
        assert!(parse_events(&["open".into()]).is_err());
        assert_eq!(parse_events(&[]).unwrap().len(), 5);
    }
}
