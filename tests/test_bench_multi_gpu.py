"""The multi-GPU bench (`python -m dsahal.bench.multi_gpu`) on two gloo ranks at its --quick shapes:
its correctness checks hold and its capacity section measures what the planner predicts."""
import json
import os

import pytest

from dsahal.bench import multi_gpu
from dsahal.distributed.testing import run_on_ranks


def run_rank(rank, world, json_path):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["DSAHAL_BACKEND"] = "reference"
    return multi_gpu.main(["--quick", "--reps", "1", "--json", json_path])


@pytest.mark.slow
def test_multi_gpu_bench_on_two_gloo_ranks(tmp_path):
    path = str(tmp_path / "multi_gpu.json")
    outcomes = run_on_ranks(run_rank, 2, args=(path,), timeout_s=300)
    assert all(o.ok and o.value == 0 for o in outcomes), [(o.error_type, o.error_message) for o in outcomes]
    report = json.loads(open(path).read())
    assert report["world"] == 2 and report["backend"] == "gloo"

    tp, dcp = report["capacity"]
    assert (tp["layout"], dcp["layout"]) == ("TP2", "TP2 DCP2")
    for row in (tp, dcp):
        assert row["measured_tokens"] == row["predicted_tokens"] > 0
        assert row["measured_contexts"] == row["predicted_contexts"] > 0
        assert row["same_on_every_rank"]
    assert dcp["tokens_vs_tp"] == 2.0  # same rows per device, each holding every other token

    merge = report["merge"]
    assert merge["merges_pick_same_set"]
    assert merge["dcp_vs_single_gpu_o_rel_err"] < 1e-2  # bf16 outputs, combined from two partial results
    assert merge["exact_payload_bytes_per_rank"] < merge["generic_payload_bytes_per_rank"]
    assert all(merge[k] > 0 for k in ("exact_merge_ms", "generic_merge_ms", "dcp_step_exact_ms", "single_gpu_step_ms"))

    first, second = report["prefill"]
    assert first["token_vs_head_sharded_bitwise"] and second["token_vs_head_sharded_bitwise"]
    assert first["batch_invariant_token_sharded_equals_single_device_bitwise"]
    assert "batch_invariant_token_sharded_equals_single_device_bitwise" not in second  # checked once


def run_one_rank(rank, world, json_path, sections):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["DSAHAL_BACKEND"] = "reference"
    try:
        return multi_gpu.main(["--quick", "--json", json_path, "--layout-world", "4"] + sections)
    except SystemExit as exc:  # argparse's error exit
        return exc.code


@pytest.mark.slow
def test_one_rank_measures_the_capacity_of_a_wider_layout_and_refuses_collective_sections(tmp_path):
    path = str(tmp_path / "capacity.json")
    (outcome,) = run_on_ranks(run_one_rank, 1, args=(path, ["--section", "capacity"]), timeout_s=120)
    assert outcome.ok and outcome.value == 0, (outcome.error_type, outcome.error_message)
    tp, dcp = json.loads(open(path).read())["capacity"]
    assert (tp["layout"], dcp["layout"]) == ("TP4", "TP4 DCP4") and dcp["tokens_vs_tp"] == 4.0
    (outcome,) = run_on_ranks(run_one_rank, 1, args=(path, ["--section", "merge"]), timeout_s=120)
    assert outcome.ok and outcome.value == 2  # needs two ranks: an error, not a silent skip
