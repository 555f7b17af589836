"""The plain formats: bf16 (latent and index keys), FP8 with a per-tensor scale (latent),
FP8 with a per-token fp32 scale (index keys, DeepSeek-V3.2's 132-byte layout)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import CacheFormat, as_bytes, from_bytes

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_MIN_SUBNORMAL = 2.0**-9


def fp8_e4m3_bound(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even into e4m3 of ``values / scale``: half an ulp, relative 2^-4 for normals,
    absolute 2^-10 * scale in the subnormal range."""
    return torch.maximum(values.abs().float() * 2.0**-4, (FP8_MIN_SUBNORMAL / 2) * scale.float())


@dataclass(frozen=True)
class Bf16Format(CacheFormat):
    """bf16, ``2 * dim`` bytes per token. Rounding: round-to-nearest-even (torch's cast);
    bound ``|x| * 2^-8`` (half an ulp of an 8-bit significand)."""

    def pack(self, values, scale=None):
        return as_bytes(values.to(torch.bfloat16))

    def unpack(self, records, scale=None):
        return from_bytes(records, torch.bfloat16).float()

    def error_bound(self, values, scale=None):
        return values.abs().float() * 2.0**-8


@dataclass(frozen=True)
class Fp8TensorScaleFormat(CacheFormat):
    """FP8 e4m3, ``dim`` bytes per token, one external fp32 scale for the whole tensor
    (``x ≈ fp8 * scale``). Rounding: ``x / scale`` round-to-nearest-even into e4m3; magnitudes
    beyond ``448 * scale`` saturate to ±448 (the scale is calibrated by the caller, so
    saturation is the caller's choice of scale, and it is clamped rather than turned into NaN)."""

    def pack(self, values, scale=None):
        q = (values.float() / scale.float()).clamp(-FP8_MAX, FP8_MAX)
        return q.to(torch.float8_e4m3fn).view(torch.uint8)

    def unpack(self, records, scale=None):
        return records.contiguous().view(torch.float8_e4m3fn).float() * scale.float()

    def error_bound(self, values, scale=None):
        return fp8_e4m3_bound(values, scale.reshape(()))


@dataclass(frozen=True)
class Fp8TokenScaleFormat(CacheFormat):
    """FP8 e4m3 values followed by one fp32 scale per token: ``dim + 4`` bytes
    (128 + 4 = 132 for index keys). Scale rounding: ``2^ceil(log2(amax / 448))`` — a power of two
    (UE8M0-representable, so dividing by it is exact) rounded *up*, so the token's largest
    magnitude never saturates; amax is floored at 1e-4 so an all-zero token gets a finite scale.
    Values: round-to-nearest-even into e4m3."""

    def token_scale(self, values: torch.Tensor) -> torch.Tensor:
        amax = values.abs().float().amax(dim=-1).clamp_min(1e-4)
        return torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))

    def pack(self, values, scale=None):
        token_scale = self.token_scale(values)
        q = (values.float() / token_scale[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
        return torch.cat([q, as_bytes(token_scale[:, None])], dim=-1)

    def unpack(self, records, scale=None):
        q = records[:, : self.dim].contiguous().view(torch.float8_e4m3fn).float()
        token_scale = from_bytes(records[:, self.dim : self.dim + 4], torch.float32)
        return q * token_scale

    def error_bound(self, values, scale=None):
        return fp8_e4m3_bound(values, self.token_scale(values)[:, None])
