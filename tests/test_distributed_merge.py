"""The exact DCP top-k merge, its 32-bit packing and its traffic, on simulated ranks in one process.

The gloo tests (test_distributed_gloo.py) check that real ranks return what this simulation returns.
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsahal import ops
from dsahal.distributed import local_context_lengths, merge_in_process, plan_merge, round_scores_for_merge
from dsahal.distributed.merge import first_round_payload_bytes, merge_traffic
from dsahal.distributed.packing import id_bits_for_width, key_to_score, score_key

SETTINGS = settings(max_examples=40, deadline=None)


def shard_scores(scores, lengths, world):
    """Global ``[T, W·N]`` scores and lengths -> per-rank local scores and lengths (token p on rank p % W)."""
    return ([scores[:, r::world] for r in range(world)],
            [local_context_lengths(lengths, r, world) for r in range(world)])


def single_device(scores, lengths, k, world):
    """What the merge must equal: top-k of the merge-rounded gathered scores, smaller position first on ties."""
    return ops.topk(round_scores_for_merge(scores, scores.shape[1] // world), lengths, k)


def random_scores(gen, rows, width, style, world=1):
    if style == "one_hot_rank":  # most winners on one rank: its first-round candidates run out
        scores = torch.randn(rows, width, generator=gen)
        scores[:, world - 1::world] += 3.0
    elif style == "ties":
        scores = torch.randint(0, 3, (rows, width), generator=gen).float()
    elif style == "huge":
        scores = (torch.rand(rows, width, generator=gen) - 0.5) * 6e38
    else:
        scores = torch.randn(rows, width, generator=gen)
    scores[torch.rand(rows, width, generator=gen) < 0.15] = float("-inf")
    return scores


@SETTINGS
@given(seed=st.integers(0, 2**16), world=st.sampled_from([1, 2, 3, 4, 8]), rows=st.integers(1, 4),
       local_width=st.integers(1, 24), k=st.integers(1, 60),
       style=st.sampled_from(["normal", "ties", "huge", "one_hot_rank"]))
def test_merge_equals_single_device_topk_on_rounded_scores(seed, world, rows, local_width, k, style):
    gen = torch.Generator().manual_seed(seed)
    scores = random_scores(gen, rows, world * local_width, style, world)
    lengths = torch.randint(0, world * local_width + 1, (rows,), generator=gen).int()  # any L, not only multiples
    got, _ = merge_in_process(*shard_scores(scores, lengths, world), k)
    assert torch.equal(got, single_device(scores, lengths, k, world))


@pytest.mark.parametrize("world", [2, 4, 8])
def test_all_winners_on_one_rank_are_recovered_by_a_resend(world):
    gen = torch.Generator().manual_seed(world)
    k, width = 32, 64 * world
    scores = torch.randn(3, width, generator=gen)
    scores[:, 1::world] += 100.0  # every winner lives on rank 1
    lengths = torch.full((3,), width, dtype=torch.int32)
    got, stats = merge_in_process(*shard_scores(scores, lengths, world), k)
    assert torch.equal(got, single_device(scores, lengths, k, world))
    assert stats[1].resend_rows[1] == 3 and stats[1].resend_bytes > 0
    assert torch.all(got.long() % world == 1)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_heavy_ties_across_ranks_go_to_the_smallest_global_positions(world):
    k, width = 40, 24 * world
    scores = torch.full((2, width), 7.0)
    lengths = torch.tensor([width, 23], dtype=torch.int32)
    got, _ = merge_in_process(*shard_scores(scores, lengths, world), k)
    assert torch.equal(got[0], torch.arange(k, dtype=torch.int32))
    assert torch.equal(got[1], torch.cat([torch.arange(23), torch.full((k - 23,), -1)]).int())


def test_rows_shorter_than_k_are_padded_with_minus_one():
    scores = torch.randn(2, 12)
    lengths = torch.tensor([5, 0], dtype=torch.int32)
    got, _ = merge_in_process(*shard_scores(scores, lengths, 4), 8)
    assert torch.equal(got[0, 5:], torch.full((3,), -1, dtype=torch.int32))
    assert sorted(got[0, :5].tolist()) == list(range(5))
    assert torch.equal(got[1], torch.full((8,), -1, dtype=torch.int32))


def test_minus_inf_scores_are_never_selected():
    scores = torch.tensor([[1.0, float("-inf"), 2.0, float("-inf"), 0.5, float("-inf")]])
    got, _ = merge_in_process(*shard_scores(scores, torch.tensor([6]), 2), 5)
    assert got.tolist() == [[2, 0, 4, -1, -1]]


def test_one_rank_op_call_equals_single_device_topk():
    """W = 1 through dsahal.ops.topk_merge without torch.distributed initialised."""
    gen = torch.Generator().manual_seed(3)
    scores = random_scores(gen, 4, 30, "ties")
    lengths = torch.tensor([30, 17, 1, 0], dtype=torch.int32)
    got = ops.topk_merge(scores, lengths, 9)
    assert torch.equal(got, single_device(scores, lengths, 9, 1))
    assert merge_traffic.last.world == 1 and merge_traffic.last.resend_bytes == 0


def test_score_key_orders_like_floats_and_round_trips():
    values = torch.tensor([float("-inf"), -3e38, -1.5, -1e-45, 0.0, 1e-45, 2.0, 3e38, float("inf")])
    keys = score_key(values)
    assert torch.all(keys[1:] > keys[:-1])
    assert torch.equal(key_to_score(keys), values)
    assert torch.equal(score_key(torch.tensor([-0.0])), score_key(torch.tensor([0.0])))


def test_merge_rounding_is_monotone_keeps_finite_and_matches_bf16_classes_at_16_id_bits():
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(4000, generator=gen) * 10 ** torch.randint(-30, 30, (4000,), generator=gen),
                   torch.tensor([-3.4e38, 3.4e38, float("-inf")])]).sort().values
    rounded = round_scores_for_merge(x, 65536)
    assert id_bits_for_width(65536) == 16
    assert torch.all(rounded[1:] >= rounded[:-1]) and torch.all(rounded <= x)
    assert torch.equal(torch.isfinite(rounded), torch.isfinite(x))
    # Same class <=> same sign and same bf16-truncated magnitude.
    truncated = (x.abs().view(torch.int32) & ~0xFFFF).view(torch.float32) * torch.sign(x)
    same_class = rounded[1:] == rounded[:-1]
    same_truncation = (truncated[1:] == truncated[:-1]) & (torch.sign(x[1:]) == torch.sign(x[:-1]))
    assert torch.equal(same_class, same_truncation)


def test_local_width_beyond_23_id_bits_is_rejected():
    with pytest.raises(ValueError, match="topk_merge: local score width expected <= 2\\*\\*23"):
        id_bits_for_width(2**23 + 1)


def test_traffic_at_w8_k2048_is_over_8x_below_the_generic_merge():
    """Messages measured on simulated ranks with random scores (no resend happens); also the formula."""
    world, k, rows, local_width = 8, 2048, 4, 131072 // 8  # 128K context
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(rows, world * local_width, generator=gen)
    lengths = torch.full((rows,), world * local_width, dtype=torch.int32)
    _, stats = merge_in_process(*shard_scores(scores, lengths, world), k)
    plan = plan_merge(k, local_width, world)
    assert plan.candidates == math.ceil(1.5 * k / world) == 384
    assert all(s.resend_bytes == 0 for s in stats)
    assert stats[0].payload_bytes == first_round_payload_bytes(rows, plan) == 4 * (2 + rows * 384)
    assert stats[0].generic_payload_bytes == rows * k * 8
    print(f"\nW=8 k=2048 rows={rows}: packed {stats[0].payload_bytes} B vs generic {stats[0].generic_payload_bytes} B "
          f"per rank, {stats[0].traffic_ratio:.2f}x less (key bits {plan.key_bits})")
    assert stats[0].traffic_ratio >= 8.0


def test_the_traffic_log_totals_every_merge_and_keeps_the_last():
    merge_traffic.reset()
    scores, lengths = torch.randn(3, 20), torch.full((3,), 20, dtype=torch.int32)
    ops.topk_merge(scores, lengths, 4)
    ops.topk_merge(scores[:1], lengths[:1], 6)
    assert merge_traffic.calls == 2 and merge_traffic.last.rows == 1 and merge_traffic.last.k == 6
    assert merge_traffic.payload_bytes == 4 * (2 + 3 * 4) + 4 * (2 + 1 * 6)
    assert merge_traffic.generic_payload_bytes == 8 * (3 * 4 + 1 * 6)
