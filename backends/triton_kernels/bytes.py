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
INDEX_MXFP4 = 2  # 64 B of e2m1 pairs (dim 2i low nibble of byte i) + 4 UE8M0 scales (one per 32 dims) = 68 B
INDEX_CODES = {"bf16": INDEX_BF16, "fp8": INDEX_FP8, "mxfp4": INDEX_MXFP4}


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


# -- FP4 formats (dsahal.formats.fp4): e2m1 nibbles, e4m3 block scales, UE8M0 block scales ------------
# Codecs in integer arithmetic (plus exact fp32 comparisons): bit-exact on every device, ftz or not, and
# under TRITON_INTERPRET=1, whose float -> e4m3 cast is wrong.


@triton.jit
def e4m3_bits(x, ROUND_UP: tl.constexpr):
    """fp32 ``x`` (finite, ``|x| <= 448``) -> float8_e4m3fn bit patterns as int32 in ``0..255``.

    Round to nearest, ties to even (torch's cast, subnormals included; ``-0.0`` keeps its sign), or with
    ``ROUND_UP`` (for ``x >= 0``) the smallest e4m3 value ``>= x`` (``numerics.e4m3_round_up``). The
    significand is shifted to e4m3's spacing at x's binade (``2^(e-3)``, ``2^-9`` below ``2^-6``) and
    the shifted-out bits decide the rounding; a carry into the next binade lands on the right code
    because e4m3 codes of one sign are ordered like their values.
    """
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    field = (bits >> 23) & 0xFF
    significand = (bits & 0x7FFFFF) | tl.where(field > 0, 0x800000, 0)  # value = significand * 2^(lead - 23)
    lead = tl.maximum(field, 1) - 127
    binade = tl.maximum(lead, -6)
    shift = tl.minimum(20 + binade - lead, 25)  # >= 20; 25 already shifts every significand bit out
    q = significand >> shift
    rem = significand & ((1 << shift) - 1)
    if ROUND_UP:
        q = q + (rem != 0).to(tl.int32)
    else:
        half = 1 << (shift - 1)
        q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    return (((binade + 6) << 3) + q) | (sign << 7)


@triton.jit
def e4m3_normal_value(code):
    """Positive *normal* e4m3 codes (int32 ``8..126``) -> their fp32 values (exact)."""
    return ((((code >> 3) + 120) << 23) | ((code & 7) << 20)).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_code(v):
    """fp32 ``v`` (already divided by its block scale) -> e2m1 code (int32 ``0..15``): sign in bit 3
    (``-0.0`` keeps it), magnitude rounded to nearest, ties to the even code, saturating at 6
    (``numerics.e2m1_encode``: a tie sits on a midpoint, 0.75, 1.75 and 3.5 go up, the others down)."""
    m = tl.minimum(tl.abs(v), 6.0)
    code = ((m > 0.25).to(tl.int32) + (m > 0.75).to(tl.int32) + (m > 1.25).to(tl.int32)
            + (m > 1.75).to(tl.int32) + (m > 2.5).to(tl.int32) + (m > 3.5).to(tl.int32) + (m > 5.0).to(tl.int32))
    code = code + ((m == 0.75) | (m == 1.75) | (m == 3.5)).to(tl.int32)
    return code | (((v.to(tl.int32, bitcast=True) >> 31) & 1) << 3)


@triton.jit
def _above(whole, sticky, mid: tl.constexpr):
    """1 where the fixed-point value ``whole + (sticky ? fraction : 0)`` exceeds the integer ``mid``."""
    return ((whole > mid) | ((whole == mid) & sticky)).to(tl.int32)


@triton.jit
def e2m1_code_pow2(x, exponent):
    """e2m1 code of ``x / 2^exponent`` (int32 exponent in ``[-127, 125]``, ``|x| <= 6 · 2^exponent``),
    decided on integers: the quotient times 4 is ``significand · 2^f`` (f <= -19 under that bound), its
    integer part and sticky bit are compared with the midpoints ``1, 3, 5, 7, 10, 14, 20`` (quarters).
    No float division or product, so subnormal inputs and quotients are exact even where the GPU
    flushes them."""
    bits = x.to(tl.int32, bitcast=True)
    field = (bits >> 23) & 0xFF
    significand = (bits & 0x7FFFFF) | tl.where(field > 0, 0x800000, 0)
    shift = tl.minimum(tl.maximum(150 - tl.maximum(field, 1) + exponent - 2, 0), 30)
    whole = significand >> shift
    sticky = (significand & ((1 << shift) - 1)) != 0
    code = (_above(whole, sticky, 1) + _above(whole, sticky, 3) + _above(whole, sticky, 5) + _above(whole, sticky, 7)
            + _above(whole, sticky, 10) + _above(whole, sticky, 14) + _above(whole, sticky, 20))
    code = code + (((whole == 3) | (whole == 7) | (whole == 14)) & (sticky == 0)).to(tl.int32)
    return code | (((bits >> 31) & 1) << 3)


@triton.jit
def ue8m0_exponent(amax):
    """The smallest ``e`` with ``amax <= 6 · 2^e``, clamped to the UE8M0 range ``[-127, 127]`` (int32;
    ``numerics.pow2_scale_at_least(amax, 6, -127, 127)``; amax >= 0 finite). For ``amax`` in
    ``[2^a, 2^(a+1))``: ``e = a - 2`` when ``amax <= 1.5 · 2^a`` (mantissa bits <= 0x400000), else ``a - 1``;
    zero and subnormal amax land below -127 and are clamped up."""
    bits = amax.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 129 + ((bits & 0x7FFFFF) > 0x400000).to(tl.int32)
    return tl.minimum(tl.maximum(exponent, -127), 127)


@triton.jit
def e2m1_ue8m0_value(codes, scale_bytes):
    """e2m1 codes (``0..15``) times ``2^(scale_byte - 127)`` as fp32 (same shapes, exact; byte 0 is the
    subnormal 2^-127 and byte 255 is NaN, as ``numerics.ue8m0_decode`` reads them)."""
    c = codes.to(tl.uint32)
    m = c & 7
    magnitude = tl.where(m >= 2, (((m >> 1) + 126) << 23) | ((m & 1) << 22), tl.where(m == 1, 0x3F000000, 0))
    value = (magnitude | ((c & 8) << 28)).to(tl.float32, bitcast=True)
    e = scale_bytes.to(tl.uint32)
    scale = tl.where(e == 0, 0x00400000, tl.where(e == 255, 0x7FC00000, e << 23)).to(tl.float32, bitcast=True)
    return value * scale
