"""Interleaved DCP sharding helpers and the balanced token split of token-sharded prefill (one process)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsahal.distributed import (
    balanced_token_split,
    build_local_block_table,
    dcp_write_slots,
    local_context_lengths,
    owner_rank,
    shard_paged_cache,
    shard_query_positions,
    to_global_positions,
    to_local_positions,
)

SETTINGS = settings(max_examples=25, deadline=None)


@SETTINGS
@given(world=st.integers(1, 8), length=st.integers(0, 200))
def test_every_position_has_one_owner_and_round_trips(world, length):
    positions = torch.arange(length, dtype=torch.int32)
    owners, local = owner_rank(positions, world), to_local_positions(positions, world)
    for rank in range(world):
        mine = owners == rank
        assert torch.equal(to_global_positions(local[mine], rank, world), positions[mine])
        assert torch.equal(local[mine], torch.arange(int(mine.sum()), dtype=torch.int32))  # dense local positions


@SETTINGS
@given(world=st.integers(1, 8), lengths=st.lists(st.integers(0, 100), min_size=1, max_size=4))
def test_local_lengths_split_each_context_within_one_token(world, lengths):
    lens = torch.tensor(lengths)
    per_rank = torch.stack([local_context_lengths(lens, r, world) for r in range(world)])
    assert torch.equal(per_rank.sum(0), lens.int())
    assert int((per_rank.max(0).values - per_rank.min(0).values).max()) <= 1


def test_a_query_sees_exactly_its_causal_keys_on_each_rank():
    world, positions = 4, torch.tensor([0, 1, 2, 3, 9, 10], dtype=torch.int32)
    for rank in range(world):
        shard = shard_query_positions(positions, rank, world)
        for t, p in enumerate(positions.tolist()):
            visible = [s // world for s in range(p + 1) if s % world == rank]
            assert int(shard.local_lengths[t]) == len(visible)
            if visible:
                assert int(shard.local_positions[t]) == visible[-1]


def test_only_the_owner_writes_a_new_token_into_its_local_slot():
    world, block_tokens = 3, 4
    positions = torch.tensor([5, 6, 7, 20], dtype=torch.int32)
    req_ids = torch.tensor([0, 0, 0, 1], dtype=torch.int32)
    writers = torch.zeros(4, dtype=torch.int32)
    for rank in range(world):
        table = build_local_block_table(torch.tensor([8, 21]), block_tokens, rank, world)
        slots = dcp_write_slots(positions, req_ids, table, block_tokens, rank, world)
        writers += (slots >= 0).int()
        for t in torch.nonzero(slots >= 0).flatten().tolist():
            local = int(positions[t]) // world
            assert int(positions[t]) % world == rank
            assert int(slots[t]) == int(table[int(req_ids[t]), local // block_tokens]) * block_tokens + local % block_tokens
    assert torch.equal(writers, torch.ones(4, dtype=torch.int32))


def test_local_block_table_takes_its_blocks_from_the_allocator():
    handed_out = []

    def allocate(n):
        ids = torch.arange(100, 100 + n)
        handed_out.append(n)
        return ids

    table = build_local_block_table(torch.tensor([10, 3]), 2, rank=1, world=2, allocate=allocate)
    assert handed_out == [3 + 1]  # ceil(5/2) + ceil(1/2) blocks
    assert table.tolist() == [[100, 101, 102], [103, -1, -1]]


def test_shards_of_a_paged_cache_hold_each_token_byte_for_byte():
    gen = torch.Generator().manual_seed(0)
    world, block_tokens = 3, 4
    pages = torch.randint(0, 256, (9, block_tokens, 6), generator=gen, dtype=torch.uint8)
    table = torch.tensor([[4, 0, 7, -1], [2, 8, 5, 1]], dtype=torch.int32)
    context_lens = torch.tensor([11, 14])
    for rank in range(world):
        local_pages, local_table = shard_paged_cache(pages, table, context_lens, rank, world)
        for b, length in enumerate(context_lens.tolist()):
            for p in range(rank, length, world):
                j = p // world
                got = local_pages[int(local_table[b, j // block_tokens]), j % block_tokens]
                assert torch.equal(got, pages[int(table[b, p // block_tokens]), p % block_tokens])


def test_sharding_helpers_reject_a_rank_outside_the_group():
    with pytest.raises(ValueError, match=r"local_context_lengths: argument 'rank' expected a value in \[0, 1\], got 2"):
        local_context_lengths(torch.tensor([5]), 2, 2)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_token_split_gives_rank_r_pieces_r_and_2w_minus_1_minus_r_of_every_request(world):
    req_ids = torch.tensor([0] * 16 + [1] * 5 + [2] * 1, dtype=torch.int32)
    split = balanced_token_split(req_ids, world)
    assert torch.equal(torch.sort(torch.cat(split)).values, torch.arange(22))
    pieces = 2 * world
    bounds = [(16 * i) // pieces for i in range(pieces + 1)]  # request 0: 16 tokens
    for rank in range(world):
        first = torch.arange(bounds[rank], bounds[rank + 1])
        last = torch.arange(bounds[pieces - 1 - rank], bounds[pieces - rank])
        assert torch.equal(split[rank][split[rank] < 16], torch.cat([first, last]))


def test_token_split_balances_causal_work_of_a_long_request():
    world, n = 4, 4096
    split = balanced_token_split(torch.zeros(n, dtype=torch.int32), world)
    work = [float((idx + 1).sum()) for idx in split]  # token at position p attends to p + 1 keys
    assert max(work) / min(work) < 1.001
    contiguous = [float((torch.arange(r * n // world, (r + 1) * n // world) + 1).sum()) for r in range(world)]
    assert max(contiguous) / min(contiguous) > 5  # what a naive contiguous split would do


def test_token_split_rejects_a_request_in_two_runs():
    with pytest.raises(ValueError, match="balanced_token_split: argument 'req_ids' expected each request's tokens"):
        balanced_token_split(torch.tensor([0, 0, 1, 0], dtype=torch.int32), 2)
