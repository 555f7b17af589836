"""all_gather and all_to_all over W = 2 and 4 gloo ranks: exact data movement, rank order."""
from __future__ import annotations

import torch
from hypothesis import given

from dsahal.conformance import assertions as A
from dsahal.conformance.distributed import RankPoolError, run_on_ranks
from dsahal.conformance.harness import conformance_property
from dsahal.conformance.strategies import collective_cases


def _on_ranks(run, name, per_rank):
    try:
        answers = run_on_ranks(run.backend, name, per_rank)
    except RankPoolError as exc:
        run.fail(f"the collective failed on the ranks: {exc}")
    for _, calls in answers:
        run.record_calls(calls)
    return [result for result, _ in answers]


@conformance_property("all_gather", "all_gather.stacks_every_rank", needs=("distributed",), scale=0.3)
@given(case=collective_cases())
def test_all_gather_stacks_every_ranks_tensor_in_rank_order(case, conformance):
    conformance.begin(case)
    inputs = case.replace(splits=None).build().inputs  # all_gather needs one shape on every rank
    results = _on_ranks(conformance, "all_gather", [(x,) for x in inputs])
    expected = torch.stack(inputs)
    for rank, got in enumerate(results):
        A.assert_equal(conformance, f"rank {rank} all_gather", got, expected)


@conformance_property("all_to_all", "all_to_all.exchanges_slices", needs=("distributed",), scale=0.3)
@given(case=collective_cases())
def test_all_to_all_delivers_each_slice_to_its_rank(case, conformance):
    conformance.begin(case)
    inputs = case.build().inputs
    world = case.world
    if case.splits is None:
        splits = [[case.rows] * world for _ in range(world)]
        per_rank = [(x, None, None) for x in inputs]
    else:
        splits = [list(s) for s in case.splits]
        per_rank = [(inputs[r], [splits[s][r] for s in range(world)], splits[r]) for r in range(world)]
    results = _on_ranks(conformance, "all_to_all", per_rank)
    for rank, got in enumerate(results):
        pieces = []
        for source in range(world):
            start = sum(splits[source][:rank])
            pieces.append(inputs[source][start: start + splits[source][rank]])
        A.assert_equal(conformance, f"rank {rank} all_to_all", got, torch.cat(pieces))
