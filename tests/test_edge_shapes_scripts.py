"""``scripts/h200/edge_check.py`` and ``shapes_check.py`` with ``--cpu-smoke``: the GPU checks' cases run on the CPU
through the reference backend (against itself for the shapes), so a script broken here is not found on a device
call. Their GPU runs are recorded in BENCHMARKS.md."""
import os
import subprocess
import sys

import pytest

FOLDER = os.path.join(os.path.dirname(__file__), "..", "scripts", "h200")


@pytest.mark.parametrize("script,cases", [("edge_check.py", ("sparse_mla empty", "kda_prefill fp64 gate")),
                                          ("shapes_check.py", ("sparse_mla nvfp4", "topk [3, 40] k=7 ties",
                                                               "dsa_attention fp8_ds_mla"))])
def test_the_cpu_smoke_run_passes_every_case(script, cases):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    done = subprocess.run([sys.executable, os.path.join(FOLDER, script), "--cpu-smoke"], capture_output=True,
                          text=True, timeout=600, cwd=FOLDER, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for case in cases:
        assert case in done.stdout, done.stdout
    assert "FAILED" not in done.stdout and "WRONG" not in done.stdout
