"""DSA attention as the composition of the selected backend's own ops (the default for any backend
that does not fuse it)."""
from __future__ import annotations

import torch

from .. import ops


def dsa_attention(q_index, index_weights, index_pages, index_fmt, q, kv_pages, kv_fmt, kv_scale, block_table,
                  req_ids, positions, topk, max_context, softmax_scale):
    scores = ops.indexer_score(q_index, index_weights, index_pages, block_table, req_ids, positions,
                               index_fmt=index_fmt, max_context=max_context, check=False)
    lengths = torch.clamp(positions.to(torch.int32) + 1, max=max_context)
    chosen = ops.topk(scores, lengths, topk, check=False)
    slots = ops.positions_to_slots(chosen, req_ids, block_table, index_pages.shape[1], check=False)
    return ops.sparse_mla(q, kv_pages, slots, kv_fmt=kv_fmt, kv_scale=kv_scale, softmax_scale=softmax_scale,
                          check=False)
