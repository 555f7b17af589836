"""Element codecs shared by the cache formats: e2m1 (FP4), e4m3 (FP8), UE8M0 and power-of-two scales.

Everything here is exact integer/bit manipulation or a single IEEE operation, so the formats built
on it are deterministic on every device. Rounding is round-to-nearest, ties to even, everywhere.
"""
from __future__ import annotations

import math

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_MIN_NORMAL = 2.0**-6
FP8_MIN_SUBNORMAL = 2.0**-9
E2M1_MAX = 6.0  # largest finite e2m1 (FP4)
BF16_MAX = 3.3895313892515355e38  # largest finite bfloat16
BF16_MIN_SUBNORMAL = 2.0**-133
FP32_MIN_NORMAL = 2.0**-126
# Largest magnitude the power-of-two-scaled formats (fp8 index, fp8_ds_mla nope, mxfp4) accept before
# saturating: above it, rounding to the grid could reach 2^128 (Inf) after scaling, e.g. 256 * 2^120.
SCALED_FORMAT_MAX = 1.5 * 2.0**127
FP32_MAX = 3.4028234663852886e38  # largest finite float32
# Largest per-tensor scale of the fp8 latent: its records hold up to 448 * scale, which must stay a finite fp32
# (a larger scale would decode a saturated record to Inf). Compared in float64, where 448 * an fp32 is exact.
FP8_TENSOR_SCALE_MAX = FP32_MAX / FP8_MAX  # ~7.6e35
UE8M0_BIAS = 127
UE8M0_MIN_EXP = -127  # byte 0x00; byte 0xFF is NaN, so the largest scale is 2^127
UE8M0_MAX_EXP = 127
UE8M0_NAN = 0xFF  # the scale byte that means NaN (OCP MX)

# The eight e2m1 magnitudes, indexed by the 3-bit code (1 exponent bit pair + 1 mantissa bit).
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring magnitudes; a value exactly on one is a tie (goes to the even code).
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def e2m1_encode(values: torch.Tensor) -> torch.Tensor:
    """fp32 values (already scaled into ``[-6, 6]``; larger magnitudes saturate to ±6) -> uint8 codes
    ``[..]`` in ``0..15``: bit 3 = sign (``-0.0`` keeps it), bits 0-2 = index into :data:`E2M1_GRID`.
    Round-to-nearest, ties to the even code (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 2.5 -> 2, 5 -> 4)."""
    magnitude = values.abs().float().clamp(max=E2M1_MAX)
    midpoints = torch.tensor(_E2M1_MIDPOINTS, dtype=torch.float32, device=values.device)
    code = torch.bucketize(magnitude, midpoints, right=False)  # number of midpoints strictly below
    tie_to_odd = (magnitude == midpoints[code.clamp(max=len(_E2M1_MIDPOINTS) - 1)]) & (code % 2 == 1)
    code = code + tie_to_odd.long()
    sign = torch.signbit(values).long() << 3
    return (code | sign).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes in ``0..15`` -> fp32 values (exact)."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=codes.device)
    magnitude = grid[(codes & 0x7).long()]
    return torch.where((codes & 0x8) != 0, -magnitude, magnitude)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[N, 2m]`` uint8 codes (< 16) -> ``[N, m]`` bytes; element ``2i`` in the low nibble,
    ``2i+1`` in the high nibble (little-endian within the byte, as CUDA's ``__nv_fp4x2_e2m1`` stores x, y)."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: ``[N, m]`` bytes -> ``[N, 2m]`` codes."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], 2 * packed.shape[1])


def pow2_scale_at_least(amax: torch.Tensor, qmax: float, min_exp: int, max_exp: int) -> torch.Tensor:
    """The smallest power of two ``s = 2^e`` with ``amax <= qmax * s`` and ``min_exp <= e <= max_exp``
    (fp32, same shape as ``amax``). Dividing by it is exact, and the largest magnitude maps into
    ``(qmax/2, qmax]`` so it never saturates (unless ``e`` is capped at ``max_exp``)."""
    amax = amax.float()
    one = torch.ones_like(amax)
    _, amax_exp = torch.frexp(amax)  # amax = m * 2^amax_exp, m in [0.5, 1); no division, so no underflow
    _, qmax_exp = math.frexp(qmax)
    exp = (amax_exp - qmax_exp).clamp(min_exp - 2, max_exp + 2)  # within one of the answer
    for _ in range(2):  # exact checks: qmax * 2^e is exact in fp32 over this range
        exp = torch.where(amax > qmax * torch.ldexp(one, exp), exp + 1, exp)
    for _ in range(2):
        exp = torch.where(amax <= qmax * torch.ldexp(one, exp - 1), exp - 1, exp)
    exp = torch.where(amax > 0, exp, torch.full_like(exp, min_exp))  # an all-zero block takes the floor
    exp = exp.clamp(min_exp, max_exp)
    return torch.ldexp(torch.ones_like(amax), exp)


def ue8m0_encode(scale: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 scales ``2^e`` (``-127 <= e <= 127``) -> UE8M0 bytes ``e + 127``."""
    _, exp = torch.frexp(scale)
    return (exp - 1 + UE8M0_BIAS).to(torch.uint8)


def ue8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes -> fp32 ``2^(byte - 127)``; byte 255 is NaN (the OCP MX spec's NaN scale: its block decodes to
    NaN; no encoder writes it; the Triton and Gluon indexers and the TPU decode read it so too)."""
    byte = codes.to(torch.int32)
    scale = torch.ldexp(torch.ones(codes.shape, dtype=torch.float32, device=codes.device), byte - UE8M0_BIAS)
    return torch.where(byte == UE8M0_NAN, float("nan"), scale)


def e4m3_round_up(values: torch.Tensor) -> torch.Tensor:
    """Positive fp32 values -> the smallest float8_e4m3fn value ``>= value`` (capped at 448).
    Used for NVFP4 block scales so that ``amax / scale <= 6`` (the block maximum never saturates)."""
    clipped = values.float().clamp(0.0, FP8_MAX)
    nearest = clipped.to(torch.float8_e4m3fn)
    bits = nearest.view(torch.uint8)
    # Positive e4m3 bit patterns are ordered like their values, so "next up" is bits + 1.
    bumped = torch.where(nearest.float() < clipped, bits + 1, bits)
    return bumped.view(torch.float8_e4m3fn)


def e4m3_half_ulp(scaled_magnitude: torch.Tensor) -> torch.Tensor:
    """Half the spacing of e4m3 values around ``|v|`` (``v`` already divided by its scale):
    2^-10 in the subnormal range (< 2^-6), else 2^(floor(log2 |v|) - 4); the largest rounding error."""
    magnitude = scaled_magnitude.float().clamp(min=FP8_MIN_NORMAL, max=FP8_MAX)
    _, exp = torch.frexp(magnitude)  # |v| in [2^(exp-1), 2^exp)
    return torch.ldexp(torch.ones_like(magnitude), exp - 1 - 4)


def e2m1_half_step(scaled_magnitude: torch.Tensor) -> torch.Tensor:
    """Half the spacing of the e2m1 grid around ``|v|`` (``|v| <= 6``): 0.25 below 2, 0.5 below 4,
    1 up to 6; the largest rounding error of :func:`e2m1_encode` there."""
    m = scaled_magnitude.float()
    return torch.where(m <= 2.0, 0.25, torch.where(m <= 4.0, 0.5, 1.0)).to(torch.float32)
