"""scripts/h200/model_launches.py: its CPU smoke run end to end (a child process: it sets TRITON_INTERPRET=1
before importing triton), the counts it prints, and one error line with exit 1 on a bad argument."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "h200" / "model_launches.py"
# The model's own launches per step (outside HAL ops) after issue 16 item 4: 247 (476 before it; 275 and 504
# with the HAL ops' 28). A ceiling with a little room: a change that adds launches to the eager decode step
# must say so here.
OWN_LAUNCHES_CEILING = 260


def run_script(*args):
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=SCRIPT.parents[2])


def table_rows(out: str) -> dict:
    """``{part: [cells]}`` of the script's markdown table."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in ("embed", "kda", "dsa", "head", "step"):
            rows[cells[0]] = cells
    return rows


def test_the_smoke_run_checks_counts_and_prints_one_table():
    done = run_script("--cpu-smoke")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "check_model_decode: pass" in done.stdout
    rows = table_rows(done.stdout)
    assert set(rows) == {"embed", "kda", "dsa", "head", "step"}, done.stdout
    # columns: part, layers, aten, of which launch, views, other, Triton, HAL calls, launches, in HAL, per layer
    step, kda, dsa = rows["step"], rows["kda"], rows["dsa"]
    assert (kda[1], dsa[1]) == ("3", "1")
    # Triton: a KDA decode per KDA layer; the DSA layer's two cache writes, the indexer's segment plan (one
    # launch where 15 torch ops were), the indexer, top-k and sparse MLA
    assert (kda[6], dsa[6], step[6]) == ("3", "6", "9")
    assert step[7] == "7"  # HAL calls: kda_decode x3, cache_write x2, dsa_attention and its nested sparse_mla
    launches, in_hal = int(step[8]), int(step[9])
    assert launches == sum(int(rows[p][8]) for p in ("embed", "kda", "dsa", "head"))
    assert int(step[3]) + int(step[5]) + int(step[6]) == launches
    assert 0 < launches - in_hal <= OWN_LAUNCHES_CEILING, done.stdout


def test_a_bad_backend_is_one_error_line_and_exit_1():
    done = run_script("--cpu-smoke", "--backend", "no-such-backend")
    assert done.returncode == 1
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model_launches: --backend expected one of"), done.stderr
