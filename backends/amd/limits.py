"""What each AMD path accepts: architecture, dtype and shape limits, as ``(*op_args) -> (ok, reason)``.

They read metadata only (shapes, dtypes, strides, the device's gfx target), never tensor values, so
checking costs no device synchronisation. The vendor limits come from the vendor entry points'
own checks and shipped kernel lists (AITER ``mla.py``, ``hsa/gfx942/mla/*.co``,
``ops/flydsl/sparse_mla_decode_kernels.py``, ``op_tests/test_flydsl_pa_mqa_logits_fp4.py``).
"""
from __future__ import annotations

import torch

from dsahal.backends.triton_kernels import limits as triton_limits

from .arch import gfx_of
from .marshal import latent_pages_are_dense
from .paths import CDNA3_4, CDNA4

OK = (True, "")
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


# -- Triton (shared kernels): the kernels' own limits, with this backend's device check ---------------

def _triton(shared):
    """A shared-kernel verifier that checks devices with this module's :func:`on_gpu` (looked up per
    call, so the AMD device rules apply wherever the Triton path is chosen)."""

    def verify(*args):
        return shared(*args, device_check=lambda **tensors: on_gpu(**tensors))

    verify.__name__ = f"triton_{shared.__name__}"
    verify.__doc__ = shared.__doc__
    return verify


FP4_FORMATS = frozenset({"nvfp4", "mxfp4"})
FP4_UNVERIFIED = ("the shared Triton kernels' FP4 paths (tl.dot_scaled, e2m1 decode) have not run on ROCm or on the "
                  "AMD block sizes: the AMD Triton route declines {fmt!r} until they have")
_shared_cache_write = _triton(triton_limits.cache_write)
_shared_indexer_score = _triton(triton_limits.indexer_score)
_shared_sparse_mla = _triton(triton_limits.sparse_mla)


def triton_cache_write(values, slots, pages, kind, fmt, scale):
    if fmt in FP4_FORMATS:
        return False, FP4_UNVERIFIED.format(fmt=fmt)
    return _shared_cache_write(values, slots, pages, kind, fmt, scale)


def triton_indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    if index_fmt in FP4_FORMATS:
        return False, FP4_UNVERIFIED.format(fmt=index_fmt)
    return _shared_indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context)


def triton_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    if kv_fmt in FP4_FORMATS:
        return False, FP4_UNVERIFIED.format(fmt=kv_fmt)
    return _shared_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)



triton_topk = _triton(triton_limits.topk)
triton_positions_to_slots = _triton(triton_limits.positions_to_slots)
triton_lse_combine = _triton(triton_limits.lse_combine)
triton_kda_decode = _triton(triton_limits.kda_decode)
triton_kda_prefill = _triton(triton_limits.kda_prefill)


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
