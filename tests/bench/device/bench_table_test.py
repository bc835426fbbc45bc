#!/usr/bin/env python3
"""bench_table.py on bench-shaped markdown: labels from file names, rounds
side by side, the median deltas, a shape one file lacks."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
HEAD = ("| shape | kernel | logits us | floor us | GB/s (% copy) | TFLOP/s (% mma.sync, % wgmma measured) "
        "| top-k us | layer us | call us | target | split us |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")


def row(shape, logits, topk):
    # layer (one span) 3 us below split (logits + top-k, each timed alone).
    return (f"| {shape} | wgmma_ws | {logits:.1f} | 67.0 | 3272 (78%) | 0.0 (0%, 0%) | {topk:.1f} "
            f"| {logits + topk - 3:.1f} | 300.0 | | {logits + topk:.1f} |\n")


class BenchTableTest(unittest.TestCase):
    def run_table(self, files, *args):
        out = subprocess.run([sys.executable, os.path.join(HERE, "bench_table.py"), *args, *files],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout

    def test_rounds_labels_and_deltas(self):
        with tempfile.TemporaryDirectory() as d:
            figures = {"kab-1-base": (90.0, 17.0), "kab-2-base": (88.0, 18.0),
                       "kab-1-new": (85.0, 17.0), "kab-2-new": (84.0, 16.0)}
            files = []
            for name, (lg, tk) in figures.items():
                path = os.path.join(d, name + ".md")
                with open(path, "w") as f:
                    f.write("Device: test\n" + HEAD + row("decode B=64", lg, tk))
                    if name.endswith("base"):
                        f.write(row("decode B=128", 150.0, 20.0))
                files.append(path)
            out = self.run_table(files)
            self.assertIn("| shape | base | new | new - base |", out)
            # base: 90 / 88 (median 89); new: 85 / 84 (84.5): -4.5.
            self.assertIn("| decode B=64 | 90.0 / 88.0 | 85.0 / 84.0 | -4.5 |", out)
            self.assertIn("| decode B=128 | 150.0 / 150.0 | - | - |", out)
            split = self.run_table(files, "--metric", "split")
            # split = logits + top-k: base 107 / 106, new 102 / 100 (-5.5).
            self.assertIn("| decode B=64 | 107.0 / 106.0 | 102.0 / 100.0 | -5.5 |", split)
            layer = self.run_table(files, "--metric", "layer")
            self.assertIn("| decode B=64 | 104.0 / 103.0 | 99.0 / 97.0 | -5.5 |", layer)

    def test_files_without_the_split_column(self):
        # Bench files before s26 end at "target": their split shows "-".
        with tempfile.TemporaryDirectory() as d:
            old_head = HEAD.replace(" split us |", "").replace("|---:|\n", "|\n")
            files = []
            for name, tail in (("kab-1-old", False), ("kab-1-new", True)):
                path = os.path.join(d, name + ".md")
                with open(path, "w") as f:
                    r = row("decode B=64", 90.0, 17.0)
                    f.write("Device: test\n" + (HEAD if tail else old_head) +
                            (r if tail else r.rsplit(" 107.0 |", 1)[0] + "\n"))
                files.append(path)
            out = self.run_table(files, "--metric", "split")
            self.assertIn("| decode B=64 | - | 107.0 | - |", out)

    def test_no_rows_fails(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "gaps-1-default.md")
            with open(path, "w") as f:
                f.write("no table here\n")
            out = subprocess.run([sys.executable, os.path.join(HERE, "bench_table.py"), path],
                                 capture_output=True, text=True)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn("no bench rows", out.stderr)


if __name__ == "__main__":
    unittest.main()
