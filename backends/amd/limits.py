"""What each AMD path accepts: architecture, dtype and shape limits, as ``(*op_args) -> (ok, reason)``.

They read metadata only (shapes, dtypes, strides, the device's gfx target), never tensor values, so
checking costs no device synchronisation. The vendor limits come from the vendor entry points'
own checks and shipped kernel lists (AITER ``mla.py``, ``hsa/gfx942/mla/*.co``,
``ops/flydsl/sparse_mla_decode_kernels.py``, ``op_tests/test_flydsl_pa_mqa_logits_fp4.py``).
"""
from __future__ import annotations

import torch

from .arch import gfx_of
from .marshal import latent_pages_are_dense
from .paths import CDNA3_4, CDNA4

OK = (True, "")
TRITON_LATENT_FORMATS = frozenset({"bf16", "fp8", "fp8_ds_mla"})
TRITON_INDEX_FORMATS = frozenset({"bf16", "fp8"})
TRITON_MAX_INDEX_HEADS = 128
TRITON_MAX_KDA_KEY_DIM = 256
AITER_MLA_BF16_HEADS = frozenset({16, 128})  # a16w16 decode kernels AITER ships for gfx942/gfx950
AITER_TOPK_MAX_K = 2048
FLYDSL_MLA_HEADS = 16  # H of the compiled FlyDSL sparse decode kernel
FLYDSL_MLA_MAX_ROWS = 96
FLYDSL_MLA_MAX_SLOTS = 33 * 64  # 1..33 splits of 64 keys
FP4_BLOCK_TOKENS = frozenset({16, 32, 64, 128, 256})  # MFMA_N multiples dividing the 256-key chunk


def on_gpu(**tensors) -> tuple[bool, str]:
    """ROCm tensors report device type 'cuda', like CUDA ones."""
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "cuda":
            return False, f"'{name}' is on {tensor.device}; the kernels need GPU tensors"
    return OK


def on_arch(tensor: torch.Tensor, archs: frozenset[str], what: str) -> tuple[bool, str]:
    ok, why = on_gpu(tensor=tensor)
    if not ok:
        return ok, why
    gfx = gfx_of(tensor)
    if gfx not in archs:
        return False, f"{what} runs on {sorted(archs)}, this device is {gfx or 'not a ROCm GPU'}"
    return OK


def _first_failure(*checks) -> tuple[bool, str]:
    for ok, why in checks:
        if not ok:
            return ok, why
    return OK


# -- Triton (shared kernels) ------------------------------------------------------------------------

def triton_cache_write(values, slots, pages, kind, fmt, scale):
    from dsahal.backends.triton_kernels.cache_write import format_code

    if format_code(kind, fmt) is None:
        return False, f"no Triton cache-write kernel for format {kind}:{fmt}"
    return on_gpu(values=values, slots=slots, pages=pages)


def triton_indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    if index_fmt not in TRITON_INDEX_FORMATS:
        return False, f"Triton indexer reads {sorted(TRITON_INDEX_FORMATS)} keys, not {index_fmt!r}"
    if q.shape[1] > TRITON_MAX_INDEX_HEADS:
        return False, f"Triton indexer holds at most {TRITON_MAX_INDEX_HEADS} heads, got {q.shape[1]}"
    return on_gpu(q=q, weights=weights, index_pages=index_pages, block_table=block_table)


def triton_topk(scores, lengths, k):
    return on_gpu(scores=scores, lengths=lengths)


def triton_positions_to_slots(positions, req_ids, block_table, block_tokens):
    return on_gpu(positions=positions, req_ids=req_ids, block_table=block_table)


def triton_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    if kv_fmt not in TRITON_LATENT_FORMATS:
        return False, f"Triton sparse MLA reads {sorted(TRITON_LATENT_FORMATS)} latents, not {kv_fmt!r}"
    return on_gpu(q=q, kv_pages=kv_pages, slots=slots)


def triton_lse_combine(o_parts, lse_parts):
    return on_gpu(o_parts=o_parts, lse_parts=lse_parts)


def _triton_kda(q, v, g, state_pool):
    if q.shape[-1] > TRITON_MAX_KDA_KEY_DIM:
        return False, f"Triton KDA key dim {q.shape[-1]} > {TRITON_MAX_KDA_KEY_DIM}"
    if state_pool.stride(-1) != 1:
        return False, "Triton KDA needs unit stride in the state pool's last (V) dim"
    if g.shape[-1] > 1 and g.stride(-1) != 1:  # the kernel reads g's channels with unit steps
        return False, f"Triton KDA needs unit stride in g's last (K) dim, got strides {list(g.stride())}"
    return on_gpu(q=q, v=v, state_pool=state_pool)


def triton_kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    return _triton_kda(q, v, g, state_pool)


def triton_kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    return _triton_kda(q, v, g, state_pool)


# -- AITER ------------------------------------------------------------------------------------------

def aiter_indexer_fp8(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    block_tokens, heads = index_pages.shape[1], q.shape[1]
    return _first_failure(
        (index_fmt == "fp8", f"AITER paged MQA logits read fp8 (132 B) keys, not {index_fmt!r}"),
        (block_tokens & (block_tokens - 1) == 0 and block_tokens <= 256,
         f"AITER paged MQA logits need block_tokens a power of two <= 256 (256-key chunks), got {block_tokens}"),
        (heads in (16, 32, 64, 128), f"AITER paged MQA logits take 16/32/64/128 heads, got {heads}"),
        on_arch(q, CDNA3_4, "AITER paged MQA logits"),
    )


def aiter_topk(scores, lengths, k):
    return _first_failure(
        (1 <= k <= AITER_TOPK_MAX_K, f"AITER top_k_per_row takes k <= {AITER_TOPK_MAX_K}, got {k}"),
        (scores.shape[1] < 2**31, "AITER top_k_per_row indexes rows with int32"),
        on_arch(scores, CDNA3_4, "AITER top_k_per_row"),
    )


def aiter_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    return _first_failure(
        (kv_fmt == "bf16" and q.dtype == torch.bfloat16,
         f"AITER sparse MLA path takes bf16 q over a bf16 latent, got {q.dtype} over {kv_fmt!r}"),
        (q.shape[1] in AITER_MLA_BF16_HEADS, f"AITER bf16 MLA decode kernels exist for {sorted(AITER_MLA_BF16_HEADS)}"
                                             f" heads, got {q.shape[1]}"),
        (latent_pages_are_dense(kv_pages), "AITER addresses slot s at s * 576: the latent pages must be dense"),
        on_arch(q, CDNA3_4, "AITER mla_decode_fwd"),
    )


# -- FlyDSL (through AITER's launchers) ---------------------------------------------------------------

def flydsl_indexer_mxfp4(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    block_tokens, heads = index_pages.shape[1], q.shape[1]
    return _first_failure(
        (index_fmt == "mxfp4", f"FlyDSL FP4 logits read mxfp4 (68 B) keys, not {index_fmt!r}"),
        (heads % 16 == 0 and heads <= 128, f"FlyDSL FP4 logits need heads a multiple of 16 <= 128, got {heads}"),
        (block_tokens in FP4_BLOCK_TOKENS, f"FlyDSL FP4 logits need block_tokens in {sorted(FP4_BLOCK_TOKENS)}, "
                                           f"got {block_tokens}"),
        on_arch(q, CDNA4, "FlyDSL FP4 logits (native e2m1 MFMA)"),
    )


def flydsl_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    tokens, heads, _ = q.shape
    return _first_failure(
        (kv_fmt == "fp8", f"FlyDSL sparse MLA reads the 576 B fp8 latent, not {kv_fmt!r}"),
        (heads == FLYDSL_MLA_HEADS, f"FlyDSL sparse MLA is compiled for {FLYDSL_MLA_HEADS} heads, got {heads}"),
        (1 <= tokens <= FLYDSL_MLA_MAX_ROWS, f"FlyDSL sparse MLA decode takes 1..{FLYDSL_MLA_MAX_ROWS} rows, "
                                             f"got {tokens}"),
        (1 <= slots.shape[1] <= FLYDSL_MLA_MAX_SLOTS, f"FlyDSL sparse MLA takes 1..{FLYDSL_MLA_MAX_SLOTS} slots per "
                                                      f"row, got {slots.shape[1]}"),
        (latent_pages_are_dense(kv_pages), "FlyDSL addresses slot s at s * 576: the latent pages must be dense"),
        on_arch(q, CDNA4, "FlyDSL sparse MLA"),
    )
