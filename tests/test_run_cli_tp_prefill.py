"""`dsahal run --tp 2` (two gloo processes with replicated caches): prefill steps token-sharded or head-sharded
per --prefill-sharding, reported per step, and the generated tokens equal the single-process run's."""
import json
import os

import pytest

from dsahal.cli import main
from dsahal.config import load_config
from dsahal.distributed.testing import run_on_ranks
from dsahal.engine.prefill_sharding import prefill_sharding_line, should_shard

# 263 prompt tokens in --chunk 100 steps: 100, 100, 63 tokens; long enough that top-k (64) selects.
ARGS = ["run", "--batch", "2", "--prompt-len", "150", "--decode", "3", "--block-tokens", "16", "--chunk", "100"]


def run_rank(rank, world, json_dir, sharding):
    os.environ["OMP_NUM_THREADS"] = "1"
    return main(ARGS + ["--tp", str(world), *sharding, "--check", "--json", os.path.join(json_dir, f"rank{rank}.json")])


@pytest.mark.slow
def test_tp_run_with_auto_token_sharding_matches_the_single_process_run(tmp_path):
    sharding = ["--prefill-sharding", "auto", "--prefill-shard-min-tokens", "100"]
    outcomes = run_on_ranks(run_rank, 2, args=(str(tmp_path), sharding), timeout_s=240)
    assert all(o.ok and o.value == 0 for o in outcomes), [(o.error_type, o.error_message) for o in outcomes]
    tp = json.loads((tmp_path / "rank0.json").read_text())
    assert not (tmp_path / "rank1.json").exists()  # only rank 0 reports
    assert main(ARGS + ["--json", str(tmp_path / "single.json")]) == 0
    single = json.loads((tmp_path / "single.json").read_text())
    assert "prefill_sharding" not in single
    assert tp["outputs"] == single["outputs"]
    info = tp["prefill_sharding"]
    assert info["mode"] == "auto" and info["ranks"] == 2 and info["min_tokens"] == 100
    # The two 100-token steps are token-sharded, the last 63-token one head-sharded; every DSA layer of a
    # step is counted in that step.
    assert [(s["tokens"], s["sharded"]) for s in info["steps"]] == [(100, True), (100, True), (63, False)]
    assert info["sharded_steps"] == [0, 1] and info["sharded_tokens"] == 200
    assert {s["layers"] for s in info["steps"]} == {len(load_config("tiny").dsa_layers)}
    assert tp["check"]["greedy_agreement"] == 1.0 and len(tp["check"]["ranks"]) == 2
    assert all(c["passed"] and c["prompt_positions"] > 0 for c in tp["check"]["ranks"])
    assert "all_to_all" in {row["op"] for row in tp["ops"]}  # the token-sharded steps' exchanges ran


def test_auto_shards_steps_at_the_threshold_and_tokens_every_step():
    assert should_shard("auto", 100, 100) and not should_shard("auto", 99, 100)
    assert should_shard("tokens", 1, 100) and not should_shard("none", 10**6, 1)


def test_report_line_names_the_sharded_steps_and_ranks():
    report = {"prefill_sharding": {"mode": "auto", "ranks": 2, "min_tokens": 100, "multi_token_steps": 3,
                                   "sharded_steps": [0, 1], "sharded_tokens": 200, "steps": []}}
    line = prefill_sharding_line(report)
    assert "2 of 3 prefill (and draft-verify) steps token-sharded" in line
    assert "over 2 ranks" in line and "steps 0, 1" in line
    assert prefill_sharding_line({}) is None


@pytest.mark.parametrize("extra, message", [
    (["--tp", "2", "--dcp", "2"], "'--tp 2' and '--dcp 2'"),
    (["--prefill-shard-min-tokens", "0"], "'--prefill-shard-min-tokens' expected an int >= 1"),
])
def test_bad_sharding_arguments_are_one_error_line(capsys, monkeypatch, extra, message):
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(ARGS + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


@pytest.mark.slow
def test_tp_run_token_sharding_every_step_with_drafts_matches_the_single_process_run(tmp_path):
    """--prefill-sharding tokens shards every multi-token step, the draft-verify steps of --draft-tokens too."""
    drafts = ["--draft-tokens", "2", "--decode", "6"]
    outcomes = run_on_ranks(run_rank, 2, args=(str(tmp_path), ["--prefill-sharding", "tokens", *drafts]),
                            timeout_s=240)
    assert all(o.ok and o.value == 0 for o in outcomes), [(o.error_type, o.error_message) for o in outcomes]
    tp = json.loads((tmp_path / "rank0.json").read_text())
    assert main(ARGS + drafts + ["--json", str(tmp_path / "single.json")]) == 0
    single = json.loads((tmp_path / "single.json").read_text())
    assert tp["outputs"] == single["outputs"] and all(len(o) == 6 for o in tp["outputs"])
    info = tp["prefill_sharding"]
    assert info["mode"] == "tokens" and info["min_tokens"] is None
    assert info["multi_token_steps"] > 3  # the 3 prefill chunks and the verify steps
    assert info["sharded_steps"] == list(range(info["multi_token_steps"]))
    assert [s["tokens"] for s in info["steps"][:3]] == [100, 100, 63]
