"""Element codecs on XLA, mirroring :mod:`dsahal.formats.numerics` bit for bit: power-of-two scales,
e2m1 (FP4) rounding, e4m3 round-up, UE8M0 — all integer/bit manipulation or single IEEE ops.

Two XLA constraints shape this module: ``torch.frexp``/``ldexp``/``bucketize`` are not lowered by
torch-xla 2.9 (they would run on the host), and XLA:CPU (like a TPU) flushes subnormal operands
to zero, so nothing here divides by a subnormal scale: scaling by ``2^e`` is a multiplication by
the exact normal power ``2^-e`` instead (identical to the host's exact division for normal inputs).
"""
from __future__ import annotations

import math

import torch

from .bits import bitcast, fp8_codes, fp8_e4m3_decode

E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_MAX = 6.0
FP8_MAX = 448.0
BF16_MAX = 3.3895313892515355e38


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """``2^e`` exactly for integer ``e`` in [-149, 127] (subnormal bit patterns below -126)."""
    e = exponent.to(torch.int32)
    normal_bits = (e.clamp(-126, 127) + 127) << 23
    subnormal_bits = torch.ones_like(e) << (e.clamp(-149, -127) + 149)
    return bitcast(torch.where(e >= -126, normal_bits, subnormal_bits), torch.float32)


def pow2_exponent_at_least(amax: torch.Tensor, qmax: float, min_exp: int, max_exp: int) -> torch.Tensor:
    """The smallest ``e`` in ``[min_exp, max_exp]`` with ``amax <= qmax * 2^e`` (int32; amax >= 0).

    With ``amax = m 2^E`` and ``qmax = q 2^Q`` (``m, q`` in [0.5, 1)), the answer before clamping is
    ``E - Q + (m > q)``: exact integer logic on the fp32 bits, no division, no log."""
    q, q_exp = math.frexp(qmax)
    threshold = int((2 * q - 1) * 2**23)  # m > q  <=>  mantissa bits > (2q - 1) 2^23
    bits = bitcast(amax.to(torch.float32), torch.int32)
    biased = bits >> 23  # amax >= 0: the sign bit is clear, so the shift is a plain one
    mantissa = bits & 0x7FFFFF
    exponent = (biased - 126) - q_exp + (mantissa > threshold).to(torch.int32)
    exponent = torch.where(biased > 0, exponent, torch.full_like(exponent, min_exp))  # zero or subnormal
    return exponent.clamp(min_exp, max_exp)


def e2m1_codes(scaled: torch.Tensor) -> torch.Tensor:
    """fp32 values already divided by their scale -> int32 e2m1 codes 0..15 (bit 3: sign, -0.0 kept).
    Round to nearest, ties to the even code; magnitudes above 6 saturate."""
    magnitude = scaled.abs().clamp(max=E2M1_MAX)
    code = torch.zeros(scaled.shape, dtype=torch.int32, device=scaled.device)
    for index, midpoint in enumerate(E2M1_MIDPOINTS):
        code = code + (magnitude > midpoint).to(torch.int32)
        if index % 2 == 1:  # a value exactly on an odd-indexed midpoint goes up to the even code
            code = code + (magnitude == midpoint).to(torch.int32)
    negative = bitcast(scaled.to(torch.float32), torch.int32) < 0
    return code | torch.where(negative, torch.full_like(code, 8), torch.zeros_like(code))


def e4m3_round_up(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive fp32 -> (the smallest e4m3 value >= it, capped at 448, as fp32; its uint8 code)."""
    clipped = values.to(torch.float32).clamp(0.0, FP8_MAX)
    codes = fp8_codes(clipped.to(torch.float8_e4m3fn)).to(torch.int32)
    nearest = fp8_e4m3_decode(codes)
    codes = torch.where(nearest < clipped, codes + 1, codes)  # positive codes are ordered like values
    return fp8_e4m3_decode(codes), codes.to(torch.uint8)


def to_bf16_saturating(values: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 round-to-nearest-even; magnitudes that would round to Inf clamp to +-bf16 max."""
    return values.to(torch.float32).clamp(-BF16_MAX, BF16_MAX).to(torch.bfloat16)
