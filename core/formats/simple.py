"""The plain formats: bf16 (latent and index keys), FP8 with a per-tensor scale (latent),
FP8 with a per-token fp32 scale (index keys, DeepSeek-V3.2's 132-byte layout)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import CacheFormat, as_bytes, from_bytes, saturation_excess
from .numerics import (
    BF16_MAX,
    BF16_MIN_SUBNORMAL,
    FP8_MAX,
    FP8_MIN_SUBNORMAL,
    FP8_TENSOR_SCALE_MAX,
    SCALED_FORMAT_MAX,
    e4m3_half_ulp,
    pow2_scale_at_least,
)


def fp8_e4m3_bound(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even into e4m3 of ``values / scale``: half an ulp, relative 2^-4 for normals,
    absolute 2^-10 * scale in the subnormal range. (Kept for callers; the formats use the tighter
    :func:`fp8_scaled_bound`.)"""
    return torch.maximum(values.abs().float() * 2.0**-4, (FP8_MIN_SUBNORMAL / 2) * scale.float())


def fp8_scaled_bound(values: torch.Tensor, scale: torch.Tensor, exact_division: bool) -> torch.Tensor:
    """Bound of ``e4m3(x / scale) * scale``: half an e4m3 ulp of ``|x|/scale`` times scale, plus the
    clamp at ``448 * scale``, plus (when the scale is not a power of two) the fp32 division's rounding."""
    scale = scale.float()
    x = values.float()
    bound = e4m3_half_ulp(x.abs() / scale) * scale + saturation_excess(x, FP8_MAX * scale)
    if not exact_division:
        bound = bound + x.abs() * 2.0**-22
    return bound


def bf16_bound(values: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even into bf16: ``|x| * 2^-8`` (half an ulp of an 8-bit significand), at least
    half the smallest subnormal (2^-134), plus the excess over bf16's largest finite value (clamped)."""
    x = values.float()
    return torch.clamp_min(x.abs() * 2.0**-8, BF16_MIN_SUBNORMAL / 2) + saturation_excess(x, BF16_MAX)


def to_bf16_saturating(values: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16, round-to-nearest-even; magnitudes that would round to Inf clamp to ±bf16 max."""
    return values.float().clamp(-BF16_MAX, BF16_MAX).to(torch.bfloat16)


@dataclass(frozen=True)
class Bf16Format(CacheFormat):
    """bf16, ``2 * dim`` bytes per token (1152 latent, 256 index). Rounding: round-to-nearest-even
    (torch's cast); finite fp32 beyond bf16's largest finite value (3.39e38) saturates instead of
    becoming Inf. Bound ``max(|x| * 2^-8, 2^-134)`` (+ the saturation excess)."""

    def encode(self, values, scale=None):
        return as_bytes(to_bf16_saturating(values))

    def decode(self, records, scale=None):
        return from_bytes(records, torch.bfloat16).float()

    def bound(self, values, scale=None):
        return bf16_bound(values)

    def max_abs(self, scale=None):
        return torch.full((self.dim,), BF16_MAX, dtype=torch.float32)


@dataclass(frozen=True)
class Fp8TensorScaleFormat(CacheFormat):
    """FP8 e4m3, ``dim`` bytes per token (576 latent), one external fp32 scale for the whole tensor
    (``x ≈ fp8 * scale``). Rounding: ``x / scale`` in fp32, then round-to-nearest-even into e4m3;
    magnitudes beyond ``448 * scale`` saturate to ±448 (the caller calibrates the scale, so
    saturation is the caller's choice, and it is clamped rather than turned into NaN).
    Bound: half an e4m3 ulp of ``|x|/scale`` times scale (relative 2^-4, absolute 2^-10·scale below
    2^-6·scale) + 2^-22·|x| for the division + the saturation excess. The scale is at most
    :data:`~dsahal.formats.numerics.FP8_TENSOR_SCALE_MAX` (~7.6e35): above it ``448 * scale`` is not a finite
    fp32, so a saturated record would decode to Inf."""

    max_tensor_scale: ClassVar[float] = FP8_TENSOR_SCALE_MAX

    def encode(self, values, scale=None):
        q = (values.float() / scale.float().reshape(())).clamp(-FP8_MAX, FP8_MAX)
        return q.to(torch.float8_e4m3fn).view(torch.uint8)

    def decode(self, records, scale=None):
        return records.contiguous().view(torch.float8_e4m3fn).float() * scale.float().reshape(())

    def bound(self, values, scale=None):
        return fp8_scaled_bound(values, scale.reshape(()), exact_division=False)

    def max_abs(self, scale=None):
        self._check_scale("max_abs", scale)  # the limit depends on it: None would fail inside float()
        return torch.full((self.dim,), FP8_MAX * float(scale), dtype=torch.float32)


@dataclass(frozen=True)
class Fp8TokenScaleFormat(CacheFormat):
    """FP8 e4m3 values followed by one fp32 scale per token: ``dim + 4`` bytes
    (128 + 4 = 132 for index keys). Scale rounding: the smallest power of two ``>= amax / 448`` (so
    dividing by it is exact and the token's largest magnitude maps into (224, 448]: it never
    saturates); amax is floored at 1e-4 so an all-zero token gets a finite scale (2^-22).
    Magnitudes above 1.5·2^127 (≈2.55e38) saturate there (beyond it the rounded value could
    overflow to Inf). Values: round-to-nearest-even into e4m3. Bound: half an e4m3 ulp of
    ``|x|/scale`` times scale (relative 2^-4; absolute 2^-10·scale in the subnormal range)."""

    def token_scale(self, values: torch.Tensor) -> torch.Tensor:
        """``[N, dim]`` -> ``[N]`` fp32 power-of-two scales."""
        amax = values.abs().float().amax(dim=-1).clamp(1e-4, SCALED_FORMAT_MAX)
        return pow2_scale_at_least(amax, FP8_MAX, min_exp=-126, max_exp=127)

    def encode(self, values, scale=None):
        token_scale = self.token_scale(values)
        clipped = values.float().clamp(-SCALED_FORMAT_MAX, SCALED_FORMAT_MAX)
        q = (clipped / token_scale[:, None]).clamp(-FP8_MAX, FP8_MAX)
        return torch.cat([q.to(torch.float8_e4m3fn).view(torch.uint8), as_bytes(token_scale[:, None])], dim=-1)

    def decode(self, records, scale=None):
        q = records[:, : self.dim].contiguous().view(torch.float8_e4m3fn).float()
        token_scale = from_bytes(records[:, self.dim : self.dim + 4], torch.float32)
        return q * token_scale

    def bound(self, values, scale=None):
        bound = fp8_scaled_bound(values, self.token_scale(values)[:, None], exact_division=True)
        return bound + saturation_excess(values, SCALED_FORMAT_MAX)

    def max_abs(self, scale=None):
        return torch.full((self.dim,), SCALED_FORMAT_MAX, dtype=torch.float32)
