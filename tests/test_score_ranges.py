"""A DSA layer's ``[T, context]`` fp32 index scores stay within a budget (:mod:`dsahal.ops.score_ranges`).

A 16K-token prefill at 128K would have allocated 8 GiB of scores. Past ``SCORES_BUDGET_BYTES`` the layer scores and
selects over token ranges, then runs one sparse-MLA call on every range's slots. Here: the ranges' arithmetic; the
composite layer (what a backend without a fused one gets) on the reference's stages; and, under
``TRITON_INTERPRET=1`` in a child process, the nvidia backend's fused layer with the budget lowered to two tokens a
range (5 tokens of two requests, interleaved: a request's tokens fall in several ranges): bitwise the one-range
output, and the float64 reference layer's within tolerance (so the compared outputs are real).
"""
from __future__ import annotations

import json

import pytest
import torch

from dsa_layer_case import small_layer_args
from interpreter_child import child_results, run_groups

from dsahal.ops import score_ranges as budget
from dsahal.ops.score_ranges import score_ranges


def test_ranges_cover_the_tokens_within_the_budget(monkeypatch):
    monkeypatch.setattr(budget, "SCORES_BUDGET_BYTES", 512 * 2**20)  # the default (DSAHAL_SCRATCH_MIB unset)
    assert score_ranges(640, 131072) == [(0, 640)]  # a decode batch: one range
    prefill = score_ranges(16384, 131072)
    assert len(prefill) == 16 and prefill[0] == (0, 1024) and prefill[-1] == (15360, 16384)
    assert all(a[1] == b[0] for a, b in zip(prefill, prefill[1:]))
    assert score_ranges(3, 2**40) == [(0, 1), (1, 2), (2, 3)]  # a row past the budget: a token a range
    assert score_ranges(0, 131072) == [(0, 0)]  # the stages still run once, on empty inputs


def test_a_range_is_planned_for_its_share_of_the_requests():
    from dsahal.ops.score_ranges import requests_in_range

    assert requests_in_range(64, 320, 320) == 64  # the one range: the block table's rows
    # ranges of whole requests of a 64 x 5 decode batch: 5 tokens a request, as the whole call
    assert requests_in_range(64, 160, 320) == 32 and requests_in_range(64, 80, 320) == 16
    assert requests_in_range(4, 1024, 16384) == 1  # a range of a long prefill: one request's tokens
    assert requests_in_range(64, 1, 320) == 1 and requests_in_range(3, 0, 0) == 1  # never below one


def test_the_indexer_names_a_bad_requests_count():
    from dsahal.backends.triton_kernels.indexer import indexer_score

    args = small_layer_args(5)
    q_index, weights, index_pages, _, _, table, req, pos = args[:8]
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match=r"triton indexer_score: requests expected an int >= 1, got " + str(bad)):
            indexer_score(q_index, weights, index_pages, table, req, pos, "fp8", 40, requests=bad)


def _in_ranges_of_two(layer, args):
    """``layer(*args)`` with the budget lowered to two 40-float score rows (48 with the nvidia layer's padding)."""
    real = budget.SCORES_BUDGET_BYTES
    budget.SCORES_BUDGET_BYTES = 2 * 4 * 48
    try:
        return layer(*args)
    finally:
        budget.SCORES_BUDGET_BYTES = real


def test_the_composite_layer_over_ranges_gives_the_one_range_result(monkeypatch):
    from dsahal.ops import composite

    monkeypatch.delenv("DSAHAL_BACKEND", raising=False)  # the reference's stages
    args = small_layer_args(3)
    calls = []
    real_indexer = composite.ops.indexer_score
    monkeypatch.setattr(composite.ops, "indexer_score", lambda *a, **k: calls.append(a[0].shape[0]) or
                        real_indexer(*a, **k))
    o1, lse1 = composite.dsa_attention(*args)
    assert calls == [5]
    calls.clear()
    o, lse = _in_ranges_of_two(composite.dsa_attention, args)
    assert calls == [2, 2, 1]
    assert torch.equal(o, o1) and torch.equal(lse, lse1)


# ----------------------------------------------------------------------------------------------------
# Child process (TRITON_INTERPRET=1)


def _fused_cases(results):
    from dsahal import ops
    from dsahal.backends.nvidia import ops as nvidia_ops
    from dsahal.backends.triton_kernels import indexer

    args = small_layer_args(11)
    launches = []  # (tokens, the requests it is planned for) of each indexer launch
    real = indexer.indexer_score
    indexer.indexer_score = lambda q, *a, **k: launches.append((q.shape[0], k["requests"])) or real(q, *a, **k)
    try:
        o1, lse1 = nvidia_ops.dsa_attention(*args)
        o, lse = _in_ranges_of_two(nvidia_ops.dsa_attention, args)
    finally:
        indexer.indexer_score = real
    want_o, want_lse = ops.dsa_attention(*args[:8], index_fmt="fp8", kv_fmt="bf16", topk=6, max_context=40,
                                         softmax_scale=0.1)
    results["fused_ranges"] = str(launches)
    results["fused_bitwise"] = bool(torch.equal(o, o1) and torch.equal(lse, lse1))
    rel = float((o1.double() - want_o.double()).norm() / want_o.double().norm())
    results["fused_reference"] = rel < 1e-5 and bool((lse1 - want_lse).abs().max() < 1e-4)


def _run_all() -> dict:
    return run_groups((_fused_cases,))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


def test_the_fused_nvidia_layer_over_ranges_gives_the_one_range_bits(interpreted):
    # the one range planned for the block table's 2 rows, each range of 2 or 1 of the 5 tokens for its share: 1
    assert interpreted["fused_ranges"] == "[(5, 2), (2, 1), (2, 1), (1, 1)]"
    assert interpreted["fused_bitwise"]
    assert interpreted["fused_reference"]


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
