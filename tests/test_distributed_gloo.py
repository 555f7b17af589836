"""Distributed merge, DCP decode and token-sharded prefill on real gloo process groups (W = 2 and 4).

Spawned processes are slow to start, so one spawn of 4 ranks runs every case over all 4 ranks and
over a 2-rank subgroup, and hands back what each case computed; each test below checks one
behaviour of those results.
"""
import math

import pytest
import torch

from dsahal import active_table, ops
from dsahal.distributed import (
    dcp_dsa_attention,
    head_sharded_dsa_prefill,
    init_distributed,
    local_context_lengths,
    merge_in_process,
    merge_traffic,
    plan_merge,
    shard_paged_cache,
    shutdown_distributed,
    token_sharded_dsa_prefill,
)
from dsahal.distributed.generic_merge import generic_topk_merge
from dsahal.distributed.merge import exact_topk_merge, first_round_payload_bytes
from dsahal.distributed.testing import count_collective_bytes, run_on_ranks
from dsahal.formats import index_format, latent_format
from dsahal.reference.topk import topk as reference_topk

WORLDS = [2, 4]
INDEX_FMT, KV_FMT = "fp8", "bf16"
SOFTMAX_SCALE = 192 ** -0.5


# ----------------------------------------------------------------------------- inputs shared by all ranks

def merge_scenarios(world):
    """name -> (global scores [T, W·N], global lengths [T], k); built from fixed seeds on every rank."""
    gen = torch.Generator().manual_seed(100 + world)
    width = world * 24
    ties = torch.randint(0, 4, (5, width), generator=gen).float()
    ties[torch.rand(5, width, generator=gen) < 0.1] = float("-inf")
    one_rank = torch.randn(3, width, generator=gen)
    one_rank[:, world - 1::world] += 50.0  # every winner on the last rank: forces resends
    # Local width 4096 leaves 20 key bits: scores 1 + i·2**-21 share rounded keys in groups of 1024,
    # so only the band round's raw scores tell them apart (and ranks hold band members they never sent).
    coarse = 1.0 + torch.randint(0, 3000, (3, world * 4096), generator=gen).float() * 2.0 ** -21
    return {
        "ties_and_ragged_lengths": (ties, torch.tensor([width, width - 1, 7, 1, 0]), 16),
        "all_winners_on_one_rank": (one_rank, torch.full((3,), width), 12),
        "rows_shorter_than_k": (torch.randn(2, width, generator=gen), torch.tensor([5, width - 3]), 3 * width),
        "raw_scores_sharing_rounded_keys": (coarse, torch.tensor([world * 4096, 301, 37]), 20),
        # Issue 20: where the exact protocol would send more than the generic merge, it must not.
        "heavy_ties": (torch.full((4, world * 64), 7.0), torch.full((4,), world * 64), 48),
        "low_bit_differences": (1.0 + torch.randint(0, 64, (3, world * 4096), generator=gen).float() * 2.0 ** -23,
                                torch.full((3,), world * 4096), 96),
    }


def paged_cache(gen, context_lens, block_tokens, kind, fmt):
    """A single-device paged cache holding random tokens for every request; returns (pages, block_table)."""
    spec = index_format(fmt) if kind == "index" else latent_format(fmt)
    blocks = [math.ceil(int(n) / block_tokens) + 1 for n in context_lens]
    order = torch.randperm(sum(blocks), generator=gen).int()
    table = torch.full((len(blocks), max(blocks)), -1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(blocks):
        table[b, :n] = order[start:start + n]
        start += n
    pages = torch.zeros(sum(blocks), block_tokens, spec.token_bytes, dtype=torch.uint8)
    for b, n in enumerate(context_lens.tolist()):
        pos = torch.arange(n)
        slots = table[b].long()[pos // block_tokens] * block_tokens + pos % block_tokens
        ops.cache_write(torch.randn(n, spec.dim, generator=gen), slots, pages, kind=kind, fmt=fmt)
    return pages, table


def attention_inputs(seed, context_lens, block_tokens, req_ids, heads):
    gen = torch.Generator().manual_seed(seed)
    index_pages, table = paged_cache(gen, context_lens, block_tokens, "index", INDEX_FMT)
    kv_pages, _ = paged_cache(torch.Generator().manual_seed(seed + 1), context_lens, block_tokens, "latent", KV_FMT)
    tokens = req_ids.numel()
    return dict(index_pages=index_pages, kv_pages=kv_pages, block_table=table,
                q_index=torch.randn(tokens, 4, 128, generator=gen), index_weights=torch.rand(tokens, 4, generator=gen),
                q=torch.randn(tokens, heads, 576, generator=gen) * 0.3)


# ----------------------------------------------------------------------------- what each rank runs

def run_merge_cases(rank, world, group):
    out = {}
    for name, (scores, lengths, k) in merge_scenarios(world).items():
        local = scores[:, rank::world]
        local_lengths = local_context_lengths(lengths, rank, world)
        with count_collective_bytes() as counted:
            got = exact_topk_merge(local.contiguous(), local_lengths, k, group)
        stats = merge_traffic.last
        # the selected backend's op: the reference here, whose merge is the op's definition (gather all, top-k)
        by_definition = ops.topk_merge(local.contiguous(), local_lengths, k, group)
        simulated, _ = merge_in_process([scores[:, r::world] for r in range(world)],
                                        [local_context_lengths(lengths, r, world) for r in range(world)], k)
        expected = ops.topk(scores, lengths.int(), k)  # single device, raw fp32 scores
        out[name] = dict(got=got, by_definition=by_definition, backend=active_table().record.backend.name,
                         expected=expected, simulated=simulated, stats=stats, counted_bytes=counted.sent_to_peers)
    return out


def run_traffic_case(rank, world, group):
    """Packed vs generic merge on the same scores, bytes counted at the torch.distributed calls."""
    tokens, k, width = 4, 256, 512
    scores = torch.randn(tokens, width, generator=torch.Generator().manual_seed(7 + rank))
    lengths = torch.full((tokens,), width, dtype=torch.int32)
    with count_collective_bytes() as packed:
        exact_topk_merge(scores, lengths, k, group)
    with count_collective_bytes() as generic:
        generic_topk_merge(scores, lengths, k, group, local_topk=reference_topk)
    return dict(packed=packed.sent_to_peers, generic=generic.sent_to_peers, stats=merge_traffic.last,
                expected_packed=first_round_payload_bytes(tokens, plan_merge(k, width, world)) * (world - 1))


def run_dcp_decode_case(rank, world, group):
    """Two requests (lengths not multiples of W), speculative decode: 3 query tokens + 1."""
    context_lens, block_tokens, k = torch.tensor([37, 50]), 4, 16
    req_ids = torch.tensor([0, 0, 0, 1], dtype=torch.int32)
    positions = torch.tensor([34, 35, 36, 49], dtype=torch.int32)
    x = attention_inputs(11, context_lens, block_tokens, req_ids, heads=4)
    max_context = 52
    scores = ops.indexer_score(x["q_index"], x["index_weights"], x["index_pages"], x["block_table"], req_ids,
                               positions, index_fmt=INDEX_FMT, max_context=max_context)
    chosen = ops.topk(scores, positions + 1, k)
    slots = ops.positions_to_slots(chosen, req_ids, x["block_table"], block_tokens)
    expected = ops.sparse_mla(x["q"], x["kv_pages"], slots, kv_fmt=KV_FMT, softmax_scale=SOFTMAX_SCALE)
    local_index, local_table = shard_paged_cache(x["index_pages"], x["block_table"], context_lens, rank, world)
    local_kv, _ = shard_paged_cache(x["kv_pages"], x["block_table"], context_lens, rank, world)
    got = dcp_dsa_attention(x["q_index"], x["index_weights"], local_index, x["q"], local_kv, local_table, req_ids,
                            positions, index_fmt=INDEX_FMT, kv_fmt=KV_FMT, topk=k, max_context=max_context,
                            softmax_scale=SOFTMAX_SCALE, group=group)
    return dict(got=got, expected=expected)


def run_prefill_case(rank, world, group):
    """A fresh 13-token request and a 4-token append after a 3-token prefix; H = 2·W heads, H/W per rank."""
    context_lens, block_tokens, k = torch.tensor([13, 7]), 4, 6
    req_ids = torch.tensor([0] * 13 + [1] * 4, dtype=torch.int32)
    positions = torch.cat([torch.arange(13), torch.arange(3, 7)]).int()
    heads = 2 * world
    x = attention_inputs(21, context_lens, block_tokens, req_ids, heads=heads)
    mine = x["q"][:, 2 * rank:2 * rank + 2].contiguous()
    common = dict(index_fmt=INDEX_FMT, kv_fmt=KV_FMT, topk=k, max_context=16, softmax_scale=SOFTMAX_SCALE)
    args = (x["q_index"], x["index_weights"], x["index_pages"], mine, x["kv_pages"], x["block_table"], req_ids,
            positions)
    token_o, token_lse = token_sharded_dsa_prefill(*args, return_lse=True, group=group, **common)
    head_o, head_lse = head_sharded_dsa_prefill(*args, **common)
    batch_invariant = active_table().record.backend.capabilities.batch_invariant
    return dict(token=(token_o, token_lse), head=(head_o, head_lse), batch_invariant=batch_invariant)


CASES = {"merge": run_merge_cases, "traffic": run_traffic_case, "dcp_decode": run_dcp_decode_case,
         "prefill": run_prefill_case}


def run_all_cases(rank, world):
    """On each of 4 ranks: every case over all 4 ranks, then over the subgroup {0, 1} (ranks 2, 3 idle)."""
    import traceback

    import torch.distributed as dist

    init_distributed({"suite": "test_distributed_gloo"}, timeout_s=60.0)
    groups = {size: dist.new_group(list(range(size))) for size in WORLDS}  # every rank creates every group
    results = {}
    for size in sorted(WORLDS, reverse=True):
        if rank >= size:
            continue
        results[size] = {}
        for name, case in CASES.items():
            try:
                results[size][name] = case(rank, size, groups[size])
            except Exception:  # reported per case so one failure does not hide the others
                results[size][name] = {"error": traceback.format_exc()}
    dist.barrier()
    shutdown_distributed()
    return results


# ----------------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def gloo_runs():
    outcomes = run_on_ranks(run_all_cases, max(WORLDS), timeout_s=200.0)
    for outcome in outcomes:
        assert outcome.ok, f"rank {outcome.rank}: {outcome.error_type}: {outcome.error_message}\n{outcome.traceback}"
    return [outcome.value for outcome in outcomes]


@pytest.fixture(params=WORLDS, ids=lambda w: f"W{w}")
def gloo(request, gloo_runs):
    world = request.param
    return world, [results[world] for results in gloo_runs[:world]]


def case(gloo, name):
    world, per_rank = gloo
    for rank, results in enumerate(per_rank):
        assert "error" not in results[name], f"rank {rank}, case {name}:\n{results[name]['error']}"
    return world, [results[name] for results in per_rank]


def same_topk_set(got, expected):
    """Row by row the same positions as the single-device top-k, valid ones first, -1 padding last."""
    for row_got, row_expected in zip(got.tolist(), expected.tolist()):
        valid = [p for p in row_expected if p >= 0]
        if sorted(row_got[:len(valid)]) != sorted(valid) or any(p != -1 for p in row_got[len(valid):]):
            return False
    return got.shape == expected.shape


@pytest.mark.parametrize("scenario", ["ties_and_ragged_lengths", "all_winners_on_one_rank", "rows_shorter_than_k",
                                      "raw_scores_sharing_rounded_keys", "heavy_ties", "low_bit_differences"])
def test_every_rank_gets_the_single_device_topk_of_raw_scores(gloo, scenario):
    _, ranks = case(gloo, "merge")
    for r in ranks:
        assert same_topk_set(r[scenario]["got"], r[scenario]["expected"])
        assert torch.equal(r[scenario]["got"], r[scenario]["simulated"])


@pytest.mark.parametrize("scenario", ["ties_and_ragged_lengths", "all_winners_on_one_rank", "rows_shorter_than_k",
                                      "raw_scores_sharing_rounded_keys"])
def test_the_reference_merge_is_the_single_device_topk_of_the_gathered_row(gloo, scenario):
    """The oracle's topk_merge (all-gather every local row, interleave, top-k) equals the single-device
    top-k exactly, order included, on every rank."""
    _, ranks = case(gloo, "merge")
    for r in ranks:
        assert r[scenario]["backend"] == "reference"
        assert torch.equal(r[scenario]["by_definition"], r[scenario]["expected"])


def test_no_rank_sends_more_than_the_generic_merge_and_heavy_ties_are_bounded(gloo):
    world, ranks = case(gloo, "merge")
    for r in ranks:
        for name, result in r.items():
            stats = result["stats"]
            assert result["counted_bytes"] <= stats.generic_payload_bytes * (world - 1), name
    for name in ("heavy_ties", "low_bit_differences"):  # the plain band round would exceed the generic volume
        assert {r[name]["stats"].protocol for r in ranks} == {"exact+completion"}, name


def test_the_band_round_runs_where_rounded_keys_tie(gloo):
    _, ranks = case(gloo, "merge")
    assert all(r["raw_scores_sharing_rounded_keys"]["stats"].band_rows == 3 for r in ranks)
    # raw scores travel: in the band round, or in the completion where the band round would cost more
    assert sum(r["raw_scores_sharing_rounded_keys"]["stats"].band_bytes
               + r["raw_scores_sharing_rounded_keys"]["stats"].completion_bytes for r in ranks) > 0
    assert any(result["stats"].band_bytes > 0 for r in ranks for result in r.values())  # some band round ran


def test_only_the_rank_owning_unsent_winners_resends(gloo):
    world, ranks = case(gloo, "merge")
    stats = ranks[0]["all_winners_on_one_rank"]["stats"]
    assert stats.resend_rows == tuple([0] * (world - 1) + [3])
    assert ranks[world - 1]["all_winners_on_one_rank"]["stats"].resend_bytes > 0
    assert ranks[0]["all_winners_on_one_rank"]["stats"].resend_bytes == 0


def test_counted_bytes_equal_the_merge_statistics(gloo):
    _, ranks = case(gloo, "merge")
    for r in ranks:
        for result in r.values():
            assert result["counted_bytes"] == result["stats"].wire_bytes


def test_packed_merge_sends_2k_over_c_times_fewer_bytes_than_the_generic_merge(gloo):
    world, ranks = case(gloo, "traffic")
    for r in ranks:
        assert r["stats"].resend_bytes == 0 and r["stats"].band_bytes == 0  # first round only (checked scores)
        assert r["packed"] == r["expected_packed"]
        assert r["generic"] == 4 * 256 * 8 * (world - 1)
    ratio = ranks[0]["generic"] / ranks[0]["packed"]
    print(f"\ngloo W={world} k=256: packed {ranks[0]['packed']} B, generic {ranks[0]['generic']} B sent to peers, "
          f"{ratio:.2f}x less")
    assert ratio == pytest.approx(2 * 256 / math.ceil(1.5 * 256 / world), rel=0.01)


def test_dcp_decode_equals_single_device_attention(gloo):
    _, ranks = case(gloo, "dcp_decode")
    for r in ranks:
        (o, lse), (o_ref, lse_ref) = r["got"], r["expected"]
        torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse, lse_ref, rtol=1e-6, atol=1e-6)
    assert all(torch.equal(r["got"][0], ranks[0]["got"][0]) for r in ranks)


def test_token_sharded_prefill_equals_head_sharded_prefill(gloo):
    _, ranks = case(gloo, "prefill")
    for r in ranks:
        (o, lse), (o_ref, lse_ref) = r["token"], r["head"]
        torch.testing.assert_close(o, o_ref, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(lse, lse_ref, rtol=1e-6, atol=1e-7)
        if r["batch_invariant"]:  # a backend claiming batch invariance must match bit for bit
            assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
