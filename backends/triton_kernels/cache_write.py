"""Cache write: quantise tokens into a cache format and scatter them to their slots.

One program writes one token. Slots outside ``[0, num_slots)`` (including -1) write nothing.
Formats (``dsahal.formats``):

- latent bf16 (1152 B), index bf16 (256 B): round-to-nearest-even to bf16;
- latent fp8 (576 B): ``clamp(x / scale, ±448)`` to e4m3, one external fp32 scale;
- index fp8 (132 B): 128 e4m3 then the token's fp32 scale, the smallest power of two
  ``>= amax / 448`` (amax floored at 1e-4), decided by exact comparisons, never by a rounded log2;
- latent fp8_ds_mla (656 B): 4 tiles of 128 e4m3, 4 fp32 power-of-two tile scales (same rule,
  floored at 2^-126), 64 bf16 RoPE dims (saturating);
- latent nvfp4 (352 B): 256 B of e2m1 pairs, 64 e4m3 RoPE dims at unit scale (saturating at 448),
  32 e4m3 block scales, each the smallest e4m3 ``>= amax / 6`` of its 16 dims (floored at 2^-6);
- index mxfp4 (68 B): 64 B of e2m1 pairs, 4 UE8M0 block scales, each the smallest power of two
  ``>= amax / 6`` of its 32 dims (inputs saturate at 1.5 · 2^127).

The FP4 formats are encoded with the integer codecs of :mod:`.bytes` (no float -> fp8 cast, no
division by a power of two), so their bytes are the same on every device and under the interpreter.

Every rule mirrors :mod:`dsahal.formats` bit for bit (checked on the GPU against its ``pack``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .bytes import (e2m1_code, e2m1_code_pow2, e4m3_bits, e4m3_normal_value, store_bf16, store_f32, store_fp8,
                    ue8m0_exponent)
from dsahal.kernel_launch import wrap_launched

FP8_MAX = 448.0
BF16_MAX: tl.constexpr = tl.constexpr(3.3895313892515355e38)  # largest finite bf16: bf16 writes saturate here
SCALED_MAX: tl.constexpr = tl.constexpr(1.5 * 2.0**127)  # index fp8 inputs saturate here (dsahal.formats)
# Format codes of this kernel.
BF16 = 0
FP8_TENSOR = 1
FP8_TOKEN = 2
FP8_DS_MLA = 3
NVFP4 = 4
MXFP4 = 5
FP4_DIMS = {NVFP4: 576, MXFP4: 128}  # the FP4 writers read exactly these many values per token


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
        if FMT == 4:
            _write_nvfp4(values_ptr + n * stride_vn, row)
        elif FMT == 5:
            _write_mxfp4(values_ptr + n * stride_vn, row)
        else:
            _write_fp8_or_bf16(values_ptr + n * stride_vn, row, scale_ptr, D, FMT, BLOCK_D, TILE)


@triton.jit
def _write_fp8_or_bf16(src, row, scale_ptr, D, FMT: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr):
    """One token of the bf16 / fp8 / fp8_ds_mla formats: ``src`` its D values, ``row`` its record (uint8)."""
    cols = tl.arange(0, BLOCK_D)
    in_dim = cols < D
    x = tl.load(src + cols, mask=in_dim, other=0.0).to(tl.float32)
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


@triton.jit
def _write_nvfp4(src, row):
    """One NVFP4 latent record (352 B at ``row``) from the 576 values at ``src``.

    The 512 nope dims are read as ``[32 blocks, 8 pairs]`` of even and odd dims, so each output byte
    (low nibble dim 2i, high nibble dim 2i+1) is formed in registers and every scale is one row max.
    """
    block = tl.arange(0, 32)[:, None]
    pair = tl.arange(0, 8)[None, :]
    even = tl.load(src + 16 * block + 2 * pair).to(tl.float32)  # [32, 8]
    odd = tl.load(src + 16 * block + 2 * pair + 1).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(even), axis=1), tl.max(tl.abs(odd), axis=1))  # [32]
    # the format's fp32 amax / 6 (rounded), floored at 2^-6 and capped at 448, rounded *up* onto e4m3
    needed = tl.minimum(tl.maximum(tl.math.div_rn(amax, 6.0), 2.0**-6), 448.0)
    scale_code = e4m3_bits(needed, True)
    scale = e4m3_normal_value(scale_code)[:, None]
    codes = e2m1_code(tl.math.div_rn(even, scale)) | (e2m1_code(tl.math.div_rn(odd, scale)) << 4)
    tl.store(row + 8 * block + pair, codes.to(tl.uint8))
    tl.store(row + 320 + tl.arange(0, 32), scale_code.to(tl.uint8))
    dims = tl.arange(0, 64)
    rope = tl.load(src + 512 + dims).to(tl.float32)
    tl.store(row + 256 + dims, e4m3_bits(tl.minimum(tl.maximum(rope, -448.0), 448.0), False).to(tl.uint8))


@triton.jit
def _write_mxfp4(src, row):
    """One MXFP4 index-key record (68 B at ``row``) from the 128 values at ``src``: ``[4 blocks, 16 pairs]``
    of even and odd dims, one UE8M0 exponent per block, codes decided on integers (exact)."""
    block = tl.arange(0, 4)[:, None]
    pair = tl.arange(0, 16)[None, :]
    even = tl.load(src + 32 * block + 2 * pair).to(tl.float32)  # [4, 16]
    odd = tl.load(src + 32 * block + 2 * pair + 1).to(tl.float32)
    even = tl.minimum(tl.maximum(even, -SCALED_MAX), SCALED_MAX)
    odd = tl.minimum(tl.maximum(odd, -SCALED_MAX), SCALED_MAX)
    exponent = ue8m0_exponent(tl.maximum(tl.max(tl.abs(even), axis=1), tl.max(tl.abs(odd), axis=1)))  # [4]
    codes = e2m1_code_pow2(even, exponent[:, None]) | (e2m1_code_pow2(odd, exponent[:, None]) << 4)
    tl.store(row + 16 * block + pair, codes.to(tl.uint8))
    tl.store(row + 64 + tl.arange(0, 4), (exponent + 127).to(tl.uint8))


def format_code(kind, fmt):
    codes = {("latent", "bf16"): BF16, ("index", "bf16"): BF16, ("latent", "fp8"): FP8_TENSOR,
             ("index", "fp8"): FP8_TOKEN, ("latent", "fp8_ds_mla"): FP8_DS_MLA, ("latent", "nvfp4"): NVFP4,
             ("index", "mxfp4"): MXFP4}
    return codes.get((kind, fmt))


def cache_write(values, slots, pages, kind, fmt, scale, *, num_warps=4):
    """Launch :func:`cache_write_kernel`.

    Args:
        values: ``[N, D]`` fp32/bf16/fp16 (D = 576 latent, 128 index).
        slots: ``[N]`` int32/int64; -1 or out of range = skip.
        pages: ``[num_blocks, block_tokens, token_bytes]`` uint8, written in place; any strides (a view
            into a larger pool): only the ``token_bytes`` of each written record are touched.
        kind, fmt: the cache format; scale: ``[]`` fp32 for latent fp8, else None.
    """
    code = format_code(kind, fmt)
    if code is None:
        raise ValueError(f"triton cache_write: no kernel for format {kind}:{fmt}")
    tokens, dim = values.shape
    if code in FP4_DIMS and dim != FP4_DIMS[code]:
        raise ValueError(f"triton cache_write: {kind}:{fmt} writes {FP4_DIMS[code]} values per token, "
                         f"got values of shape {list(values.shape)}")
    if tokens == 0:
        return
    values = values if values.stride(-1) == 1 else values.contiguous()
    scale_arg = scale if scale is not None else values  # unused unless FP8_TENSOR
    cache_write_kernel[(tokens,)](
        values, values.stride(0), slots, pages, pages.stride(0), pages.stride(1), scale_arg,
        dim, pages.shape[0] * pages.shape[1], pages.shape[1],
        FMT=code, BLOCK_D=triton.next_power_of_2(dim), TILE=128, num_warps=num_warps,
    )


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
