"""The AMD backend's score-only DCP merge on real gloo ranks (2 and 4 processes on 127.0.0.1).

Specification: on every rank, ``score_only_topk_merge`` equals ``dsahal.ops.topk`` (the reference)
on the gathered global scores — same positions, same order — and each rank's local winners are
exactly the global winners it owns. One spawn per world size runs every case; the tests below
read its results.
"""
import math

import pytest
import torch

from dsahal.distributed.testing import run_on_ranks

# Multi-process: two spawns (W = 2, 4), 15-45 s on 2 shared cores.
pytestmark = pytest.mark.slow

K_FOR_RANDOM = (1, 3, 8, 17)
RANDOM_DRAWS = 80  # seeded draws per world size, on top of the named adversarial cases


def _global_case(name, seed):
    """``(scores [T, L], lengths [T], k)`` of one case, identical on every rank (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    if name == "distinct":  # continuous scores, context not divisible by W, rows of every length
        scores = torch.randn(5, 37, generator=gen)
        return scores, torch.tensor([37, 36, 9, 1, 0], dtype=torch.int32), 8
    if name == "all_winners_on_rank_1":
        scores = torch.randn(3, 64, generator=gen)
        scores[:, 1::4] += 100.0  # rank 1 of any W in {2, 4} owns positions 1, 5, 9...: all of them win
        return scores, torch.full((3,), 64, dtype=torch.int32), 12
    if name == "all_equal":  # every candidate ties at the threshold: the smallest positions must win
        return torch.full((3, 45), 7.0), torch.tensor([45, 23, 6], dtype=torch.int32), 10
    if name == "heavy_ties":  # few distinct values: ties at the threshold across every rank
        scores = torch.randint(0, 3, (6, 50), generator=gen).float()
        return scores, torch.tensor([50, 49, 31, 17, 4, 2], dtype=torch.int32), 11
    if name == "shorter_than_k":
        scores = torch.randn(3, 20, generator=gen)
        return scores, torch.tensor([5, 1, 0], dtype=torch.int32), 16
    if name == "minus_inf_rows":  # a fully masked row, a mostly masked one, -inf inside the length
        scores = torch.randn(4, 30, generator=gen)
        scores[0] = float("-inf")
        scores[1, 3:] = float("-inf")
        scores[2, ::2] = float("-inf")
        return scores, torch.tensor([30, 30, 30, 13], dtype=torch.int32), 9
    if name == "k_beyond_context":
        scores = torch.randint(0, 2, (2, 11), generator=gen).float()
        return scores, torch.tensor([11, 7], dtype=torch.int32), 40
    if name == "extreme_magnitudes":
        scores = (torch.rand(3, 40, generator=gen) - 0.5) * 6e38
        scores[:, 5] = float("inf")
        scores[:, 9] = float("inf")
        return scores, torch.full((3,), 40, dtype=torch.int32), 6
    if name == "no_rows":
        return torch.empty(0, 10), torch.empty(0, dtype=torch.int32), 4
    raise KeyError(name)


NAMED_CASES = ("distinct", "all_winners_on_rank_1", "all_equal", "heavy_ties", "shorter_than_k",
               "minus_inf_rows", "k_beyond_context", "extreme_magnitudes", "no_rows")


def _random_case(draw):
    """Seeded random cases: widths not divisible by W, random lengths, ties, -inf sprinkled."""
    gen = torch.Generator().manual_seed(10_000 + draw)
    rows, width = int(torch.randint(1, 5, (1,), generator=gen)), int(torch.randint(1, 48, (1,), generator=gen))
    style = draw % 3
    if style == 0:
        scores = torch.randn(rows, width, generator=gen)
    elif style == 1:
        scores = torch.randint(0, 4, (rows, width), generator=gen).float()
    else:
        scores = torch.randint(-2, 2, (rows, width), generator=gen).float() * 1e30
    scores[torch.rand(rows, width, generator=gen) < 0.2] = float("-inf")
    lengths = torch.randint(0, width + 1, (rows,), generator=gen).int()
    return scores, lengths, K_FOR_RANDOM[draw % len(K_FOR_RANDOM)]


def _shard(scores, lengths, rank, world, seed):
    """Rank ``rank``'s local scores (token p on rank p % W) padded to a common width with garbage
    past the local length, which the merge must ignore, and its local lengths."""
    tokens, context = scores.shape
    width = max(1, math.ceil(context / world))
    local = torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed + rank)) * 1e3
    mine = scores[:, rank::world]
    local[:, : mine.shape[1]] = mine
    local_lengths = torch.clamp((lengths.long() - rank + world - 1) // world, min=0).int()
    return local, local_lengths


def merge_on_rank(rank, world):
    """Worker: run every case on this rank; return {case: (merged, local winners as global positions,
    traffic)}."""
    import torch.distributed as dist

    from dsahal.backends.amd.score_only_merge import score_only_local_winners, score_only_topk_merge

    dist.init_process_group("gloo")
    try:
        cases = [(name, _global_case(name, 7)) for name in NAMED_CASES]
        cases += [(f"random_{d}", _random_case(d)) for d in range(RANDOM_DRAWS)]
        results = {}
        for index, (name, (scores, lengths, k)) in enumerate(cases):
            local, local_lengths = _shard(scores, lengths, rank, world, seed=index)
            merged = score_only_topk_merge(local, local_lengths, k)
            owned = torch.empty(0, k, dtype=torch.long)
            traffic = None
            if scores.shape[0]:
                winners = score_only_local_winners(local, local_lengths, k)
                owned = torch.where(winners.local_index >= 0, winners.local_index * world + rank, -1)
                traffic = vars(winners.traffic)
            # Plain lists: tensors would cross the process boundary through shared memory that
            # dies with this process.
            results[name] = (merged.tolist(), owned.tolist(), traffic)
        return results
    finally:
        dist.destroy_process_group()


def _expected(name):
    from dsahal import ops

    scores, lengths, k = _random_case(int(name.split("_")[1])) if name.startswith("random_") else _global_case(name, 7)
    return ops.topk(scores, lengths, k), scores, k


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"W{w}")
def gloo_results(request):
    world = request.param
    outcomes = run_on_ranks(merge_on_rank, world, timeout_s=120, rank_env={r: {"DSAHAL_BACKEND": "reference"}
                                                                              for r in range(world)})
    failed = [o for o in outcomes if not o.ok]
    assert not failed, "\n".join(f"rank {o.rank}: {o.error_type}: {o.error_message}\n{o.traceback}" for o in failed)
    return world, [o.value for o in outcomes]


@pytest.mark.parametrize("case", NAMED_CASES)
def test_merge_equals_single_device_topk_on_every_rank(gloo_results, case):
    world, per_rank = gloo_results
    expected, _, _ = _expected(case)
    for rank in range(world):
        merged = per_rank[rank][case][0]
        assert merged == expected.tolist(), f"rank {rank} of {world}:\n{merged}\nexpected\n{expected}"


def test_merge_equals_single_device_topk_on_seeded_random_draws(gloo_results):
    world, per_rank = gloo_results
    for draw in range(RANDOM_DRAWS):
        expected, scores, k = _expected(f"random_{draw}")
        for rank in range(world):
            merged = per_rank[rank][f"random_{draw}"][0]
            assert merged == expected.tolist(), f"draw {draw}, rank {rank} of {world}, k={k}:\n{scores}"


@pytest.mark.parametrize("case", [c for c in NAMED_CASES if c != "no_rows"] + ["random_4", "random_5"])
def test_each_rank_owns_exactly_its_share_of_the_winners(gloo_results, case):
    world, per_rank = gloo_results
    expected, _, _ = _expected(case)
    for rank in range(world):
        owned = per_rank[rank][case][1]
        for row in range(expected.shape[0]):
            want = sorted(p for p in expected[row].tolist() if p >= 0 and p % world == rank)
            got = [p for p in owned[row] if p >= 0]
            assert got == want, f"rank {rank}, row {row}"


def test_scores_travel_as_k_floats_per_row_and_ties_only_when_ambiguous(gloo_results):
    world, per_rank = gloo_results
    distinct = per_rank[0]["distinct"][2]
    assert distinct["scores"] == 5 * 8 * 4  # T rows x k fp32 scores
    assert distinct["tie_positions"] == 0  # continuous scores: no row needs the tie exchange
    assert per_rank[0]["all_equal"][2]["tie_positions"] > 0
