"""The NVIDIA backend's own verifiers: the fused DSA layer and the few-heads sparse MLA. Every other route is verified by
the shared Triton kernels' limits (:mod:`dsahal.backends.triton_kernels.limits`) or by
:mod:`.flashmla`. Metadata only (no tensor values: no GPU sync)."""
from __future__ import annotations

import torch

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


SMALL_HEADS_FORMATS = ("fp8_ds_mla", "nvfp4")


def small_heads_accepts(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale) -> tuple[bool, str]:
    """The few-heads kernel serves up to :data:`config.SMALL_HEADS_MAX` heads of bf16 queries on the formats
    with per-tile scales, where it beat the general kernel on the H200 (2026-12-01, 320 tokens x 2048 slots,
    H = 16: fp8_ds_mla 0.90 vs 1.02 ms, nvfp4 0.86 vs 0.90 ms; ``scripts/h200/small_heads_sweep.py``); on
    bf16 and per-tensor fp8 latents the general kernel was faster (0.47 / 0.45 vs 0.61 ms)."""
    if q.dim() == 3 and q.shape[1] > config.SMALL_HEADS_MAX:
        return False, f"{q.shape[1]} heads > {config.SMALL_HEADS_MAX}: the many-heads routes serve it"
    if kv_fmt not in SMALL_HEADS_FORMATS:
        return False, f"{kv_fmt} latents: the general kernel measured faster (the few-heads route takes {SMALL_HEADS_FORMATS})"
    if q.dtype != torch.bfloat16:
        return False, f"{str(q.dtype).replace('torch.', '')} queries: the exact fp32 dots are the general kernel's"
    return limits.sparse_mla_small_heads(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)
