"""`dsahal run --check` can fail: deliberately broken backends (tests/mutants) exit 1 naming the difference,
correct backends exit 0, prompt positions are compared too, and the tolerance table is the documented one."""
import json
from pathlib import Path

import pytest

from dsahal.cli import main
from dsahal.engine.check import DTYPE_TOLERANCE, check_tolerance, merge_rank_checks

MUTANTS_DIR = Path(__file__).parent / "mutants"
SMALL = ["run", "--batch", "2", "--prompt-len", "24", "--decode", "4", "--block-tokens", "16", "--chunk", "16",
         "--check"]


def run_check(tmp_path, *extra):
    path = tmp_path / "run.json"
    code = main(SMALL + list(extra) + ["--json", str(path)])
    return code, json.loads(path.read_text())["check"]


@pytest.fixture
def mutants(monkeypatch):
    monkeypatch.syspath_prepend(str(MUTANTS_DIR))

    def load(name):
        monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", name)
    return load


@pytest.mark.parametrize("mutant,extra", [
    ("mutant_kda_read_before_write", []),  # wrong at decode steps
    # The reference's fused dsa_attention runs its own stages, so the indexer mutant shows with the split ops;
    # it is wrong most at the first prompt position (a query that sees no key at all).
    ("mutant_indexer_causal", ["--split-dsa"]),
    ("mutant_cache_write_neighbour", []),
])
def test_a_broken_backend_fails_the_check_with_exit_1(mutant, extra, mutants, tmp_path, capsys):
    mutants(mutant)
    code, check = run_check(tmp_path, "--backend", mutant, *extra)
    err = capsys.readouterr().err
    assert code == 1 and not check["passed"]
    assert check["relative_logit_diff"] > check["tolerance"] == DTYPE_TOLERANCE["float32"]
    assert f"error: dsahal run --check: backend {mutant!r} differs from the reference by" in err
    assert "beyond the tolerance 1.0e-03 for float32 with bf16 latents and fp8 index keys" in err
    assert err.count("error:") == 1 and "Traceback" not in err


def test_the_indexer_mutant_is_worst_at_a_prompt_position(mutants, tmp_path, capsys):
    mutants("mutant_indexer_causal")
    code, check = run_check(tmp_path, "--backend", "mutant_indexer_causal", "--split-dsa")
    assert code == 1 and check["prompt_max_abs_logit_diff"] > check["sampled_max_abs_logit_diff"]
    assert "prompt position" in check["where"]


def test_the_reference_passes_its_own_check(tmp_path, capsys):
    code, check = run_check(tmp_path)
    assert code == 0 and check["passed"] and check["max_abs_logit_diff"] == 0.0
    assert check["prompt_positions"] == 23 + 17 and check["positions"] == 2 * 4


def test_a_correct_backend_with_fp4_caches_passes_within_its_tolerance(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "dsahal.backends.ppu.cpu_twin")
    code, check = run_check(tmp_path, "--backend", "ppu-cpu-twin", "--latent-fmt", "nvfp4", "--index-fmt", "mxfp4")
    assert code == 0 and check["passed"], check
    assert check["tolerance"] == pytest.approx(1e-3 + 5e-3 + 2e-3)
    assert 0 < check["relative_logit_diff"] < check["tolerance"] / 10  # a real difference, well inside


def test_check_tolerance_overrides_the_table(mutants, tmp_path, capsys):
    mutants("mutant_kda_read_before_write")
    code, check = run_check(tmp_path, "--backend", "mutant_kda_read_before_write", "--check-tolerance", "0.5")
    assert code == 0 and check["tolerance"] == 0.5
    code, check = run_check(tmp_path, "--backend", "mutant_kda_read_before_write", "--check-tolerance", "1e-4")
    err = capsys.readouterr().err
    assert code == 1 and "beyond the tolerance 1.0e-04 (--check-tolerance)" in err  # the flag's value, named so
    assert "for float32 with" not in err
    assert main(SMALL + ["--check-tolerance", "0"]) == 2
    assert "--check-tolerance expected a number > 0, got 0.0" in capsys.readouterr().err


def test_the_tolerance_table_per_dtype_and_format():
    assert check_tolerance("float32", "bf16", "fp8") == 1e-3
    assert check_tolerance("bfloat16", "fp8_ds_mla", "fp8") == pytest.approx(2e-2 + 2e-3)
    with pytest.raises(ValueError, match="no tolerance for latent format 'int3'"):
        check_tolerance("float32", "int3", "fp8")


def test_a_dcp_check_passes_only_if_every_rank_does():
    good = {"relative_logit_diff": 1e-6, "passed": True, "where": "request 0, prompt position 3"}
    bad = {"relative_logit_diff": 0.2, "passed": False, "where": "request 1, position 30 (decode step 7)"}
    merged = merge_rank_checks([good, bad])
    assert not merged["passed"] and merged["where"] == "rank 1: request 1, position 30 (decode step 7)"
    assert merged["ranks"] == [good, bad] and merge_rank_checks([good, good])["passed"]
