#!/usr/bin/env python3
"""The module import graph of a crate, its cycles, and a picture of it.

    python3 scripts/import_graph.py fanstore-daemon [--png docs/img/daemon-imports.png] [--check]

A module is a source file (`a/mod.rs` is `a`). An edge A -> B is any
`crate::B...`, `super::B...` or `self::B...` path in A's code (comments left
out; `{..}` groups expanded), cut to B's module, so `impl Node` in a service
file counts as an import of `node`. Modules are grouped for the picture and
the cycle check by their top-level name, except under `inputs/`, `outputs/`,
`ops/` and `hooks/`, whose files are each their own unit.
Prints the units, the cycles (strongly connected components with more than
one unit) and the edges inside them. --check exits 1 when there is a cycle
not listed in ALLOWED below. --png renders with graphviz's `dot`.
"""
import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPLIT = ("inputs", "outputs", "ops", "hooks")   # directories whose files are units

# Cycles that are known and explained (docs/architecture.md, "Import graph").
ALLOWED: dict = {}


def modules(src: Path):
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "mod":
            parts.pop()
        if parts in (["lib"], ["main"]) or parts[0] == "bin":
            continue
        yield parts, f


def unit(parts):
    if parts[0] in SPLIT and len(parts) > 1:
        return "::".join(parts)
    return parts[0]


def without_tests(text: str) -> str:
    """The text without its `#[cfg(test)] mod .. { }` blocks: a test may
    reach anywhere; the graph is of the code that ships."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))? )?mod [a-z_0-9]+ \{", text)
        if not m:
            return text
        i, depth = m.end(), 1
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[:m.start()] + text[i:]


def expand(text: str, here):
    """Every module path the code names: `crate::a::b`, `super::b` and
    `self::b` (relative to the file's module `here`), with one level of
    `{a, b::c}` groups expanded."""
    out = []
    pat = r"(?<!\()\b(crate|super|self)((?:::[a-z_][a-z0-9_]*)*)(?:::\{([^{}]*)\})?"
    for m in re.finditer(pat, text):
        root, rest, group = m.group(1), m.group(2), m.group(3)
        if root == "crate":
            base = []
        elif root == "super":
            base = list(here[:-1])
            while rest.startswith("::super"):
                rest = rest[len("::super"):]
                base = base[:-1]
        else:
            base = list(here)
        path = base + [s for s in rest.split("::") if s]
        if group is None:
            out.append(path)
        else:
            for item in group.split(","):
                item = item.strip().split(" as ")[0]
                sub = [s for s in item.split("::") if s and s != "self"]
                out.append(path + sub)
    return out


def code_only(text: str) -> str:
    out = []
    for line in text.splitlines():
        s = line.lstrip()
        if s.startswith("//"):
            continue
        out.append(line.split(" // ")[0])
    return "\n".join(out)


def graph(crate: str):
    src = ROOT / crate / "src"
    mods = list(modules(src))
    names = {tuple(p) for p, _ in mods}
    edges = {}
    for parts, f in mods:
        a = unit(parts)
        edges.setdefault(a, set())
        # string literals left out too: a path in a message or a test's data is not an import
        text = re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', without_tests(code_only(f.read_text())))
        # a `mod.rs` file's own module is its directory's
        for path in expand(text, parts):
            # the longest prefix that names a module
            for n in range(len(path), 0, -1):
                if tuple(path[:n]) in names:
                    b = unit(path[:n])
                    if b != a:
                        edges[a].add(b)
                    break
    return edges


def sccs(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def dot(crate, edges, cyclic):
    lines = [f'digraph "{crate}" {{', "  rankdir=LR; node [shape=box, fontsize=10, style=filled, fillcolor=white];"]
    for v in sorted(edges):
        color = "#f4cccc" if v in cyclic else ("#d9ead3" if v.startswith(("inputs", "ops")) else
                                               "#cfe2f3" if v.startswith(("outputs", "hooks")) else "white")
        lines.append(f'  "{v}" [fillcolor="{color}"];')
    for a in sorted(edges):
        for b in sorted(edges[a]):
            style = ' [color="#cc0000"]' if a in cyclic and b in cyclic and cyclic[a] == cyclic[b] else ""
            lines.append(f'  "{a}" -> "{b}"{style};')
    lines.append("}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("crate")
    ap.add_argument("--png")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    edges = graph(args.crate)
    comps = [c for c in sccs(edges) if len(c) > 1]
    cyclic = {v: i for i, c in enumerate(comps) for v in c}
    n_edges = sum(len(v) for v in edges.values())
    print(f"{args.crate}: {len(edges)} units, {n_edges} edges, {len(comps)} cycle(s)")
    bad = 0
    for c in comps:
        inside = [(a, b) for a in c for b in sorted(edges[a]) if b in c]
        known = ALLOWED.get(args.crate, [])
        ok = any(set(c) <= set(k) for k in known)
        bad += not ok
        print(f"  cycle of {len(c)}{' (allowed)' if ok else ''}: {', '.join(c)}")
        for a, b in inside:
            print(f"    {a} -> {b}")
    if args.png:
        if not shutil.which("dot"):
            sys.exit("graphviz's dot is needed for --png (apt-get install graphviz)")
        Path(args.png).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dot", "-Tpng:gd", "-Gdpi=60", "-o", args.png], input=dot(args.crate, edges, cyclic), text=True,
                       check=True)
        print(f"  wrote {args.png}")
    if args.check and bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
