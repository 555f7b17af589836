"""The NVIDIA backend's own verifiers: the fused DSA layer and the few-heads sparse MLA. Every other route is verified by
the shared Triton kernels' limits (:mod:`dsahal.backends.triton_kernels.limits`) or by
:mod:`.flashmla`. Metadata only (no tensor values: no GPU sync)."""
from __future__ import annotations

from dsahal.backends.triton_kernels import limits

from . import config


def dsa_attention_accepts(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions,
                          index_fmt, kv_fmt, kv_scale, topk, max_context, softmax_scale) -> tuple[bool, str]:
    """The fused path runs the Triton indexer and the Triton top-k (which writes int32 slots straight from
    its winners, ``[T, topk]`` on q's device); its sparse-MLA stage goes through the op table, whose routes
    (and fallback) verify themselves."""
    ok, why = limits.indexer_score(q_index, index_weights, index_pages, block_table, req_ids, positions, index_fmt,
                                   max_context)
    if not ok:
        return ok, f"indexer: {why}"
    return limits.on_gpu(q=q, kv_pages=kv_pages)  # the top-k runs where q is; it has no other limit


def small_heads_accepts(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale) -> tuple[bool, str]:
    """The few-heads kernel serves up to :data:`config.SMALL_HEADS_MAX` heads (where it beats FlashMLA's
    padded tiles and our general kernel, by the H200 measurement in :mod:`.config`)."""
    if q.dim() == 3 and q.shape[1] > config.SMALL_HEADS_MAX:
        return False, f"{q.shape[1]} heads > {config.SMALL_HEADS_MAX}: the many-heads routes serve it"
    return limits.sparse_mla_small_heads(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)
