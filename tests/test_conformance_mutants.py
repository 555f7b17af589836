"""The conformance suite has teeth: each deliberately broken backend in tests/mutants fails it,
and the failure names the broken property and carries a reproduction snippet.

Each mutant runs the property that must catch it (all formats) within CI's example budget;
``dsahal conformance --backend mutant_x`` without ``-k`` runs the whole suite the same way.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MUTANTS_DIR = Path(__file__).parent / "mutants"
EXAMPLES = "5"

# mutant module -> (op family, property that must fail, its test function)
MUTANTS = {
    "mutant_indexer_causal": ("indexer_score", "indexer_score.matches_reference",
                              "test_indexer_score_matches_reference"),
    "mutant_topk_tie": ("topk", "topk.exact_tie_rule", "test_topk_selects_the_exact_reference_set_under_the_tie_rule"),
    "mutant_sparse_mla_minus_one": ("sparse_mla", "sparse_mla.skips_minus_one",
                                    "test_sparse_mla_ignores_interleaved_minus_one_slots"),
    "mutant_lse_base2": ("sparse_mla", "sparse_mla.matches_reference", "test_sparse_mla_matches_reference"),
    "mutant_kda_read_before_write": ("kda_decode", "kda_decode.matches_reference",
                                     "test_kda_decode_matches_reference"),
    "mutant_merge_drops_winners": ("topk_merge", "topk_merge.equals_single_device",
                                   "test_topk_merge_equals_single_device_topk"),
    "mutant_cache_write_neighbour": ("cache_write", "cache_write.no_write_outside_slots",
                                     "test_cache_write_touches_nothing_outside_its_target_slots"),
    "mutant_batch_split": ("sparse_mla", "sparse_mla.batch_invariant",
                           "test_sparse_mla_rows_do_not_depend_on_the_batch"),
    "mutant_topk_width": ("topk", "topk.batch_invariant", "test_topk_rows_do_not_depend_on_the_batch_or_its_width"),
    "mutant_dsa_batch_split": ("dsa_attention", "dsa_attention.batch_invariant",
                               "test_dsa_attention_tokens_do_not_depend_on_the_batch"),
}


def run_suite(tmp_path: Path, backend: str, *extra: str,
              plugin: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """``dsahal conformance`` in a fresh process; returns the process and the JSON report."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(MUTANTS_DIR), env.get("PYTHONPATH")]))
    env.pop("DSAHAL_BACKEND", None)
    if plugin:
        env["DSAHAL_PLUGIN_MODULES"] = plugin
    report_dir = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "dsahal", "conformance", "--backend", backend, "--report-dir",
                           str(report_dir), *extra], env=env, capture_output=True, text=True, timeout=600)
    report_file = report_dir / "conformance.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return proc, report


def test_every_mutant_module_is_listed():
    modules = {p.stem for p in MUTANTS_DIR.glob("mutant_*.py")} - {"mutant_base"}
    assert modules == set(MUTANTS)


@pytest.mark.slow  # one suite process per mutant
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_suite_fails_the_mutant_naming_the_broken_property(mutant, tmp_path):
    family, prop, test_name = MUTANTS[mutant]
    proc, report = run_suite(tmp_path, mutant, "--ops", family, "-k", test_name, "--max-examples", EXAMPLES,
                             plugin=mutant)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    failed = {t["property"] for t in report["tests"] if t["outcome"] == "fail"}
    assert prop in failed, f"{mutant} survived {prop}; failed: {failed}\n{output[-3000:]}"
    assert f"backend {mutant!r} violates {prop}" in output
    message = next(t["message"] for t in report["tests"] if t["property"] == prop and t["outcome"] == "fail")
    assert "reproduce:" in message and f"dsahal.set_backend({mutant!r})" in message and ".build()" in message
