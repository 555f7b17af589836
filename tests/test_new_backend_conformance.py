"""From `dsahal new-backend acme` to a passing conformance report, as docs/backend-guide.md shows:

    dsahal new-backend acme
    pip install ./dsahal-acme
    DSAHAL_BACKEND=acme dsahal conformance --skips dsahal-acme/skips.txt

The package is really installed (pip, into a --target dir put on the subprocesses' sys.path), so
dsahal finds the backend through its entry point in the package metadata. The suite runs with a
reduced example budget; everything else is the guide's commands."""
import json
import os
import subprocess
import sys

import pytest

from dsahal.cli import main

EXAMPLES = "3"  # reduced budget: the full one is the command's default


def _env(site, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    env.update(PYTHONPATH=str(site), **extra)
    return env


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Run the three commands once: generate, install, certify."""
    work = tmp_path_factory.mktemp("vendor")
    cwd = os.getcwd()
    os.chdir(work)
    try:
        assert main(["new-backend", "acme"]) == 0  # 1. into ./dsahal-acme
    finally:
        os.chdir(cwd)
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(work / "dsahal-acme")], check=True, capture_output=True, timeout=300)  # 2.
    suite = subprocess.run(  # 3.
        [sys.executable, "-m", "dsahal", "conformance", "--skips", "dsahal-acme/skips.txt", "--max-examples", EXAMPLES],
        capture_output=True, text=True, cwd=work, env=_env(site, DSAHAL_BACKEND="acme"), timeout=600)
    report = work / "conformance-report" / "conformance.json"
    return {"dir": work, "site": site, "suite": suite,
            "report": json.loads(report.read_text()) if report.is_file() else None}


def test_the_suite_passes_on_the_freshly_generated_backend(workspace):
    suite = workspace["suite"]
    assert suite.returncode == 0, suite.stdout[-4000:] + suite.stderr[-2000:]
    assert workspace["report"]["summary"]["fail"] == 0


def test_the_backend_under_test_is_the_one_selected_by_dsahal_backend(workspace):
    backend = workspace["report"]["backend"]
    assert backend["name"] == "acme" and backend["plugin"] == "acme"
    assert backend["versions"]["dsahal-acme"] == "0.1.0"  # read from the installed package's metadata


def test_its_one_op_is_native_and_passes(workspace):
    report = workspace["report"]
    assert report["backend"]["ops"]["lse_combine"] == "native"
    tests = [t for t in report["tests"] if t["op"] == "lse_combine"]
    assert any(t["outcome"] == "pass" and t["native_examples"] > 0 for t in tests)
    assert {t["outcome"] for t in tests} <= {"pass", "skip"}  # skip only for unclaimed capabilities
    assert all("does not claim" in t["message"] for t in tests if t["outcome"] == "skip")


def test_every_other_op_is_reported_as_fallback_never_as_a_pass(workspace):
    report = workspace["report"]
    others = {op: status for op, status in report["backend"]["ops"].items() if op != "lse_combine"}
    assert set(others.values()) <= {"fallback", "composite"}  # dsa_attention: composed of the reference's ops
    for test in report["tests"]:
        if test["op"] != "lse_combine":
            assert test["outcome"] in ("fallback", "skip"), test
    fallback_ops = {t["op"] for t in report["tests"] if t["outcome"] == "fallback"}
    assert fallback_ops == set(others)


def test_the_markdown_matrix_reads_pass_for_the_op_and_fallback_for_the_rest(workspace):
    matrix = (workspace["dir"] / "conformance-report" / "conformance.md").read_text()
    assert "| lse_combine | - | **pass** |" in matrix
    assert "| sparse_mla | latent:bf16 | **fallback** |" in matrix
    assert (workspace["dir"] / "conformance-report" / "junit.xml").is_file()


def test_the_generated_quick_checks_pass(workspace):
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                          capture_output=True, text=True, cwd=workspace["dir"] / "dsahal-acme",
                          env=_env(workspace["site"]), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
