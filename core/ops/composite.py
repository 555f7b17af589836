"""Composite ops: what a backend that does not fuse an op gets, the composition of the public ops.

Each stage goes through :mod:`dsahal.ops` with ``check=False`` (the composite's own caller validated
the whole call), so each stage runs on the backend's own best route for it, or falls back to the
reference for that stage alone. The registry serves ``dsa_attention`` with this function when the
selected backend declares no route for it.
"""
from __future__ import annotations

import torch

from .. import ops
from .score_ranges import slots_over_score_ranges


def dsa_attention(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions, index_fmt,
                  kv_fmt, kv_scale, topk, max_context, softmax_scale):
    """``dsahal.ops.dsa_attention`` as indexer -> top-k -> position-to-slot -> sparse MLA, the first three over
    token ranges whose scores fit :data:`~.score_ranges.SCORES_BUDGET_BYTES` (one range up to 1024 tokens at 128K).

    Arguments in the op spec's order (:data:`dsahal.ops.catalog.SPECS`), as the registry passes them:
    q_index ``[T, Hi, 128]``, index_weights ``[T, Hi]`` fp32, index_pages / kv_pages
    ``[num_blocks, block_tokens, bytes]`` uint8, q ``[T, H, 576]``, block_table ``[B, max_blocks]``
    int32, req_ids / positions ``[T]`` int32.

    Returns:
        ``o`` ``[T, H, 512]`` in q's dtype and ``lse`` ``[T, H]`` fp32.
    """
    slots = separate_slots(q_index, index_weights, index_pages, block_table, req_ids, positions, index_fmt, topk,
                           max_context)
    return ops.sparse_mla(q, kv_pages, slots, kv_fmt=kv_fmt, kv_scale=kv_scale, softmax_scale=softmax_scale,
                          check=False)


def separate_slots(q_index, index_weights, index_pages, block_table, req_ids, positions, index_fmt, topk, max_context,
                   check: bool = False) -> torch.Tensor:
    """The layer's physical slots ``[T, topk]`` int32 (-1 padded) from the public ``indexer_score`` -> ``topk`` ->
    ``positions_to_slots``, over the token ranges whose scores fit :data:`~.score_ranges.SCORES_BUDGET_BYTES`
    (:func:`~.score_ranges.slots_over_score_ranges`); ``check``: each stage validates its arguments. Serves the
    composite layer and the model's separate-ops path (``LocalDsaAttention(fused=False)``)."""
    def slots_of(rows: slice) -> torch.Tensor:
        scores = ops.indexer_score(q_index[rows], index_weights[rows], index_pages, block_table, req_ids[rows],
                                   positions[rows], index_fmt=index_fmt, max_context=max_context, check=check)
        lengths = torch.clamp(positions[rows].to(torch.int32) + 1, max=max_context)  # causal bound of each query
        chosen = ops.topk(scores, lengths, topk, check=check)
        return ops.positions_to_slots(chosen, req_ids[rows], block_table, index_pages.shape[1], check=check)

    return slots_over_score_ranges(q_index.shape[0], max_context, slots_of)
