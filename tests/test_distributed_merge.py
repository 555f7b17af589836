"""The exact DCP top-k merge, its 32-bit packing and its traffic, on simulated ranks in one process.

The merge must return the set of ``dsahal.ops.topk`` on the gathered *raw* fp32 scores, whatever the
32-bit packing rounded away. The gloo tests (test_distributed_gloo.py) check that real ranks return
what this simulation returns.
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsahal import ops
from dsahal.distributed import local_context_lengths, merge_in_process, plan_merge, round_scores_for_merge
from dsahal.distributed.merge import exact_topk_merge, first_round_payload_bytes, merge_traffic
from dsahal.distributed.packing import id_bits_for_width, key_to_score, score_key, truncated_key

SETTINGS = settings(max_examples=40, deadline=None)
COARSE_WIDTH = 4096  # local width with 12 id bits: 20 key bits, 11 mantissa bits survive the packing


def shard_scores(scores, lengths, world):
    """Global ``[T, W·N]`` scores and lengths -> per-rank local scores and lengths (token p on rank p % W)."""
    return ([scores[:, r::world] for r in range(world)],
            [local_context_lengths(lengths, r, world) for r in range(world)])


def assert_same_topk_set(got, expected):
    """Row by row the same set of positions as the single-device top-k, valid ones first, -1 padding last."""
    assert got.shape == expected.shape and got.dtype == torch.int32
    for row_got, row_expected in zip(got.tolist(), expected.tolist()):
        valid = [p for p in row_expected if p >= 0]
        assert sorted(row_got[:len(valid)]) == sorted(valid)
        assert row_got[len(valid):] == [-1] * (len(row_got) - len(valid))


def merge_and_check(scores, lengths, k, world):
    """Merge on ``world`` simulated ranks and check against ``dsahal.ops.topk`` on the raw scores."""
    got, stats = merge_in_process(*shard_scores(scores, lengths, world), k)
    assert_same_topk_set(got, ops.topk(scores, lengths.int(), k))
    return got, stats


def random_scores(gen, rows, width, style, world=1):
    if style == "one_hot_rank":  # most winners on one rank: its first-round candidates run out
        scores = torch.randn(rows, width, generator=gen)
        scores[:, world - 1::world] += 3.0
    elif style == "ties":
        scores = torch.randint(0, 3, (rows, width), generator=gen).float()
    elif style == "huge":
        scores = (torch.rand(rows, width, generator=gen) - 0.5) * 6e38
    elif style == "collide":  # steps of 2**-20 near 1: distinct raw scores sharing rounded keys, and exact ties
        scores = 1.0 + torch.randint(0, 48, (rows, width), generator=gen).float() * 2.0 ** -20
    else:
        scores = torch.randn(rows, width, generator=gen)
    scores[torch.rand(rows, width, generator=gen) < 0.15] = float("-inf")
    return scores


@SETTINGS
@given(seed=st.integers(0, 2**16), world=st.sampled_from([1, 2, 3, 4, 8]), rows=st.integers(1, 4),
       local_width=st.integers(1, 24), k=st.integers(1, 60),
       style=st.sampled_from(["normal", "ties", "huge", "one_hot_rank", "collide"]))
def test_merge_equals_single_device_topk_on_raw_scores(seed, world, rows, local_width, k, style):
    gen = torch.Generator().manual_seed(seed)
    scores = random_scores(gen, rows, world * local_width, style, world)
    lengths = torch.randint(0, world * local_width + 1, (rows,), generator=gen).int()  # any L, not only multiples
    merge_and_check(scores, lengths, k, world)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), world=st.sampled_from([1, 2, 4]), k=st.integers(1, 40),
       context=st.integers(1, 160))
def test_merge_is_exact_where_coarse_keys_put_most_scores_in_one_rounding_class(seed, world, k, context):
    """Wide local rows (12 id bits) leave 11 mantissa bits: scores 1 + i·2**-20 collide in whole groups."""
    gen = torch.Generator().manual_seed(seed)
    scores = 1.0 + torch.randint(0, 2**12, (2, world * COARSE_WIDTH), generator=gen).float() * 2.0 ** -20
    scores[torch.rand(scores.shape, generator=gen) < 0.1] = float("-inf")
    lengths = torch.tensor([context, max(0, context - 7)], dtype=torch.int32)
    merge_and_check(scores, lengths, k, world)


def test_near_ties_are_decided_by_the_raw_score_not_the_position():
    """1.0 and 1.0 + 2**-20 share a rounded key at 16 id bits; the larger raw score must win."""
    world, width = 2, 2 * 65536
    assert plan_merge(1, width // world, world).key_bits == 16
    scores = torch.full((1, width), float("-inf"))
    scores[0, 0], scores[0, 1] = 1.0, 1.0 + 2.0 ** -20
    assert torch.equal(round_scores_for_merge(scores[:, 0], 65536), round_scores_for_merge(scores[:, 1], 65536))
    got, stats = merge_and_check(scores, torch.tensor([width]), 1, world)
    assert got.tolist() == [[1]]
    # At k = 1 the exact protocol's worst case (header, resend, completion) exceeds the generic merge's
    # 8 B per row, so the call is the generic merge, which compares raw scores directly.
    assert stats[0].protocol == "generic" and stats[0].payload_bytes == stats[0].generic_payload_bytes == 8
    scores[0, 2:9] = 2.0  # k = 8: the exact protocol; seven clear winners, the near tie decides the last slot
    got, stats = merge_and_check(scores, torch.tensor([width]), 8, world)
    assert sorted(got[0].tolist()) == list(range(1, 9))
    assert stats[0].protocol != "generic" and stats[0].band_rows == 1


@pytest.mark.parametrize("world", [1, 2, 4])
def test_band_members_past_a_ranks_local_top_k_are_found(world):
    """Every score shares one rounded key and rises with the position: each rank's best raw scores are its
    *last* local ids, which its packed ranking (smaller id first) puts past its local top-k."""
    width, context, k = world * COARSE_WIDTH, 64 * world, 8
    scores = torch.full((1, width), float("-inf"))
    scores[0, :context] = 1.0 + torch.arange(context) * 2.0 ** -23  # consecutive floats above 1
    assert torch.unique(round_scores_for_merge(scores[:, :context], COARSE_WIDTH)).numel() == 1
    got, stats = merge_and_check(scores, torch.tensor([context]), k, world)
    assert sorted(got[0].tolist()) == list(range(context - k, context))
    assert stats[0].band_rows == 1


@pytest.mark.parametrize("world", [2, 4, 8])
def test_all_winners_on_one_rank_are_recovered_by_a_resend(world):
    gen = torch.Generator().manual_seed(world)
    k, width = 32, 64 * world
    scores = torch.randn(3, width, generator=gen)
    scores[:, 1::world] += 100.0  # every winner lives on rank 1
    lengths = torch.full((3,), width, dtype=torch.int32)
    got, stats = merge_and_check(scores, lengths, k, world)
    assert stats[1].resend_rows[1] == 3 and stats[1].resend_bytes > 0
    assert torch.all(got.long() % world == 1)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_heavy_ties_across_ranks_go_to_the_smallest_global_positions(world):
    k, width = 40, 24 * world
    scores = torch.full((2, width), 7.0)
    lengths = torch.tensor([width, 23], dtype=torch.int32)
    got, _ = merge_and_check(scores, lengths, k, world)
    assert sorted(got[0].tolist()) == list(range(k))
    assert sorted(got[1, :23].tolist()) == list(range(23)) and got[1, 23:].eq(-1).all()


@pytest.mark.parametrize("world", [2, 4])
def test_exact_raw_ties_inside_a_band_go_to_the_smallest_global_positions(world):
    """Two raw values in one rounding class, each repeated on every rank: the band round orders by raw
    score, then by position."""
    width, k = world * COARSE_WIDTH, 5
    scores = torch.full((1, width), float("-inf"))
    scores[0, :4 * world] = 1.0  # many copies of the lower value, on every rank
    scores[0, 4 * world:4 * world + 3] = 1.0 + 2.0 ** -20  # three of the higher one
    got, stats = merge_and_check(scores, torch.tensor([width]), k, world)
    assert sorted(got[0].tolist()) == [0, 1, 4 * world, 4 * world + 1, 4 * world + 2]
    assert stats[0].band_rows == 1


def test_a_rank_with_more_band_members_than_twice_the_free_slots_sends_only_its_best_as_pairs():
    """Rank 1 holds 7 clear winners; rank 0 holds a band of 6 for the last slot (m = 1): it sends one
    (score, id) pair, 8 B, instead of its 6 scores, 24 B."""
    world, width, k = 2, 64, 8
    scores = torch.full((1, width), -1.0)
    scores[0, 1:15:2] = 100.0 + torch.arange(7.0)  # rank 1
    band = 5.0 + torch.tensor([3.0, 0.0, 5.0, 1.0, 4.0, 2.0]) * 2.0 ** -20  # rank 0, one rounding class
    scores[0, 0:12:2] = band
    assert torch.unique(round_scores_for_merge(band, width // world)).numel() == 1
    got, stats = merge_and_check(scores, torch.tensor([width]), k, world)
    assert 4 in got[0].tolist()  # band member 5.0 + 5·2**-20 at local id 2 of rank 0
    assert stats[0].band_bytes == 8 and stats[1].band_bytes == 0 and stats[0].band_rows == 1


def test_rows_shorter_than_k_are_padded_with_minus_one():
    scores = torch.randn(2, 12)
    lengths = torch.tensor([5, 0], dtype=torch.int32)
    got, _ = merge_and_check(scores, lengths, 8, 4)
    assert torch.equal(got[0, 5:], torch.full((3,), -1, dtype=torch.int32))
    assert sorted(got[0, :5].tolist()) == list(range(5))
    assert torch.equal(got[1], torch.full((8,), -1, dtype=torch.int32))


def test_minus_inf_scores_are_never_selected():
    scores = torch.tensor([[1.0, float("-inf"), 2.0, float("-inf"), 0.5, float("-inf")]])
    got, _ = merge_and_check(scores, torch.tensor([6]), 5, 2)
    assert got.tolist() == [[2, 0, 4, -1, -1]]


def test_winners_come_best_first_by_rounded_key():
    gen = torch.Generator().manual_seed(5)
    scores = random_scores(gen, 4, 4 * COARSE_WIDTH, "collide")
    got, _ = merge_and_check(scores, torch.full((4,), 4 * COARSE_WIDTH), 30, 4)
    keys = truncated_key(scores.gather(1, got.long()), id_bits_for_width(COARSE_WIDTH))
    assert torch.all(keys[:, 1:] <= keys[:, :-1])


def test_one_rank_exact_merge_equals_single_device_topk():
    """W = 1 through the packed merge's entry point without torch.distributed initialised."""
    gen = torch.Generator().manual_seed(3)
    scores = random_scores(gen, 4, 30, "ties")
    lengths = torch.tensor([30, 17, 1, 0], dtype=torch.int32)
    got = exact_topk_merge(scores, lengths, 9)
    assert_same_topk_set(got, ops.topk(scores, lengths, 9))
    assert merge_traffic.last.world == 1 and merge_traffic.last.resend_bytes == 0
    assert merge_traffic.last.band_rows > 0 and merge_traffic.last.wire_bytes == 0


def test_widths_the_packed_words_cannot_carry_are_merged_all_the_same():
    """An empty shard (N = 0) gives -1 rows; N past 2^23 (ids wider than the words' 23 bits) goes to the generic
    merge: both the reference's answer (the route used to raise for widths the op accepts)."""
    from dsahal.reference.topk import topk_merge as reference_merge

    empty = torch.zeros(3, 0)
    lengths = torch.zeros(3, dtype=torch.int32)
    got = exact_topk_merge(empty, lengths, 4)
    assert got.dtype == torch.int32 and torch.equal(got, torch.full((3, 4), -1, dtype=torch.int32))
    assert torch.equal(got, reference_merge(empty, lengths, 4, None).to(torch.int32))
    gen = torch.Generator().manual_seed(8)
    wide = torch.randn(2, 2**23 + 5, generator=gen)
    lengths = torch.tensor([2**23 + 5, 2**23 + 1], dtype=torch.int32)
    wide[0, -3:] = 1e9  # winners past 2^23: their ids need 24 bits
    got = exact_topk_merge(wide, lengths, 6)
    assert_same_topk_set(got, reference_merge(wide, lengths, 6, None))
    assert {2**23 + 2, 2**23 + 3, 2**23 + 4} <= set(got[0].tolist())


def test_score_key_orders_like_floats_and_round_trips():
    values = torch.tensor([float("-inf"), -3e38, -1.5, -1e-45, 0.0, 1e-45, 2.0, 3e38, float("inf")])
    keys = score_key(values)
    assert torch.all(keys[1:] > keys[:-1])
    assert torch.equal(key_to_score(keys), values)
    assert torch.equal(score_key(torch.tensor([-0.0])), score_key(torch.tensor([0.0])))


def test_rounded_keys_are_monotone_and_match_bf16_classes_at_16_id_bits():
    """The band argument: a larger rounded key means a larger raw score."""
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(4000, generator=gen) * 10 ** torch.randint(-30, 30, (4000,), generator=gen),
                   torch.tensor([-3.4e38, 3.4e38, float("-inf")])]).sort().values
    keys = truncated_key(x, id_bits_for_width(65536))
    assert id_bits_for_width(65536) == 16
    assert torch.all(keys[1:] >= keys[:-1])
    rounded = round_scores_for_merge(x, 65536)
    assert torch.all(rounded <= x) and torch.equal(torch.isfinite(rounded), torch.isfinite(x))
    # Same class <=> same sign and same bf16-truncated magnitude.
    truncated = (x.abs().view(torch.int32) & ~0xFFFF).view(torch.float32) * torch.sign(x)
    same_class = keys[1:] == keys[:-1]
    same_truncation = (truncated[1:] == truncated[:-1]) & (torch.sign(x[1:]) == torch.sign(x[:-1]))
    assert torch.equal(same_class, same_truncation)


def test_local_width_beyond_23_id_bits_is_rejected():
    with pytest.raises(ValueError, match="topk_merge: local score width expected <= 2\\*\\*23"):
        id_bits_for_width(2**23 + 1)


def test_rows_whose_rounded_keys_separate_the_winners_skip_the_band_round():
    scores = torch.arange(64, dtype=torch.float32).flip(0)[None, :].repeat(3, 1)  # distinct classes
    lengths = torch.full((3,), 64, dtype=torch.int32)
    _, stats = merge_and_check(scores, lengths, 10, 4)
    assert all(s.band_rows == 0 and s.band_bytes == 0 for s in stats)
    assert stats[0].payload_bytes == first_round_payload_bytes(3, plan_merge(10, 16, 4))


def test_traffic_at_w8_k2048_is_over_8x_below_the_generic_merge():
    """128K context of indexer-like scores (relu'd sums). Without resend or band round the ratio is
    2k/c = 10.7x; the band round (raw scores of the threshold's rounding class) costs a few bytes."""
    world, k, rows, local_width = 8, 2048, 4, 131072 // 8
    gen = torch.Generator().manual_seed(0)
    scores = sum(torch.rand(rows, 1, generator=gen) * torch.relu(torch.randn(rows, world * local_width,
                                                                              generator=gen)) for _ in range(4))
    lengths = torch.full((rows,), world * local_width, dtype=torch.int32)
    _, stats = merge_and_check(scores, lengths, k, world)
    plan = plan_merge(k, local_width, world)
    assert plan.candidates == math.ceil(1.5 * k / world) == 384
    assert all(s.resend_bytes == 0 for s in stats)
    assert stats[0].first_round_bytes == first_round_payload_bytes(rows, plan) == 4 * (2 + rows * 384)
    assert stats[0].generic_payload_bytes == rows * k * 8
    band = sum(s.band_bytes for s in stats) / world
    total = stats[0].first_round_bytes + band
    print(f"\nW=8 k=2048 rows={rows} (key bits {plan.key_bits}): first round {stats[0].first_round_bytes} B "
          f"({stats[0].generic_payload_bytes / stats[0].first_round_bytes:.2f}x less than generic "
          f"{stats[0].generic_payload_bytes} B); band round in {stats[0].band_rows}/{rows} rows, {band:.0f} B per rank: "
          f"{stats[0].generic_payload_bytes / total:.2f}x less")
    assert stats[0].generic_payload_bytes / stats[0].first_round_bytes > 10.6
    assert all(s.traffic_ratio >= 8.0 for s in stats)


def test_band_round_bytes_count_in_the_payload_and_the_ratio():
    gen = torch.Generator().manual_seed(1)
    scores = random_scores(gen, 3, 4 * COARSE_WIDTH, "collide")
    _, stats = merge_and_check(scores, torch.full((3,), 4 * COARSE_WIDTH), 24, 4)
    for s in stats:
        assert s.band_rows == 3 and s.band_bytes + s.completion_bytes > 0
        assert s.payload_bytes == s.first_round_bytes + s.resend_bytes + s.band_bytes + s.completion_bytes
        assert s.traffic_ratio == s.generic_payload_bytes / s.payload_bytes >= 1.0


def test_the_traffic_log_totals_every_merge_and_keeps_the_last():
    merge_traffic.reset()
    scores = torch.arange(60, dtype=torch.float32).reshape(3, 20)  # distinct rounded keys: no band round
    lengths = torch.full((3,), 20, dtype=torch.int32)
    exact_topk_merge(scores, lengths, 4)
    exact_topk_merge(scores[:1], lengths[:1], 6)
    assert merge_traffic.calls == 2 and merge_traffic.last.rows == 1 and merge_traffic.last.k == 6
    first_round = [first_round_payload_bytes(rows, plan_merge(k, 20, 1)) for rows, k in ((3, 4), (1, 6))]
    assert merge_traffic.payload_bytes == sum(first_round) == 4 * (2 + 3 * 5) + 4 * (2 + 1 * 7)  # c = k + 1 at W = 1
    assert merge_traffic.generic_payload_bytes == 8 * (3 * 4 + 1 * 6)
    assert merge_traffic.rows == 4 and merge_traffic.band_rows == 0
    exact_topk_merge(torch.full((2, 20), 3.0), lengths[:2], 4)  # one class, 20 members for 4 slots
    assert merge_traffic.band_rows == 2
