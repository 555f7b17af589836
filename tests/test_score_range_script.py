"""``scripts/h200/score_range_sweep.py --cpu-smoke``: the H200 sweep of the DSA layer's score-range budget runs on
the CPU under the Triton interpreter: every budget's output bitwise the one-range output, in both modes (its times mean
nothing)."""
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "h200", "score_range_sweep.py")


def test_the_cpu_smoke_run_checks_every_budget():
    done = subprocess.run([sys.executable, SCRIPT, "--cpu-smoke"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    ranges = [line.split("|")[3].strip() for line in done.stdout.splitlines() if line.startswith("| 2 x 3 at 256")]
    assert ranges == ["1", "2", "3"], done.stdout  # the shipped budget, then two budgets that make ranges
    assert "pass batch-invariant H=16: 3 ranges vs one, bitwise equal" in done.stdout
    assert done.stdout.count("| bitwise |") == 3  # the interpreted kernels: every budget bit for bit
