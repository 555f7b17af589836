"""Which calls the PPU sends to the shared Triton kernels (``dsahal.backends.triton_kernels``).

The PPU's toolchain is assumed to compile CUDA-targeted Triton kernels that use integer, fp32 and
bf16 arithmetic, but **not** the FP8 (``float8e4nv``) conversions and MMAs: FP8 support on the PPU is
not documented publicly. So a call goes to a Triton kernel only when it touches no FP8 value;
every other call runs the portable torch formulation of this folder. None of this has been run
on a PPU: it is the policy a PPU owner should confirm or widen, one rule per op below.

Every rule reads metadata only and returns ``(takes, reason)``; ``DSAHAL_PPU_TRITON=0`` turns all
Triton routes off (every call portable), for bisecting a problem on the hardware. Block sizes are
the launchers' defaults: nothing is tuned for the PPU.
"""
from __future__ import annotations

import importlib.util
import os

import torch

# The Triton launchers take device tensors of this type (the PPU is a CUDA device to torch).
KERNEL_DEVICE_TYPE = "cuda"
# Limits of the shared kernels (see their launchers' docstrings).
MAX_INDEX_HEADS = 128
MAX_KDA_KEY_DIM = 256

TAKES = (True, "")


def triton_enabled() -> tuple[bool, str]:
    if os.environ.get("DSAHAL_PPU_TRITON", "1").strip() in ("0", "false", "no", "off"):
        return False, "DSAHAL_PPU_TRITON=0"
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    return TAKES


def _common(**tensors) -> tuple[bool, str]:
    enabled = triton_enabled()
    if not enabled[0]:
        return enabled
    for name, tensor in tensors.items():
        if tensor is not None and tensor.device.type != KERNEL_DEVICE_TYPE:
            return False, f"'{name}' is on {tensor.device.type}, the Triton kernels take {KERNEL_DEVICE_TYPE} tensors"
    return TAKES


def _unit_stride(**tensors) -> tuple[bool, str]:
    for name, tensor in tensors.items():
        if tensor.stride(-1) != 1:
            return False, f"'{name}' has stride {tensor.stride(-1)} in its last dim; the kernel needs 1"
    return TAKES


def takes_lse_combine(o_parts, lse_parts):
    return _common(o_parts=o_parts, lse_parts=lse_parts)


def takes_positions_to_slots(positions, req_ids, block_table, block_tokens):
    ok = _common(positions=positions, req_ids=req_ids, block_table=block_table)
    return ok if not ok[0] else _unit_stride(block_table=block_table)


def takes_topk(scores, lengths, k):
    return _common(scores=scores, lengths=lengths)  # integer radix select: no FP8 anywhere


def takes_indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    ok = _common(q=q, weights=weights, index_pages=index_pages, block_table=block_table)
    if not ok[0]:
        return ok
    if index_fmt != "bf16":
        return False, f"index format {index_fmt!r}: FP8/FP4 keys need conversions not assumed on the PPU"
    if q.dtype == torch.float8_e4m3fn:
        return False, "fp8 queries need FP8 conversions not assumed on the PPU"
    if q.shape[1] > MAX_INDEX_HEADS:
        return False, f"{q.shape[1]} indexer heads; the kernel holds at most {MAX_INDEX_HEADS}"
    return _unit_stride(block_table=block_table)


def takes_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    ok = _common(q=q, kv_pages=kv_pages, slots=slots)
    if not ok[0]:
        return ok
    if kv_fmt != "bf16":
        return False, f"latent format {kv_fmt!r}: FP8/FP4 latents need conversions not assumed on the PPU"
    return TAKES


def takes_kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    ok = _common(q=q, k=k, v=v, g=g, beta=beta, state_pool=state_pool, state_ids=state_ids)
    if not ok[0]:
        return ok
    if q.shape[-1] > MAX_KDA_KEY_DIM:
        return False, f"key dim {q.shape[-1]} > {MAX_KDA_KEY_DIM}"
    # The kernel walks K and V with unit steps: q, k, g, v and the pool's V dim must be dense.
    return _unit_stride(q=q, k=k, v=v, g=g, state_pool=state_pool)
