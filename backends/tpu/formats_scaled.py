"""The block-scaled cache formats on XLA: fp8_ds_mla (656 B latent), nvfp4 (352 B latent) and
mxfp4 (68 B index keys), each mirroring its host codec in :mod:`dsahal.formats` bit for bit for
normal (non-subnormal) inputs. Read the host classes' docstrings for the byte layouts.

Records are ``[N, token_bytes]`` uint8, values ``[N, dim]``.
"""
from __future__ import annotations

import torch

from .bits import bytes_to, fp4_e2m1_decode, fp8_codes, fp8_e4m3_decode, pack_nibbles, to_bytes, unpack_nibbles
from .numerics import E2M1_MAX, FP8_MAX, e2m1_codes, e4m3_round_up, pow2, pow2_exponent_at_least, to_bf16_saturating

SCALED_FORMAT_MAX = 1.5 * 2.0**127
FP8_MIN_NORMAL = 2.0**-6

DS_NOPE, DS_TILE, DS_TILES = 512, 128, 4
NV_NOPE, NV_BLOCK, NV_BLOCKS = 512, 16, 32
MX_DIM, MX_BLOCK, MX_BLOCKS = 128, 32, 4


def _block_amax(values: torch.Tensor, blocks: int, size: int) -> torch.Tensor:
    return values.to(torch.float32).reshape(-1, blocks, size).abs().amax(dim=-1)


def pack_fp8_ds_mla(values, scale=None):
    """512 e4m3 (4 power-of-two tile scales, rounded up) + 4 fp32 scales + 64 saturating bf16 RoPE."""
    nope = values[:, :DS_NOPE].to(torch.float32)
    exponent = pow2_exponent_at_least(_block_amax(nope, DS_TILES, DS_TILE).clamp(max=SCALED_FORMAT_MAX),
                                      FP8_MAX, -126, 127)  # [N, 4]
    clipped = nope.clamp(-SCALED_FORMAT_MAX, SCALED_FORMAT_MAX).reshape(-1, DS_TILES, DS_TILE)
    scaled = (clipped * pow2(-exponent)[:, :, None]).clamp(-FP8_MAX, FP8_MAX)  # exact: x / 2^e
    codes = fp8_codes(scaled.reshape(-1, DS_NOPE).to(torch.float8_e4m3fn))
    scales = to_bytes(pow2(exponent))  # [N, 16]
    rope = to_bytes(to_bf16_saturating(values[:, DS_NOPE:]))
    return torch.cat([codes, scales, rope], dim=-1)


def unpack_fp8_ds_mla(records, scale=None):
    scales = bytes_to(records[:, DS_NOPE:DS_NOPE + 4 * DS_TILES], torch.float32)  # [N, 4]
    nope = fp8_e4m3_decode(records[:, :DS_NOPE]).reshape(-1, DS_TILES, DS_TILE) * scales[:, :, None]
    rope = bytes_to(records[:, DS_NOPE + 4 * DS_TILES:], torch.bfloat16).to(torch.float32)
    return torch.cat([nope.reshape(-1, DS_NOPE), rope], dim=-1)


def pack_nvfp4(values, scale=None):
    """256 B packed e2m1 (e4m3 block scales of 16, rounded up, floored at 2^-6) + 64 e4m3 RoPE + 32 scales."""
    nope = values[:, :NV_NOPE].to(torch.float32)
    needed = (_block_amax(nope, NV_BLOCKS, NV_BLOCK) / E2M1_MAX).clamp_min(FP8_MIN_NORMAL)
    scales, scale_codes = e4m3_round_up(needed)  # [N, 32], normal e4m3 values: division is safe
    scaled = nope.reshape(-1, NV_BLOCKS, NV_BLOCK) / scales[:, :, None]
    packed = pack_nibbles(e2m1_codes(scaled.reshape(-1, NV_NOPE)))
    rope = fp8_codes(values[:, NV_NOPE:].to(torch.float32).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn))
    return torch.cat([packed, rope, scale_codes], dim=-1)


def unpack_nvfp4(records, scale=None):
    codes = unpack_nibbles(records[:, :NV_NOPE // 2])
    scales = fp8_e4m3_decode(records[:, NV_NOPE // 2 + 64:])
    nope = fp4_e2m1_decode(codes).reshape(-1, NV_BLOCKS, NV_BLOCK) * scales[:, :, None]
    rope = fp8_e4m3_decode(records[:, NV_NOPE // 2:NV_NOPE // 2 + 64])
    return torch.cat([nope.reshape(-1, NV_NOPE), rope], dim=-1)


def pack_mxfp4(values, scale=None):
    """64 B packed e2m1 + 4 UE8M0 scales (power of two >= amax / 6 per 32 dims, exponent in [-127, 127])."""
    x = values.to(torch.float32)
    exponent = pow2_exponent_at_least(_block_amax(x, MX_BLOCKS, MX_BLOCK).clamp(max=SCALED_FORMAT_MAX),
                                      E2M1_MAX, -127, 127)  # [N, 4]
    clipped = x.clamp(-SCALED_FORMAT_MAX, SCALED_FORMAT_MAX).reshape(-1, MX_BLOCKS, MX_BLOCK)
    scaled = clipped * pow2(-exponent)[:, :, None]  # x / 2^e without dividing by a subnormal 2^-127
    packed = pack_nibbles(e2m1_codes(scaled.reshape(-1, MX_DIM)))
    return torch.cat([packed, (exponent + 127).to(torch.uint8)], dim=-1)


def unpack_mxfp4(records, scale=None):
    codes = unpack_nibbles(records[:, :MX_DIM // 2])
    scale_bytes = records[:, MX_DIM // 2:].to(torch.int32)
    # byte 255 is the OCP MX NaN scale (no encoder writes it; numerics.ue8m0_decode reads it so too)
    scales = torch.where(scale_bytes == 255, float("nan"), pow2(scale_bytes - 127))
    values = fp4_e2m1_decode(codes).reshape(-1, MX_BLOCKS, MX_BLOCK) * scales[:, :, None]
    return values.reshape(-1, MX_DIM)
