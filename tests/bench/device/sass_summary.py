#!/usr/bin/env python3
"""What a kernel's SASS spends its instructions on, from `cuobjdump -sass`.

  sass_summary.py [--match REGEX] [--top N] LISTING [BASE_LISTING]

For every function of LISTING whose mangled name matches REGEX (all when
unset): its static instruction count and its N most frequent opcodes
(`SHFL.BFLY` counts as `SHFL`, a predicate `@P0` is dropped), then the same
for its tile loop: the smallest loop (a backward branch and its target)
that holds the function's first tensor-core instruction (`HGMMA`, `QGMMA`,
`IGMMA`, `HMMA`, `IMMA`), as run.sh's `sass` stage prints it for kernel
work. With BASE_LISTING (the same kernels of another build), each count
is followed by the base's and the difference.
"""
import argparse
import collections
import re
import sys

# "        /*1b60*/                   QGMMA.64x128x32... ;   /* 0x... */"
INSN = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(\S.*?)\s*;")
FUNC = re.compile(r"^\s*Function : (\S+)")
TENSOR = ("HGMMA", "QGMMA", "IGMMA", "HMMA", "IMMA", "QMMA")


def opcode(text):
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def branch_target(op, text):
    # "BRA 0x1340" or "@!P0 BRA 0x2710": the target address, else None.
    m = re.search(r"0x([0-9a-f]+)", text) if op == "BRA" else None
    return int(m.group(1), 16) if m else None


def parse(path):
    """{function: [(address, opcode, text)]} in listing order."""
    funcs = collections.OrderedDict()
    cur = None
    with open(path) as f:
        for line in f:
            m = FUNC.match(line)
            if m:
                cur = funcs.setdefault(m.group(1), [])
                continue
            m = INSN.match(line)
            if m and cur is not None:
                text = m.group(2)
                cur.append((int(m.group(1), 16), opcode(text), text))
    return funcs


def tile_loop(insns):
    """The instructions of the smallest loop holding the first tensor-core
    instruction, or [] when there is none."""
    first = next((a for a, op, _ in insns if op in TENSOR), None)
    if first is None:
        return []
    best = None
    for addr, op, text in insns:
        t = branch_target(op, text)
        if t is not None and t <= first <= addr and (best is None or addr - t < best[1] - best[0]):
            best = (t, addr)
    if best is None:
        return []
    return [i for i in insns if best[0] <= i[0] <= best[1]]


def counts(insns):
    return collections.Counter(op for _, op, _ in insns)


def report(name, part, new, base, top):
    c_new = counts(new)
    c_base = counts(base) if base is not None else None
    head = f"{name} {part}: {len(new)} instructions"
    if base is not None:
        head += f" (base {len(base)}, {len(new) - len(base):+d})"
    print(head)
    ops = [op for op, _ in c_new.most_common(top)]
    if c_base is not None:  # opcodes whose count changed, too
        ops += [op for op in sorted(set(c_new) | set(c_base)) if c_new[op] != c_base[op] and op not in ops]
    cells = []
    for op in ops:
        cell = f"{op} {c_new[op]}"
        if c_base is not None and c_base[op] != c_new[op]:
            cell += f" (base {c_base[op]})"
        cells.append(cell)
    print("  " + ", ".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--match", default="", help="regex on the mangled function names")
    ap.add_argument("--top", type=int, default=16, help="opcodes listed per function")
    ap.add_argument("listing")
    ap.add_argument("base", nargs="?")
    a = ap.parse_args()
    new = parse(a.listing)
    base = parse(a.base) if a.base else {}
    names = [n for n in new if re.search(a.match, n)]
    if not names:
        print(f"sass_summary: no function matches '{a.match}' in {a.listing}", file=sys.stderr)
        return 1
    for name in names:
        b = base.get(name) if a.base else None
        if a.base and b is None:
            print(f"{name}: not in the base listing")
        report(name, "whole", new[name], b, a.top)
        loop, b_loop = tile_loop(new[name]), tile_loop(b) if b is not None else None
        if loop:
            report(name, "tile loop", loop, b_loop if b_loop else None, a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
