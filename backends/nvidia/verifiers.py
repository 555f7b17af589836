"""Per-op verifiers of the NVIDIA backend: ``(*op_args) -> (ok, reason)``; a rejected call falls back
to the reference. They read metadata only (never tensor values: no GPU sync)."""
from __future__ import annotations

import torch

from dsahal.backends.triton_kernels.cache_write import format_code

LATENT_FORMATS = frozenset({"bf16", "fp8", "fp8_ds_mla"})
INDEX_FORMATS = frozenset({"bf16", "fp8"})
MAX_INDEX_HEADS = 128
MAX_KDA_KEY_DIM = 256


def _on_cuda(**tensors) -> tuple[bool, str]:
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device.type != "cuda":
            return False, f"'{name}' is on {t.device}, the Triton kernels need CUDA tensors"
    return True, ""


def verify_cache_write(values, slots, pages, kind, fmt, scale):
    if format_code(kind, fmt) is None:
        return False, f"no Triton kernel for format {kind}:{fmt}"
    return _on_cuda(values=values, slots=slots, pages=pages)


def verify_indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    if index_fmt not in INDEX_FORMATS:
        return False, f"index format {index_fmt!r} has no Triton kernel (have {sorted(INDEX_FORMATS)})"
    if q.shape[1] > MAX_INDEX_HEADS:
        return False, f"{q.shape[1]} indexer heads; the kernel holds at most {MAX_INDEX_HEADS}"
    return _on_cuda(q=q, weights=weights, index_pages=index_pages, block_table=block_table)


def verify_topk(scores, lengths, k):
    return _on_cuda(scores=scores, lengths=lengths)


def verify_positions_to_slots(positions, req_ids, block_table, block_tokens):
    return _on_cuda(positions=positions, req_ids=req_ids, block_table=block_table)


def verify_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    if kv_fmt not in LATENT_FORMATS:
        return False, f"latent format {kv_fmt!r} has no Triton kernel (have {sorted(LATENT_FORMATS)})"
    return _on_cuda(q=q, kv_pages=kv_pages, slots=slots)


def verify_lse_combine(o_parts, lse_parts):
    return _on_cuda(o_parts=o_parts, lse_parts=lse_parts)


def verify_dsa_attention(q_index, index_weights, index_pages, index_fmt, q, kv_pages, kv_fmt, kv_scale, block_table,
                         req_ids, positions, topk, max_context, softmax_scale):
    ok, why = verify_indexer_score(q_index, index_weights, index_pages, block_table, req_ids, positions, index_fmt,
                                   max_context)
    if not ok:
        return ok, why
    return verify_sparse_mla(q, kv_pages, positions, kv_fmt, kv_scale, softmax_scale)


def _verify_kda(q, v, g, state_pool):
    if q.shape[-1] > MAX_KDA_KEY_DIM:
        return False, f"key dim {q.shape[-1]} > {MAX_KDA_KEY_DIM}"
    if state_pool.stride(-1) != 1:
        return False, "state_pool needs unit stride in its last (V) dim"
    if g.shape[-1] > 1 and g.stride(-1) != 1:  # the kernel reads g's channels with unit steps
        return False, f"g needs unit stride in its last (K) dim, got strides {list(g.stride())}"
    return _on_cuda(q=q, v=v, state_pool=state_pool)


def verify_kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    return _verify_kda(q, v, g, state_pool)


def verify_kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    return _verify_kda(q, v, g, state_pool)
