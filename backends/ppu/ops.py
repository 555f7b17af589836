"""The PPU backend's Triton routes: the shared Triton kernels, with the small index tensors made
contiguous (the kernels index them with unit steps). Each is the implementation of an op's
``triton`` route, verified by :mod:`.routes`; the ``portable`` routes are the torch formulations of
:mod:`.portable_attention`, :mod:`.portable_index` and :mod:`.portable_kda`. Kernel modules are
imported on first use, so a machine without triton (or the CPU twin) never imports them.
"""
from __future__ import annotations


def lse_combine(o_parts, lse_parts):
    from dsahal.backends.triton_kernels.lse_combine import lse_combine as kernel

    return kernel(o_parts, lse_parts)


def positions_to_slots(positions, req_ids, block_table, block_tokens):
    from dsahal.backends.triton_kernels.slots import positions_to_slots as kernel

    return kernel(positions, req_ids.contiguous(), block_table, block_tokens)


def topk(scores, lengths, k):
    from dsahal.backends.triton_kernels.topk import topk as kernel

    return kernel(scores, lengths.contiguous(), k)


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    from dsahal.backends.triton_kernels.indexer import indexer_score as kernel

    return kernel(q.contiguous(), weights.contiguous(), index_pages, block_table, req_ids.contiguous(),
                  positions.contiguous(), index_fmt, max_context)


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    from dsahal.backends.triton_kernels.sparse_mla import sparse_mla as kernel

    return kernel(q, kv_pages, slots.contiguous(), kv_fmt, kv_scale, softmax_scale)


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    from dsahal.backends.triton_kernels.kda import kda_decode as kernel

    return kernel(q, k, v, g, beta, state_pool, state_ids.contiguous(), scale, use_qk_l2norm)
