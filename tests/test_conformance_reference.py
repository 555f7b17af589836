"""The reference passes its own conformance suite (reduced example budget) and the three reports
are written: JUnit XML, JSON per test, markdown matrix op x format x outcome."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from dsahal import formats
from dsahal.ops.catalog import OP_NAMES
from test_conformance_mutants import run_suite


@pytest.mark.slow  # the whole suite in a subprocess, with gloo ranks
def test_reference_passes_the_whole_suite_and_writes_three_reports(tmp_path):
    proc, report = run_suite(tmp_path, "reference", "--max-examples", "3", "--derandomize")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    tests = report["tests"]
    assert {t["op"] for t in tests} == set(OP_NAMES)
    assert {t["outcome"] for t in tests} <= {"pass", "skip"}
    latent = {t["format"] for t in tests if t["op"] == "sparse_mla"}
    index = {t["format"] for t in tests if t["op"] == "indexer_score"}
    assert latent == {f"latent:{n}" for n in formats.LATENT_FORMATS}
    assert index == {f"index:{n}" for n in formats.INDEX_FORMATS}
    skipped = [t for t in tests if t["outcome"] == "skip"]
    assert skipped and all("does not claim batch_invariant" in t["message"] for t in skipped)
    assert all(t["examples"] >= 1 and t["native_examples"] == t["examples"] for t in tests if t["outcome"] == "pass")
    assert report["backend"]["name"] == "reference" and report["settings"]["max_examples"] == 3

    junit = ET.parse(tmp_path / "report" / "junit.xml").getroot()
    suite = junit if junit.tag == "testsuite" else junit.find("testsuite")
    assert int(suite.get("failures")) == 0 and int(suite.get("tests")) == len(tests)

    markdown = (tmp_path / "report" / "conformance.md").read_text()
    assert "| op | format | status | pass | fail | skip | fallback | examples native / fallback |" in markdown
    for op in OP_NAMES:
        assert f"| {op} |" in markdown
