"""Portable torch formulations of the selection ops for the PPU: indexer score, top-k, slots.

Batched fp32 tensor code (no per-token Python loop): the indexer loops over requests and over
context chunks only, so its working set stays bounded at 1M-token contexts.
"""
from __future__ import annotations

import torch

from dsahal.formats import index_format

# Context positions scored per step of the indexer, and the most fp32 logits ([tokens, H, chunk])
# one step may hold (256 MiB): a long prefill request is scored a group of its tokens at a time.
INDEXER_CONTEXT_CHUNK = 16384
INDEXER_MAX_LOGITS = 1 << 26
# Top-k orders the chosen indices through an fp32 key; exact only while indices fit 24 bits.
TOPK_MAX_WIDTH = 1 << 24

NEG_INF = float("-inf")


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    """``score[t, s] = Σ_h weights[t, h] · relu(q[t, h] · k[s])`` over ``s <= positions[t]``, fp32.

    Args:
        q: ``[T, H, 128]`` (fp8 q has its scale folded into weights); weights: ``[T, H]`` fp32;
        index_pages: ``[num_blocks, block_tokens, token_bytes]`` uint8 in ``index_fmt``;
        block_table: ``[B, max_blocks]`` int32 (-1 unmapped); req_ids, positions: ``[T]`` int32.
    Returns:
        ``[T, max_context]`` fp32, -inf past each token's position and on unmapped blocks.
    """
    spec = index_format(index_fmt)
    block_tokens = index_pages.shape[1]
    scores = torch.full((q.shape[0], max_context), NEG_INF, dtype=torch.float32, device=q.device)
    queries, head_weights, positions = q.float(), weights.float(), positions.long()
    rows_per_step = max(1, INDEXER_MAX_LOGITS // (max(1, q.shape[1]) * INDEXER_CONTEXT_CHUNK))
    # One pass per request: its tokens share the keys, so each key chunk is dequantised once per
    # group of rows (one group for decode; prefill requests may need several).
    for req in torch.unique(req_ids).tolist():
        rows_of_req = torch.nonzero(req_ids == req).flatten()
        blocks_of_req = block_table[req].long()
        for first in range(0, rows_of_req.numel(), rows_per_step):
            rows = rows_of_req[first:first + rows_per_step]
            own_positions = positions[rows]
            visible = min(int(own_positions.max()) + 1, max_context)
            for start in range(0, visible, INDEXER_CONTEXT_CHUNK):
                ctx = torch.arange(start, min(visible, start + INDEXER_CONTEXT_CHUNK), device=q.device)
                block = blocks_of_req[ctx // block_tokens]
                keys = spec.unpack(index_pages[block.clamp_min(0), ctx % block_tokens]).float()  # [L, 128]
                logits = torch.relu(torch.einsum("nhd,ld->nhl", queries[rows], keys))
                row_scores = torch.einsum("nh,nhl->nl", head_weights[rows], logits)
                visible_mask = (ctx[None, :] <= own_positions[:, None]) & (block >= 0)[None, :]
                scores[rows, start:start + ctx.numel()] = torch.where(visible_mask, row_scores, NEG_INF)
    return scores


def topk(scores, lengths, k):
    """The ``k`` largest of ``scores[t, :lengths[t]]``, ties to the smaller index, -inf never chosen.

    Works in O(N log k) with ``torch.topk`` plus one linear pass: the k-th largest value is the
    threshold; everything above it is kept, and the ties at the threshold are filled in index
    order (a prefix count), which is the tie rule. Indices come out ascending, -1 padding last.

    Args:
        scores: ``[T, N]`` fp32 (N < 2^24); lengths: ``[T]`` int32; k: positive int.
    Returns:
        ``[T, k]`` int32.
    """
    tokens, width = scores.shape
    columns = torch.arange(width, device=scores.device)
    masked = scores.masked_fill(columns[None, :] >= lengths[:, None].long(), NEG_INF)
    take = min(k, width)
    out = torch.full((tokens, k), -1, dtype=torch.int32, device=scores.device)
    if take == 0 or tokens == 0:
        return out
    threshold = torch.topk(masked, take, dim=1).values[:, -1:]  # [T, 1] the take-th largest
    above = masked > threshold
    at = (masked == threshold) & (threshold > NEG_INF)
    room = take - above.sum(dim=1, keepdim=True)  # ties the row still needs
    chosen = above | (at & (torch.cumsum(at, dim=1) <= room))
    # Pull the chosen columns out in ascending order: larger key for a smaller column.
    key = torch.where(chosen, (width - columns).float()[None, :], torch.full_like(masked, -1.0))
    picked_keys, picked = torch.topk(key, take, dim=1)
    out[:, :take] = torch.where(picked_keys > 0, picked, torch.full_like(picked, -1)).to(torch.int32)
    return out


def positions_to_slots(positions, req_ids, block_table, block_tokens):
    """``slot = block_table[req, pos // block_tokens] * block_tokens + pos % block_tokens``.

    Args:
        positions: ``[T, K]`` int32 (-1 padding); req_ids: ``[T]``; block_table: ``[B, max_blocks]``.
    Returns:
        ``[T, K]`` int32; -1 for padding and for unmapped blocks.
    """
    pos = positions.long()
    logical_block = torch.div(pos.clamp_min(0), block_tokens, rounding_mode="floor")
    block = block_table.long()[req_ids.long()[:, None], logical_block]  # [T, K]
    slots = block * block_tokens + pos.clamp_min(0) % block_tokens
    return slots.masked_fill((pos < 0) | (block < 0), -1).to(torch.int32)
