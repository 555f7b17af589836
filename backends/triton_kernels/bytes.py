"""Reading and writing typed values inside uint8 cache pages.

Pages are ``uint8`` tensors; a token's record starts at the byte offset
``block * stride_block + offset * stride_token``. These helpers take a uint8 pointer tensor
and reinterpret it. bf16 is moved as raw 16-bit words and widened by a shift, which is exact
and also correct under ``TRITON_INTERPRET=1`` (whose bf16 arithmetic is not).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Latent formats understood by the kernels (the names of ``dsahal.formats``).
LATENT_BF16 = 0  # 576 bf16 = 1152 B
LATENT_FP8 = 1  # 576 e4m3 = 576 B, one external fp32 scale
LATENT_FP8_DS_MLA = 2  # 512 e4m3 | 4 fp32 tile scales | 64 bf16 rope = 656 B
LATENT_NVFP4 = 3  # 256 B of e2m1 pairs | 64 e4m3 rope | 32 e4m3 block scales (one per 16 dims) = 352 B
LATENT_CODES = {"bf16": LATENT_BF16, "fp8": LATENT_FP8, "fp8_ds_mla": LATENT_FP8_DS_MLA, "nvfp4": LATENT_NVFP4}

INDEX_BF16 = 0  # 128 bf16 = 256 B
INDEX_FP8 = 1  # 128 e4m3 + fp32 scale = 132 B
INDEX_CODES = {"bf16": INDEX_BF16, "fp8": INDEX_FP8}


def typed_views(pages):
    """The same page bytes as (uint8, uint16, fp32) tensors, with (block, token) strides in elements.

    Kernels index each view with integer element offsets instead of casting byte pointers, so
    the compiler can prove contiguity and alignment and emit wide (up to 16-byte) loads. A view
    whose strides are not whole elements is replaced by the uint8 one (never read in that case).
    """
    views = []
    for dtype, size in ((torch.uint8, 1), (torch.uint16, 2), (torch.float32, 4)):
        ok = pages.stride(0) % size == 0 and pages.stride(1) % size == 0 and pages.data_ptr() % size == 0
        ok = ok and pages.shape[-1] % size == 0
        view = pages.view(dtype) if ok else pages
        views.append((view, pages.stride(0) // size if ok else 0, pages.stride(1) // size if ok else 0))
    return views


def views_usable(pages) -> bool:
    """Whether every record starts 4-byte aligned (all three typed views are exact)."""
    return pages.data_ptr() % 4 == 0 and pages.stride(0) % 4 == 0 and pages.stride(1) % 4 == 0


def row_alignment(pages) -> int:
    """Largest power of two (<= 16) dividing every record's start address: the kernels promise it
    to the compiler (``tl.multiple_of``) so that gathered rows load in 4- to 16-byte vectors."""
    align = 16
    for value in (pages.data_ptr(), pages.stride(0), pages.stride(1)):
        while align > 1 and value % align:
            align //= 2
    return align


@triton.jit
def typed_rows(pages_ptr, row, ALIGN: tl.constexpr, byte_offset, DTYPE: tl.constexpr):
    """``[BLOCK_N]`` pointers of element type ``DTYPE`` at ``row + byte_offset`` (row aligned to ALIGN).
    Index the result with element offsets so the compiler sees contiguous, aligned accesses."""
    return (pages_ptr + tl.multiple_of(row, ALIGN) + byte_offset).to(tl.pointer_type(DTYPE))


@triton.jit
def widen_bf16(words, AS_BF16: tl.constexpr):
    """Raw bf16 words (uint16) as bf16, or exactly widened to fp32."""
    if AS_BF16:
        values = words.to(tl.bfloat16, bitcast=True)
    else:
        values = (words.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return values


@triton.jit
def load_u16_bytewise(byte_ptr, mask):
    """Little-endian 16-bit words at any byte address (two byte loads; for unaligned page pools)."""
    lo = tl.load(byte_ptr, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(byte_ptr + 1, mask=mask, other=0).to(tl.uint16)
    return lo | (hi << 8)


@triton.jit
def load_f32_bytewise(byte_ptr, mask):
    """fp32 at any byte address (four byte loads)."""
    word = tl.load(byte_ptr, mask=mask, other=0).to(tl.uint32)
    for i in tl.static_range(1, 4):
        word = word | (tl.load(byte_ptr + i, mask=mask, other=0).to(tl.uint32) << (8 * i))
    return word.to(tl.float32, bitcast=True)


@triton.jit
def store_u16_bytewise(byte_ptr, words, mask):
    tl.store(byte_ptr, (words & 0xFF).to(tl.uint8), mask=mask)
    tl.store(byte_ptr + 1, (words >> 8).to(tl.uint8), mask=mask)


@triton.jit
def store_u32_bytewise(byte_ptr, words, mask):
    for i in tl.static_range(0, 4):
        tl.store(byte_ptr + i, ((words >> (8 * i)) & 0xFF).to(tl.uint8), mask=mask)


@triton.jit
def load_bf16(byte_ptr, mask, AS_BF16: tl.constexpr):
    """bf16 values at ``byte_ptr`` (uint8 pointers, 2-byte aligned) as bf16 or exact fp32."""
    words = tl.load(byte_ptr.to(tl.pointer_type(tl.uint16)), mask=mask, other=0)
    return widen_bf16(words, AS_BF16)


@triton.jit
def load_fp8(byte_ptr, mask):
    """e4m3 bytes at ``byte_ptr`` as fp32 (exact)."""
    raw = tl.load(byte_ptr, mask=mask, other=0)
    return raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def load_f32(byte_ptr, mask):
    """fp32 values at ``byte_ptr`` (4-byte aligned)."""
    return tl.load(byte_ptr.to(tl.pointer_type(tl.float32)), mask=mask, other=0.0)


@triton.jit
def store_bf16(byte_ptr, values, mask):
    """Round fp32 ``values`` to bf16 (nearest-even) and store them at ``byte_ptr`` (any alignment)."""
    store_u16_bytewise(byte_ptr, values.to(tl.bfloat16).to(tl.uint16, bitcast=True), mask)


@triton.jit
def store_fp8(byte_ptr, values, mask):
    """Round fp32 ``values`` (already within ±448) to e4m3 and store the bytes."""
    tl.store(byte_ptr, values.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=mask)


@triton.jit
def store_f32(byte_ptr, values, mask):
    """fp32 ``values`` at ``byte_ptr`` (any alignment)."""
    store_u32_bytewise(byte_ptr, values.to(tl.uint32, bitcast=True), mask)
