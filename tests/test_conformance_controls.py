"""The suite's controls and bookkeeping: vendor skip/xfail files (stale entries warned), fallback
reporting, capability skips, the pytest entry point, usage errors, an inert plugin elsewhere."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsahal.conformance import controls, report
from dsahal.conformance.assertions import assert_topk_rows
from dsahal.conformance.harness import PropertyViolation
from test_conformance_mutants import run_suite


@pytest.mark.slow  # a suite subprocess
def test_skip_and_xfail_files_apply_by_prefix_and_warn_about_stale_entries(tmp_path):
    skips = tmp_path / "skips.txt"
    skips.write_text("# vendor skips\ntest_topk.py::test_topk_rejects_bad_input  # validation is upstream\n"
                     "test_nothing.py::test_gone  # removed long ago\n")
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("test_topk.py::test_topk_selects_the_exact_reference_set  # known tie-rule bug, ticket 12\n")
    proc, rep = run_suite(tmp_path, "mutant_topk_tie", "--ops", "topk", "--max-examples", "4", "--skips", str(skips),
                          "--xfails", str(xfails), plugin="mutant_topk_tie")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]  # the known failure is expected, nothing else fails
    outcomes = {t["property"]: (t["outcome"], t["message"]) for t in rep["tests"]}
    assert outcomes["topk.exact_tie_rule"][0] == "xfail" and "ticket 12" in outcomes["topk.exact_tie_rule"][1]
    assert outcomes["topk.rejects_bad_input"] == ("skip", "vendor skip (skips.txt:2): validation is upstream")
    assert outcomes["topk.valid_selection"][0] == "pass"
    assert "stale control entry 'test_nothing.py::test_gone' (skips.txt:3)" in output


@pytest.mark.slow  # a suite subprocess
def test_ops_served_by_the_reference_are_reported_as_fallback_never_as_passes(tmp_path):
    proc, rep = run_suite(tmp_path, "partial", "--ops", "topk", "lse_combine", "positions_to_slots", "sparse_mla",
                          "topk_merge", "--max-examples", "6", "--seed", "7", plugin="partial_backend")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    by_id = {t["id"]: t for t in rep["tests"]}
    slots = by_id["test_slots.py::test_positions_to_slots_matches_reference_exactly"]
    assert slots["outcome"] == "fallback" and "does not implement positions_to_slots" in slots["message"]
    combine = by_id["test_lse_combine.py::test_lse_combine_matches_reference"]
    assert combine["outcome"] == "fallback" and "every route declined" in combine["message"]
    assert "no lse_combine kernel for these shapes" in combine["message"]
    assert combine["native_examples"] == 0 and combine["fallback_examples"] == combine["examples"] > 0
    valid = by_id["test_topk.py::test_topk_selects_the_reference_score_multiset"]
    assert valid["native_examples"] > 0, valid  # narrow rows ran natively; wide ones are counted apart
    assert valid["outcome"] == ("pass" if valid["native_examples"] else "fallback")
    assert valid["native_examples"] + valid["fallback_examples"] == valid["examples"]
    unclaimed = by_id["test_sparse_mla.py::test_sparse_mla_matches_reference[latent:fp8]"]
    assert unclaimed["outcome"] == "skip" and "does not claim latent format 'fp8'" in unclaimed["message"]
    merge = by_id["test_topk_merge.py::test_topk_merge_equals_single_device_topk"]
    assert merge["outcome"] == "skip" and "does not claim distributed" in merge["message"]
    markdown = (tmp_path / "report" / "conformance.md").read_text()
    assert "| positions_to_slots | - | **fallback** |" in markdown


@pytest.mark.slow  # a suite subprocess
def test_the_suite_runs_as_a_plain_pytest_plugin_with_pyargs(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    env["DSAHAL_BACKEND"] = "reference"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "dsahal.conformance", "-q", "-p",
                           "no:cacheprovider", "--dsahal-ops", "positions_to_slots", "--dsahal-max-examples", "3",
                           "--dsahal-report-dir", str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "dsahal conformance: backend 'reference'" in proc.stdout
    assert {p.name for p in tmp_path.iterdir()} >= {"junit.xml", "conformance.json", "conformance.md"}


def test_the_plugin_is_inert_when_the_suite_is_not_run(tmp_path):
    (tmp_path / "test_plain.py").write_text("from hypothesis import given, settings, strategies as st\n"
                                            "@given(st.integers())\n"
                                            "def test_default_budget(x):\n"
                                            "    assert settings.default.max_examples == 100\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    env["DSAHAL_BACKEND"] = "no-such-backend"  # selecting it would fail: the plugin must not try
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_plain.py"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dsahal conformance" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(("__", "."))) == ["test_plain.py"]


def test_an_unknown_backend_is_a_usage_error_listing_the_backends(tmp_path):
    proc, rep = run_suite(tmp_path, "no-such-backend", "--ops", "topk", "--max-examples", "1")
    assert proc.returncode == 2 and rep == {}
    assert "unknown backend 'no-such-backend'" in proc.stdout + proc.stderr
    assert "reference: available" in proc.stdout + proc.stderr


class _Recorder:
    """A stand-in PropertyRun: fail() raises with the detail only."""

    def fail(self, detail):
        raise PropertyViolation(detail)


def test_topk_checker_accepts_any_tie_member_but_exact_set_demands_the_smaller_index():
    scores = torch.tensor([[3.0, 1.0, 1.0, 1.0, float("-inf")]])
    lengths = torch.tensor([5])
    reference = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    other_tie = torch.tensor([[3, 0, 2]], dtype=torch.int32)
    assert_topk_rows(_Recorder(), other_tie, scores, lengths, 3, reference, exact_set=False)
    with pytest.raises(PropertyViolation, match="tie rule violated"):
        assert_topk_rows(_Recorder(), other_tie, scores, lengths, 3, reference, exact_set=True)
    with pytest.raises(PropertyViolation, match="selected a -inf"):
        assert_topk_rows(_Recorder(), torch.tensor([[0, 1, 4]], dtype=torch.int32), scores, lengths, 3, reference,
                         exact_set=False)
    with pytest.raises(PropertyViolation, match="valid ids first"):
        assert_topk_rows(_Recorder(), torch.tensor([[0, -1, 1]], dtype=torch.int32), scores, lengths, 3, reference,
                         exact_set=False)


def test_control_files_parse_prefixes_and_reasons(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("\n# comment\ntest_a.py::test_b  # why\ntest_c.py\n")
    entries = controls.read_control_file(path)
    assert [(e.prefix, e.reason, e.source) for e in entries] == [("test_a.py::test_b", "why", "x.txt:3"),
                                                                  ("test_c.py", "no reason given", "x.txt:4")]
    assert controls.match(entries, "some/dir/test_c.py::test_z[latent:fp8]") is entries[1]
    assert controls.stale(entries) == [entries[0]]


def test_a_matrix_cell_fails_if_any_property_failed():
    records = [report.TestRecord("a", "a", "topk", "p", "-", "x", outcome="pass"),
               report.TestRecord("b", "b", "topk", "q", "-", "x", outcome="fail"),
               report.TestRecord("c", "c", "kda_decode", "q", "-", "x", outcome="fallback")]
    table = report.matrix(records)
    assert report.cell_status(table["topk"]["-"]) == "fail"
    assert report.cell_status(table["kda_decode"]["-"]) == "fallback"


def test_the_summary_line_of_an_op_without_formats_is_its_status_alone():
    # the terminal summary printed `topk  -=pass` for ops whose only format is "-"
    records = [report.TestRecord("a", "a", "topk", "p", "-", "x", outcome="pass"),
               report.TestRecord("b", "b", "sparse_mla", "p", "latent:fp8", "x", outcome="pass"),
               report.TestRecord("c", "c", "sparse_mla", "p", "latent:bf16", "x", outcome="fallback")]
    table = report.matrix(records)
    assert report.op_cells(table["topk"]) == "pass"
    assert report.op_cells(table["sparse_mla"]) == "latent:bf16=fallback, latent:fp8=pass"




def test_the_ci_template_runs_one_job_per_hardware_and_uploads_the_reports():
    import dsahal.conformance

    template = (Path(dsahal.conformance.__file__).parent / "templates" / "conformance-ci.yml").read_text()
    for label in ("nvidia-h200", "amd-mi300x", "tpu-v5e", "ppu", "ubuntu-latest"):
        assert label in template
    assert "runs-on: ${{ matrix.runs-on }}" in template
    assert "dsahal conformance" in template and "actions/upload-artifact" in template
    assert "--report-dir" in template and "GITHUB_STEP_SUMMARY" in template


def test_arguments_move_to_the_device_under_test_keeping_views_and_guards():
    from dsahal.conformance.harness import default_device, place
    from dsahal.conformance.paged import SparseMlaCase
    from dsahal.registry import Backend

    case = SparseMlaCase(fmt="bf16", rows=2, heads=2, topk=5, num_blocks=2, block_tokens=4, minus_one_fraction=0.2,
                         empty_rows=(), duplicates=False, q_dtype="bfloat16", softmax_scale=0.1, regime="normal",
                         lead=8, seed=1)
    cpu = case.build()
    moved = place(cpu, torch.device("meta"))
    assert moved.q.device.type == "meta" and moved.slots.device.type == "meta"
    assert moved.kv_pages.stride() == cpu.kv_pages.stride() and not moved.kv_pages.is_contiguous()
    assert moved.kv_pages._base is moved.guarded.pool  # still a view into the guarded pool
    assert moved.guarded.pages._base is moved.guarded.pool
    assert default_device(Backend("g", tags=frozenset({"gpu", "cuda", "ppu"}))) == "cuda"
    assert default_device(Backend("t", tags=frozenset({"tpu", "xla"}))) == "xla"
    assert default_device(Backend("c", tags=frozenset({"cpu"}))) == "cpu"
