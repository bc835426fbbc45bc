#!/usr/bin/env python3
"""Where a kernel's time goes: a launch's fixed cost and its marginal rate,
fitted over the context lengths of indexer_gpu_bench --markdown files.

  bench_fit.py [--min-batch N] [--merge-batches] FILE.md...

Per shape, the median over the files (rounds of one build) of its logits
time and of the bytes it read (the bench's GB/s column times its logits
time: K of the entries scored plus the logits written). Shapes that differ
only in their context (`n=...`) form a family; with --merge-batches also
those that differ only in their batch (`B=...`), so that B=64 and B=128
of a persistent kernel fit as one. Rows below --min-batch (default 1) are
left out, and so are families whose bytes do not grow with the context (a
candidate consumer reads its pool). For each family of two or more sizes,
least squares of time against bytes: the intercept is what a launch costs
whatever its size (fixed us), the slope's inverse the rate each further
byte is read at (marginal GB/s, and its share of the files' lowest
measured copy bandwidth, from their `Device:` line). The largest residual
says how well the line holds (0 with two points). A marginal rate near
copy with a large fixed cost points at the launch's start and end; a low
marginal rate, at the work per byte.
"""
import argparse
import collections
import re
import statistics
import sys

from bench_table import COLUMNS, bench_cells, figure


def read(path):
    """({shape: (kernel, logits us, bytes MB)}, copy GB/s or None) of one file."""
    rows, copy = collections.OrderedDict(), None
    with open(path) as f:
        for line in f:
            m = re.search(r"copy ([0-9.]+) GB/s", line) if line.startswith("Device:") else None
            if m:
                copy = float(m.group(1))
            cells = bench_cells(line)
            if cells is None or len(cells) <= COLUMNS["gbs"]:
                continue
            us, gbs = figure(cells[COLUMNS["logits"]]), figure(cells[COLUMNS["gbs"]])
            if us is None or gbs is None:
                continue
            rows[cells[0]] = (cells[1], us, gbs * us / 1e3)
    return rows, copy


def batch_of(shape):
    m = re.search(r"\bB=(\d+)", shape)
    return int(m.group(1)) if m else None


def family_of(shape, merge_batches):
    f = re.sub(r"\s*\bn=\S+", "", shape)
    if merge_batches:
        f = re.sub(r"\s*\bB=\d+", "", f)
    return re.sub(r"\s+", " ", f).strip()


def fit(points):
    """(a, b) of y = a + b x by least squares; None when x does not vary."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-batch", type=int, default=1)
    ap.add_argument("--merge-batches", action="store_true")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    per_shape = collections.OrderedDict()  # shape -> [(kernel, us, MB) per file]
    copies = []
    for path in a.files:
        try:
            rows, copy = read(path)
        except OSError as e:
            sys.exit(f"bench_fit: {e}")
        if copy is not None:
            copies.append(copy)
        for s, v in rows.items():
            per_shape.setdefault(s, []).append(v)
    if not per_shape:
        sys.exit("bench_fit: no bench rows in " + " ".join(a.files))
    copy = min(copies) if copies else None
    families = collections.OrderedDict()  # (family, kernel) -> [(MB, us, shape)]
    for s, vals in per_shape.items():
        b = batch_of(s)
        if b is not None and b < a.min_batch:
            continue
        kernel = vals[0][0]
        us = statistics.median(v[1] for v in vals)
        mb = statistics.median(v[2] for v in vals)
        families.setdefault((family_of(s, a.merge_batches), kernel), []).append((mb, us, s))
    print(f"Fitted: logits us = fixed + MB / marginal rate (medians of {len(a.files)} file(s); "
          f"copy {copy:.0f} GB/s)\n" if copy else
          f"Fitted: logits us = fixed + MB / marginal rate (medians of {len(a.files)} file(s))\n")
    print("| family | kernel | points | fixed us | marginal GB/s | % of copy | largest residual us |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    printed = 0
    for (fam, kernel), pts in families.items():
        # Two sizes at least, whose bytes differ (a candidate consumer reads
        # its pool, the same at every context).
        if len(pts) < 2 or max(mb for mb, _, _ in pts) < 1.5 * min(mb for mb, _, _ in pts):
            continue
        ab = fit([(mb, us) for mb, us, _ in pts])
        if ab is None or ab[1] <= 0:
            continue
        fixed, slope = ab
        rate = 1e3 / slope  # MB per us -> GB/s
        resid = max(abs(us - (fixed + slope * mb)) for mb, us, _ in pts)
        share = f"{100 * rate / copy:.0f}" if copy else "-"
        print(f"| {fam} | {kernel} | {len(pts)} | {fixed:.1f} | {rate:.0f} | {share} | {resid:.1f} |")
        printed += 1
    if printed == 0:
        sys.exit("bench_fit: no family with two or more sizes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
