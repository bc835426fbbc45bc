#!/usr/bin/env python3
"""Side by side: several indexer_gpu_bench --markdown files of one call.

  bench_table.py [--metric logits|topk|layer|split|gbs] FILE.md...

Each file's label is its name without the directory, the `.md`, a leading
stage name (`kab-`, `gaps-`, `knob-`, `table-`) and any round number (`-1`, `-2`): run.sh's
`kab-1-base.md` and `kab-2-base.md` are both `base`, `gaps-1-clean.md` is
`clean`. Prints one markdown row per shape (in the order the files first
name them) and one column per label, a label's rounds as `r1 / r2 / ...`,
then the median of each label's figure less the first label's (`delta`
columns) when there are two or more labels. Shapes a file lacks show `-`.
"""
import argparse
import collections
import os
import re
import statistics
import sys

# The bench's markdown columns (gpu_bench.cu): shape, kernel, logits us,
# floor us, GB/s (% copy), TFLOP/s, top-k us, layer us, call us, target,
# split us (logits + top-k each timed alone; files before s26 lack it).
COLUMNS = {"logits": 2, "gbs": 4, "topk": 6, "layer": 7, "split": 10}


def label_of(path):
    stem = os.path.basename(path)
    stem = stem[:-3] if stem.endswith(".md") else stem
    parts = [p for p in stem.split("-") if p and not p.isdigit()]
    if len(parts) > 1 and parts[0] in ("kab", "gaps", "knob", "table"):
        parts = parts[1:]
    return "-".join(parts) or stem


def figure(cell):
    # "3272 (78%)" -> 3272; "87.3" -> 87.3; anything else -> None.
    m = re.match(r"\s*(-?[0-9.]+)", cell)
    if not m:
        return None
    try:
        return float(m.group(1))
    except ValueError:
        return None


def bench_cells(line):
    """The cells of one of the bench's markdown rows; None for any other line
    (text, the header, the rule). bench_fit.py reads rows through it too."""
    if not line.startswith("| ") or line.startswith("| shape ") or line.startswith("|---"):
        return None
    return [c.strip() for c in line.strip().strip("|").split("|")]


def read(path, metric):
    """{shape: figure} of one bench markdown file, in file order; None where
    a bench row lacks the metric's column (files older than that column)."""
    out = collections.OrderedDict()
    col = COLUMNS[metric]
    with open(path) as f:
        for line in f:
            cells = bench_cells(line)
            if cells is None:
                continue
            if len(cells) <= col:
                out.setdefault(cells[0], None)
                continue
            v = figure(cells[col])
            if v is not None:
                out[cells[0]] = v
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metric", choices=sorted(COLUMNS), default="logits")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    labels = collections.OrderedDict()  # label -> [ {shape: v} per round ]
    shapes = collections.OrderedDict()
    for path in a.files:
        try:
            rows = read(path, a.metric)
        except OSError as e:
            sys.exit(f"bench_table: {e}")
        labels.setdefault(label_of(path), []).append(rows)
        for s in rows:
            shapes[s] = True
    if not shapes:
        sys.exit("bench_table: no bench rows in " + " ".join(a.files))
    names = list(labels)
    head = ["shape"] + names + [f"{n} - {names[0]}" for n in names[1:]]
    print(f"{a.metric} ({'us' if a.metric != 'gbs' else 'GB/s'}; rounds as r1 / r2 / ...)\n")
    print("| " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * (len(head) - 1))
    for s in shapes:
        cells, med = [s], {}
        for n in names:
            vals = [r[s] for r in labels[n] if r.get(s) is not None]
            cells.append(" / ".join(f"{v:.1f}" for v in vals) if vals else "-")
            if vals:
                med[n] = statistics.median(vals)
        for n in names[1:]:
            ok = n in med and names[0] in med
            cells.append(f"{med[n] - med[names[0]]:+.1f}" if ok else "-")
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
