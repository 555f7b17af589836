"""The PPU backend's op table passes the conformance suite on the CPU (through the CPU twin, which
serves exactly the ppu backend's ops and verifiers), with the PPU's own skip file. This checks
the portable formulations, not PPU hardware. A reduced example budget keeps it fast."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIPS = os.path.join(ROOT, "backends", "ppu", "skips.txt")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ppu-report")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    env["DSAHAL_PLUGIN_MODULES"] = "dsahal.backends.ppu.cpu_twin"
    done = subprocess.run([sys.executable, "-m", "dsahal", "conformance", "--backend", "ppu-cpu-twin", "--skips", SKIPS,
                           "--max-examples", "2", "--report-dir", str(out)],
                          capture_output=True, text=True, env=env, cwd=str(out), timeout=600)
    return done, json.loads((out / "conformance.json").read_text())


def test_ppu_ops_pass_the_suite_on_the_cpu(report):
    done, data = report
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert data["summary"]["fail"] == 0 and data["summary"]["pass"] > 0


def test_every_op_the_ppu_implements_passes_natively(report):
    from dsahal.backends.ppu.plugin import OPS

    _, data = report
    passed = {t["op"] for t in data["tests"] if t["outcome"] == "pass" and t["native_examples"] > 0}
    assert set(OPS) <= passed


def test_the_ppu_skip_file_is_well_formed_and_not_stale(report):
    done, _ = report
    assert "stale control entry" not in done.stdout
