"""FlashMLA's 656-byte "ds_mla" FP8 latent (DeepSeek-V3.2's sparse-MLA KV cache).

One token's record, byte offsets::

    [  0, 512)  512 "nope" latent dims as float8_e4m3fn, in 4 tiles of 128 dims
    [512, 528)  4 float32 scales, one per tile (tile i covers dims 128*i .. 128*i + 127)
    [528, 656)  64 RoPE dims as bfloat16 (not quantised: RoPE is the precision-sensitive part)

Value of nope dim d: ``e4m3[d] * scale[d // 128]``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import CacheFormat, as_bytes, from_bytes, saturation_excess
from .numerics import BF16_MAX, FP8_MAX, SCALED_FORMAT_MAX, pow2_scale_at_least
from .simple import bf16_bound, fp8_scaled_bound, to_bf16_saturating

NOPE_DIM = 512
ROPE_DIM = 64
TILE = 128
TILES = NOPE_DIM // TILE
SCALES_OFFSET = NOPE_DIM
ROPE_OFFSET = NOPE_DIM + 4 * TILES
RECORD_BYTES = ROPE_OFFSET + 2 * ROPE_DIM  # 656


@dataclass(frozen=True)
class Fp8DsMlaFormat(CacheFormat):
    """FlashMLA's FP8 latent: 512 e4m3 + 4 fp32 tile scales + 64 bf16 RoPE = 656 bytes per token.

    Rounding. Tile scale: the smallest power of two ``>= amax_tile / 448`` (floored at 2^-126, the
    smallest normal fp32) — a power of two so that ``x / scale`` is exact, rounded *up* so the
    tile's largest magnitude lands in (224, 448] and never saturates (magnitudes above 1.5·2^127
    ≈ 2.55e38 saturate there, where the rounded value could otherwise overflow to Inf). (FlashMLA's own test
    quantiser uses ``amax / 448`` unrounded; any positive fp32 scale reads back the same way, so
    kernels are indifferent.) Nope values: round-to-nearest-even into e4m3. RoPE: round-to-nearest-
    even into bf16, saturating at ±3.39e38.

    Bound per element: nope ``scale * half-ulp_e4m3(|x| / scale)`` (relative 2^-4; absolute
    2^-10·scale for magnitudes below 2^-6·scale); RoPE ``max(|x| * 2^-8, 2^-134)``.
    """

    def tile_scales(self, values: torch.Tensor) -> torch.Tensor:
        """``[N, 576]`` -> ``[N, 4]`` fp32 power-of-two tile scales."""
        tiles = values[:, :NOPE_DIM].float().reshape(-1, TILES, TILE)
        amax = tiles.abs().amax(dim=-1).clamp(max=SCALED_FORMAT_MAX)
        return pow2_scale_at_least(amax, FP8_MAX, min_exp=-126, max_exp=127)

    def encode(self, values, scale=None):
        scales = self.tile_scales(values)  # [N, 4]
        nope = values[:, :NOPE_DIM].float().clamp(-SCALED_FORMAT_MAX, SCALED_FORMAT_MAX)
        tiles = nope.reshape(-1, TILES, TILE) / scales[:, :, None]
        nope = tiles.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1, NOPE_DIM)
        rope = as_bytes(to_bf16_saturating(values[:, NOPE_DIM:]))
        return torch.cat([nope, as_bytes(scales), rope], dim=-1)

    def decode(self, records, scale=None):
        nope = records[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
        scales = from_bytes(records[:, SCALES_OFFSET:ROPE_OFFSET], torch.float32)  # [N, 4]
        nope = (nope.reshape(-1, TILES, TILE) * scales[:, :, None]).reshape(-1, NOPE_DIM)
        rope = from_bytes(records[:, ROPE_OFFSET:RECORD_BYTES], torch.bfloat16).float()
        return torch.cat([nope, rope], dim=-1)

    def bound(self, values, scale=None):
        per_dim_scale = self.tile_scales(values).repeat_interleave(TILE, dim=1)  # [N, 512]
        nope = fp8_scaled_bound(values[:, :NOPE_DIM], per_dim_scale, exact_division=True)
        nope = nope + saturation_excess(values[:, :NOPE_DIM], SCALED_FORMAT_MAX)
        return torch.cat([nope, bf16_bound(values[:, NOPE_DIM:])], dim=-1)

    def max_abs(self, scale=None):
        return torch.cat([torch.full((NOPE_DIM,), SCALED_FORMAT_MAX),
                          torch.full((ROPE_DIM,), BF16_MAX)]).float()
