"""The PPU backend's op entry points: the shared Triton kernel when :mod:`.routes` says the PPU
takes the call, the portable torch formulation otherwise. Signatures are the backend-facing
argument lists of :mod:`dsahal.ops`. Kernel modules are imported on first use, so a machine
without triton (or the CPU twin) never imports it.

Small index tensors are made contiguous before a launch: the kernels index them with unit steps.
"""
from __future__ import annotations

from . import portable_attention, portable_index, portable_kda, routes


def lse_combine(o_parts, lse_parts):
    if routes.takes_lse_combine(o_parts, lse_parts)[0]:
        from dsahal.backends.triton_kernels.lse_combine import lse_combine as kernel

        return kernel(o_parts, lse_parts)
    return portable_attention.lse_combine(o_parts, lse_parts)


def positions_to_slots(positions, req_ids, block_table, block_tokens):
    if routes.takes_positions_to_slots(positions, req_ids, block_table, block_tokens)[0]:
        from dsahal.backends.triton_kernels.slots import positions_to_slots as kernel

        return kernel(positions, req_ids.contiguous(), block_table, block_tokens)
    return portable_index.positions_to_slots(positions, req_ids, block_table, block_tokens)


def topk(scores, lengths, k):
    if routes.takes_topk(scores, lengths, k)[0]:
        from dsahal.backends.triton_kernels.topk import topk as kernel

        return kernel(scores, lengths.contiguous(), k)
    return portable_index.topk(scores, lengths, k)


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    if routes.takes_indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context)[0]:
        from dsahal.backends.triton_kernels.indexer import indexer_score as kernel

        return kernel(q.contiguous(), weights.contiguous(), index_pages, block_table, req_ids.contiguous(),
                      positions.contiguous(), index_fmt, max_context)
    return portable_index.indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt,
                                        max_context)


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    if routes.takes_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)[0]:
        from dsahal.backends.triton_kernels.sparse_mla import sparse_mla as kernel

        return kernel(q, kv_pages, slots.contiguous(), kv_fmt, kv_scale, softmax_scale)
    return portable_attention.sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    if routes.takes_kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm)[0]:
        from dsahal.backends.triton_kernels.kda import kda_decode as kernel

        return kernel(q, k, v, g, beta, state_pool, state_ids.contiguous(), scale, use_qk_l2norm)
    return portable_kda.kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm)
