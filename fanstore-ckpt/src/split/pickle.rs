//! Names for torch.save storages: a small pickle reader (protocols 0-5,
//! no code is run) that rebuilds `data.pkl`'s object tree as inert nodes
//! and finds, for each storage key (`<archive>/data/<key>`), the first
//! tensor that uses it: its path of dict keys and list indices joined by
//! `.` (a plain state_dict gives PyTorch's own parameter names), its dtype
//! (from the storage class) and its shape.
//!
//! A tensor is a `REDUCE` of a `torch.*` callable whose first argument is
//! the persistent id `('storage', torch.<X>Storage, key, location, numel)`
//! and whose third is the size tuple (`_rebuild_tensor_v2`); other `torch.*`
//! reductions (`_rebuild_parameter`, `_rebuild_from_type_v2`, ...) are
//! looked through. Anything unexpected gives `None`, and the storages keep
//! their entry names.

use std::collections::HashMap;

/// What the pickle says about one storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
}

const MAX_NODES: usize = 4_000_000;
const MAX_DEPTH: usize = 64;

type Id = usize;

#[derive(Debug, Clone)]
enum Node {
    None,
    Int(i64),
    Other,
    Str(String),
    Global(String, String),
    Tuple(Vec<Id>),
    List(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    /// `func(*args)`, plus items a later SETITEMS/APPENDS added (OrderedDict).
    Reduce { func: Id, args: Id, items: Vec<(Id, Id)>, list: Vec<Id> },
    PersId(Id),
}

struct Vm<'a> {
    b: &'a [u8],
    pos: usize,
    nodes: Vec<Node>,
    stack: Vec<Id>,
    marks: Vec<usize>,
    memo: HashMap<u64, Id>,
}

impl<'a> Vm<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn le(&mut self, n: usize) -> Option<u64> {
        let s = self.take(n)?;
        let mut v = 0u64;
        for (i, &c) in s.iter().enumerate() {
            v |= (c as u64) << (8 * i);
        }
        Some(v)
    }
    fn line(&mut self) -> Option<&'a [u8]> {
        let rest = self.b.get(self.pos..)?;
        let n = rest.iter().position(|&c| c == b'\n')?;
        self.pos += n + 1;
        Some(&rest[..n])
    }
    fn push(&mut self, n: Node) -> Option<()> {
        if self.nodes.len() >= MAX_NODES {
            return None;
        }
        self.nodes.push(n);
        self.stack.push(self.nodes.len() - 1);
        Some(())
    }
    fn pop(&mut self) -> Option<Id> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return None;
        }
        self.stack.pop()
    }
    fn pop_mark(&mut self) -> Option<Vec<Id>> {
        let m = self.marks.pop()?;
        if m > self.stack.len() {
            return None;
        }
        Some(self.stack.split_off(m))
    }
    fn top(&self) -> Option<Id> {
        let floor = self.marks.last().copied().unwrap_or(0);
        (self.stack.len() > floor).then(|| self.stack[self.stack.len() - 1])
    }
    fn str_len(&mut self, width: usize) -> Option<()> {
        let n = usize::try_from(self.le(width)?).ok()?;
        let s = self.take(n)?;
        let s = std::str::from_utf8(s).ok()?.to_string();
        self.push(Node::Str(s))
    }
    fn skip_len(&mut self, width: usize) -> Option<()> {
        let n = usize::try_from(self.le(width)?).ok()?;
        self.take(n)?;
        self.push(Node::Other)
    }
    fn add_items(&mut self, target: Id, kv: Vec<Id>) -> Option<()> {
        if !kv.len().is_multiple_of(2) {
            return None;
        }
        let pairs: Vec<(Id, Id)> = kv.chunks(2).map(|c| (c[0], c[1])).collect();
        match &mut self.nodes[target] {
            Node::Dict(items) | Node::Reduce { items, .. } => items.extend(pairs),
            _ => return None,
        }
        Some(())
    }
    fn add_list(&mut self, target: Id, vals: Vec<Id>) -> Option<()> {
        match &mut self.nodes[target] {
            Node::List(items) | Node::Reduce { list: items, .. } => items.extend(vals),
            Node::Other => {} // a set, or an object we do not model
            _ => return None,
        }
        Some(())
    }

    fn run(&mut self) -> Option<Id> {
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    self.u8()?; // PROTO
                }
                0x95 => {
                    self.le(8)?; // FRAME: a length hint only
                }
                b'.' => return self.pop(), // STOP
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let t = self.top()?;
                    self.stack.push(t);
                }
                b'N' => self.push(Node::None)?,
                0x88 | 0x89 => self.push(Node::Other)?,
                b'J' => {
                    let v = self.le(4)? as u32 as i32 as i64;
                    self.push(Node::Int(v))?
                }
                b'K' => {
                    let v = self.le(1)? as i64;
                    self.push(Node::Int(v))?
                }
                b'M' => {
                    let v = self.le(2)? as i64;
                    self.push(Node::Int(v))?
                }
                0x8a | 0x8b => {
                    let n = usize::try_from(self.le(if op == 0x8a { 1 } else { 4 })?).ok()?;
                    let s = self.take(n)?;
                    let v = if n <= 8 && n > 0 {
                        let mut a = [if s[n - 1] & 0x80 != 0 { 0xff } else { 0 }; 8];
                        a[..n].copy_from_slice(s);
                        Node::Int(i64::from_le_bytes(a))
                    } else if n == 0 {
                        Node::Int(0)
                    } else {
                        Node::Other
                    };
                    self.push(v)?
                }
                b'I' | b'L' => {
                    let l = self.line()?;
                    let t = std::str::from_utf8(l).ok()?.trim_end_matches('L');
                    let v = match t {
                        "00" => Node::Other, // False
                        "01" => Node::Other, // True
                        _ => t.parse().map(Node::Int).unwrap_or(Node::Other),
                    };
                    self.push(v)?
                }
                b'F' => {
                    self.line()?;
                    self.push(Node::Other)?
                }
                b'G' => {
                    self.take(8)?;
                    self.push(Node::Other)?
                }
                b'X' => self.str_len(4)?,
                0x8c => self.str_len(1)?,
                0x8d => self.str_len(8)?,
                b'V' => {
                    let l = self.line()?;
                    let s = std::str::from_utf8(l).ok()?.to_string();
                    self.push(Node::Str(s))?
                }
                b'S' => {
                    let l = self.line()?;
                    let s = std::str::from_utf8(l).ok()?;
                    let s = s.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')).unwrap_or(s).to_string();
                    self.push(Node::Str(s))?
                }
                b'T' => self.str_len(4)?,
                b'U' => self.str_len(1)?,
                b'B' => self.skip_len(4)?,
                b'C' => self.skip_len(1)?,
                0x8e | 0x96 => self.skip_len(8)?,
                b']' => self.push(Node::List(Vec::new()))?,
                b')' => self.push(Node::Tuple(Vec::new()))?,
                b'}' => self.push(Node::Dict(Vec::new()))?,
                0x8f => self.push(Node::Other)?, // EMPTY_SET
                b'l' => {
                    let v = self.pop_mark()?;
                    self.push(Node::List(v))?
                }
                b't' => {
                    let v = self.pop_mark()?;
                    self.push(Node::Tuple(v))?
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return None;
                    }
                    let v = self.stack.split_off(self.stack.len() - n);
                    self.push(Node::Tuple(v))?
                }
                b'd' => {
                    let kv = self.pop_mark()?;
                    if !kv.len().is_multiple_of(2) {
                        return None;
                    }
                    self.push(Node::Dict(kv.chunks(2).map(|c| (c[0], c[1])).collect()))?
                }
                0x91 => {
                    self.pop_mark()?;
                    self.push(Node::Other)? // FROZENSET
                }
                b'a' => {
                    let v = self.pop()?;
                    let t = self.top()?;
                    self.add_list(t, vec![v])?
                }
                b'e' | 0x90 => {
                    let v = self.pop_mark()?;
                    let t = self.top()?;
                    self.add_list(t, v)?
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let t = self.top()?;
                    self.add_items(t, vec![k, v])?
                }
                b'u' => {
                    let kv = self.pop_mark()?;
                    let t = self.top()?;
                    self.add_items(t, kv)?
                }
                b'c' => {
                    let m = std::str::from_utf8(self.line()?).ok()?.to_string();
                    let n = std::str::from_utf8(self.line()?).ok()?.to_string();
                    self.push(Node::Global(m, n))?
                }
                0x93 => {
                    let n = self.pop()?;
                    let m = self.pop()?;
                    let (Node::Str(m), Node::Str(n)) = (&self.nodes[m], &self.nodes[n]) else { return None };
                    let g = Node::Global(m.clone(), n.clone());
                    self.push(g)?
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let func = self.pop()?;
                    self.push(Node::Reduce { func, args, items: Vec::new(), list: Vec::new() })?
                }
                0x92 => {
                    let _kwargs = self.pop()?;
                    let args = self.pop()?;
                    let func = self.pop()?;
                    self.push(Node::Reduce { func, args, items: Vec::new(), list: Vec::new() })?
                }
                b'b' => {
                    self.pop()?; // BUILD: state is not needed
                    self.top()?;
                }
                b'Q' => {
                    let pid = self.pop()?;
                    self.push(Node::PersId(pid))?
                }
                b'P' => {
                    self.line()?;
                    self.push(Node::Other)?
                }
                b'g' | b'h' | b'j' => {
                    let k = match op {
                        b'g' => std::str::from_utf8(self.line()?).ok()?.parse().ok()?,
                        b'h' => self.le(1)?,
                        _ => self.le(4)?,
                    };
                    let id = *self.memo.get(&k)?;
                    self.stack.push(id);
                }
                b'p' | b'q' | b'r' => {
                    let k = match op {
                        b'p' => std::str::from_utf8(self.line()?).ok()?.parse().ok()?,
                        b'q' => self.le(1)?,
                        _ => self.le(4)?,
                    };
                    let t = self.top()?;
                    self.memo.insert(k, t);
                }
                0x94 => {
                    let t = self.top()?;
                    let k = self.memo.len() as u64;
                    self.memo.insert(k, t);
                }
                _ => return None, // EXT*, INST/OBJ, out-of-band buffers, unknown
            }
        }
    }
}

/// Maps storage keys to the first tensor using each, from a torch.save `data.pkl`.
pub fn torch_storages(pkl: &[u8]) -> Option<HashMap<String, StorageInfo>> {
    let mut vm = Vm { b: pkl, pos: 0, nodes: Vec::new(), stack: Vec::new(), marks: Vec::new(), memo: HashMap::new() };
    let root = vm.run()?;
    let mut w = Walker {
        nodes: &vm.nodes,
        out: HashMap::new(),
        visiting: vec![false; vm.nodes.len()],
        // Shared sub-objects are walked once per reference: bound the total
        // so that a pickle of nested shared tuples cannot take 2^depth steps.
        budget: 4 * vm.nodes.len() + 1024,
        path: Vec::new(),
    };
    w.walk(root, 0);
    (w.budget > 0).then_some(w.out)
}

struct Walker<'n> {
    nodes: &'n [Node],
    out: HashMap<String, StorageInfo>,
    visiting: Vec<bool>,
    budget: usize,
    path: Vec<String>,
}

fn key_text(nodes: &[Node], k: Id) -> Option<String> {
    match &nodes[k] {
        Node::Str(s) => Some(s.clone()),
        Node::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

impl Walker<'_> {
    fn walk(&mut self, id: Id, depth: usize) {
        if depth > MAX_DEPTH || self.visiting[id] || self.budget == 0 {
            return;
        }
        self.budget -= 1;
        self.visiting[id] = true;
        let nodes = self.nodes;
        match &nodes[id] {
            Node::Dict(items) => self.items(items, depth),
            Node::List(v) | Node::Tuple(v) => self.seq(v, depth),
            Node::Reduce { func, args, items, list } => {
                let torch = matches!(&nodes[*func], Node::Global(m, _) if m == "torch" || m.starts_with("torch."));
                if torch {
                    if let Some((key, info)) = tensor(nodes, *args, &self.path) {
                        self.out.entry(key).or_insert(info);
                    } else {
                        // _rebuild_parameter(tensor, ...), _rebuild_from_type_v2(f, type, args, state), ...
                        self.look_through(*args, depth + 1);
                    }
                } else {
                    self.items(items, depth);
                    self.seq(list, depth);
                    // e.g. OrderedDict([(k, v), ...]) built from its argument
                    self.look_through(*args, depth + 1);
                }
            }
            _ => {}
        }
        self.visiting[id] = false;
    }

    fn items(&mut self, items: &[(Id, Id)], depth: usize) {
        for &(k, v) in items {
            let Some(k) = key_text(self.nodes, k) else { continue };
            self.path.push(k);
            self.walk(v, depth + 1);
            self.path.pop();
        }
    }

    fn seq(&mut self, v: &[Id], depth: usize) {
        for (i, &c) in v.iter().enumerate() {
            self.path.push(i.to_string());
            self.walk(c, depth + 1);
            self.path.pop();
        }
    }

    /// Walks into a reduction's arguments without adding path segments.
    fn look_through(&mut self, args: Id, depth: usize) {
        if depth > MAX_DEPTH || self.budget == 0 {
            return;
        }
        self.budget -= 1;
        let nodes = self.nodes;
        if let Node::Tuple(v) = &nodes[args] {
            for &c in v {
                match &nodes[c] {
                    Node::Tuple(_) => self.look_through(c, depth + 1),
                    _ => self.walk(c, depth + 1),
                }
            }
        }
    }
}

/// `args` of a tensor rebuild: (persistent storage id, offset, size, ...).
fn tensor(nodes: &[Node], args: Id, path: &[String]) -> Option<(String, StorageInfo)> {
    let Node::Tuple(a) = &nodes[args] else { return None };
    let Node::PersId(pid) = &nodes[*a.first()?] else { return None };
    let Node::Tuple(p) = &nodes[*pid] else { return None };
    if p.len() < 3 || !matches!(&nodes[p[0]], Node::Str(s) if s == "storage") {
        return None;
    }
    let key = key_text(nodes, p[2])?;
    let dtype = match &nodes[p[1]] {
        Node::Global(_, cls) => storage_dtype(cls).to_string(),
        _ => String::new(),
    };
    let shape = match a.get(2).map(|&s| &nodes[s]) {
        Some(Node::Tuple(dims)) => {
            dims.iter().map(|&d| if let Node::Int(i) = nodes[d] { u64::try_from(i).ok() } else { None }).collect::<Option<Vec<_>>>()?
        }
        _ => Vec::new(),
    };
    Some((key, StorageInfo { name: path.join("."), dtype, shape }))
}

/// safetensors-style dtype names for torch's typed storage classes.
fn storage_dtype(cls: &str) -> &str {
    match cls {
        "FloatStorage" => "F32",
        "DoubleStorage" => "F64",
        "HalfStorage" => "F16",
        "BFloat16Storage" => "BF16",
        "LongStorage" => "I64",
        "IntStorage" => "I32",
        "ShortStorage" => "I16",
        "CharStorage" => "I8",
        "ByteStorage" => "U8",
        "BoolStorage" => "BOOL",
        "ComplexFloatStorage" => "C64",
        "ComplexDoubleStorage" => "C128",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Protocol 2 bytes as torch.save writes a two-tensor OrderedDict state_dict
    /// (memoised globals on the second tensor, as the pickler does).
    fn state_dict_pickle() -> Vec<u8> {
        let mut p = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01(".to_vec();
        let s = |t: &str| {
            let mut v = vec![b'X'];
            v.extend_from_slice(&(t.len() as u32).to_le_bytes());
            v.extend_from_slice(t.as_bytes());
            v
        };
        // first tensor: "enc.weight", storage key "0", FloatStorage, shape (2, 3)
        p.extend(s("enc.weight"));
        p.extend_from_slice(b"q\x02ctorch._utils\n_rebuild_tensor_v2\nq\x03((");
        p.extend(s("storage"));
        p.extend_from_slice(b"q\x04ctorch\nFloatStorage\nq\x05");
        p.extend(s("0"));
        p.extend(s("cpu"));
        p.extend_from_slice(b"K\x06tq\x06QK\x00K\x02K\x03\x86q\x07K\x03K\x01\x86q\x08\x89ccollections\nOrderedDict\n)Rq\x09tq\x0aRq\x0b");
        // second tensor: "enc.bias", storage key "1", HalfStorage, shape (3,), memoised globals
        p.extend(s("enc.bias"));
        p.extend_from_slice(b"h\x03((h\x04ctorch\nHalfStorage\nq\x0c");
        p.extend(s("1"));
        p.extend(s("cpu"));
        p.extend_from_slice(b"K\x03tq\x0dQK\x00K\x03\x85K\x01\x85\x89h\x00)Rtq\x0eRq\x0f");
        p.extend_from_slice(b"u.");
        p
    }

    #[test]
    fn names_dtypes_and_shapes_of_a_state_dict() {
        let m = torch_storages(&state_dict_pickle()).unwrap();
        assert_eq!(m["0"], StorageInfo { name: "enc.weight".into(), dtype: "F32".into(), shape: vec![2, 3] });
        assert_eq!(m["1"], StorageInfo { name: "enc.bias".into(), dtype: "F16".into(), shape: vec![3] });
    }

    #[test]
    fn truncated_or_mutated_pickles_never_panic() {
        let base = state_dict_pickle();
        for n in 0..base.len() {
            let _ = torch_storages(&base[..n]);
        }
        for b in fanstore_core::format::testing::mutated_copies(&base, 20_000, 3) {
            let _ = torch_storages(&b);
        }
        // self-referencing containers through the memo do not loop
        assert!(torch_storages(b"\x80\x02]q\x00h\x00a.").is_some());
        // 60 levels of a tuple holding its predecessor twice: 2^60 paths, bounded work
        let mut p = b"\x80\x02)q\x00".to_vec();
        for i in 0..60u8 {
            p.extend_from_slice(&[b'h', i, b'h', i, 0x86, b'q', i + 1]);
        }
        p.push(b'.');
        let t = std::time::Instant::now();
        assert!(torch_storages(&p).is_none());
        assert!(t.elapsed().as_secs() < 2);
    }
}
