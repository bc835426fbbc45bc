#!/usr/bin/env python3
"""run.sh's knob, table and sass stages without a GPU: a fake pack whose
bench writes bench-shaped markdown from the knob it was given and whose
test binary fails under one setting. Checks the variants (';'), their
labels, that each variant's settings reach the bench and the tests, the
tables against `off`, and that a failing test or an unset KNOB fails the
stage; the table stage's rounds beside a packed base bench and without
one; the sass stage's summary from a fake cuobjdump; kcheck on a filter
alone; and that a changed compressed pack replaces the dev/ a warm machine
kept."""
import os
import shutil
import stat
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "run.sh")

# The bench: logits 70 + the shape knob (4 when unset), top-k 4.
BENCH = r"""#!/usr/bin/env bash
md=""; only=""; trace=""; ceilings=measured
while (($#)); do
  case $1 in
    --markdown) md=$2; shift ;;
    --only) only=$2; shift ;;
    --trace) trace=1 ;;
    --no-ceilings) ceilings=skipped ;;
  esac
  shift
done
v=${INDEXER_GPU_BLOCK_STREAM:-4}
only=${only:-every shape}
{
  echo "| shape | kernel | logits us | floor us | GB/s (% copy) | TFLOP/s | top-k us | layer us | call us | target | split us |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"
  echo "| $only | block_stream | $((70 + v)).0 | 41.7 | 2013 (48%) | 0.0 | 4.0 | $((74 + v)).0 | 90.0 | | $((75 + v)).0 |"
  # The whole table (no --only): a family of two contexts for the fits,
  # 80 MB in 40 us and 320 MB in 100 us (20 us fixed, 4000 GB/s).
  if [[ $only == "every shape" ]]; then
    echo "| decode fp8 B=64 n=32k | wgmma_ws | 40.0 | 19.0 | 2000 (47%) | 0.0 | 4.0 | 44.0 | 90.0 | | 44.0 |"
    echo "| decode fp8 B=64 n=128k | wgmma_ws | 100.0 | 76.0 | 3200 (76%) | 0.0 | 4.0 | 104.0 | 90.0 | | 104.0 |"
  fi
  if [[ -n $trace ]]; then
    echo
    echo "Where the logits time goes (--trace): ceilings $ceilings."
    echo
    echo "| shape | kernel | untraced us | traced us | outside |"
    echo "| $only | block_stream | $((70 + v)).0 | $((71 + v)).0 | 9.0 |"
  fi
} > "$md"
"""
# The test binary: fails under shape 6, names its filter and setting.
TEST = r"""#!/usr/bin/env bash
echo "filter $1 shape ${INDEXER_GPU_BLOCK_STREAM:-default}"
if [[ ${INDEXER_GPU_BLOCK_STREAM:-} == 6 ]]; then echo "[  FAILED  ] 1 test"; exit 1; fi
echo "[  PASSED  ] 1 test."
"""
# compute-sanitizer: runs the command after its options, names its tool
# and the setting it ran under.
SANITIZER = r"""#!/usr/bin/env bash
tool=""
while [[ $1 == --* ]]; do [[ $1 == --tool ]] && tool=$2; shift 2; done
"$@"; rc=$?
echo "========= $tool ERROR SUMMARY: 0 errors (shape ${INDEXER_GPU_BLOCK_STREAM:-default})"
exit $rc
"""


class RunShKnobTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = self.tmp.name
        self.dev = os.path.join(d, "dev")
        self.out = os.path.join(d, "out")
        os.makedirs(os.path.join(self.dev, "bin"))
        for name, text in (("indexer_gpu_bench", BENCH), ("fake_test", TEST), ("compute-sanitizer", SANITIZER)):
            p = os.path.join(self.dev, "bin", name)
            with open(p, "w") as f:
                f.write(text)
            os.chmod(p, os.stat(p).st_mode | stat.S_IXUSR)
        for name in ("gpu-tests.txt", "links.txt"):
            open(os.path.join(self.dev, name), "w").close()
        with open(os.path.join(self.dev, "SOURCE.txt"), "w") as f:
            f.write("fake pack\n")

    def tearDown(self):
        self.tmp.cleanup()

    def run_knob(self, **env):
        e = dict(os.environ, DEV=self.dev, OUT=self.out, KNOB_ONLY="minimax block B=64", OUT_TAR="0")
        e.update(env)
        res = subprocess.run(["bash", RUN, "knob"], env=e, capture_output=True, text=True, timeout=120)
        log_path = os.path.join(self.out, "knob.log")
        log = ""
        if os.path.exists(log_path):
            with open(log_path) as f:
                log = f.read()
        return res.returncode, log

    def test_variants_labels_and_tables(self):
        rc, log = self.run_knob(KNOB="INDEXER_GPU_BLOCK_STREAM=5; INDEXER_GPU_BLOCK_STREAM=7",
                                KNOB_TESTS="fake_test:GpuBlockTest.*", KNOB_SANITIZE="1")
        self.assertEqual(rc, 0, log)
        # Both sanitizers under each variant's setting, none without one.
        for tool in ("memcheck", "racecheck"):
            for v in ("5", "7"):
                self.assertIn(f"{tool} knob-BLOCK_STREAM={v} rc 0; [  PASSED  ] 1 test. "
                              f"========= {tool} ERROR SUMMARY: 0 errors (shape {v})", log)
            self.assertNotIn(f"{tool} knob-off", log)
        # Each variant's tests ran with its setting and the filter.
        self.assertIn("tests off: fake_test rc 0", log)
        self.assertIn("tests BLOCK_STREAM=5: fake_test rc 0", log)
        self.assertIn("tests BLOCK_STREAM=7: fake_test rc 0", log)
        for label in ("off", "BLOCK_STREAM=5", "BLOCK_STREAM=7"):
            for r in (1, 2):
                self.assertTrue(os.path.exists(os.path.join(self.out, f"knob-{r}-{label}.md")), label)
        # The logits table: off first, each variant's rounds, deltas against off.
        logits = log[log.index("logits (us"):log.index("== topk")]
        self.assertIn("| shape | off | BLOCK_STREAM=5 | BLOCK_STREAM=7 | BLOCK_STREAM=5 - off | BLOCK_STREAM=7 - off |",
                      logits)
        self.assertIn("| minimax block B=64 | 74.0 / 74.0 | 75.0 / 75.0 | 77.0 / 77.0 | +1.0 | +3.0 |", logits)
        # The split table (logits + top-k each timed alone) after the layer's.
        split = log[log.index("split (us"):]
        self.assertIn("| minimax block B=64 | 79.0 / 79.0 | 80.0 / 80.0 | 82.0 / 82.0 | +1.0 | +3.0 |", split)

    def test_a_failing_test_fails_the_stage(self):
        rc, log = self.run_knob(KNOB="INDEXER_GPU_BLOCK_STREAM=5;INDEXER_GPU_BLOCK_STREAM=6",
                                KNOB_TESTS="fake_test:GpuBlockTest.*")
        self.assertNotEqual(rc, 0, log)
        self.assertIn("tests BLOCK_STREAM=6: fake_test rc 1", log)
        self.assertIn("tests BLOCK_STREAM=5: fake_test rc 0", log)

    def test_an_unpacked_test_binary_fails(self):
        rc, log = self.run_knob(KNOB="INDEXER_GPU_BLOCK_STREAM=5", KNOB_TESTS="gpu_paths_test:GpuBlockTest.*")
        self.assertNotEqual(rc, 0, log)
        self.assertIn("KNOB_TESTS names 'gpu_paths_test', not a packed binary", log)

    def test_out_packs_all_but_the_logs(self):
        # The device tool returns 8 files named without '=': the bench files go
        # into out.tgz, merged with an earlier run's in the same folder.
        env = dict(KNOB="INDEXER_GPU_BLOCK_STREAM=5", OUT_TAR="1")
        for _ in range(2):
            rc, log = self.run_knob(**env)
            self.assertEqual(rc, 0, log)
            env["KNOB"] = "INDEXER_GPU_BLOCK_STREAM=7"
        self.assertEqual(sorted(os.listdir(self.out)), ["env.log", "knob.log", "out.tgz"])
        names = subprocess.run(["tar", "tzf", os.path.join(self.out, "out.tgz")], capture_output=True,
                               text=True, check=True).stdout.split()
        for label in ("off", "BLOCK_STREAM=5", "BLOCK_STREAM=7"):
            self.assertIn(f"knob-1-{label}.md", names)

    def test_another_card_runs_nothing(self):
        smi = os.path.join(self.dev, "bin", "nvidia-smi")
        with open(smi, "w") as f:
            f.write("#!/usr/bin/env bash\necho 'NVIDIA H100 80GB HBM3'\n")
        os.chmod(smi, os.stat(smi).st_mode | stat.S_IXUSR)
        e = dict(os.environ, DEV=self.dev, OUT=self.out, KNOB="INDEXER_GPU_BLOCK_STREAM=5", CARD="H200")
        res = subprocess.run(["bash", RUN, "knob"], env=e, capture_output=True, text=True, timeout=120)
        self.assertEqual(res.returncode, 4, res.stdout + res.stderr)
        self.assertIn("the GPU is 'NVIDIA H100 80GB HBM3', not H200: nothing run", res.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.out, "knob.log")))
        e["CARD"] = "H100"
        res = subprocess.run(["bash", RUN, "knob"], env=e, capture_output=True, text=True, timeout=120)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def test_a_new_compressed_pack_replaces_the_unpacked_one(self):
        # A warm device machine keeps the git-ignored dev/ of the call before:
        # run.sh must unpack devpack/dev.tar.xz again when it changed, and
        # only then. The tree is a copy (run.sh unpacks into its own root);
        # each pack's nvidia-smi names it, and CARD=none prints that name.
        root = os.path.join(self.tmp.name, "tree")
        os.makedirs(os.path.join(root, "tests", "bench", "device"))
        os.makedirs(os.path.join(root, "devpack"))
        shutil.copy(RUN, os.path.join(root, "tests", "bench", "device", "run.sh"))

        def pack(name):
            src = os.path.join(self.tmp.name, "src-" + name)
            os.makedirs(os.path.join(src, "dev", "bin"))
            smi = os.path.join(src, "dev", "bin", "nvidia-smi")
            with open(smi, "w") as f:
                f.write(f"#!/usr/bin/env bash\necho 'GPU {name}'\n")
            os.chmod(smi, os.stat(smi).st_mode | stat.S_IXUSR)
            subprocess.run(["tar", "-cJf", os.path.join(root, "devpack", "dev.tar.xz"), "-C", src, "dev"],
                           check=True)

        def card():
            e = {k: v for k, v in os.environ.items() if k != "DEV"}
            e.update(OUT=self.out, CARD="none")
            res = subprocess.run(["bash", os.path.join(root, "tests", "bench", "device", "run.sh"), "env"],
                                 env=e, capture_output=True, text=True, timeout=120)
            self.assertEqual(res.returncode, 4, res.stdout + res.stderr)
            return res.stdout

        pack("A")
        self.assertIn("the GPU is 'GPU A'", card())
        marker = os.path.join(root, "dev", "left-by-a-run")
        open(marker, "w").close()
        self.assertIn("the GPU is 'GPU A'", card())
        self.assertTrue(os.path.exists(marker), "the same pack was unpacked again")
        pack("B")
        self.assertIn("the GPU is 'GPU B'", card())
        self.assertFalse(os.path.exists(marker), "the old dev/ was not replaced")

    def write_exe(self, path, text):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)

    def run_stage(self, stage, **env):
        e = dict(os.environ, DEV=self.dev, OUT=self.out, OUT_TAR="0")
        e.update(env)
        res = subprocess.run(["bash", RUN, stage], env=e, capture_output=True, text=True, timeout=120)
        log_path = os.path.join(self.out, f"{stage}.log")
        log = ""
        if os.path.exists(log_path):
            with open(log_path) as f:
                log = f.read()
        return res.returncode, log, res.stdout

    def test_table_beside_the_base(self):
        # The base bench: logits 2 us above this pack's (its default knob 6).
        self.write_exe(os.path.join(self.dev, "base", "indexer_gpu_bench"), BENCH.replace(":-4}", ":-6}"))
        rc, log, out = self.run_stage("table", TABLE_ROUNDS="2")
        self.assertEqual(rc, 0, log)
        self.assertIn("table: base new x 2", out)
        for r in (1, 2):
            for side in ("base", "new"):
                self.assertTrue(os.path.exists(os.path.join(self.out, f"table-{r}-{side}.md")), (r, side))
        logits = log[log.index("logits (us"):log.index("== topk")]
        self.assertIn("| shape | base | new | new - base |", logits)
        self.assertIn("| every shape | 76.0 / 76.0 | 74.0 / 74.0 | -2.0 |", logits)
        # The new side's fits: per batch, then B >= 64 merged (one family).
        fits = log[log.index("== fits (new, per batch)"):]
        self.assertIn("medians of 2 file(s)", fits)
        self.assertIn("| decode fp8 B=64 | wgmma_ws | 2 | 20.0 | 4000 | - | 0.0 |", fits)
        self.assertIn("| decode fp8 | wgmma_ws | 2 | 20.0 | 4000 | - | 0.0 |", fits[fits.index("B >= 64 merged"):])

    def test_table_alone_and_a_failing_bench(self):
        rc, log, out = self.run_stage("table", TABLE_ROUNDS="1")
        self.assertEqual(rc, 0, log)
        self.assertIn("table: new x 1", out)
        self.assertIn("| every shape | 74.0 |", log)
        self.assertFalse(os.path.exists(os.path.join(self.out, "table-1-base.md")))
        failing = os.path.join(self.tmp.name, "failing_bench")
        self.write_exe(failing, "#!/usr/bin/env bash\necho 'bench: no GPU'\nexit 1\n")
        rc, log, out = self.run_stage("table", TABLE_ROUNDS="1", TABLE_BASE=failing)
        self.assertNotEqual(rc, 0, log)
        self.assertIn("table round 1 base rc 1", log)
        self.assertIn("### table: FAILED", out)

    def test_trace_rounds(self):
        # Two rounds of the bench with --trace, the ceilings measured once;
        # each round's trace section in the log; a failing bench fails it.
        rc, log, out = self.run_stage("trace", TRACE_ROUNDS="2", TRACE_ONLY="decode fp8 B=64")
        self.assertEqual(rc, 0, log)
        for r in (1, 2):
            self.assertTrue(os.path.exists(os.path.join(self.out, f"trace-{r}.md")), r)
        self.assertIn("Where the logits time goes (--trace): ceilings measured.", log)
        self.assertIn("Where the logits time goes (--trace): ceilings skipped.", log)
        self.assertIn("| decode fp8 B=64 | block_stream | 74.0 | 75.0 | 9.0 |", log)
        self.assertNotIn("| shape | base | new |", log)
        os.remove(os.path.join(self.dev, "bin", "indexer_gpu_bench"))
        self.write_exe(os.path.join(self.dev, "bin", "indexer_gpu_bench"), "#!/usr/bin/env bash\necho 'bench: no GPU'\nexit 1\n")
        rc, log, out = self.run_stage("trace", TRACE_ROUNDS="1")
        self.assertNotEqual(rc, 0, log)
        self.assertIn("trace round 1 rc 1", log)
        self.assertIn("### trace: FAILED", out)

    def test_sass_summary_beside_the_base(self):
        # cuobjdump: the kernel has one more SHFL in the base's binary.
        listing = (
            "#!/usr/bin/env bash\n"
            "shfl=''; [[ $2 == */base/* ]] && shfl='        /*0020*/ SHFL.BFLY PT, R1, R2, 0x1, 0x1f ;\n'\n"
            "printf '\\t\\tFunction : _Z6KernelILi2EEvv\\n'\n"
            "printf '        /*0000*/ S2R R0, SR_TID.X ;\\n        /*0010*/ QGMMA.64x128x32 R24, gdesc[UR8], RZ ;\\n'\n"
            "printf \"$shfl\"\n"
            "printf '\\t\\tFunction : _Z5Otherv\\n        /*0000*/ EXIT ;\\n'\n")
        self.write_exe(os.path.join(self.dev, "bin", "cuobjdump"), listing)
        self.write_exe(os.path.join(self.dev, "base", "indexer_gpu_bench"), BENCH)
        rc, log, out = self.run_stage("sass", SASS_MATCH="Kernel")
        self.assertEqual(rc, 0, log)
        self.assertIn("_Z6KernelILi2EEvv whole: 2 instructions (base 3, -1)", log)
        self.assertIn("SHFL 0 (base 1)", log)
        self.assertIn("whole: 2 instructions", out)  # the console summary
        with open(os.path.join(self.out, "sass-new.txt")) as f:
            kept = f.read()
        self.assertIn("_Z6KernelILi2EEvv", kept)
        self.assertNotIn("_Z5Otherv", kept)

    def test_kcheck_the_filter_only(self):
        # KCHECK_SHARDS=0: the filter's tests once, then both sanitizers;
        # no shards of the whole binary.
        self.write_exe(os.path.join(self.dev, "bin", "gpu_backend_test"), TEST)
        rc, log, out = self.run_stage("kcheck", KCHECK_SHARDS="0", KCHECK_FILTER="GpuBlockTest.*")
        self.assertEqual(rc, 0, log)
        self.assertIn("gpu_backend_test --gtest_filter=GpuBlockTest.* rc 0; [  PASSED  ] 1 test.", log)
        for tool in ("memcheck", "racecheck"):
            self.assertIn(f"{tool} kcheck rc 0; [  PASSED  ] 1 test. ========= {tool} ERROR SUMMARY", log)
        self.assertNotIn("shard", log)
        # A failing test fails the stage.
        rc, log, out = self.run_stage("kcheck", KCHECK_SHARDS="0", KCHECK_FILTER="GpuBlockTest.*",
                                      INDEXER_GPU_BLOCK_STREAM="6")
        self.assertNotEqual(rc, 0, log)
        self.assertIn("gpu_backend_test --gtest_filter=GpuBlockTest.* rc 1; [  FAILED  ] 1 test", log)
        self.assertIn("### kcheck: FAILED", out)

    def test_no_knob_fails(self):
        rc, log = self.run_knob(KNOB="")
        self.assertNotEqual(rc, 0)
        self.assertIn("KNOB names no setting", log)


if __name__ == "__main__":
    unittest.main()
