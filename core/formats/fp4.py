"""FP4 (e2m1) formats: NVFP4 for the MLA latent (352 B) and MXFP4 for index keys (68 B).

Both store two e2m1 codes per byte: element ``2i`` in the low nibble, ``2i+1`` in the high nibble;
a code is ``sign << 3 | magnitude index`` into ``0, 0.5, 1, 1.5, 2, 3, 4, 6``.

NVFP4 latent record, byte offsets::

    [  0, 256)  512 nope dims as packed e2m1 (dim 2i low nibble of byte i, dim 2i+1 high nibble)
    [256, 320)  64 RoPE dims as float8_e4m3fn at unit scale (value = e4m3)
    [320, 352)  32 float8_e4m3fn block scales, block j covers nope dims 16j .. 16j + 15

MXFP4 index-key record::

    [ 0, 64)  128 dims as packed e2m1
    [64, 68)  4 UE8M0 scales (byte e means 2^(e - 127)), block j covers dims 32j .. 32j + 31
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import CacheFormat, saturation_excess
from .numerics import (
    E2M1_MAX,
    FP8_MAX,
    FP8_MIN_NORMAL,
    SCALED_FORMAT_MAX,
    UE8M0_MAX_EXP,
    UE8M0_MIN_EXP,
    e2m1_decode,
    e2m1_encode,
    e2m1_half_step,
    e4m3_half_ulp,
    e4m3_round_up,
    pack_nibbles,
    pow2_scale_at_least,
    ue8m0_decode,
    ue8m0_encode,
    unpack_nibbles,
)

NVFP4_NOPE_DIM = 512
NVFP4_ROPE_DIM = 64
NVFP4_BLOCK = 16
NVFP4_BLOCKS = NVFP4_NOPE_DIM // NVFP4_BLOCK  # 32
NVFP4_ROPE_OFFSET = NVFP4_NOPE_DIM // 2  # 256
NVFP4_SCALES_OFFSET = NVFP4_ROPE_OFFSET + NVFP4_ROPE_DIM  # 320
NVFP4_RECORD_BYTES = NVFP4_SCALES_OFFSET + NVFP4_BLOCKS  # 352
NVFP4_BLOCK_MAX = E2M1_MAX * FP8_MAX  # 2688: the largest nope magnitude a record holds

MXFP4_DIM = 128
MXFP4_BLOCK = 32
MXFP4_BLOCKS = MXFP4_DIM // MXFP4_BLOCK  # 4
MXFP4_SCALES_OFFSET = MXFP4_DIM // 2  # 64
MXFP4_RECORD_BYTES = MXFP4_SCALES_OFFSET + MXFP4_BLOCKS  # 68


def _e2m1_bound(values: torch.Tensor, scale: torch.Tensor, *, exact_division: bool) -> torch.Tensor:
    """Bound of ``e2m1(x / scale) * scale`` for one block scale per element (same shape as values)."""
    x = values.float()
    scaled = x.abs() / scale
    bound = e2m1_half_step(scaled) * scale + saturation_excess(x, E2M1_MAX * scale)
    if not exact_division:
        bound = bound + x.abs() * 2.0**-22  # fp32 division before rounding, and the ties it may move
    return bound


@dataclass(frozen=True)
class Nvfp4LatentFormat(CacheFormat):
    """NVFP4 latent: 256 B packed e2m1 + 64 B e4m3 RoPE + 32 B e4m3 block scales = 352 bytes per token.

    Scales: one level, self-contained (no per-tensor fp32 second level: the record has no room for it
    and it would need calibrating before the first token; docs/cache.md §1). Block scale ``s_j`` is the
    smallest e4m3 value ``>= amax_j / 6`` (rounded *up*: the block maximum maps to at most 6, never
    saturating), floored at 2^-6 (the smallest normal e4m3; below it re-packing would not stay exact).
    A block holds magnitudes up to 6 · 448 = 2688, larger ones saturate (latents after MLA's kv_a
    RMSNorm sit far inside).

    RoPE: e4m3 at unit scale (value = e4m3): range ±448 (saturating), relative error 2^-4,
    absolute 2^-10 below 2^-6. There is no byte left for a RoPE scale either.

    Rounding: ``x / s_j`` in fp32, then round-to-nearest, ties-to-even into e2m1.
    Bound per nope element: ``s_j * h(|x| / s_j)`` with ``h`` = 0.25 up to 2, 0.5 up to 4, 1 up to 6
    (half the e2m1 grid spacing) + 2^-22·|x| + the saturation excess; per RoPE element half an
    e4m3 ulp + the excess over 448.
    """

    def block_scales(self, values: torch.Tensor) -> torch.Tensor:
        """``[N, 576]`` -> ``[N, 32]`` fp32 block scales (each an e4m3 value in [2^-6, 448])."""
        blocks = values[:, :NVFP4_NOPE_DIM].float().reshape(-1, NVFP4_BLOCKS, NVFP4_BLOCK)
        needed = blocks.abs().amax(dim=-1) / E2M1_MAX
        return e4m3_round_up(needed.clamp_min(FP8_MIN_NORMAL)).float()

    def encode(self, values, scale=None):
        scales = self.block_scales(values)  # [N, 32]
        blocks = values[:, :NVFP4_NOPE_DIM].float().reshape(-1, NVFP4_BLOCKS, NVFP4_BLOCK) / scales[:, :, None]
        nope = pack_nibbles(e2m1_encode(blocks.reshape(-1, NVFP4_NOPE_DIM)))
        rope = values[:, NVFP4_NOPE_DIM:].float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return torch.cat([nope, rope.view(torch.uint8), scales.to(torch.float8_e4m3fn).view(torch.uint8)], dim=-1)

    def decode(self, records, scale=None):
        codes = unpack_nibbles(records[:, :NVFP4_ROPE_OFFSET])  # [N, 512]
        scales = records[:, NVFP4_SCALES_OFFSET:NVFP4_RECORD_BYTES].contiguous().view(torch.float8_e4m3fn).float()
        nope = e2m1_decode(codes).reshape(-1, NVFP4_BLOCKS, NVFP4_BLOCK) * scales[:, :, None]
        rope = records[:, NVFP4_ROPE_OFFSET:NVFP4_SCALES_OFFSET].contiguous().view(torch.float8_e4m3fn).float()
        return torch.cat([nope.reshape(-1, NVFP4_NOPE_DIM), rope], dim=-1)

    def bound(self, values, scale=None):
        per_dim_scale = self.block_scales(values).repeat_interleave(NVFP4_BLOCK, dim=1)  # [N, 512]
        nope = _e2m1_bound(values[:, :NVFP4_NOPE_DIM], per_dim_scale, exact_division=False)
        rope = values[:, NVFP4_NOPE_DIM:].float()
        rope_bound = e4m3_half_ulp(rope.abs()) + saturation_excess(rope, FP8_MAX)
        return torch.cat([nope, rope_bound], dim=-1)

    def max_abs(self, scale=None):
        return torch.cat([torch.full((NVFP4_NOPE_DIM,), NVFP4_BLOCK_MAX),
                          torch.full((NVFP4_ROPE_DIM,), FP8_MAX)]).float()


@dataclass(frozen=True)
class Mxfp4IndexFormat(CacheFormat):
    """MXFP4 index keys: 64 B packed e2m1 + 4 B UE8M0 scales (one per 32 dims) = 68 bytes per token.

    Scale rounding: the smallest power of two ``>= amax_j / 6`` (exponent clamped to [-127, 127],
    the UE8M0 range). This rounds *up*, unlike the OCP MX spec's ``2^(floor(log2 amax) - 2)``,
    which can push the block maximum past 6 and clip it; here the maximum lands in (3, 6] and
    never saturates, at the cost of one bit of headroom in the worst case. Division by a power of
    two is exact. Values: round-to-nearest, ties-to-even into e2m1. Magnitudes above 1.5·2^127
    (≈2.55e38, the largest the grid reaches without overflowing to Inf) saturate there.
    Bound per element: ``s_j * h(|x| / s_j)`` (``h`` as for NVFP4) + the saturation excess.
    """

    def block_scales(self, values: torch.Tensor) -> torch.Tensor:
        """``[N, 128]`` -> ``[N, 4]`` fp32 power-of-two scales."""
        blocks = values.float().reshape(-1, MXFP4_BLOCKS, MXFP4_BLOCK)
        amax = blocks.abs().amax(dim=-1).clamp(max=SCALED_FORMAT_MAX)
        return pow2_scale_at_least(amax, E2M1_MAX, UE8M0_MIN_EXP, UE8M0_MAX_EXP)

    def encode(self, values, scale=None):
        scales = self.block_scales(values)
        clipped = values.float().clamp(-SCALED_FORMAT_MAX, SCALED_FORMAT_MAX)
        blocks = clipped.reshape(-1, MXFP4_BLOCKS, MXFP4_BLOCK) / scales[:, :, None]
        codes = pack_nibbles(e2m1_encode(blocks.reshape(-1, MXFP4_DIM)))
        return torch.cat([codes, ue8m0_encode(scales)], dim=-1)

    def decode(self, records, scale=None):
        codes = unpack_nibbles(records[:, :MXFP4_SCALES_OFFSET])
        scales = ue8m0_decode(records[:, MXFP4_SCALES_OFFSET:MXFP4_RECORD_BYTES])
        values = e2m1_decode(codes).reshape(-1, MXFP4_BLOCKS, MXFP4_BLOCK) * scales[:, :, None]
        return values.reshape(-1, MXFP4_DIM)

    def bound(self, values, scale=None):
        per_dim_scale = self.block_scales(values).repeat_interleave(MXFP4_BLOCK, dim=1)
        bound = _e2m1_bound(values, per_dim_scale, exact_division=True)
        return bound + saturation_excess(values, SCALED_FORMAT_MAX)

    def max_abs(self, scale=None):
        return torch.full((MXFP4_DIM,), SCALED_FORMAT_MAX, dtype=torch.float32)
