"""``scripts/h200/invariant_mla_check.py --cpu-smoke``: the H200 check of batch-invariant mode's general sparse-MLA
kernel runs every step on the CPU under the Triton interpreter (its checks pass, its times mean nothing), and a
failed check is one ``error:`` line with exit status 1."""
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "h200", "invariant_mla_check.py")


def test_the_cpu_smoke_run_passes_its_checks():
    done = subprocess.run([sys.executable, SCRIPT, "--cpu-smoke"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("pass ") == 4 and "FAIL" not in done.stdout
    assert "| 8 tok, H=16 |" in done.stdout  # the timing table's row (times meaningless here)
    assert "| fp8_ds_mla |" in done.stdout  # the bounded partials' row


def test_a_run_without_a_gpu_is_one_error_line():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and done.stderr.startswith("error: invariant_mla_check: needs a CUDA")
