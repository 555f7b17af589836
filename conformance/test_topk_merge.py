"""topk_merge: over W = 2 and 4 gloo ranks, and W = 8 (where a rank sends under k/5 candidates and
the resend path carries most of a concentrated row), every rank returns exactly the single-device
top-k of the gathered scores (same tie rule), including all winners on one rank, heavy ties and
short rows."""
from __future__ import annotations

import pytest
from hypothesis import example, given

from dsahal.conformance import assertions as A
from dsahal.conformance.cases import MergeCase
from dsahal.conformance.distributed import RankPoolError, run_on_ranks
from dsahal.conformance.harness import conformance_property
from dsahal.conformance.ranks_wide import WIDE_WORLD, run_on_wide_ranks, shutdown_wide_pool
from dsahal.conformance.strategies import merge_cases

# Every winner on one rank: a merge sending only ~1.5k/W candidates per rank must resend.
ALL_WINNERS_ON_ONE_RANK = (
    MergeCase(world=2, rows=2, k=8, lengths=(40, 23), mode="continuous", neg_inf_fraction=0.0, concentrated=True,
              hot_rank=1, seed=3),
    MergeCase(world=4, rows=2, k=12, lengths=(64, 50), mode="palette", neg_inf_fraction=0.0, concentrated=True,
              hot_rank=2, seed=4),
)
# W = 8: every winner of rows as long as 8 ranks x (k + 1) on one rank, which sends ceil(1.5k/8) of them
# and must resend the other ~80%; a palette row adds heavy ties (the band round) on top.
RESEND_AT_EIGHT = (
    MergeCase(world=WIDE_WORLD, rows=2, k=24, lengths=(320, 250), mode="continuous", neg_inf_fraction=0.0,
              concentrated=True, hot_rank=5, seed=19),
    MergeCase(world=WIDE_WORLD, rows=1, k=20, lengths=(300,), mode="palette", neg_inf_fraction=0.0, concentrated=True,
              hot_rank=7, seed=20),
)


def _check_merge(conformance, case, run_ranks):
    conformance.begin(case)
    a = case.build()
    per_rank = [(a.local_scores[r], a.local_lengths[r], a.k) for r in range(case.world)]
    try:
        answers = run_ranks(conformance.backend, "topk_merge", per_rank)
    except RankPoolError as exc:
        conformance.fail(f"the collective failed on the ranks: {exc}")
    for _, calls in answers:
        conformance.record_calls(calls)
    expected = conformance.table.reference["topk"](a.scores, a.lengths, a.k)
    for rank, (got, _) in enumerate(answers):
        A.assert_topk_rows(conformance, got, a.scores, a.lengths, a.k, expected, exact_set=True,
                           what=f"rank {rank} of {case.world}")


@conformance_property("topk_merge", "topk_merge.equals_single_device", needs=("distributed",), scale=0.5)
@given(case=merge_cases())
@example(case=ALL_WINNERS_ON_ONE_RANK[0])
@example(case=ALL_WINNERS_ON_ONE_RANK[1])
def test_topk_merge_equals_single_device_topk(case, conformance):
    _check_merge(conformance, case, run_on_ranks)


@pytest.fixture(scope="module")
def wide_ranks():
    """The 8-rank gloo pool, started by the first example and stopped with this module."""
    yield run_on_wide_ranks
    shutdown_wide_pool()


@conformance_property("topk_merge", "topk_merge.equals_single_device_w8", needs=("distributed",), scale=0.2)
@given(case=merge_cases(worlds=(WIDE_WORLD,), max_k=32, max_width=400))
@example(case=RESEND_AT_EIGHT[0])
@example(case=RESEND_AT_EIGHT[1])
def test_topk_merge_at_eight_ranks_equals_single_device_topk(case, conformance, wide_ranks):
    _check_merge(conformance, case, wide_ranks)


@conformance_property("topk_merge", "topk_merge.rejects_bad_input", scale=0.2)
@given(case=merge_cases(worlds=(2,)))
def test_topk_merge_rejects_bad_input(case, conformance):
    """Validation happens on each rank before any communication, so a single process checks it
    (the valid call runs as a group of one)."""
    import torch

    from dsahal import ops
    from dsahal.conformance.badinput import check_rejections

    conformance.begin(case)
    a = case.build()
    scores, lengths = a.local_scores[0], a.local_lengths[0]
    conformance.call(lambda: ops.topk_merge(scores, lengths, a.k))
    too_long = lengths.clone()
    too_long[0] = scores.shape[1] + 1
    check_rejections(conformance, "topk_merge", {
        "local_scores bf16": (lambda: ops.topk_merge(scores.bfloat16(), lengths, a.k), TypeError),
        "local_lengths of another row count": (lambda: ops.topk_merge(scores, torch.cat([lengths, lengths]), a.k),
                                               ValueError),
        "local length beyond the local width": (lambda: ops.topk_merge(scores, too_long, a.k), ValueError),
        "k = 0": (lambda: ops.topk_merge(scores, lengths, 0), ValueError),
    })
