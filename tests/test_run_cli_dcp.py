"""`dsahal run --dcp 2` on two gloo processes (the torchrun environment) equals the single-process run."""
import json
import os

import pytest

from dsahal.cli import main
from dsahal.distributed.testing import run_on_ranks

# Long enough that each rank's shard exceeds top-k (64): the exact merge decides which tokens are kept.
ARGS = ["run", "--batch", "2", "--prompt-len", "150", "--decode", "3", "--block-tokens", "16"]


def run_rank(rank, world, json_dir):
    os.environ["OMP_NUM_THREADS"] = "1"
    code = main(ARGS + ["--dcp", str(world), "--check", "--json", os.path.join(json_dir, f"rank{rank}.json")])
    return code


@pytest.mark.slow
def test_dcp_run_on_two_ranks_matches_the_single_process_run(tmp_path, capsys):
    outcomes = run_on_ranks(run_rank, 2, args=(str(tmp_path),), timeout_s=240)
    assert all(o.ok and o.value == 0 for o in outcomes), [(o.error_type, o.error_message) for o in outcomes]
    dcp = json.loads((tmp_path / "rank0.json").read_text())
    assert not (tmp_path / "rank1.json").exists()  # only rank 0 reports
    assert main(ARGS + ["--json", str(tmp_path / "single.json")]) == 0
    single = json.loads((tmp_path / "single.json").read_text())
    assert dcp["dcp"] == 2 and dcp["outputs"] == single["outputs"]
    assert dcp["check"]["max_abs_logit_diff"] < 1e-4 and dcp["check"]["greedy_agreement"] == 1.0
    assert len(dcp["check"]["ranks"]) == 2 and all(c["passed"] and c["prompt_positions"] > 0
                                                    for c in dcp["check"]["ranks"])  # every rank compared
    assert {"topk_merge", "lse_combine", "all_gather"} <= {row["op"] for row in dcp["ops"]}


def test_dcp_without_a_launcher_says_how_to_start_it(capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(ARGS + ["--dcp", "2"]) == 2
    assert "torchrun" in capsys.readouterr().err
