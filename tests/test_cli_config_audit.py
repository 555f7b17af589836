"""Model configs and `dsahal run` / `bench --quick` options a user would try (a helper's audit): each one
that crashed with a traceback, ran silently with part of the config ignored, or failed deep inside with a
misleading message is now one `error:` line naming the key or flag, before anything runs."""
import dataclasses
import json
import math

import pytest
import torch

import dsahal.cli.run as run_cli
from dsahal.cli import main
from dsahal.config import load_config
from dsahal.model import HybridModel, SamplingParams, sample_one

SMALL = ["run", "--batch", "1", "--prompt-len", "8", "--decode", "2", "--threads", "1"]


def tiny(**changes) -> dict:
    data = json.loads(json.dumps(dataclasses.asdict(load_config("tiny"))))
    data.pop("notes")
    data["num_layers"] = len(data.pop("layer_kinds"))
    data["layer_pattern"] = "kkkd"
    return data | changes


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and [line for line in lines if line.startswith("error: ")] == lines[-1:], err
    return lines[-1]


@pytest.fixture
def no_model(monkeypatch):
    """The refusals come before the weights: building the model fails the test."""
    monkeypatch.setattr(run_cli, "_load_model", lambda *a, **k: pytest.fail("the run started"))


@pytest.mark.parametrize("data,fragment", [
    # the split, not only the sum: sparse_mla returns 512 dims, so 448 + 128 failed in the model's einsum
    (tiny(kv_lora_rank=448, qk_rope_dim=128), "got kv_lora_rank=448, qk_rope_dim=128"),
    (tiny(kda_heads=-2), "kda_heads expected >= 0 (0: same as num_heads), got -2"),  # a torch traceback
    (tiny(layer_pattern=3), "layer_pattern expected letters 'k' and 'd', got 3"),  # TypeError: not iterable
    # the layers spelt out beside a pattern or count: those were dropped without a word
    (tiny(layer_kinds=["kda", "dsa"]), "expected either layer_kinds or layer_pattern, got both"),
    ({k: v for k, v in tiny(layer_kinds=["kda", "dsa"]).items() if k != "layer_pattern"},
     "num_layers expected 2 (the length of layer_kinds), got 4"),
    # MoE fields that build nothing: no MoE layer would hold them
    (tiny(n_shared_experts=2), "n_shared_experts expected 0 when n_routed_experts is 0"),
    (tiny(num_experts_per_tok=3), "num_experts_per_tok expected 0 when n_routed_experts is 0"),
    (tiny(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=4),
     "first_k_dense_replace expected < num_layers (4)"),
    # the model graph's floats: rope_theta inf ran; mscale 0 failed as dsa_attention's softmax_scale
    (tiny(rope_theta=math.inf), "field 'rope_theta' expected a finite number > 0, got inf"),
    (tiny(rms_norm_eps=math.inf), "field 'rms_norm_eps' expected a finite number > 0, got inf"),
    (tiny(mscale=0), "field 'mscale' expected a finite number > 0"),
    (tiny(mscale=-1.0), "field 'mscale' expected a finite number > 0"),
])
def test_a_config_that_cannot_run_as_written_is_one_error_line(data, fragment, tmp_path, capsys, no_model):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(data))
    assert main(SMALL + ["--config", str(path)]) == 2
    assert fragment in one_error_line(capsys)


def test_a_key_given_twice_is_refused_not_the_last_one_taken(tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(tiny())[:-1] + ', "num_heads": 5}')
    assert main(SMALL + ["--config", str(path)]) == 2
    assert "expected each key once, got keys given more than once ['num_heads']" in one_error_line(capsys)


def test_a_config_path_that_is_a_directory_or_missing_says_so(tmp_path, capsys):
    folder = tmp_path / "model.json"
    folder.mkdir()
    for argv in (SMALL, ["plan", "--memory-gib", "1", "--context", "1M"]):  # IsADirectoryError tracebacks
        assert main(argv + ["--config", str(folder)]) == 2
        assert "got a directory" in one_error_line(capsys)
    assert main(SMALL + ["--config", str(tmp_path / "typo.json")]) == 2  # was "not a JSON file"
    assert f"model config '{tmp_path / 'typo.json'}': no such file" in one_error_line(capsys)


def test_an_existing_json_file_without_the_suffix_is_read(tmp_path):
    for name in ("model.JSON", "model.cfg"):  # was "unknown model config ...: not a JSON file"
        (tmp_path / name).write_text(json.dumps(tiny()))
        assert load_config(str(tmp_path / name)) == load_config("tiny")


@pytest.mark.parametrize("args,fragment", [
    (["--temperature", "inf"], "--temperature expected a finite number >= 0 (0: greedy), got inf"),
    (["--dcp-timeout", "nan"], "--dcp-timeout expected a finite number of seconds > 0, got nan"),
    (["--dcp-timeout", "0"], "--dcp-timeout expected a finite number of seconds > 0, got 0.0"),
    (["--dcp-timeout", "inf"], "--dcp-timeout expected a finite number of seconds > 0, got inf"),
    (["--device", "meta"], "argument '--device meta' expected a device that holds data"),
    (["--json", "/nonexistent-dsahal-dir/out.json"], "argument '--json': expected a file in an existing directory"),
])
def test_a_run_option_that_would_fail_late_is_refused_before_the_run(args, fragment, capsys, no_model):
    assert main(SMALL + args) == 2
    assert fragment in one_error_line(capsys)


def test_json_to_a_directory_is_refused_before_the_run(tmp_path, capsys, no_model):
    assert main(SMALL + ["--json", str(tmp_path)]) == 2  # was an IsADirectoryError after the whole run
    assert "argument '--json': expected a file to write, got the directory" in one_error_line(capsys)


def test_a_tiny_temperature_samples_the_argmax_and_inf_is_refused():
    logits = torch.tensor([0.5, 3.0, -1.0, 2.0])
    generator = torch.Generator().manual_seed(0)
    assert sample_one(logits, SamplingParams(1e-300, seed=0), generator) == 1  # was NaN probabilities
    with pytest.raises(ValueError, match="temperature expected a finite number >= 0, got inf"):
        SamplingParams(math.inf, seed=0)


def test_the_model_graph_refuses_an_infinite_rope_theta():
    with pytest.raises(ValueError, match="field 'rope_theta' expected a finite number > 0"):
        HybridModel(dataclasses.replace(load_config("tiny"), rope_theta=math.inf))


def test_bench_quick_options_that_select_nothing_or_cannot_be_written(tmp_path, capsys):
    # --section dispatch times lse_combine only: this ran nothing and reported "0 of 0 checks passed", exit 0
    assert main(["bench", "--quick", "--section", "dispatch", "--op", "kda_decode"]) == 2
    assert "expected to select at least one case, got none (the sections' ops: dispatch: lse_combine)" in \
        one_error_line(capsys)
    assert main(["bench", "--quick", "--section", "dispatch", "--json", str(tmp_path)]) == 2  # after the run
    assert "argument '--json': expected a file to write, got the directory" in one_error_line(capsys)


def test_token_sharded_prefill_without_tp_is_an_error_not_ignored():
    from dsahal.engine.prefill_sharding import check_sharding_args

    with pytest.raises(ValueError, match=r"'--prefill-sharding tokens' expected --tp > 1 .* got --tp 1"):
        check_sharding_args("tokens", 100, 1, 1)
    check_sharding_args("auto", 100, 1, 1)  # the default: nothing to shard on one rank, and it says nothing


def test_the_check_line_says_when_the_reference_was_checked_against_itself():
    from dsahal.engine.check import describe_check

    check = dict(passed=True, max_abs_logit_diff=0.0, relative_logit_diff=0.0, max_abs_logit=3.0, tolerance=1e-3,
                 prompt_positions=7, prompt_max_abs_logit_diff=0.0, positions=2, sampled_max_abs_logit_diff=0.0,
                 greedy_agree=2, greedy_agreement=1.0)
    assert "against itself" in describe_check(dict(check, backend_under_test=None))
    assert "against itself" not in describe_check(dict(check, backend_under_test="nvidia"))
    assert "against itself" not in describe_check(check)  # a report from before the field
