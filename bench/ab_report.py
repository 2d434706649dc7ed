"""Puts the goal rows of bench/ab.sh's runs side by side:
    python3 bench/ab_report.py bench/out/ab   -> bench/out/ab/report.md
Each piece's JSON has `goals`: rows (experiment, goal, measured, met, note);
one table per piece, one column per run (round, base/head)."""
import json
import sys
from pathlib import Path

ab = Path(sys.argv[1])
runs = sorted((d for d in ab.iterdir() if d.is_dir()), key=lambda d: (int(d.name.split("-")[0]), d.name))
md = ["# A/B: " + (ab / "runs.txt").read_text().splitlines()[0], ""]
for piece in ("read", "remote", "write", "ckpt"):
    cols, rows = [], {}
    for d in runs:
        f = d / f"{piece}.json"
        if not f.exists():
            continue
        cols.append(d.name)
        for g in json.loads(f.read_text()).get("goals", []):
            key = (str(g[0]), str(g[1]))
            rows.setdefault(key, {})[d.name] = str(g[2])
    if not cols:
        continue
    md += [f"## {piece}", "", "| experiment | goal | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for (exp, goal), vals in rows.items():
        md.append(f"| {exp} | {goal} | " + " | ".join(vals.get(c, "-") for c in cols) + " |")
    md.append("")
(ab / "report.md").write_text("\n".join(md))
print("\n".join(md))
