"""Reference DSA attention: the reference's own indexer, top-k, position-to-slot and sparse MLA,
composed directly (never through ``dsahal.ops``: the oracle must not run what it judges)."""
from __future__ import annotations

import torch

from .indexer import indexer_score
from .slots import positions_to_slots
from .sparse_mla import sparse_mla
from .topk import topk as topk_of


def dsa_attention(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions, index_fmt,
                  kv_fmt, kv_scale, topk, max_context, softmax_scale):
    """``sparse_mla(q, positions_to_slots(topk(indexer_score(...), min(positions + 1, max_context), topk)))``.

    Arguments in the op spec's order (:data:`dsahal.ops.catalog.SPECS`): q_index ``[T, Hi, 128]``,
    index_weights ``[T, Hi]``, index_pages / kv_pages ``[num_blocks, block_tokens, bytes]`` uint8,
    q ``[T, H, 576]``, block_table ``[B, max_blocks]``, req_ids / positions ``[T]``.

    Returns:
        ``o`` ``[T, H, 512]`` in q's dtype and ``lse`` ``[T, H]`` fp32.
    """
    scores = indexer_score(q_index, index_weights, index_pages, block_table, req_ids, positions, index_fmt,
                           max_context)  # [T, max_context], -inf past each token's causal bound
    lengths = torch.clamp(positions.to(torch.int32) + 1, max=max_context)
    chosen = topk_of(scores, lengths, topk)  # [T, topk] positions, -1 padding
    slots = positions_to_slots(chosen, req_ids, block_table, index_pages.shape[1])
    return sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)
