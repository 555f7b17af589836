"""Per-op verifiers of the NVIDIA backend: ``(*op_args) -> (ok, reason)``; a rejected call falls back
to the reference. They read metadata only (never tensor values: no GPU sync)."""
from __future__ import annotations

from dsahal.backends.triton_kernels import limits

# The NVIDIA backend serves every op with the shared Triton kernels: their limits are its limits.
verify_cache_write = limits.cache_write
verify_indexer_score = limits.indexer_score
verify_topk = limits.topk
verify_positions_to_slots = limits.positions_to_slots
verify_sparse_mla = limits.sparse_mla
verify_lse_combine = limits.lse_combine
verify_kda_decode = limits.kda_decode
verify_kda_prefill = limits.kda_prefill


def verify_dsa_attention(q_index, index_weights, index_pages, index_fmt, q, kv_pages, kv_fmt, kv_scale, block_table,
                         req_ids, positions, topk, max_context, softmax_scale):
    ok, why = verify_indexer_score(q_index, index_weights, index_pages, block_table, req_ids, positions, index_fmt,
                                   max_context)
    if not ok:
        return ok, why
    return verify_sparse_mla(q, kv_pages, positions, kv_fmt, kv_scale, softmax_scale)
