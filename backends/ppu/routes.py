"""Which calls the PPU sends to the shared Triton kernels (``dsahal.backends.triton_kernels``).

The PPU's toolchain is assumed to compile CUDA-targeted Triton kernels that use integer, fp32 and
bf16 arithmetic, but **not** the FP8 (``float8e4nv``) conversions and MMAs: FP8 support on the PPU is
not documented publicly. So a call goes to a Triton kernel only when it touches no FP8 value;
every other call runs the portable torch formulation of this folder. None of this has been run
on a PPU: it is the policy a PPU owner should confirm or widen, one rule per op below.

Every rule reads metadata only and returns ``(takes, reason)``; it is the verifier of the op's
``triton`` route (:mod:`.plugin`), whose probe is :func:`triton_enabled`: ``DSAHAL_PPU_TRITON=0``
turns every Triton route off (every call portable), for bisecting a problem on the hardware (the same
as ``DSAHAL_ROUTES=op:-triton`` for every op). Block sizes are the launchers' defaults: nothing is
tuned for the PPU.
"""
from __future__ import annotations

import importlib.util
import os

import torch

from dsahal.backends.triton_kernels import limits
from dsahal.registry.settings import PPU_TRITON, env_flag

# The Triton launchers take device tensors of this type (the PPU is a CUDA device to torch).
KERNEL_DEVICE_TYPE = "cuda"

TAKES = (True, "")


def triton_enabled() -> tuple[bool, str]:
    if not env_flag(PPU_TRITON, default=True):
        return False, f"{PPU_TRITON}={os.environ.get(PPU_TRITON)}"
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    return TAKES


def _on_kernel_device(**tensors) -> tuple[bool, str]:
    """The PPU's device check for the shared kernels' verifiers."""
    for name, tensor in tensors.items():
        if tensor is not None and tensor.device.type != KERNEL_DEVICE_TYPE:
            return False, f"'{name}' is on {tensor.device.type}, the Triton kernels take {KERNEL_DEVICE_TYPE} tensors"
    return TAKES


def _kernel_limits(shared, *args) -> tuple[bool, str]:
    """The shared kernel's own limits (formats, sizes, strides), checked with the PPU device rule;
    ``KERNEL_DEVICE_TYPE`` is read per call so tests can point it at the interpreter's host tensors."""
    return shared(*args, device_check=_on_kernel_device)


def takes_lse_combine(o_parts, lse_parts):
    return _kernel_limits(limits.lse_combine, o_parts, lse_parts)


def takes_positions_to_slots(positions, req_ids, block_table, block_tokens):
    return _kernel_limits(limits.positions_to_slots, positions, req_ids, block_table, block_tokens)


def takes_topk(scores, lengths, k):
    return _kernel_limits(limits.topk, scores, lengths, k)  # integer radix select: no FP8 anywhere


def takes_indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    ok = _on_kernel_device(q=q, weights=weights, index_pages=index_pages, block_table=block_table)
    if not ok[0]:
        return ok
    if index_fmt != "bf16":
        return False, f"index format {index_fmt!r}: FP8/FP4 keys need conversions not assumed on the PPU"
    if q.dtype == torch.float8_e4m3fn:
        return False, "fp8 queries need FP8 conversions not assumed on the PPU"
    return _kernel_limits(limits.indexer_score, q, weights, index_pages, block_table, req_ids, positions,
                          index_fmt, max_context)


def takes_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    ok = _on_kernel_device(q=q, kv_pages=kv_pages, slots=slots)
    if not ok[0]:
        return ok
    if kv_fmt != "bf16":
        return False, f"latent format {kv_fmt!r}: FP8/FP4 latents need conversions not assumed on the PPU"
    return _kernel_limits(limits.sparse_mla, q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)


def takes_kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    return _kernel_limits(limits.kda_decode, q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm)
