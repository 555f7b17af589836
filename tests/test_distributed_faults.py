"""Faults on real gloo ranks: a dead or silent peer is a clear error within the timeout, never a hang;
ranks started with different configurations or world sizes are stopped at start-up, naming the difference."""
import os
import time

import torch

from dsahal import ops
from dsahal.distributed import DistributedFault, StartupMismatch, init_distributed, shutdown_distributed
from dsahal.distributed.launch import describe_differences
from dsahal.distributed.merge import exact_topk_merge
from dsahal.distributed.testing import run_on_ranks

TIMEOUT_S = 3.0


def merge_while_peer_misbehaves(rank, world, misbehaviour):
    init_distributed({"suite": "faults"}, timeout_s=TIMEOUT_S)
    scores = torch.randn(2, 64)
    exact_topk_merge(scores, torch.full((2,), 64), 8)  # a healthy round first: the group works
    ops.topk_merge(scores, torch.full((2,), 64), 8)  # and the reference's merge, by definition
    if rank == 1:
        if misbehaviour == "dies":
            os._exit(17)
        time.sleep(60)  # stops answering; the harness kills it once rank 0 has reported
    start = time.monotonic()
    try:
        exact_topk_merge(scores, torch.full((2,), 64), 8)
    except DistributedFault as exc:
        outcome = {"seconds": time.monotonic() - start, "message": str(exc)}
    else:
        outcome = {"seconds": time.monotonic() - start, "message": "no error"}
    if misbehaviour == "dies":  # the reference's merge after the peer died: a clear error too, naming the op
        for key, check in (("reference", False), ("validated", True)):  # (check=True: the ranks-agree exchange)
            try:
                ops.topk_merge(scores, torch.full((2,), 64), 8, check=check)
                outcome[key] = "no error"
            except RuntimeError as exc:
                outcome[key] = str(exc)
    return outcome


def start_with(rank, world, fingerprints):
    try:
        init_distributed(fingerprints[rank], timeout_s=10.0)
    finally:
        shutdown_distributed()


def test_a_dead_peer_makes_the_merge_fail_at_once_with_a_clear_error():
    outcomes = run_on_ranks(merge_while_peer_misbehaves, 2, args=("dies",), timeout_s=60.0, wait_for=[0])
    assert outcomes[0].ok, outcomes[0].traceback
    report = outcomes[0].value
    assert "topk_merge first round failed on rank 0 of 2: a peer rank died or did not answer" in report["message"]
    assert report["seconds"] < TIMEOUT_S + 2.0
    assert report["reference"].startswith(
        "dsahal.topk_merge (reference): the all-gather of the local scores failed on rank 0 of 2: "), report["reference"]
    assert report["validated"].startswith(
        "dsahal.topk_merge: the all-gather of every rank's [T, N] and k (the check that the ranks agree) failed on "
        "rank 0 of 2: "), report["validated"]


def test_a_silent_peer_makes_the_merge_fail_within_the_timeout():
    outcomes = run_on_ranks(merge_while_peer_misbehaves, 2, args=("hangs",), timeout_s=60.0, wait_for=[0])
    assert outcomes[0].ok, outcomes[0].traceback
    report = outcomes[0].value
    assert f"within the process group's timeout ({TIMEOUT_S:g} s)" in report["message"]
    assert TIMEOUT_S - 0.5 < report["seconds"] < TIMEOUT_S + 5.0
    assert outcomes[1].timed_out  # it was still asleep: the harness ended it


def test_ranks_with_different_configs_are_stopped_at_start_up_naming_the_difference():
    fingerprints = [{"config": "tiny", "dcp": 2, "kv_fmt": "fp8"}, {"config": "tiny", "dcp": 4, "kv_fmt": "fp8"}]
    outcomes = run_on_ranks(start_with, 2, args=(fingerprints,), timeout_s=60.0)
    for outcome in outcomes:
        assert outcome.error_type == "StartupMismatch", outcome.traceback
        assert "rank 1 was started differently from rank 0" in outcome.error_message
        assert "dcp: rank" in outcome.error_message and "kv_fmt" not in outcome.error_message


def test_ranks_with_different_world_sizes_are_stopped_at_start_up_naming_the_difference():
    fingerprints = [{"config": "tiny"}, {"config": "tiny"}]
    outcomes = run_on_ranks(start_with, 2, args=(fingerprints,), timeout_s=60.0, rank_env={1: {"WORLD_SIZE": "3"}})
    assert outcomes[0].error_type == "StartupMismatch", outcomes[0].traceback
    assert "world_size: rank 0 has 2, rank 1 has 3" in outcomes[0].error_message
    assert outcomes[1].error_type == "StartupMismatch", outcomes[1].traceback
    assert "world_size: rank 1 has 3, rank 0 has 2" in outcomes[1].error_message


def test_describe_differences_lists_each_differing_field_with_both_values():
    text = describe_differences({"a": 1, "b": "x", "c": 3}, {"a": 1, "b": "y", "d": 4}, 0, 2)
    assert text == ("b: rank 0 has 'x', rank 2 has 'y'; c: rank 0 has 3, rank 2 has '<missing>'; "
                    "d: rank 0 has '<missing>', rank 2 has 4")

