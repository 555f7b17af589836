"""Cache formats on XLA: pack (quantise to bytes) and unpack (bytes to fp32) with XLA-native ops.

Each function mirrors the host codec of the same name in :mod:`dsahal.formats` bit for bit
(same rounding: round-to-nearest-even casts, power-of-two token scales), but never calls
``Tensor.view(dtype)``: bytes are reinterpreted with XLA's bitcast (:mod:`.bits`).

Records are ``[*S, token_bytes]`` uint8; values are ``[*S, dim]``.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from dsahal.formats import cache_format

from .bits import bitcast, bytes_to, exact_pow2, fp8_codes, fp8_e4m3_decode, to_bytes

FP8_MAX = 448.0

Packer = Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]
Unpacker = Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]


def _pack_bf16(values, scale=None):
    return to_bytes(values.to(torch.bfloat16))


def _unpack_bf16(records, scale=None):
    return bytes_to(records, torch.bfloat16).to(torch.float32)


def _pack_fp8_tensor_scale(values, scale):
    scaled = (values.to(torch.float32) / scale.to(torch.float32)).clamp(-FP8_MAX, FP8_MAX)
    return fp8_codes(scaled.to(torch.float8_e4m3fn))


def _unpack_fp8_tensor_scale(records, scale):
    return fp8_e4m3_decode(records) * scale.to(torch.float32)


def fp8_token_scale(values: torch.Tensor) -> torch.Tensor:
    """``2^ceil(log2(max(amax, 1e-4) / 448))`` per token, ``[*S, dim] -> [*S]`` fp32, exactly.

    The ceiling of the log is read off the fp32 bits of the ratio (its exponent, plus one unless
    the mantissa is zero) rather than from a ``log2`` whose last-ulp rounding differs by device.
    """
    ratio = values.abs().to(torch.float32).amax(dim=-1).clamp_min(1e-4) / FP8_MAX
    bits = bitcast(ratio, torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    exact_power = (bits & 0x7FFFFF) == 0
    return exact_pow2(torch.where(exact_power, exponent, exponent + 1))


def _pack_fp8_token_scale(values, scale=None):
    token_scale = fp8_token_scale(values)
    codes = fp8_codes((values.to(torch.float32) / token_scale[..., None]).to(torch.float8_e4m3fn))
    return torch.cat([codes, to_bytes(token_scale[..., None])], dim=-1)


def _unpack_fp8_token_scale(records, scale=None):
    dim = records.shape[-1] - 4
    token_scale = bytes_to(records[..., dim:], torch.float32)  # [*S, 1]
    return fp8_e4m3_decode(records[..., :dim]) * token_scale


# (kind, format name) -> (pack, unpack). Formats missing here are not claimed by the backend
# (its Capabilities list exactly these), so the registry's verifier routes them elsewhere.
CODECS: dict[tuple[str, str], tuple[Packer, Unpacker]] = {
    ("latent", "bf16"): (_pack_bf16, _unpack_bf16),
    ("latent", "fp8"): (_pack_fp8_tensor_scale, _unpack_fp8_tensor_scale),
    ("index", "bf16"): (_pack_bf16, _unpack_bf16),
    ("index", "fp8"): (_pack_fp8_token_scale, _unpack_fp8_token_scale),
}


def pack(values: torch.Tensor, kind: str, fmt: str, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """``[*S, dim]`` float -> ``[*S, token_bytes]`` uint8 records in ``kind:fmt``."""
    return CODECS[(kind, fmt)][0](values, scale)


def unpack(records: torch.Tensor, kind: str, fmt: str, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """``[*S, token_bytes]`` uint8 records -> ``[*S, dim]`` fp32."""
    spec = cache_format(kind, fmt)
    flat = records.reshape(-1, spec.token_bytes)
    return CODECS[(kind, fmt)][1](flat, scale).reshape(*records.shape[:-1], spec.dim)
