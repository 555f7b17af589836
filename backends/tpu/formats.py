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

from . import formats_scaled as scaled
from .bits import bytes_to, fp8_codes, fp8_e4m3_decode, to_bytes
from .numerics import FP8_MAX, pow2, pow2_exponent_at_least, to_bf16_saturating

SCALED_FORMAT_MAX = scaled.SCALED_FORMAT_MAX

Packer = Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]
Unpacker = Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]


def _pack_bf16(values, scale=None):
    return to_bytes(to_bf16_saturating(values))


def _unpack_bf16(records, scale=None):
    return bytes_to(records, torch.bfloat16).to(torch.float32)


def _pack_fp8_tensor_scale(values, scale):
    scaled = (values.to(torch.float32) / scale.to(torch.float32)).clamp(-FP8_MAX, FP8_MAX)
    return fp8_codes(scaled.to(torch.float8_e4m3fn))


def _unpack_fp8_tensor_scale(records, scale):
    return fp8_e4m3_decode(records) * scale.to(torch.float32)


def fp8_token_scale(values: torch.Tensor) -> torch.Tensor:
    """The smallest power of two ``>= clamp(amax, 1e-4, 1.5 2^127) / 448`` per token, ``[N, dim] -> [N]``
    fp32, from the bits of amax (no division, no log: exact on every device)."""
    amax = values.abs().to(torch.float32).amax(dim=-1).clamp(1e-4, SCALED_FORMAT_MAX)
    return pow2(pow2_exponent_at_least(amax, FP8_MAX, -126, 127))


def _pack_fp8_token_scale(values, scale=None):
    token_scale = fp8_token_scale(values)
    clipped = values.to(torch.float32).clamp(-SCALED_FORMAT_MAX, SCALED_FORMAT_MAX)
    scaled = (clipped / token_scale[..., None]).clamp(-FP8_MAX, FP8_MAX)  # a normal power of two: exact
    return torch.cat([fp8_codes(scaled.to(torch.float8_e4m3fn)), to_bytes(token_scale[..., None])], dim=-1)


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
    ("latent", "fp8_ds_mla"): (scaled.pack_fp8_ds_mla, scaled.unpack_fp8_ds_mla),
    ("latent", "nvfp4"): (scaled.pack_nvfp4, scaled.unpack_nvfp4),
    ("index", "mxfp4"): (scaled.pack_mxfp4, scaled.unpack_mxfp4),
}


def pack(values: torch.Tensor, kind: str, fmt: str, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """``[N, dim]`` float -> ``[N, token_bytes]`` uint8 records in ``kind:fmt``."""
    return CODECS[(kind, fmt)][0](values, scale)


def unpack(records: torch.Tensor, kind: str, fmt: str, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """``[*S, token_bytes]`` uint8 records -> ``[*S, dim]`` fp32."""
    spec = cache_format(kind, fmt)
    flat = records.reshape(-1, spec.token_bytes)
    return CODECS[(kind, fmt)][1](flat, scale).reshape(*records.shape[:-1], spec.dim)
