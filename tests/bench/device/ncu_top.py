#!/usr/bin/env python3
"""Where a kernel's warps wait, from an ncu source-page CSV (run.sh stage ncu
with NCU_SOURCE=1: --page source --print-source sass --csv).

  ncu_top.py FILE.csv [--top N] [--from ADDR --to ADDR]...

Prints the total warp-state samples, the N instructions with the most
samples (share, executions, the two largest stall reasons) and, for each
--from/--to pair (address suffixes as printed, e.g. aa510 ab2d0), the
samples and stall reasons of that address range: a producer loop against
the consumers', say.
"""
import argparse
import collections
import csv
import sys


def load(path):
    rows = list(csv.reader(open(path, newline="")))
    head = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if head is None:
        sys.exit(f"{path}: no 'Address' header (not an ncu --page source --csv file?)")
    h = rows[head]
    data = [r for r in rows[head + 1:] if len(r) == len(h) and r[0].startswith("0x")]
    return h, data


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--from", dest="lo", action="append", default=[])
    ap.add_argument("--to", dest="hi", action="append", default=[])
    a = ap.parse_args()
    h, data = load(a.csv)
    col = {c: i for i, c in enumerate(h)}
    samples = col["Warp Stall Sampling (All Samples)"]
    execs = col["Instructions Executed"]
    stalls = [c for c in h if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(int(r[samples]) for r in data) or 1
    print(f"{a.csv}: {len(data)} instructions, {total} samples")

    def reasons(rs, n):
        c = collections.Counter()
        for r in rs:
            for s in stalls:
                c[s[6:]] += int(r[col[s]])
        return ", ".join(f"{k} {v}" for k, v in c.most_common(n) if v)

    for r in sorted(data, key=lambda r: -int(r[samples]))[: a.top]:
        print(f"{r[0][-5:]}  {r[1].strip()[:56]:56} {int(r[samples]):6} {100 * int(r[samples]) / total:5.1f}%"
              f" {int(r[execs]):9}  {reasons([r], 2)}")
    addr = [r[0][-5:] for r in data]
    for lo, hi in zip(a.lo, a.hi):
        if lo not in addr or hi not in addr:
            sys.exit(f"range {lo}..{hi}: address not in the file")
        rs = data[addr.index(lo): addr.index(hi) + 1]
        n = sum(int(r[samples]) for r in rs)
        print(f"range {lo}..{hi}: {len(rs)} instructions, {n} samples ({100 * n / total:.1f}%): {reasons(rs, 6)}")


if __name__ == "__main__":
    main()
