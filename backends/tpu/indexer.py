"""Lightning indexer on XLA: gather each query token's padded key pages, then dense matmuls.

The TensorCore half of the TPU's DSA split: per query token, the index keys of context
positions ``0..max_context-1`` are gathered from the paged cache into a dense
``[tokens, max_context, 128]`` buffer (``max_context`` is the static, bucketed width the caller
asks for), dequantised, and scored for all heads with one batched matmul. Causality and
unmapped blocks are masks (-inf), never shapes, so one graph serves every context length
below ``max_context``. Query tokens are processed in static tiles to bound memory.
"""
from __future__ import annotations

import torch

from dsahal.formats import INDEX_DIM

from .buckets import token_tiles
from .formats import unpack


def context_slots(block_table, req_ids, max_context: int, block_tokens: int) -> torch.Tensor:
    """``[T, max_context]`` int64 physical slot of every context position of each token's
    request; -1 where the block is unmapped or beyond the block table."""
    blocks_needed = -(-max_context // block_tokens)
    table = block_table.to(torch.int64)
    if table.shape[1] < blocks_needed:  # positions past the table are unmapped
        pad = table.new_full((table.shape[0], blocks_needed - table.shape[1]), -1)
        table = torch.cat([table, pad], dim=1)
    rows = table[req_ids.to(torch.int64), :blocks_needed]  # [T, blocks_needed]
    position = torch.arange(max_context, device=block_table.device)
    block = rows[:, torch.div(position, block_tokens, rounding_mode="floor")]  # [T, C]
    slots = block * block_tokens + torch.remainder(position, block_tokens)[None, :]
    return torch.where(block >= 0, slots, torch.full_like(slots, -1))


def score_tile(q, weights, index_pages, slots, positions, index_fmt) -> torch.Tensor:
    """One tile: q ``[t, H, 128]``, weights ``[t, H]``, slots ``[t, C]`` -> ``[t, C]`` fp32 scores."""
    valid = slots >= 0
    safe = torch.where(valid, slots, torch.zeros_like(slots))
    block_tokens = index_pages.shape[1]
    records = index_pages[torch.div(safe, block_tokens, rounding_mode="floor"), torch.remainder(safe, block_tokens)]
    keys = unpack(records, "index", index_fmt, None)  # [t, C, 128] fp32
    keys = torch.where(valid[..., None], keys, torch.zeros_like(keys))  # unmapped: slot 0's bytes, maybe NaN
    logits = torch.einsum("thd,tcd->thc", q.to(torch.float32), keys)
    scores = torch.einsum("th,thc->tc", weights.to(torch.float32), torch.relu(logits))
    context = torch.arange(slots.shape[1], device=slots.device)
    visible = valid & (context[None, :] <= positions.to(torch.int64)[:, None])
    return torch.where(visible, scores, torch.full_like(scores, float("-inf")))


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    """``[T, H, 128]`` queries -> ``[T, max_context]`` fp32 scores (-inf past each position)."""
    tokens, heads, _ = q.shape
    slots = context_slots(block_table, req_ids, max_context, index_pages.shape[1])
    tiles = token_tiles(tokens, max_context * max(heads, INDEX_DIM))
    parts = [score_tile(q[tile], weights[tile], index_pages, slots[tile], positions[tile], index_fmt)
             for tile in tiles]
    if not parts:
        return q.new_zeros((0, max_context), dtype=torch.float32)
    return parts[0] if len(parts) == 1 else torch.cat(parts)
