"""DSA attention under decode context parallelism (DESIGN §6): each rank holds every W-th token.

Per layer and step, on every rank of the DCP group:

1. ``indexer_score`` over this rank's index pages (local positions, causal bound ``(p - rank) // W``);
2. ``topk_merge``: the exact global top-k, the same ``[T, k]`` global positions on every rank;
3. ``sparse_mla`` over the winners this rank owns (``p % W == rank``, local position ``p // W``);
4. ``all_gather`` of the partial ``(o, lse)`` and ``lse_combine`` into attention over all winners.

The result equals single-device DSA attention (the merge selects exactly the single-device top-k
set of the raw scores), within the tolerance of the LSE combine.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import ops
from ..ops._validate import ShapeBinder
from ..ops.dsa_attention import validate_dsa_attention
from . import collective
from .sharding import local_width, shard_query_positions


def dcp_dsa_attention(
    q_index: torch.Tensor, index_weights: torch.Tensor, index_pages: torch.Tensor, q: torch.Tensor,
    kv_pages: torch.Tensor, block_table: torch.Tensor, req_ids: torch.Tensor, positions: torch.Tensor, *,
    index_fmt: str, kv_fmt: str, topk: int, max_context: int, softmax_scale: float,
    kv_scale: Optional[torch.Tensor] = None, group=None, check: bool = True,
    merge: Optional[Callable[..., torch.Tensor]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One DSA layer's decode attention over an interleaved context; drop-in for ``dsahal.ops.dsa_attention``
    (same arguments, plus ``group``) where the cache views and block table are this rank's shard.

    Args:
        q_index: ``[T, Hi, 128]`` indexer queries; index_weights: ``[T, Hi]`` fp32 (same on every rank).
        index_pages: ``[local_blocks, block_tokens, index_bytes]`` uint8, this rank's index-key pages.
        q: ``[T, H, 576]`` absorbed queries, the same on every rank (gather head-sharded queries first
            when the DCP group is also the TP group).
        kv_pages: ``[local_blocks, block_tokens, latent_bytes]`` uint8, this rank's latent pages.
        block_table: ``[B, max_local_blocks]`` int32, this rank's block table over *local* positions.
        req_ids: ``[T]`` int32; positions: ``[T]`` int32 *global* positions of the query tokens
            (a query sees global keys ``0..p``).
        topk: tokens attended per query; max_context: global score width (>= every position + 1).
        group: the DCP process group (None: the default group, or a single rank).
        merge: ``(local_scores, local_lengths, k, group) -> [T, k]`` global positions; default the
            backend's ``dsahal.ops.topk_merge`` (the multi-GPU bench passes
            :func:`~dsahal.distributed.generic_merge.generic_topk_merge` to time the baseline).

    Returns:
        ``o`` ``[T, H, 512]`` in q's dtype and ``lse`` ``[T, H]`` fp32, identical on every rank. Collective.
    """
    rank, world = ops.group_rank_and_size(group)
    if check:
        ShapeBinder("distributed.dcp_dsa_attention").positive_int("max_context", max_context)
    width = local_width(max_context, world)
    shard = shard_query_positions(positions, rank, world)
    if check:
        validate_dsa_attention(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids,
                               shard.local_positions, index_fmt, kv_fmt, kv_scale, topk, width, softmax_scale)
    scores = ops.indexer_score(q_index, index_weights, index_pages, block_table, req_ids, shard.local_positions,
                               index_fmt=index_fmt, max_context=width, check=False)
    local_lengths = torch.clamp(shard.local_lengths, max=width)
    with collective.collective_step("topk_merge", group):
        if merge is None:
            winners = ops.topk_merge(scores, local_lengths, topk, group, check=False)  # [T, k] global positions
        else:
            winners = merge(scores, local_lengths, topk, group)
    mine = (winners >= 0) & (winners.long() % world == rank)
    local_winners = torch.where(mine, torch.div(winners, world, rounding_mode="floor"), torch.full_like(winners, -1))
    slots = ops.positions_to_slots(local_winners, req_ids, block_table, kv_pages.shape[1], check=False)
    o_part, lse_part = ops.sparse_mla(q, kv_pages, slots, kv_fmt=kv_fmt, kv_scale=kv_scale,
                                      softmax_scale=softmax_scale, check=False)
    o_parts = collective.all_gather(o_part, group, "dcp attention output gather")
    lse_parts = collective.all_gather(lse_part, group, "dcp attention lse gather")
    return ops.lse_combine(o_parts, lse_parts, check=False)
