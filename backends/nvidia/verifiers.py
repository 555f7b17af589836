"""The NVIDIA backend's own verifiers: the fused DSA layer and the few-heads sparse MLA. Every other route is verified by
the shared Triton kernels' limits (:mod:`dsahal.backends.triton_kernels.limits`) or by
:mod:`.flashmla`. Metadata only (no tensor values: no GPU sync)."""
from __future__ import annotations

import functools
import importlib

import torch

from dsahal.backends.triton_kernels import limits

from . import config, flashmla


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


GLUON_MIN_CAPABILITY = (8, 9)  # the fp8 -> fp16 conversion (cvt.rn.f16x2.e4m3x2) is sm_89+


def gluon_few_heads_accepts(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale) -> tuple[bool, str]:
    """The Gluon few-heads kernel (:mod:`dsahal.backends.triton_kernels.sparse_mla_gluon`): what its launcher takes
    (:func:`~dsahal.backends.triton_kernels.sparse_mla_gluon.refusal`), on an NVIDIA GPU of sm_89 or newer."""
    try:
        from dsahal.backends.triton_kernels import sparse_mla_gluon as gluon_mla
    except ImportError as exc:  # a Triton without Gluon (3.4+ has it)
        return False, f"the installed Triton has no Gluon ({exc})"
    why = gluon_mla.refusal(q, kv_pages, kv_fmt, slots)
    if why:
        return False, why
    capability = _capability(q.device.index)
    if capability < GLUON_MIN_CAPABILITY:
        return False, (f"sm{capability[0]}{capability[1]}: the Gluon kernel's fp8 conversion needs "
                       f"sm{GLUON_MIN_CAPABILITY[0]}{GLUON_MIN_CAPABILITY[1]} or newer")
    return True, ""


WGMMA_CAPABILITY = (9, 0)  # Hopper's wgmma: sm_90 only (Blackwell has tcgen05 MMAs instead)


def wgmma_few_heads_accepts(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale) -> tuple[bool, str]:
    """The wgmma few-heads kernel (:mod:`dsahal.backends.triton_kernels.sparse_mla_wgmma`): what its launcher takes
    (:func:`~dsahal.backends.triton_kernels.sparse_mla_wgmma.refusal`: fp8_ds_mla or per-tensor FP8 records) on an
    sm_90 GPU, at most :data:`config.WGMMA_ROUTE_MAX_HEADS` heads for the format (the kernel takes more, in groups of
    16: not routed, the limits say why). In default mode a call of fewer than :data:`config.WGMMA_MIN_TOKENS` query
    tokens that FlashMLA's decode serves (its package loads and its verifier takes the call) is left to it: there it
    measured as fast in GPU time, with less host time a call (thirty-sixth session, H100: 8 tokens 21.4 us against our
    20.9 at 256-slot splits; from 16 tokens ours is faster). Every call in batch-invariant mode, where a route must not
    depend on the batch (this kernel's splits are a fixed slot count, so its result does not either)."""
    most = config.WGMMA_ROUTE_MAX_HEADS.get(kv_fmt)
    if most is not None and q.dim() == 3 and q.shape[1] > most:  # first: the calls FlashMLA serves (64, 128 heads)
        # pay no more than this on every call (host time at 64 x 1 tokens, twenty-fifth session)
        return False, (f"{q.shape[1]} heads: the route takes at most {most} with {kv_fmt} latents "
                       f"(config.WGMMA_ROUTE_MAX_HEADS)")
    why = _wgmma_refusal("sparse_mla_wgmma", q, kv_pages, kv_fmt, slots)
    if why:
        return False, why
    if (not config.batch_invariant() and q.shape[0] < config.WGMMA_MIN_TOKENS and _flashmla_loads()
            and flashmla.decode_accepts(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)[0]):
        return False, (f"{q.shape[0]} query tokens: below {config.WGMMA_MIN_TOKENS}, FlashMLA's decode (which takes "
                       f"this call) is as fast in GPU time with less host time (default mode)")
    return True, ""


def wgmma_nvfp4_accepts(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale) -> tuple[bool, str]:
    """The wgmma NVFP4 kernel (:mod:`dsahal.backends.triton_kernels.sparse_mla_wgmma_fp4`): what its launcher takes
    (:func:`~dsahal.backends.triton_kernels.sparse_mla_wgmma_fp4.refusal`) on an sm_90 GPU, in both modes and at every
    batch size (FlashMLA has no NVFP4 latent; on the H200 it was faster than the few-heads Triton kernel from 8 tokens
    to 512, twenty-third session), up to :data:`config.WGMMA_GROUPED_MAX_HEADS` heads (groups of 16)."""
    why = _wgmma_refusal("sparse_mla_wgmma_fp4", q, kv_pages, kv_fmt, slots)
    if not why and q.shape[1] > config.WGMMA_GROUPED_MAX_HEADS:
        why = f"{q.shape[1]} heads: the route takes at most {config.WGMMA_GROUPED_MAX_HEADS} (groups of 16)"
    return not why, why


@functools.lru_cache(maxsize=None)
def _kernel_module(module_name: str):
    """The kernel module :mod:`dsahal.backends.triton_kernels`.``module_name``, imported once (the verifiers run on
    every call), or why it does not import (a Triton without Gluon: 3.4+ has it)."""
    try:
        return importlib.import_module(f"dsahal.backends.triton_kernels.{module_name}")
    except ImportError as exc:
        return f"the installed Triton has no Gluon ({exc})"


def _wgmma_refusal(module_name: str, q, kv_pages, kv_fmt, slots) -> str:
    """Why a wgmma kernel of :mod:`dsahal.backends.triton_kernels` (``module_name``) does not take a call ("" when it
    does): a Triton with Gluon, the launcher's own refusal, an sm_90 GPU."""
    module = _kernel_module(module_name)
    if isinstance(module, str):
        return module
    why = module.refusal(q, kv_pages, kv_fmt, slots)
    if why:
        return why
    capability = _capability(q.device.index)
    if capability != WGMMA_CAPABILITY:
        return f"sm{capability[0]}{capability[1]}: the kernel's wgmma is sm_90 only"
    return ""


@functools.lru_cache(maxsize=None)
def _flashmla_loads() -> bool:
    """Whether FlashMLA's route is available in this process (its probe, asked once)."""
    return flashmla.probe()[0]


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    """A CUDA device's compute capability, asked of the driver once (the verifier runs on every call)."""
    return torch.cuda.get_device_capability(index)


def small_heads_accepts(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale) -> tuple[bool, str]:
    """The few-heads kernel serves up to :data:`config.SMALL_HEADS_MAX` heads of bf16 queries on the formats
    with per-tile scales, where it beat the general kernel on the H200 (2026-12-01, 320 tokens x 2048 slots,
    H = 16: fp8_ds_mla 0.90 vs 1.02 ms, nvfp4 0.86 vs 0.90 ms; ``scripts/h200/small_heads_sweep.py``); on
    bf16 and per-tensor fp8 latents the general kernel was faster (0.47 / 0.45 vs 0.61 ms). fp8_ds_mla at <= 16
    heads runs on the raw-e4m3 kernel since the eighth session (0.457 ms at H = 16: ``hopper_config``)."""
    if q.dim() == 3 and q.shape[1] > config.SMALL_HEADS_MAX:
        return False, f"{q.shape[1]} heads > {config.SMALL_HEADS_MAX}: the many-heads routes serve it"
    if kv_fmt not in SMALL_HEADS_FORMATS:
        return False, f"{kv_fmt} latents: the general kernel measured faster (the few-heads route takes {SMALL_HEADS_FORMATS})"
    if q.dtype != torch.bfloat16:
        return False, f"{str(q.dtype).replace('torch.', '')} queries: the exact fp32 dots are the general kernel's"
    return limits.sparse_mla_small_heads(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)


# KDA prefill calls of at most this many tokens go to the token-by-token Triton kernel. H200, 2026-12-01
# (scripts/h200/kda_prefill_check.py, 32 heads, K = V = 128, bf16): 4 prompts of 128/112/96/80 tokens 0.325 ms
# vs fla's chunk_kda 1.64 ms with a fresh cu_seqlens (2.08 ms through the fla route); at 8 x 512 both 2.5 ms;
# at 64 x 128 (8K tokens) fla 2.6 vs 5.0 ms. The token-by-token kernel's time grows with the longest sequence,
# so a small total bounds it: one 512-token sequence is ~1.3 ms at ~2.5 us a token.
SHORT_PREFILL_TOKENS = 512


CHUNK_MAX_DIM = 128  # the chunked kernel's K and a call's V (tiles held on chip; V past it in slices)


def chunk_prefill_accepts(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    """Our chunked kernel: K up to :data:`CHUNK_MAX_DIM` (any V: past it the launcher runs slices of the value
    columns, each an exact call of its own), and what the recurrent kernel takes."""
    if q.shape[-1] > CHUNK_MAX_DIM:
        return False, (f"K = {q.shape[-1]}: the chunked kernel holds K <= {CHUNK_MAX_DIM} on chip (V past it runs "
                       f"in slices)")
    return limits.kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm)


def chunk_mixed_accepts(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    """The chunked kernel's mixed mode, ahead of fla: 16-bit inputs (fp32 ones go on to the exact recurrent
    kernel, as before: the chunked kernel's exact fp32 dots spill on sm_90), and what the chunked kernel takes."""
    if q.dtype == torch.float32:
        return False, "fp32 inputs: the exact recurrent kernel serves them (the chunked kernel's fp32 dots spill)"
    return chunk_prefill_accepts(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm)


def short_prefill_accepts(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    """The recurrent kernel ahead of fla for short calls (``T <= SHORT_PREFILL_TOKENS``); longer ones go on."""
    if q.shape[0] > SHORT_PREFILL_TOKENS:
        return False, f"{q.shape[0]} tokens > {SHORT_PREFILL_TOKENS}: the chunked kernels are faster there"
    return limits.kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm)
