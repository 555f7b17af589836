"""Slot lists made safe for kernels that trust their indices (FlashMLA checks only for -1).

One launch: ``[T, K]`` int32/int64 slots -> ``[T, width]`` int32, every entry outside
``[0, num_slots)`` set to -1 and columns ``K..width`` filled with -1. Replaces the four or five
elementwise torch ops the same thing takes (each a kernel launch: ~20 µs of host time apiece on the
H200 machine, measured 2026-12-01), so a route that needs it pays one launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from dsahal.kernel_launch import wrap_launched


@triton.jit(do_not_specialize=("K", "WIDTH", "NUM_SLOTS"))
def _guard_kernel(src, stride_t, dst, K, WIDTH, NUM_SLOTS, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slots = tl.load(src + row * stride_t + cols, mask=cols < K, other=-1).to(tl.int64)
    safe = tl.where((slots >= 0) & (slots < NUM_SLOTS), slots, -1).to(tl.int32)
    tl.store(dst + row * WIDTH + cols, safe, mask=cols < WIDTH)


def guard_indices(slots: torch.Tensor, num_slots: int, width: int, block: int = 1024) -> torch.Tensor:
    """``slots`` ``[T, K]`` (unit stride in K) -> ``[T, width]`` int32 with ``width >= K``."""
    tokens, k = slots.shape
    out = torch.empty((tokens, width), dtype=torch.int32, device=slots.device)
    if tokens and width:
        src = slots if k == 0 or slots.stride(1) == 1 else slots.contiguous()
        _guard_kernel[(tokens, triton.cdiv(width, block))](src, src.stride(0), out, k, width, num_slots, BLOCK=block)
    return out


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
