"""`dsahal run`: the main job's report, its --check against the reference, and its errors.

This module is also a test-only plugin (``DSAHAL_PLUGIN_MODULES=test_run_cli``): a backend whose
sparse MLA is slightly off, so --check has a disagreement to find.
"""
import json

import pytest

from dsahal.cli import main
from dsahal.reference.sparse_mla import sparse_mla as reference_sparse_mla
from dsahal.registry import Backend, hookimpl

SMALL_RUN = ["run", "--batch", "2", "--prompt-len", "24", "--decode", "3", "--block-tokens", "16", "--chunk", "16"]


def skewed_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    o, lse = reference_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)
    return o * 1.05, lse


@hookimpl
def dsahal_backends():
    return [Backend(name="skewed", ops={"sparse_mla": skewed_sparse_mla}, tags=frozenset({"test"}), priority=-1)]


def run_json(tmp_path, capsys, *extra):
    path = tmp_path / "run.json"
    assert main(SMALL_RUN + list(extra) + ["--json", str(path)]) == 0
    return json.loads(path.read_text()), capsys.readouterr().out


def test_run_reports_throughput_per_op_times_and_memory(tmp_path, capsys):
    report, out = run_json(tmp_path, capsys)
    assert report["backend"] == "reference" and report["prompt_lengths"] == [24, 18]
    stats = report["stats"]
    assert stats["prefill_tokens"] == 42 and stats["prefill_steps"] == 3  # chunks of 16
    assert stats["decode_tokens"] == 4 and stats["decode_tokens_per_s"] > 0
    ops = {row["op"]: row for row in report["ops"]}
    assert ops["kda_prefill"]["calls"] == 3 * 3 and ops["kda_decode"]["calls"] == 3 * 2  # 3 KDA layers
    assert ops["dsa_attention"]["calls"] == 5 and ops["cache_write"]["calls"] == 10
    # the reference's DSA layer composes its own stages directly (the oracle runs nothing it judges)
    assert "sparse_mla" not in ops and ops["dsa_attention"]["routes"] == "reference"
    assert report["memory"]["bytes"] > 0
    for fragment in ("backend  reference", "config   tiny", "tokens/s", "per-op time", "kda_prefill", "peak memory"):
        assert fragment in out


def test_check_on_the_reference_itself_agrees_exactly(tmp_path, capsys):
    report, out = run_json(tmp_path, capsys, "--check")
    check = report["check"]
    assert check == {**check, "max_abs_logit_diff": 0.0, "greedy_agree": 6, "positions": 6, "passed": True,
                     "prompt_positions": 23 + 17}  # every prompt position but each prompt's last
    assert "greedy agreement 6/6 (100.0%)" in out and "within the tolerance 1.0e-03" in out


def test_check_reports_the_difference_of_a_backend_that_is_off(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "test_run_cli")
    path = tmp_path / "run.json"
    assert main(SMALL_RUN + ["--backend", "skewed", "--check", "--json", str(path)]) == 1  # beyond the tolerance
    err = capsys.readouterr().err
    assert "error: dsahal run --check: backend 'skewed' differs from the reference by" in err
    report = json.loads(path.read_text())
    assert report["backend"] == "skewed" and not report["check"]["passed"]
    assert report["check"]["max_abs_logit_diff"] > 1e-3
    ops = {row["op"]: row for row in report["ops"]}
    assert ops["sparse_mla"]["status"] == "native" and ops["kda_prefill"]["status"] == "fallback"


def test_the_same_seed_gives_the_same_tokens_and_split_dsa_the_same_as_fused(tmp_path, capsys):
    first, _ = run_json(tmp_path, capsys)
    second, _ = run_json(tmp_path, capsys, "--split-dsa")
    assert first["outputs"] == second["outputs"]
    assert "indexer_score" in {row["op"] for row in second["ops"]}
    assert "dsa_attention" not in {row["op"] for row in second["ops"]}


def test_sampling_with_a_temperature_is_seeded(tmp_path, capsys):
    a, _ = run_json(tmp_path, capsys, "--temperature", "1.0", "--seed", "3")
    b, _ = run_json(tmp_path, capsys, "--temperature", "1.0", "--seed", "3")
    assert a["outputs"] == b["outputs"]


def test_weights_saved_by_the_model_load_into_run(tmp_path, capsys):
    from dsahal.config import load_config
    from dsahal.model import HybridModel, init_weights, save_weights

    path = tmp_path / "tiny.safetensors"
    save_weights(init_weights(HybridModel(load_config("tiny")), seed=0), path)
    seeded, _ = run_json(tmp_path, capsys)
    loaded, _ = run_json(tmp_path, capsys, "--weights", str(path), "--seed", "0")
    assert loaded["outputs"] == seeded["outputs"]


@pytest.mark.parametrize("argv,fragment", [
    (["--config", "no-such-model"], "unknown model config 'no-such-model'"),
    (["--backend", "no-such-backend"], "unknown backend 'no-such-backend'"),
    (["--batch", "0"], "--batch expected an int >= 1, got 0"),
    (["--latent-fmt", "int3"], "unknown latent format 'int3'"),
])
def test_bad_arguments_exit_2_with_the_reason(argv, fragment, capsys):
    assert main(["run"] + argv) == 2
    assert fragment in capsys.readouterr().err


def test_a_bad_config_file_is_named(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "bad", "num_layers": 2, "vocab_size": 10, "hidden_size": 8,
                                "intermediate_size": 8, "num_heads": 1, "q_lora_rank": 4, "hiden_size": 3}))
    assert main(["run", "--config", str(path)]) == 2
    assert "unknown keys ['hiden_size']" in capsys.readouterr().err


def test_a_checkpoint_of_another_config_is_refused_with_the_tensor_named(tmp_path, capsys):
    import dataclasses

    from dsahal.config import load_config
    from dsahal.model import HybridModel, init_weights, save_weights

    path = tmp_path / "other.safetensors"
    save_weights(init_weights(HybridModel(dataclasses.replace(load_config("tiny"), vocab_size=64))), path)
    assert main(SMALL_RUN + ["--weights", str(path)]) == 2
    assert "tensor 'embed.weight': checkpoint shape [64, 256], model expects [512, 256]" in capsys.readouterr().err



def test_speculative_decoding_emits_the_same_tokens(tmp_path, capsys):
    plain, _ = run_json(tmp_path, capsys)
    drafted, _ = run_json(tmp_path, capsys, "--draft-tokens", "3")
    assert drafted["outputs"] == plain["outputs"]
    assert "draft_tokens" in drafted["stats"]


def test_fused_glue_is_switched_on_for_the_run_only_and_reported(tmp_path, capsys, monkeypatch):
    """--fused-glue: eager steps may take dsahal.model.fused (CUDA only: on this CPU the torch chains still run,
    so the tokens are the same as without it); the default is restored after the run."""
    from dsahal.model import fused

    seen = []
    real = fused.active
    monkeypatch.setattr(fused, "active", lambda *t: seen.append(fused.on_by_default()) or real(*t))
    report, _ = run_json(tmp_path, capsys, "--fused-glue")
    assert report["fused_glue"] is True and seen and all(seen), "the glue's call sites saw it off during the run"
    assert not fused.on_by_default(), "--fused-glue outlived its run"
    seen.clear()
    plain, _ = run_json(tmp_path, capsys)
    assert plain["fused_glue"] is False and seen and not any(seen)
    assert plain["outputs"] == report["outputs"]
