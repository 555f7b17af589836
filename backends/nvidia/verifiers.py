"""The NVIDIA backend's one verifier of its own: the fused DSA layer. Every other route is verified by
the shared Triton kernels' limits (:mod:`dsahal.backends.triton_kernels.limits`) or by
:mod:`.flashmla`. Metadata only (no tensor values: no GPU sync)."""
from __future__ import annotations

from dsahal.backends.triton_kernels import limits


def dsa_attention_accepts(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions,
                          index_fmt, kv_fmt, kv_scale, topk, max_context, softmax_scale) -> tuple[bool, str]:
    """The fused path runs the Triton indexer, the Triton top-k (which writes int32 slots straight from
    its winners, shaped ``[T, topk]`` on q's device) and the Triton sparse MLA."""
    ok, why = limits.indexer_score(q_index, index_weights, index_pages, block_table, req_ids, positions, index_fmt,
                                   max_context)
    if not ok:
        return ok, f"indexer: {why}"
    # The slots do not exist yet: the fused top-k writes them contiguous int32 [T, topk] on q's device,
    # which the Triton sparse MLA takes; the limits are asked about everything else.
    ok, why = limits.sparse_mla(q, kv_pages, None, kv_fmt, kv_scale, softmax_scale)
    return (ok, why) if ok else (False, f"sparse MLA: {why}")
