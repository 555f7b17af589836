"""Byte-level reinterpretation on XLA: the cache pages are uint8, the math is float.

``Tensor.view(dtype)`` is not lowered by torch-xla 2.9 (it runs on the host through the
``aten::view_copy.dtype`` fallback, a device round trip per call), so this module lowers
XLA's own ``BitcastConvert`` through torch-xla's user-computation registry instead. XLA
bitcasts between widths by adding or removing a trailing dimension (``u8[N, 4] <-> f32[N]``),
little-endian, exactly like ``Tensor.view`` on the host.

FP8 e4m3 and FP4 e2m1 codes are decoded through small lookup tables (a gather of 256 or 16
entries): XLA's primitive-type enum in ``xla_builder`` has no FP8 member, and a table is exact
and cheap on every XLA device.
"""
from __future__ import annotations

import torch
import torch_xla.core.xla_builder as xb
import torch_xla.core.xla_op_registry as xor

_XLA_TYPES = {
    torch.uint8: xb.Type.U8,
    torch.int16: xb.Type.S16,
    torch.int32: xb.Type.S32,
    torch.float32: xb.Type.F32,
    torch.bfloat16: xb.Type.BF16,
    torch.float16: xb.Type.F16,
}


def _bitcast_lowering(x, to_type):
    return x.bitcast(to_type)


_BITCAST = xor.register("dsahal_bitcast", _bitcast_lowering)


def bitcast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret the bits of XLA tensor ``x`` as ``dtype``.

    Same width: same shape. Narrower target (e.g. f32 -> u8): a trailing dim of the width
    ratio is added, ``[*S] -> [*S, 4]``. Wider target (u8 -> f32): the trailing dim must equal
    the ratio and is removed, ``[*S, 4] -> [*S]``.
    """
    if x.dtype == dtype:
        return x
    if dtype not in _XLA_TYPES:
        raise TypeError(f"dsahal tpu bitcast: unsupported target dtype {dtype}")
    return _BITCAST(x, to_type=_XLA_TYPES[dtype])


def bytes_to(records: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[*S, n * width]`` uint8 -> ``[*S, n]`` of ``dtype`` (``width`` = dtype's byte size)."""
    width = torch.empty((), dtype=dtype).element_size()
    if width == 1:
        return bitcast(records, dtype)
    grouped = records.reshape(*records.shape[:-1], records.shape[-1] // width, width)
    return bitcast(grouped, dtype)


def to_bytes(values: torch.Tensor) -> torch.Tensor:
    """``[*S, n]`` of a 1-, 2- or 4-byte dtype -> ``[*S, n * width]`` uint8 (little-endian)."""
    if values.dtype == torch.float8_e4m3fn:
        # FP8 has no XLA builder type: its byte is recovered through a 4-byte widening instead.
        return fp8_codes(values)
    raw = bitcast(values, torch.uint8)
    if values.element_size() == 1:
        return raw
    return raw.reshape(*values.shape[:-1], values.shape[-1] * values.element_size())


def fp8_e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """uint8 e4m3 codes (any shape) -> float32 values, exactly (NaN codes 0x7f/0xff give NaN).

    Elementwise, no table gather (a gather from a small table compiles slowly on XLA:CPU and is
    a poor fit for the TPU's vector unit): a normal code becomes the fp32 bit pattern
    ``(exponent + 120) << 23 | mantissa << 20``; a subnormal one is ``mantissa * 2^-9``."""
    code = codes.to(torch.int32)
    magnitude_code = code & 0x7F
    exponent = magnitude_code >> 3
    mantissa = code & 0x7
    normal_bits = ((exponent + 120) << 23) | (mantissa << 20)
    normal = bitcast(normal_bits, torch.float32)
    subnormal = mantissa.to(torch.float32) * (2.0**-9)
    magnitude = torch.where(exponent > 0, normal, subnormal)
    value = torch.where(code >= 0x80, -magnitude, magnitude)
    return torch.where(magnitude_code == 0x7F, torch.full_like(value, float("nan")), value)


def fp8_codes(values: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn values -> their uint8 codes, exactly.

    The value is widened to fp32 (exact), whose bits hold sign, exponent and the top 3 mantissa
    bits; the e4m3 fields are rebuilt with integer ops (normal: exponent - 120; subnormal
    ``|x| < 2^-6``: mantissa = ``|x| * 2^9``)."""
    wide = values.to(torch.float32)
    bits = bitcast(wide, torch.int32)
    # Shift only non-negative ints: torch-xla lowers ``>>`` on negative int32 as a division
    # rounding toward zero, not as an arithmetic shift, so the sign bit is split off first.
    sign = torch.where(bits < 0, torch.full_like(bits, 0x80), torch.zeros_like(bits))
    magnitude = bits & 0x7FFFFFFF
    exponent = magnitude >> 23
    mantissa = (magnitude >> 20) & 0x7
    normal = exponent >= 121  # |x| >= 2^-6
    normal_code = ((exponent - 120) << 3) | mantissa
    subnormal_code = (wide.abs() * 512.0).to(torch.int32)  # exact: e4m3 subnormals are k * 2^-9
    code = torch.where(normal, normal_code, subnormal_code)
    nan = torch.isnan(wide)
    code = torch.where(nan, torch.full_like(code, 0x7F), code)
    return (sign | code).to(torch.uint8)


def fp4_e2m1_decode(nibbles: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes (integer tensor, values 0..15, any shape) -> float32 values, exactly.

    Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6: exponent field e = bits 1-2, mantissa m = bit 0;
    normal (e > 0) ``2^(e-1) * (1 + m/2)``, subnormal ``m / 2``."""
    code = nibbles.to(torch.int32)
    exponent = (code >> 1) & 0x3
    mantissa = (code & 0x1).to(torch.float32)
    normal = bitcast((exponent + 126) << 23, torch.float32) * (1.0 + 0.5 * mantissa)
    magnitude = torch.where(exponent > 0, normal, 0.5 * mantissa)
    return torch.where(code >= 8, -magnitude, magnitude)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``[*S, n]`` uint8, two codes per byte (low nibble first) -> ``[*S, 2n]`` int32 codes."""
    wide = packed.to(torch.int32)
    pair = torch.stack([wide & 0xF, (wide >> 4) & 0xF], dim=-1)
    return pair.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[*S, 2n]`` integer codes 0..15 -> ``[*S, n]`` uint8, low nibble first."""
    pair = codes.to(torch.int32).reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pair[..., 0] | (pair[..., 1] << 4)).to(torch.uint8)
