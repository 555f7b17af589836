"""One DSA layer fused into one XLA graph: indexer -> exact top-k -> slots -> sparse MLA.

The same four XLA formulations as the separate ops, called directly: no validation, no
custom-op boundary and no host round trip between them, so a decode step is one traced graph
whose shapes depend only on (tokens, heads, max_context, topk, cache shape). Decode steps whose
context length stays below one ``max_context`` bucket therefore reuse one compiled executable.
"""
from __future__ import annotations

import torch

from dsahal.ops.score_ranges import slots_over_score_ranges

from .indexer import indexer_score
from .slots import positions_to_slots
from .sparse_mla import sparse_mla
from .topk import topk as exact_topk


def dsa_attention(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions, index_fmt,
                  kv_fmt, kv_scale, topk, max_context, softmax_scale):
    # token ranges whose [T, context] fp32 scores fit dsahal.ops.score_ranges' budget: one for a decode step (the same
    # graph as without ranges); a long prefill's graph holds one indexer and top-k a range, its scores bounded
    def slots_of(rows: slice) -> torch.Tensor:
        scores = indexer_score(q_index[rows], index_weights[rows], index_pages, block_table, req_ids[rows],
                               positions[rows], index_fmt, max_context)
        lengths = torch.clamp(positions[rows].to(torch.int32) + 1, max=max_context)
        chosen = exact_topk(scores, lengths, topk)
        return positions_to_slots(chosen, req_ids[rows], block_table, index_pages.shape[1])

    slots = slots_over_score_ranges(q_index.shape[0], max_context, slots_of)
    return sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)
