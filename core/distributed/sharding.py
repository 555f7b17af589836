"""Interleaved sharding of a request's context over the ``W`` ranks of a DCP group.

Global position ``p`` of a request lives on rank ``p % W`` at local position ``p // W``. Each rank
keeps its own paged cache (latent and index pages) with its own block table, addressing local
positions exactly as a single device addresses global ones, so every single-device op runs
unchanged on a shard. Interleaving (rather than contiguous chunks) keeps the shards within one
token of each other at every length, so a growing request never overflows one rank first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..ops._validate import INDEX_DTYPES, ShapeBinder, values_in_range

OP = "distributed.sharding"


def _check_rank(op: str, rank: int, world: int) -> None:
    v = ShapeBinder(op)
    v.positive_int("world", world)
    v.positive_int("rank", rank, minimum=0)
    if rank >= world:
        v.fail(f"argument 'rank' expected a value in [0, {world - 1}], got {rank}")


def owner_rank(positions: torch.Tensor, world: int) -> torch.Tensor:
    """Rank holding each global position: ``positions % world`` (same shape, int32; -1 stays -1)."""
    pos = positions.long()
    return torch.where(pos >= 0, pos % world, torch.full_like(pos, -1)).to(torch.int32)


def to_local_positions(positions: torch.Tensor, world: int) -> torch.Tensor:
    """Local position of each global position on its owner: ``positions // world`` (-1 stays -1)."""
    pos = positions.long()
    return torch.where(pos >= 0, pos // world, torch.full_like(pos, -1)).to(torch.int32)


def to_global_positions(local_positions: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Inverse of :func:`to_local_positions` on ``rank``: ``local * world + rank`` (-1 stays -1)."""
    _check_rank("distributed.to_global_positions", rank, world)
    pos = local_positions.long()
    return torch.where(pos >= 0, pos * world + rank, torch.full_like(pos, -1)).to(torch.int32)


def local_context_lengths(context_lens: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Tokens of a context of length ``L`` stored on ``rank``: ``ceil((L - rank) / world)``, at least 0.

    Args:
        context_lens: ``[B]`` int32/int64 global context lengths.

    Returns:
        ``[B]`` int32.
    """
    _check_rank("distributed.local_context_lengths", rank, world)
    lens = context_lens.long()
    return torch.clamp(torch.div(lens - rank + world - 1, world, rounding_mode="floor"), min=0).to(torch.int32)


def local_width(max_context: int, world: int) -> int:
    """Width of a rank's local score row for a global width ``max_context``: ``ceil(max_context / world)``."""
    return -(-int(max_context) // int(world))


@dataclass(frozen=True)
class DcpQueryShard:
    """One rank's view of a batch of query tokens.

    ``local_positions``: ``[T]`` int32, the last local key each query sees (``(p - rank) // W``;
    0 where it sees none, which ``local_lengths`` then marks). ``local_lengths``: ``[T]`` int32,
    number of visible local keys (``ceil((p + 1 - rank) / W)``, at least 0).
    """

    local_positions: torch.Tensor
    local_lengths: torch.Tensor


def shard_query_positions(positions: torch.Tensor, rank: int, world: int) -> DcpQueryShard:
    """Causal bounds of query tokens (global ``positions`` ``[T]``, a query sees keys ``0..p``) on ``rank``."""
    op = "distributed.shard_query_positions"
    _check_rank(op, rank, world)
    ShapeBinder(op).tensor("positions", positions, ["T"], INDEX_DTYPES)
    values_in_range(op, "positions", positions, 0, 2**31 - 1)
    lengths = local_context_lengths(positions.long() + 1, rank, world)
    local_pos = torch.clamp(lengths.long() - 1, min=0).to(torch.int32)
    return DcpQueryShard(local_positions=local_pos, local_lengths=lengths)


def dcp_write_slots(positions: torch.Tensor, req_ids: torch.Tensor, local_block_table: torch.Tensor,
                    block_tokens: int, rank: int, world: int) -> torch.Tensor:
    """Slots in this rank's cache for new tokens at global ``positions``; -1 for tokens another rank owns.

    Args:
        positions: ``[N]`` int32 global positions of the new tokens; req_ids: ``[N]`` int32.
        local_block_table: ``[B, max_local_blocks]`` int32 this rank's block table (-1 unmapped).

    Returns:
        ``[N]`` int32 slots for ``dsahal.ops.cache_write`` (every rank calls it; only the owner writes).
    """
    op = "distributed.dcp_write_slots"
    _check_rank(op, rank, world)
    v = ShapeBinder(op)
    v.tensor("positions", positions, ["N"], INDEX_DTYPES)
    v.tensor("req_ids", req_ids, ["N"], INDEX_DTYPES)
    v.tensor("local_block_table", local_block_table, ["B", None], INDEX_DTYPES)
    v.positive_int("block_tokens", block_tokens)
    values_in_range(op, "req_ids", req_ids, 0, local_block_table.shape[0] - 1)
    pos = positions.long()
    mine = (pos >= 0) & (pos % world == rank)
    local = torch.where(mine, pos // world, torch.zeros_like(pos))
    capacity = local_block_table.shape[1] * block_tokens
    values_in_range(op, "positions", local[mine], 0, capacity - 1,
                    what=f" after // {world} (local_block_table maps {capacity} local tokens)")
    block = local_block_table.long()[req_ids.long(), local // block_tokens]
    slots = block * block_tokens + local % block_tokens
    return torch.where(mine & (block >= 0), slots, torch.full_like(slots, -1)).to(torch.int32)


def build_local_block_table(context_capacity: torch.Tensor, block_tokens: int, rank: int, world: int,
                            allocate: Optional[Callable[[int], torch.Tensor]] = None) -> torch.Tensor:
    """A fresh block table for this rank's shard of requests that will hold ``context_capacity`` tokens.

    Args:
        context_capacity: ``[B]`` int global token capacity wanted per request.
        allocate: ``n -> [n]`` int block ids of this rank's cache (e.g. ``PackedKVCache.allocate_blocks``);
            default: consecutive blocks from 0.

    Returns:
        ``[B, max_local_blocks]`` int32, -1 past each request's blocks.
    """
    local = local_context_lengths(context_capacity, rank, world).long()
    blocks = torch.div(local + block_tokens - 1, block_tokens, rounding_mode="floor")
    width = max(int(blocks.max()) if blocks.numel() else 0, 1)
    table = torch.full((context_capacity.shape[0], width), -1, dtype=torch.int32)
    ids = allocate(int(blocks.sum())) if allocate is not None else torch.arange(int(blocks.sum()))
    if ids.numel() != int(blocks.sum()):
        ShapeBinder("distributed.build_local_block_table").fail(
            f"argument 'allocate' expected {int(blocks.sum())} block ids, got {ids.numel()}")
    start = 0
    for b, n in enumerate(blocks.tolist()):
        table[b, :n] = ids[start:start + n].to(torch.int32)
        start += n
    return table


def shard_paged_cache(pages: torch.Tensor, block_table: torch.Tensor, context_lens: torch.Tensor, rank: int,
                      world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's copy of a single-device paged cache: tokens ``p % world == rank`` at local ``p // world``.

    Used to move a replicated (TP) cache onto a DCP group, and by tests to build shards whose
    union is a known single-device cache. Copies packed records byte for byte (any format).

    Args:
        pages: ``[num_blocks, block_tokens, token_bytes]`` uint8 single-device pages.
        block_table: ``[B, max_blocks]`` int32; context_lens: ``[B]`` int tokens per request.

    Returns:
        (``local_pages`` ``[local_blocks, block_tokens, token_bytes]`` uint8,
        ``local_block_table`` ``[B, max_local_blocks]`` int32, blocks numbered from 0).
    """
    op = "distributed.shard_paged_cache"
    _check_rank(op, rank, world)
    v = ShapeBinder(op)
    v.tensor("pages", pages, [None, None, None], torch.uint8)
    v.tensor("block_table", block_table, ["B", None], INDEX_DTYPES)
    v.tensor("context_lens", context_lens, ["B"], INDEX_DTYPES)
    block_tokens = pages.shape[1]
    values_in_range(op, "context_lens", context_lens, 0, block_table.shape[1] * block_tokens)
    local_table = build_local_block_table(context_lens, block_tokens, rank, world)
    num_local_blocks = int(local_table.max()) + 1 if local_table.numel() and int(local_table.max()) >= 0 else 1
    local_pages = torch.zeros((num_local_blocks, block_tokens, pages.shape[2]), dtype=torch.uint8,
                              device=pages.device)
    local_lens = local_context_lengths(context_lens, rank, world)
    for b in range(block_table.shape[0]):
        local = torch.arange(int(local_lens[b]))
        global_pos = local * world + rank
        src_block = block_table[b].long()[global_pos // block_tokens]
        if bool((src_block < 0).any()):
            v.fail(f"argument 'block_table' expected mapped blocks for request {b}'s {int(context_lens[b])} "
                   "tokens, got -1")
        dst_block = local_table[b].long()[local // block_tokens]
        local_pages[dst_block, local % block_tokens] = pages[src_block, global_pos % block_tokens]
    return local_pages, local_table
