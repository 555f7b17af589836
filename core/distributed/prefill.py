"""Token-sharded prefill of a DSA layer (DESIGN §6, the seed's "shard attention by token, not head").

Under tensor parallelism each of W ranks holds H/W attention heads of every token and a replicated
cache; the indexer is not head-sharded, so head-sharded prefill scores every token on every rank.
Token-sharded prefill instead:

1. one all-to-all turns "all tokens, H/W heads" into "1/W of the tokens, all H heads";
2. each rank runs the indexer, top-k and sparse MLA (``dsahal.ops.dsa_attention``) for its tokens;
3. a second all-to-all turns "its tokens, all heads" back into "all tokens, its H/W heads".

Tokens are dealt out so causal work balances: each request is cut into 2W contiguous pieces and
rank r takes pieces r and 2W-1-r (one early, cheap piece and one late, expensive piece).
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import ops
from ..formats import LATENT_NOPE_DIM
from ..ops._validate import INDEX_DTYPES, ShapeBinder
from ..ops.dsa_attention import validate_dsa_attention
from . import collective

OP = "distributed.token_sharded_dsa_prefill"


def balanced_token_split(req_ids: torch.Tensor, world: int) -> list[torch.Tensor]:
    """Token indices each rank handles: every request (a contiguous run of ``req_ids``) cut into
    ``2·world`` near-equal pieces, rank ``r`` taking pieces ``r`` and ``2·world-1-r``.

    Args:
        req_ids: ``[T]`` int32; each request's tokens must be contiguous.

    Returns:
        ``world`` int64 tensors of token indices, disjoint, together covering ``0..T-1``.
    """
    v = ShapeBinder("distributed.balanced_token_split")
    v.tensor("req_ids", req_ids, ["T"], INDEX_DTYPES)
    v.positive_int("world", world)
    ids = req_ids.cpu().long()
    starts = [0] + [i for i in range(1, len(ids)) if ids[i] != ids[i - 1]]
    ends = starts[1:] + [len(ids)]
    if len({int(ids[s]) for s in starts}) != len(starts):
        v.fail("argument 'req_ids' expected each request's tokens to be contiguous, got a request split into "
               "several runs")
    pieces = 2 * world
    chosen: list[list[torch.Tensor]] = [[] for _ in range(world)]
    for start, end in zip(starts, ends):
        n = end - start
        bounds = [start + (n * i) // pieces for i in range(pieces + 1)]
        for rank in range(world):
            for piece in (rank, pieces - 1 - rank):
                chosen[rank].append(torch.arange(bounds[piece], bounds[piece + 1]))
    return [torch.cat(parts).to(req_ids.device) if parts else torch.zeros(0, dtype=torch.int64,
                                                                         device=req_ids.device)
            for parts in chosen]


def head_sharded_dsa_prefill(
    q_index: torch.Tensor, index_weights: torch.Tensor, index_pages: torch.Tensor, q: torch.Tensor,
    kv_pages: torch.Tensor, block_table: torch.Tensor, req_ids: torch.Tensor, positions: torch.Tensor, *,
    index_fmt: str, kv_fmt: str, topk: int, max_context: int, softmax_scale: float,
    kv_scale: Optional[torch.Tensor] = None, check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline: every rank runs the whole indexer and attends with its own ``H/W`` heads.
    Arguments as :func:`token_sharded_dsa_prefill`; returns ``o`` ``[T, H/W, 512]``, ``lse`` ``[T, H/W]``."""
    return ops.dsa_attention(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions,
                             index_fmt=index_fmt, kv_fmt=kv_fmt, topk=topk, max_context=max_context,
                             softmax_scale=softmax_scale, kv_scale=kv_scale, check=check)


def token_sharded_dsa_prefill(
    q_index: torch.Tensor, index_weights: torch.Tensor, index_pages: torch.Tensor, q: torch.Tensor,
    kv_pages: torch.Tensor, block_table: torch.Tensor, req_ids: torch.Tensor, positions: torch.Tensor, *,
    index_fmt: str, kv_fmt: str, topk: int, max_context: int, softmax_scale: float,
    kv_scale: Optional[torch.Tensor] = None, group=None, return_lse: bool = False, check: bool = True,
):
    """DSA prefill attention with the work split by token across the ranks of ``group``.

    Args:
        q_index: ``[T, Hi, 128]``, index_weights: ``[T, Hi]`` fp32: the indexer's queries for every
            token (the indexer is not head-sharded; identical on every rank).
        index_pages, kv_pages: the replicated cache of this rank (``[blocks, block_tokens, bytes]`` uint8).
        q: ``[T, H/W, 576]`` absorbed queries of this rank's heads (rank r holds heads
            ``r·H/W .. (r+1)·H/W - 1``), for every token.
        block_table: ``[B, max_blocks]`` int32; req_ids, positions: ``[T]`` int32, each request contiguous.
        return_lse: also return the LSE (a third, small all-to-all).

    Returns:
        ``o`` ``[T, H/W, 512]`` in q's dtype (and ``lse`` ``[T, H/W]`` fp32 with ``return_lse``), equal to
        :func:`head_sharded_dsa_prefill`. Collective: two all-to-alls (three with ``return_lse``).
    """
    if check:
        validate_dsa_attention(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids,
                               positions, index_fmt, kv_fmt, kv_scale, topk, max_context, softmax_scale)
    rank, world = ops.group_rank_and_size(group)
    split = balanced_token_split(req_ids, world)  # identical on every rank: it depends on req_ids only
    counts = [int(s.numel()) for s in split]
    order = torch.cat(split)
    mine = split[rank]
    local_heads, tokens_here = q.shape[1], counts[rank]

    received = collective.all_to_all(q[order], [tokens_here] * world, counts, group, "prefill query all-to-all")
    q_tokens = received.reshape(world, tokens_here, local_heads, q.shape[2]).transpose(0, 1)
    q_tokens = q_tokens.reshape(tokens_here, world * local_heads, q.shape[2])  # heads in rank order
    if tokens_here:
        o, lse = ops.dsa_attention(q_index[mine], index_weights[mine], index_pages, q_tokens, kv_pages, block_table,
                                   req_ids[mine], positions[mine], index_fmt=index_fmt, kv_fmt=kv_fmt, topk=topk,
                                   max_context=max_context, softmax_scale=softmax_scale, kv_scale=kv_scale,
                                   check=False)
    else:
        o = q.new_zeros((0, world * local_heads, LATENT_NOPE_DIM))
        lse = torch.zeros((0, world * local_heads), dtype=torch.float32, device=q.device)

    o_out = _heads_back(o, order, counts, world, group, "prefill output all-to-all")
    if not return_lse:
        return o_out
    return o_out, _heads_back(lse, order, counts, world, group, "prefill lse all-to-all")


def _heads_back(x: torch.Tensor, order: torch.Tensor, counts: list[int], world: int, group, what: str):
    """``[T_r, H, *D]`` on each rank -> ``[T, H/W, *D]`` in the original token order."""
    tokens_here, heads = x.shape[0], x.shape[1]
    by_dest = x.reshape(tokens_here, world, heads // world, *x.shape[2:]).transpose(0, 1)
    by_dest = by_dest.reshape(world * tokens_here, heads // world, *x.shape[2:])
    gathered = collective.all_to_all(by_dest, counts, [tokens_here] * world, group, what)
    out = torch.empty_like(gathered)
    out[order] = gathered
    return out
