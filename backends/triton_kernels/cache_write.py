"""Cache write: quantise tokens into a cache format and scatter them to their slots.

One program writes one token. Slots outside ``[0, num_slots)`` (including -1) write nothing.
Formats (``dsahal.formats``):

- latent bf16 (1152 B), index bf16 (256 B): round-to-nearest-even to bf16;
- latent fp8 (576 B): ``clamp(x / scale, ±448)`` to e4m3, one external fp32 scale;
- index fp8 (132 B): 128 e4m3 then the token's fp32 scale, the smallest power of two
  ``>= amax / 448`` (amax floored at 1e-4), decided by exact comparisons, never by a rounded log2;
- latent fp8_ds_mla (656 B): 4 tiles of 128 e4m3, 4 fp32 power-of-two tile scales (same rule,
  floored at 2^-126), 64 bf16 RoPE dims (saturating).

Every rule mirrors :mod:`dsahal.formats` bit for bit (checked on the GPU against its ``pack``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .bytes import store_bf16, store_f32, store_fp8

FP8_MAX = 448.0
BF16_MAX: tl.constexpr = tl.constexpr(3.3895313892515355e38)  # largest finite bf16: bf16 writes saturate here
SCALED_MAX: tl.constexpr = tl.constexpr(1.5 * 2.0**127)  # index fp8 inputs saturate here (dsahal.formats)
# Format codes of this kernel.
BF16 = 0
FP8_TENSOR = 1
FP8_TOKEN = 2
FP8_DS_MLA = 3


@triton.jit
def _pow2(exponent):
    """``2^exponent`` as fp32 for an int32 exponent in ``[-126, 127]``."""
    return ((exponent + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _pow2_scale_at_least(amax, MIN_EXP: tl.constexpr, MAX_EXP: tl.constexpr):
    """The smallest ``2^e >= amax / 448`` with ``MIN_EXP <= e <= MAX_EXP``, decided by exact
    comparisons ``amax <= 448 · 2^e`` (``dsahal.formats.numerics.pow2_scale_at_least``)."""
    ratio = tl.math.div_rn(amax, 448.0)
    bits = ratio.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # ceil(log2) for normals
    exponent = tl.minimum(tl.maximum(exponent, MIN_EXP), MAX_EXP)
    # the division rounded: step down or up by one where the exact test says so
    lower = tl.maximum(exponent - 1, MIN_EXP)
    exponent = tl.where((exponent > MIN_EXP) & (amax <= 448.0 * _pow2(lower)), lower, exponent)
    exponent = tl.where((exponent < MAX_EXP) & (amax > 448.0 * _pow2(exponent)), exponent + 1, exponent)
    exponent = tl.where(amax > 0.0, exponent, MIN_EXP)
    return _pow2(exponent)


# Counts and sizes that vary from call to call are not specialised on (Triton would compile a
# variant per value pattern: ==1, multiple of 16); strides stay specialised for wide loads.
SIZE_ARGS = ("num_slots", "block_tokens")


@triton.jit(do_not_specialize=SIZE_ARGS)
def cache_write_kernel(
    values_ptr, stride_vn,  # [N, D]
    slots_ptr,  # [N]
    pages_ptr, stride_pb, stride_pt,  # [num_blocks, block_tokens, token_bytes] uint8
    scale_ptr,  # [] fp32 tensor scale (FP8_TENSOR)
    D, num_slots, block_tokens,
    FMT: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + n).to(tl.int64)
    if (slot >= 0) & (slot < num_slots):
        row = pages_ptr + (slot // block_tokens) * stride_pb + (slot % block_tokens) * stride_pt
        cols = tl.arange(0, BLOCK_D)
        in_dim = cols < D
        x = tl.load(values_ptr + n * stride_vn + cols, mask=in_dim, other=0.0).to(tl.float32)
        if FMT == 0:
            store_bf16(row + 2 * cols, tl.minimum(tl.maximum(x, -BF16_MAX), BF16_MAX), in_dim)
        elif FMT == 1:
            scale = tl.load(scale_ptr)
            q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -448.0), 448.0)
            store_fp8(row + cols, q, in_dim)
        elif FMT == 2:
            x = tl.minimum(tl.maximum(x, -SCALED_MAX), SCALED_MAX)
            amax = tl.minimum(tl.maximum(tl.max(tl.abs(x), axis=0), 1e-4), SCALED_MAX)
            scale = _pow2_scale_at_least(amax, -126, 127)
            q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -448.0), 448.0)
            store_fp8(row + cols, q, in_dim)
            store_f32(row + D + 0 * cols, scale + 0.0 * x, cols == 0)
        else:
            nope = cols < 512
            tile = cols // TILE
            amax = tl.zeros([BLOCK_D], tl.float32)
            for i in tl.static_range(0, 512 // TILE):
                tile_amax = tl.max(tl.where(tile == i, tl.abs(x), 0.0), axis=0)
                amax = tl.where(tile == i, tile_amax, amax)
            scale = _pow2_scale_at_least(amax, -126, 127)
            q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -448.0), 448.0)
            store_fp8(row + cols, q, nope)
            store_f32(row + 512 + 4 * tile, scale, nope & (cols % TILE == 0))
            rope = tl.minimum(tl.maximum(x, -BF16_MAX), BF16_MAX)
            store_bf16(row + 528 + 2 * (cols - 512), rope, in_dim & (cols >= 512))


def format_code(kind, fmt):
    codes = {("latent", "bf16"): BF16, ("index", "bf16"): BF16, ("latent", "fp8"): FP8_TENSOR,
             ("index", "fp8"): FP8_TOKEN, ("latent", "fp8_ds_mla"): FP8_DS_MLA}
    return codes.get((kind, fmt))


def cache_write(values, slots, pages, kind, fmt, scale, *, num_warps=4):
    """Launch :func:`cache_write_kernel`.

    Args:
        values: ``[N, D]`` fp32/bf16/fp16 (D = 576 latent, 128 index).
        slots: ``[N]`` int32/int64; -1 or out of range = skip.
        pages: ``[num_blocks, block_tokens, token_bytes]`` uint8, written in place.
        kind, fmt: the cache format; scale: ``[]`` fp32 for latent fp8, else None.
    """
    code = format_code(kind, fmt)
    if code is None:
        raise ValueError(f"triton cache_write: no kernel for format {kind}:{fmt}")
    tokens, dim = values.shape
    if tokens == 0:
        return
    values = values if values.stride(-1) == 1 else values.contiguous()
    scale_arg = scale if scale is not None else values  # unused unless FP8_TENSOR
    cache_write_kernel[(tokens,)](
        values, values.stride(0), slots, pages, pages.stride(0), pages.stride(1), scale_arg,
        dim, pages.shape[0] * pages.shape[1], pages.shape[1],
        FMT=code, BLOCK_D=triton.next_power_of_2(dim), TILE=128, num_warps=num_warps,
    )
