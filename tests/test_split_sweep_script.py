"""``scripts/h200/split_sweep.py --cpu-smoke``: the H200 sweep of the general sparse-MLA kernel's slot splits runs on
the CPU under the Triton interpreter: every split checked against the unsplit output, both tables printed (its times
mean nothing); and its copy of the default-mode split rule is the backend's."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, "..", "scripts", "h200", "split_sweep.py")


def test_the_cpu_smoke_run_checks_every_split():
    done = subprocess.run([sys.executable, SCRIPT, "--cpu-smoke"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    grid = [line for line in done.stdout.splitlines() if line.startswith(("| fp8_ds_mla | 16 | ", "| bf16 | 16 | "))]
    assert len(grid) == 4 + 2, done.stdout  # four calls timed at each split, then a total per format
    assert not any("nan" in line or "| - |" in line for line in grid), done.stdout  # no split failed its check


@pytest.mark.parametrize("tokens,heads", [(8, 128), (64, 128), (64, 64), (320, 128), (16, 64), (1, 128)])
def test_the_sweeps_split_rule_is_the_backends(tokens, heads, monkeypatch):
    sys.path.insert(0, os.path.join(HERE, "..", "scripts", "h200"))
    try:
        from split_sweep import default_split
    finally:
        sys.path.pop(0)
    from dsahal.backends.nvidia import config

    monkeypatch.setattr(config, "batch_invariant", lambda: False)
    config.sparse_mla_config.cache_clear()
    try:
        cfg = config.sparse_mla_config(tokens, heads, 2048, "fp8_ds_mla")
    finally:
        config.sparse_mla_config.cache_clear()
    assert default_split(tokens, heads, 2048, cfg["block_h"], cfg["block_n"], config.TARGET_PROGRAMS) == \
        cfg["split_size"]
