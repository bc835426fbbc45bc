#!/usr/bin/env python3
"""bench_fit.py on bench-shaped markdown made from a known line: the fixed
cost and marginal rate come back, rounds are medians, batches merge on
request, a consumer (bytes flat in the context) is left out."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE = ("Device: NVIDIA H200, 132 SMs. Ceilings measured here: copy {copy} GB/s "
          "(device-to-device, read + write); an empty kernel 2.9 us.\n")
HEAD = ("| shape | kernel | logits us | floor us | GB/s (% copy) | TFLOP/s (% mma.sync, % wgmma measured) "
        "| top-k us | layer us | call us | target | split us |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")


def row(shape, kernel, mb, us):
    # The bench's GB/s is its bytes over its logits time.
    return (f"| {shape} | {kernel} | {us:.1f} | 1.0 | {mb * 1e3 / us:.0f} (50%) | 0.0 (0%, 0%) | 10.0 "
            f"| {us + 7:.1f} | 200.0 | | {us + 10:.1f} |\n")


def line(fixed, rate, mb):
    return fixed + mb * 1e3 / rate


class BenchFitTest(unittest.TestCase):
    def run_fit(self, files, *args, ok=True):
        out = subprocess.run([sys.executable, os.path.join(HERE, "bench_fit.py"), *args, *files],
                             capture_output=True, text=True)
        if ok:
            self.assertEqual(out.returncode, 0, out.stderr)
        return out

    def table(self, out):
        rows = {}
        for l in out.stdout.splitlines():
            cells = [c.strip() for c in l.strip().strip("|").split("|")]
            if len(cells) == 7 and re.match(r"^[0-9]+$", cells[2]):
                rows[cells[0]] = cells
        return rows

    def write(self, d, name, copy, rows):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(DEVICE.format(copy=copy) + "Method: test\n\n" + HEAD + "".join(rows))
        return path

    def test_recovers_the_line_and_takes_medians(self):
        with tempfile.TemporaryDirectory() as d:
            files = []
            # 20 us fixed at 3000 GB/s; the rounds sit 0, 2 and 5 us above it,
            # so the median of three is 2 us above (the mean would be 2.3).
            for i, (copy, noise) in enumerate(((4222, 0.0), (4213, 2.0), (4230, 5.0))):
                rows = []
                for n, mb in (("8k", 70.0), ("32k", 280.0), ("128k", 1120.0)):
                    rows.append(row(f"decode fp8 B=64 next_n=1 n={n}", "wgmma_ws", mb,
                                    line(20.0, 3000.0, mb) + noise))
                # A consumer reads its pool: the same bytes at every context.
                rows.append(row("v4.1 consumer fp8 B=64 n=32k", "wgmma_ws", 50.0, 30.0))
                rows.append(row("v4.1 consumer fp8 B=64 n=128k", "wgmma_ws", 50.0, 31.0))
                files.append(self.write(d, f"table-{i + 1}-base.md", copy, rows))
            out = self.run_fit(files)
            self.assertIn("copy 4213 GB/s", out.stdout)  # the lowest of the files
            rows = self.table(out)
            fam = rows["decode fp8 B=64 next_n=1"]
            self.assertEqual(fam[1], "wgmma_ws")
            self.assertEqual(fam[2], "3")
            self.assertAlmostEqual(float(fam[3]), 22.0, delta=0.2)
            self.assertAlmostEqual(float(fam[4]), 3000.0, delta=15.0)
            self.assertEqual(fam[5], "71")  # 3000 / 4213
            self.assertLessEqual(float(fam[6]), 0.2)
            self.assertNotIn("v4.1 consumer fp8 B=64", rows)

    def test_merge_batches_and_min_batch(self):
        with tempfile.TemporaryDirectory() as d:
            rows = []
            for b in (1, 64, 128):
                for n, mb in (("32k", 140.0 * max(b, 1) / 64), ("128k", 560.0 * max(b, 1) / 64)):
                    # B=1 runs a slower line: a single row does not fill the device.
                    us = line(12.0, 1500.0, mb) if b == 1 else line(20.0, 3400.0, mb)
                    rows.append(row(f"minimax block mxfp4 Hi=4 B={b} n={n}", "block_stream", mb, us))
            path = self.write(d, "table-1-base.md", 4213, rows)
            per_batch = self.table(self.run_fit([path]))
            self.assertIn("minimax block mxfp4 Hi=4 B=1", per_batch)
            self.assertIn("minimax block mxfp4 Hi=4 B=128", per_batch)
            merged = self.table(self.run_fit([path], "--merge-batches", "--min-batch", "64"))
            self.assertEqual(list(merged), ["minimax block mxfp4 Hi=4"])
            fam = merged["minimax block mxfp4 Hi=4"]
            self.assertEqual(fam[2], "4")
            self.assertAlmostEqual(float(fam[3]), 20.0, delta=0.2)
            self.assertAlmostEqual(float(fam[4]), 3400.0, delta=20.0)

    def test_nothing_to_fit_fails(self):
        with tempfile.TemporaryDirectory() as d:
            empty = self.write(d, "a.md", 4213, [])
            out = self.run_fit([empty], ok=False)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn("no bench rows", out.stderr)
            one = self.write(d, "b.md", 4213, [row("decode fp8 B=64 n=32k", "wgmma_ws", 280.0, 90.0)])
            out = self.run_fit([one], ok=False)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn("two or more sizes", out.stderr)


if __name__ == "__main__":
    unittest.main()
