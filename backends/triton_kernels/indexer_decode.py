"""Paged indexer score, block-tile path: FP8 (132 B) and MXFP4 (68 B) keys in aligned, packed pages.

Same contract as :func:`dsahal.backends.triton_kernels.indexer.indexer_score` (its module docstring),
for the calls this path serves (:func:`serves`): every key tile of ``BLOCK_N`` positions lies inside
one cache block (``block_tokens % BLOCK_N == 0``), records are packed (``stride(1) == token_bytes``)
and 4-byte aligned, and the dots run on the tensor cores (FP8 or bf16 queries).

Why a second kernel: the general one multiplies a key tile by one ``[GROUP * BLOCK_H, 128]`` operand
(5 decode tokens padded to 8, 256 rows) and sums heads through a 3-D reshape of the MMA accumulator,
with per-element masks and per-key addressing; on the H200 it ran at 15% of the copy ceiling with the
integer ALU the busiest pipe (ncu, 2026-11-29). Here, per key tile:

* one block-table lookup and one base pointer; record offsets are tile-invariant (hoisted);
* no load masks: an unmapped or out-of-range block reads block 0 (always a valid block) and its
  scores are set to -inf afterwards;
* per query token ``g`` of the segment (a run of up to ``GROUP`` tokens of one request), one MMA
  ``keys [BLOCK_N, 128] @ q_gᵀ [128, BLOCK_H]`` -> ``[BLOCK_N, BLOCK_H]``, relu, head weights and a
  plain ``tl.sum(axis=1)`` (in-thread adds and warp shuffles on the accumulator layout; no reshape);
  tokens the segment does not have skip their MMA (a uniform branch), so 5 tokens cost 5, not 8;
* key tiles after the segment's furthest position skip loads and MMAs and only store -inf.

Every score is one key, one token: the same arithmetic whatever the batch holds (batch invariant).

MXFP4 keys are decoded once per tile (into bf16 even-dim and odd-dim halves, exact) and multiplied
by the matching halves of each token's queries (two K = 64 MMAs), or, with ``SCALED_DOT``, passed
packed to ``tl.dot_scaled`` per token. ``MX`` (:data:`MXFP4_MODES`, launcher ``mxfp4_mode``) picks a
cheaper decode: an e2m1 code shifted into an e4m3 byte is the same value times 2^-6, exactly
(:func:`_e2m1_as_e4m3`: masks and shifts, where the general decode spends ~15 integer ops and a select
chain per value, the integer ALU bound at 5 tokens); mode 1 then scales every value by its block's
power of two (built once per key and block) and keeps the even/odd bf16 MMAs; modes 2-4 keep the
values unscaled (bf16, fp16 or e4m3 operands), run one K = 32 MMA per 32-dim scale block and multiply
each block's ``[BLOCK_N, BLOCK_H]`` result by that key's power of two ``2^(byte - 121)`` (the scale
times 2^6) before the sum over blocks and the relu, so no value is scaled before its MMA.

FP8 keys, ``ALU`` (:data:`ALU_FLAGS`, launcher ``alu``; 0 keeps the path as it was): the sm_90 SASS of the
byte path spends about half of a tile's instructions moving bytes (the prefetched tile lives in 64 one-byte
values a thread; they are unpacked, then repacked for the layout conversion to the MMA operand). Flag 1 loads
the 128 key bytes as 32 int32 words per record and splits them in-thread right before the MMA (LLVM folds
that back into the words); flag 2 lays the load out as ``[k_hi 8, m3 2, m_hi, m_lo 8, k_lo]``, which the
coalescer distributes exactly like the FP8 wgmma A fragment (registers renamed, no shared-memory round
trip); flag 4 (tile == cache block) drops the two integer divisions per tile.

Every format, ``ALU`` flag 64: each token's ``[BLOCK_N]`` scores leave the head sum in the MMA's row layout (a
row's value in the four lanes of a quad); ``tl.store`` converts them to a coalesced layout through shared memory
and two barriers per token, the largest stalls under Nsight Compute (fifteenth session). With the flag they are
stored where they are, by a predicated PTX ``st.global.f32`` per element (the quad's four equal stores to one
address merge): 12 -> 2 barriers a tile in the sm_90 SASS. CPU launches (the interpreter runs no PTX) keep
``tl.store``; the values are the same.

MXFP4 keys, ``ALU`` flags 8 and 16 (``mxfp4_mode`` 2-4; flag 4 applies as for FP8): the sm_90 SASS of mode 4
spends about half of a tile's instructions on bytes (one-byte loads of the scales, ~190 byte permutes and ~160
LOP3 extracting, decoding and repacking the 32 packed bytes a thread holds). Flag 8 loads each 32-dim block as
4 int32 words per record and the 4 scale bytes as one word, and decodes whole words (:func:`_e4m3_words`:
shifts and masks on 32-bit lanes give the 4 even-dim and the 4 odd-dim e4m3 bytes of 4 pairs at once); the
words are then split into bytes in dim order. Flag 16 skips that interleave: the keys keep each word's even
bytes then its odd bytes (dim ``8c + 2j + h`` at column ``8c + 4h + j``) and the queries are loaded in the
same order (:func:`_word_order_dims`), so the MMA's dot product is the same sum, term for term.

Grid: ``(T, key-tile chunks)``; axis 0 indexes a device-built list of segment starts (live segments
first, the rest ``T``: those programs exit at once), so there is no host sync. Tile loops (``LOOP``):
0 unrolled, 1 rolled with the next tile's bytes loaded into registers before this tile's MMAs (one
tile in flight per program beyond the one computed; the last re-reads itself, a cache hit), 3 the same
two tiles ahead, 2 rolled for Triton's software pipeliner (``num_stages``, asynchronous copies into
shared memory).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .alignment import aligned_rows
from . import grid as grid_limits
from .bytes import INDEX_CODES, INDEX_FP8, INDEX_MXFP4, e2m1_ue8m0_value, views_usable
from .segments import segment_starts
from dsahal.kernel_launch import wrap_launched

DOT_BF16 = 0  # same codes as indexer.DOT_*
DOT_FP8 = 1
DOT_FP32 = 2  # exact fp32 dots: only when asked for (tests under TRITON_INTERPRET=1); never served
MAX_GROUP = 8  # query tokens per segment (explicit operands q0..q7 below)

# MXFP4 key decodes of the block tiles (the kernel's MX constexpr; 0 keeps the path as it was)
MXFP4_MODES = {
    0: "tl.dot_scaled (scaled_dot > 0) or the general per-element decode",
    1: "shift decode to e4m3, fp32 block scale per element, bf16 even/odd MMAs",
    2: "shift decode, bf16 MMA per 32-dim block, block scale on its result",
    3: "as 2 with fp16 MMAs (each head's query row scaled into fp16's range by a power of two, undone on its weight)",
    4: "as 2 with FP8 MMAs (FP8 queries)",
    5: "as 2, the block scale on the values instead (in fp32), the four bf16 MMAs chained",
    6: "as 5 with the scale multiply in bf16 (packed bf16x2)",
}

# Instruction-count options of the FP8-key tiles (the kernel's ALU constexpr, launcher ``alu``: a sum of flags;
# 0 keeps the path as it was). SASS of the sm_90 compile, rolled prefetch loop, FP8 q, 5-token segments: the
# byte path spends ~200 of its 420 instructions per 64-key tile unpacking the prefetched bytes (carried
# through the loop as 64 one-byte values a thread) and repacking them for the layout conversion to the MMA.
ALU_FLAGS = {
    1: "FP8 keys loaded as int32 words (the prefetched tile is 16 registers a thread; bytes split in-thread)",
    2: "FP8 keys loaded in the FP8 MMA's register layout (no shared-memory layout conversion; BLOCK_N % 16 == 0)",
    4: "a key tile is one whole cache block (block_tokens == BLOCK_N): no integer divisions per tile",
    8: "MXFP4 keys (mxfp4_mode 2-4) loaded as int32 words (4 per 32-dim block, the 4 scale bytes as one): the "
       "e2m1 -> e4m3 shift decode on whole words, 8 values per 7 ops",
    16: "with flag 8: each 8-dim group of the decoded keys as its 4 even dims then its 4 odd dims (the words' own "
        "order, no byte interleave), the queries loaded in that order",
    32: "bf16 queries on FP8 keys as fp16 MMAs: each head's query row scaled into fp16's range by a power of two "
        "(undone on its weight), the keys widened e4m3 -> fp16 (H200, ninth session: 1.13-1.33x slower than the "
        "bf16 MMAs, so off)",
    64: "each token's scores stored from the MMA's own register layout by inline PTX (no conversion to the store's "
        "layout through shared memory and two barriers; not under the interpreter). NOT CORRECT at every shape: on the "
        "H200 (twenty-third session, scripts/h200/dsa_repeat_probe.py) it left entries of some tokens' score rows "
        "unwritten at 4 heads, 6-8 tokens a request; no configuration of the backend sets it since",
    128: "bf16 queries as two FP8 MMAs (FP8 keys, or MXFP4 keys in mxfp4_mode 4): each head's query row scaled by a "
         "power of two into e4m3's range and split exactly into hi + lo e4m3 parts (the scale undone on its "
         "weight), so the keys stay e4m3 instead of being widened to bf16 every tile",
}

# ALU flag 128's low parts (_e4m3_hi_lo, _hi_lo_dot): FP8 keys in separate accumulators (16), MXFP4 keys chained (1)
FP8_KEYS_LO_SCALE: tl.constexpr = tl.constexpr(16)
MXFP4_LO_SCALE: tl.constexpr = tl.constexpr(1)

SIZE_ARGS = ("T", "max_context", "num_blocks", "max_blocks", "block_tokens", "n_tiles")
# the arguments that describe the index cache, the same whichever rows a batch holds (compile_budget: batch-invariant
# mode keeps their alignment facts)
CACHE_ARGS = {"indexer_tiles_kernel": ("pages_u8", "s8_b", "pages_f32", "s32_b")}
# the queries and weights, which :func:`launch` makes aligned on every call (.alignment.aligned_rows): batch-invariant
# mode keeps their facts too (without them the sm_90 loop with bf16 queries ran 1,059 instructions and spilled 400
# bytes, against the default compile's 640 and none)
LAUNCHER_ALIGNED_ARGS = {"indexer_tiles_kernel": ("q_ptr", "stride_qt", "stride_qh", "w_ptr", "stride_wt")}
L2_AHEAD_MAX = 8  # l2_ahead: how far ahead (in key tiles) the rolled loop may ask L2 for a tile's lines

# Programs a launch should have before its key chunks get longer (``wide_tiles``): 8 per SM of an H200's
# 132, so the last wave is short next to the launch and short rows still spread over the GPU.
WIDE_TILE_PROGRAMS = 1024


@triton.jit
def _lanes(flag, like):
    """Scalar ``flag`` as a lane vector shaped like ``like`` (the interpreter mishandles masks that mix
    tensors and scalars)."""
    return (like * 0 + flag.to(tl.int32)) != 0


@triton.jit
def _block_factor(scale_byte):
    """``2^(byte - 121)`` as fp32 for ue8m0 scale bytes: the block scale ``2^(byte - 127)`` times the 2^6 that
    :func:`_e2m1_as_e4m3` takes off. Its exponent field ``byte + 6`` is never subnormal, so it is one shift;
    bytes 249-254 give Inf (scales of 2^122 and up, which no encoder writes), byte 255 NaN (the OCP MX NaN scale,
    as ``numerics.ue8m0_decode`` reads it)."""
    byte = scale_byte.to(tl.int32)
    return tl.where(byte == 255, 0x7FC00000, tl.minimum(byte + 6, 255) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_as_e4m3(pairs):
    """Packed e2m1 pairs (``uint8``, low nibble the even dim) -> (even, odd) e4m3 bytes holding the e2m1
    value times 2^-6, exactly: the sign moves to bit 7 and the 3 magnitude bits (2 exponent, 1 mantissa)
    to bits 4..2, where e4m3 reads them with exponent bias 7 instead of 1. Subnormals line up too (e2m1
    code 1 = 0.5 reads as the e4m3 subnormal 2^-7), so it is two masks and two shifts per value, no
    compares or selects (the general decode, :func:`e2m1_ue8m0_value`, takes ~15 integer ops)."""
    even = ((pairs & 0x08) << 4) | ((pairs & 0x07) << 2)
    odd = (pairs & 0x80) | ((pairs & 0x70) >> 2)
    return even, odd


@triton.jit
def _e4m3_words(words):
    """:func:`_e2m1_as_e4m3` on int32 words of 4 packed pairs each (pair ``j`` in byte ``j``) -> (even, odd)
    int32 words whose byte ``j`` is the e4m3 byte of pair ``j``'s even / odd dim. Every shift moves bits
    within a byte or into bits the mask then clears, so the four bytes are decoded at once (the arithmetic
    shift's sign bits are masked off too). ``-0x7F7F7F80`` is ``0x80808080`` as an int32 (the sign bits)."""
    even = ((words << 2) & 0x1C1C1C1C) | ((words << 4) & -0x7F7F7F80)
    odd = (words & -0x7F7F7F80) | ((words >> 2) & 0x1C1C1C1C)
    return even, odd


@triton.jit
def _word_order_dims(cols):
    """Dim of each column ``8c + 4h + j`` of the word-order keys (``ALU & 16``): ``8c + 2j + h`` (the even dim
    of pair ``4c + j`` for ``h = 0``, its odd dim for ``h = 1``)."""
    return (cols & 24) | ((cols & 3) << 1) | ((cols >> 2) & 1)


@triton.jit
def _mma_cast(x, DOT: tl.constexpr, MX: tl.constexpr):
    """An operand in the MMA type of the MXFP4 block modes: fp32 (exact dots, tests), fp16 (``MX == 3``),
    e4m3 as given (``MX == 4``: FP8 queries and keys), else bf16."""
    if MX == 4:
        return x
    elif DOT == 2:
        return x.to(tl.float32)
    elif MX == 3:
        return x.to(tl.float16)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _fp16_row_scale(amax):
    """Per-row powers of two (up, down = 1 / up) for rows of largest magnitude ``amax`` (fp32 ``[BLOCK_H]``):
    ``amax * up`` lies in [2^14, 2^15), inside fp16's range (a bf16 query of any magnitude, rounded to fp16
    unscaled, overflows past 65504 and loses its small values to subnormals); the MMA then sees the row's values
    to fp16's 11 bits relative to its own maximum, and ``relu(up · x) · down = relu(x)`` exactly (a power of
    two, positive), so ``down`` goes on the head's weight. Rows below 2^-112 (zero included) take up = 2^126,
    whose ``down`` is still a normal fp32."""
    return _pow2_row_scale(amax, 14)


@triton.jit
def _pow2_row_scale(amax, TOP: tl.constexpr):
    """Per-row powers of two (up, down = 1 / up) putting ``amax * up`` in [2^TOP, 2^(TOP + 1)) (up capped at
    2^126, so ``down`` stays a normal fp32)."""
    biased = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # amax in [2^(biased-127), 2^(biased-126))
    field = tl.minimum(254 + TOP - biased, 253)  # exponent field of 2^(127 + TOP - biased)
    up = (field << 23).to(tl.float32, bitcast=True)
    down = ((254 - field) << 23).to(tl.float32, bitcast=True)
    return up, down


@triton.jit
def _hi_lo_scale(amax):
    """Per-row powers of two (up, down = 1 / up) for :func:`_e4m3_hi_lo` of rows whose largest magnitude is ``amax``
    (``[BLOCK_H]``, :func:`_row_amax`): ``up`` puts the row's largest value in [2^7, 2^8) (:func:`_pow2_row_scale`;
    e4m3's largest is 448); ``down`` is NaN for a row holding Inf or NaN (``amax`` Inf), whose e4m3 parts would have
    hidden it (the GPU's conversion saturates Inf to 448; the interpreter's loses NaN), so that row's scores come
    out NaN."""
    up, down = _pow2_row_scale(amax, 7)
    return up, tl.where(amax < float("inf"), down, float("nan"))


@triton.jit
def _row_amax(x):
    """Largest magnitude per row of ``x`` ``[R, D]`` -> ``[R]``, Inf for a row holding NaN (a max may skip NaN)."""
    return tl.max(tl.where(x == x, tl.abs(x), float("inf")), 1)


@triton.jit
def _e4m3_hi_lo(x, up, LO_SCALE: tl.constexpr):
    """Rows of bf16 values ``x`` (fp32 ``[BLOCK_H, D]``) and their powers of two ``up`` (:func:`_hi_lo_scale`) ->
    (hi, lo): e4m3 ``[BLOCK_H, D]`` with ``hi + lo / LO_SCALE = x · up``. Two FP8 MMAs against e4m3 keys then give
    the bf16 query's dot products from exact products (:func:`_hi_lo_dot`).

    ``hi`` is the scaled value rounded to e4m3's 4 significant bits (to nearest, ties to even, on the fp32 bits; 0
    below e4m3's smallest normal 2^-6), so the residual is a multiple of the value's bf16 ulp (8 significant bits)
    no larger than 2^3 of them: 4 bits, held exactly by ``lo`` = ``LO_SCALE`` (16 or 1) x the residual (at most
    2^7) while that is a multiple of e4m3's subnormal step 2^-9. So with ``LO_SCALE`` 16 every scaled value of at
    least 2^-6 (all but the row's values below about 2^-13 of its largest) is exact, a smaller one off by at most
    2^-14 (2^-21 of the row's largest); with 1, from 2^-2 (2^-9 of the largest), off by at most 2^-10 below. Both
    parts are e4m3 values before the conversion, so no conversion rounds (the interpreter's rounding of fp32 to
    e4m3 is not the GPU's)."""
    scaled = x * up[:, None]
    bits = scaled.to(tl.int32, bitcast=True)
    # keep 3 of fp32's 23 mantissa bits, rounding the 20 dropped ones to nearest even (a carry may step the
    # exponent: still a 4-bit value); the sign bit is never reached below 2^128
    hi = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
    hi = tl.where(tl.abs(scaled) >= 0.015625, hi, 0.0)
    rest = (scaled - hi) * LO_SCALE  # exact: |scaled - hi| <= 2^-4 |scaled|, a multiple of its ulp
    lo = tl.floor(rest * 512.0 + 0.5) * 0.001953125  # to multiples of 2^-9 (exact where rest already is one)
    return hi.to(tl.float8e4nv), lo.to(tl.float8e4nv)


@triton.jit
def _hi_lo_dot(keys, hi, lo, LO_SCALE: tl.constexpr):
    """``keys [N, K] @ (hi + lo / LO_SCALE)ᵀ`` for the parts of :func:`_e4m3_hi_lo` (each ``[BLOCK_H, K]`` e4m3).
    ``LO_SCALE`` 16: two FP8 MMAs into separate fp32 accumulators, added after (the multiply by 1/16 also keeps the
    compiler from folding the add into the MMA's accumulator). 1: the low part's MMA chained onto the high part's
    accumulator, one accumulator fewer, its products then summed at the FP8 MMA accumulator's precision relative to
    the high part's sum (H200, eighteenth session, relative score error: FP8 keys, K = 128, 4.3e-4 chained against
    1.2e-4 separate, FP8 queries 1.3e-4; MXFP4 keys, one K = 32 MMA a block, 8.8e-5 chained, 2.0e-5 separate, whose
    extra accumulators took 174 -> 235 registers and 1.27x the time)."""
    if LO_SCALE == 1:
        return tl.dot(keys, tl.trans(lo), tl.dot(keys, tl.trans(hi)))
    return tl.dot(keys, tl.trans(hi)) + tl.dot(keys, tl.trans(lo)) * (1.0 / LO_SCALE)


@triton.jit
def _member(req_ptr, pos_ptr, off_ptr, t0, g: tl.constexpr, T, req, off0):
    """Token ``t0 + g``: (whether it belongs to the segment, its position; -1 when not)."""
    t = t0 + g
    inside = t < T
    tt = tl.where(inside, t, t0)
    ok = inside & (tl.load(req_ptr + tt) == req) & (tl.load(off_ptr + tt) == off0 + g)
    pos = tl.where(ok, tl.load(pos_ptr + tt), -1)
    return ok, pos


@triton.jit
def _load_q(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, t, ok, H, BLOCK_H: tl.constexpr, DOT: tl.constexpr,
            SPLIT: tl.constexpr, MX: tl.constexpr, ALU: tl.constexpr):
    """Queries of token ``t`` as MMA operands (``[BLOCK_H, 128]``, or its even / odd dim halves
    ``[BLOCK_H, 64]`` each with ``SPLIT``, or its four 32-dim scale blocks ``[BLOCK_H, 32]`` each with
    ``MX >= 2``, their dims in the decoded keys' word order with ``ALU & 16``; zero beyond ``H``) and a pointer
    to its head weights."""
    heads = tl.arange(0, BLOCK_H)
    row_ok = (heads < H) & _lanes(ok, heads)
    rows = q_ptr + tl.where(ok, t, 0).to(tl.int64) * stride_qt + heads[:, None] * stride_qh
    if MX >= 2:
        dims = tl.arange(0, 32)[None, :]
        if (ALU & 16) != 0:
            dims = _word_order_dims(dims)
        b0 = tl.load(rows + dims, mask=row_ok[:, None], other=0.0)
        b1 = tl.load(rows + 32 + dims, mask=row_ok[:, None], other=0.0)
        b2 = tl.load(rows + 64 + dims, mask=row_ok[:, None], other=0.0)
        b3 = tl.load(rows + 96 + dims, mask=row_ok[:, None], other=0.0)
        if MX == 4 and (ALU & 128) != 0:  # bf16 queries as e4m3 hi + lo per block, one row scale (undone after)
            b0, b1, b2, b3 = b0.to(tl.float32), b1.to(tl.float32), b2.to(tl.float32), b3.to(tl.float32)
            # one power of two a row, over its four blocks
            up, down = _hi_lo_scale(tl.maximum(tl.maximum(_row_amax(b0), _row_amax(b1)),
                                               tl.maximum(_row_amax(b2), _row_amax(b3))))
            h0, l0 = _e4m3_hi_lo(b0, up, MXFP4_LO_SCALE)
            h1, l1 = _e4m3_hi_lo(b1, up, MXFP4_LO_SCALE)
            h2, l2 = _e4m3_hi_lo(b2, up, MXFP4_LO_SCALE)
            h3, l3 = _e4m3_hi_lo(b3, up, MXFP4_LO_SCALE)
            q = (h0, l0, h1, l1, h2, l2, h3, l3, down)
        elif MX == 3:  # fp16 operands: each head's row times a power of two that fits fp16's range (undone after)
            b0, b1, b2, b3 = b0.to(tl.float32), b1.to(tl.float32), b2.to(tl.float32), b3.to(tl.float32)
            up, down = _fp16_row_scale(tl.maximum(tl.maximum(tl.max(tl.abs(b0), 1), tl.max(tl.abs(b1), 1)),
                                                  tl.maximum(tl.max(tl.abs(b2), 1), tl.max(tl.abs(b3), 1))))
            q = (_mma_cast(b0 * up[:, None], DOT, MX), _mma_cast(b1 * up[:, None], DOT, MX),
                 _mma_cast(b2 * up[:, None], DOT, MX), _mma_cast(b3 * up[:, None], DOT, MX), down)
        else:
            q = (_mma_cast(b0, DOT, MX), _mma_cast(b1, DOT, MX), _mma_cast(b2, DOT, MX), _mma_cast(b3, DOT, MX))
    elif SPLIT:
        half = tl.arange(0, 64)
        q_even = tl.load(rows + 2 * half[None, :], mask=row_ok[:, None], other=0.0)
        q_odd = tl.load(rows + 2 * half[None, :] + 1, mask=row_ok[:, None], other=0.0)
        if DOT == 2:
            q = (q_even.to(tl.float32), q_odd.to(tl.float32))
        else:
            q = (q_even.to(tl.bfloat16), q_odd.to(tl.bfloat16))
    elif (ALU & 128) != 0:  # bf16 queries on FP8 keys as e4m3 hi + lo (_e4m3_hi_lo), for two FP8 MMAs
        q = tl.load(rows + tl.arange(0, 128)[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
        up, down = _hi_lo_scale(_row_amax(q))
        hi, lo = _e4m3_hi_lo(q, up, FP8_KEYS_LO_SCALE)
        q = (hi, lo, down)
    elif (ALU & 32) != 0:  # fp16 MMA on FP8 keys: the rows' powers of two, undone on the weights
        q = tl.load(rows + tl.arange(0, 128)[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
        up, down = _fp16_row_scale(tl.max(tl.abs(q), 1))
        q = ((q * up[:, None]).to(tl.float16), down)
    else:
        q = tl.load(rows + tl.arange(0, 128)[None, :], mask=row_ok[:, None], other=0.0)
        if DOT == 0:
            q = q.to(tl.bfloat16)
        elif DOT == 2:
            q = q.to(tl.float32)
    # the weights stay in memory (an L1 hit per tile): held in registers for 8 tokens they took ~64 of them
    w = w_ptr + tl.where(ok, t, 0).to(tl.int64) * stride_wt
    return q, w


@triton.jit
def _token_score(keys, scale, q, w, FMT: tl.constexpr, DOT: tl.constexpr, SCALED_DOT: tl.constexpr,
                 MX: tl.constexpr, ALU: tl.constexpr):
    """``Σ_h w[h] · relu(q[h] · k[s]) · scale[s]`` for the tile's keys: ``[BLOCK_N]`` fp32."""
    if FMT == 2 and MX >= 5:  # scaled blocks: one accumulator chained through the four K = 32 MMAs
        k0, k1, k2, k3 = keys
        q0, q1, q2, q3 = q
        if DOT == 2:
            logits = tl.dot(k0, tl.trans(q0), input_precision="ieee")
            logits = tl.dot(k1, tl.trans(q1), logits, input_precision="ieee")
            logits = tl.dot(k2, tl.trans(q2), logits, input_precision="ieee")
            logits = tl.dot(k3, tl.trans(q3), logits, input_precision="ieee")
        else:
            logits = tl.dot(k0, tl.trans(q0))
            logits = tl.dot(k1, tl.trans(q1), logits)
            logits = tl.dot(k2, tl.trans(q2), logits)
            logits = tl.dot(k3, tl.trans(q3), logits)
    elif FMT == 2 and MX == 4 and (ALU & 128) != 0:  # bf16 queries as e4m3 hi + lo: two FP8 MMAs per block
        blocks, factors = keys
        k0, k1, k2, k3 = blocks
        f0, f1, f2, f3 = factors
        h0, l0, h1, l1, h2, l2, h3, l3, down = q
        w = w * down
        logits = _hi_lo_dot(k0, h0, l0, MXFP4_LO_SCALE) * f0[:, None]
        logits += _hi_lo_dot(k1, h1, l1, MXFP4_LO_SCALE) * f1[:, None]
        logits += _hi_lo_dot(k2, h2, l2, MXFP4_LO_SCALE) * f2[:, None]
        logits += _hi_lo_dot(k3, h3, l3, MXFP4_LO_SCALE) * f3[:, None]
    elif FMT == 2 and MX >= 2:  # MXFP4 block modes: one K = 32 MMA per scale block, scaled per key after it
        blocks, factors = keys  # no nested unpacking: Triton 3.6's dependency scan fails on it (see tests)
        k0, k1, k2, k3 = blocks
        f0, f1, f2, f3 = factors
        if MX == 3:  # the rows' powers of two (_fp16_row_scale) undone on the head weights
            q0, q1, q2, q3, down = q
            w = w * down
        else:
            q0, q1, q2, q3 = q
        if DOT == 2 and MX == 2:
            logits = tl.dot(k0, tl.trans(q0), input_precision="ieee") * f0[:, None]
            logits += tl.dot(k1, tl.trans(q1), input_precision="ieee") * f1[:, None]
            logits += tl.dot(k2, tl.trans(q2), input_precision="ieee") * f2[:, None]
            logits += tl.dot(k3, tl.trans(q3), input_precision="ieee") * f3[:, None]
        else:
            logits = tl.dot(k0, tl.trans(q0)) * f0[:, None]
            logits += tl.dot(k1, tl.trans(q1)) * f1[:, None]
            logits += tl.dot(k2, tl.trans(q2)) * f2[:, None]
            logits += tl.dot(k3, tl.trans(q3)) * f3[:, None]
    elif FMT == 2:  # MXFP4: the block scales are inside the dot (scale is 1)
        if SCALED_DOT > 0:
            packed, scales = keys
            logits = tl.dot_scaled(packed, scales, "e2m1", tl.trans(q), None, "bf16", fast_math=SCALED_DOT == 2)
        else:
            even, odd = keys
            q_even, q_odd = q
            if DOT == 2:
                logits = tl.dot(odd, tl.trans(q_odd), tl.dot(even, tl.trans(q_even), input_precision="ieee"),
                                input_precision="ieee")
            else:
                logits = tl.dot(odd, tl.trans(q_odd), tl.dot(even, tl.trans(q_even)))
    elif DOT == 2:
        logits = tl.dot(keys, tl.trans(q), input_precision="ieee")  # [BLOCK_N, BLOCK_H]
    elif FMT == 1 and (ALU & 128) != 0:  # bf16 queries as e4m3 hi + lo (_e4m3_hi_lo): two FP8 MMAs
        hi, lo, down = q
        logits = _hi_lo_dot(keys, hi, lo, FP8_KEYS_LO_SCALE)
        w = w * down
    elif FMT == 1 and (ALU & 32) != 0:  # fp16 MMA: the row scales (_fp16_row_scale) undone on the head weights
        q16, down = q
        logits = tl.dot(keys, tl.trans(q16))
        w = w * down
    else:
        logits = tl.dot(keys, tl.trans(q))
    return tl.sum(tl.maximum(logits, 0.0, propagate_nan=tl.PropagateNan.ALL) * w[None, :], axis=1) * scale


@triton.jit
def _store(out_ptr, stride_ot, t, ok, s, score, visible, max_context, ALU: tl.constexpr):
    ptrs = out_ptr + t.to(tl.int64) * stride_ot + s
    value = tl.where(visible, score, float("-inf"))
    mask = (s < max_context) & _lanes(ok, s)
    if (ALU & 64) != 0:
        # tl.store would first move the scores from the head sum's layout (a row's value in the four lanes of
        # a quad) to a coalesced one, through shared memory and two barriers a token (the largest stalls under
        # Nsight Compute); an elementwise PTX store takes them where they are (the quad's four equal stores to
        # one address merge in the load/store unit)
        tl.inline_asm_elementwise("{\n\t.reg .pred p;\n\tsetp.ne.s32 p, $3, 0;\n\t@p st.global.f32 [$1], $2;"
                                  "\n\tmov.u32 $0, 0;\n\t}", "=r,l,f,r",
                                  [ptrs.to(tl.int64), value, mask.to(tl.int32)], dtype=tl.int32, is_pure=False,
                                  pack=1)
    else:
        tl.store(ptrs, value, mask=mask)


@triton.jit
def _table_entry(block_table_ptr, stride_bt, req, tile, max_blocks, block_tokens, BLOCK_N: tl.constexpr,
                 ALU: tl.constexpr):
    """Block-table entry of key tile ``tile`` of request ``req`` (-1 past the table)."""
    if (ALU & 4) != 0:  # a tile is a whole block (the launcher checked block_tokens == BLOCK_N): no division
        logical = tile
    else:
        logical = tile * BLOCK_N // block_tokens
    in_table = logical < max_blocks
    entry = tl.load(block_table_ptr + req * stride_bt + tl.where(in_table, logical, 0))
    return tl.where(in_table, entry, -1)


@triton.jit
def _tile_bytes(pages_u8, s8_b, pages_f32, s32_b, entry, tile, num_blocks, block_tokens, FMT: tl.constexpr,
                TOKEN_BYTES: tl.constexpr, BLOCK_N: tl.constexpr, MX: tl.constexpr, ALU: tl.constexpr):
    """The bytes of key tile ``tile`` (inside the cache block ``entry``), unmasked: an unmapped tile reads
    block 0. -> (FP8: e4m3 keys ``[BLOCK_N, 128]``, fp32 scales ``[BLOCK_N]``; MXFP4: packed pairs
    ``[BLOCK_N, 64]``, UE8M0 scales ``[BLOCK_N, 4]``, or with ``MX >= 2`` per scale block: four
    ``[BLOCK_N, 16]`` pair tiles and four ``[BLOCK_N]`` scale bytes; whether the block is mapped)."""
    mapped = (entry >= 0) & (entry < num_blocks)
    block = tl.where(mapped, entry, 0).to(tl.int64)
    first = tile * BLOCK_N
    if (ALU & 4) != 0:
        key0 = 0
    else:
        key0 = first - (first // block_tokens) * block_tokens
    keys_in_tile = tl.arange(0, BLOCK_N)
    # every record starts 4-byte aligned (serves() checks it): say so, or a launch whose block stride is
    # not specialised as a multiple of 16 loads the keys byte by byte
    start = tl.multiple_of(block * s8_b + key0 * TOKEN_BYTES, 4)
    rows = pages_u8 + start + keys_in_tile[:, None] * TOKEN_BYTES
    if FMT == 1 and (ALU & 2) != 0:
        # the MMA's own register layout: the load is laid out as [k_hi 8, m3 2, m_hi 4, m_lo 8, k_lo] (the
        # coalescer gives lanes to m_lo and k_lo, warps to m_hi, registers to m3 then k_hi), which after the
        # permute and reshape to [BLOCK_N, 128] differs from the FP8 wgmma A fragment only in register order
        # (key = 16 m_hi + 8 m3 + m_lo, byte = 16 k_hi + k_lo: plain addresses, only the loop nest is reordered)
        key = (tl.arange(0, 2)[None, :, None, None, None] * 8
               + tl.arange(0, BLOCK_N // 16)[None, None, :, None, None] * 16
               + tl.arange(0, 8)[None, None, None, :, None])
        k_hi = tl.arange(0, 8)[:, None, None, None, None]
        if (ALU & 1) != 0:
            words = pages_f32 + (block * s32_b + key0 * (TOKEN_BYTES // 4)) + key * (TOKEN_BYTES // 4)
            a = tl.load(words + k_hi * 4 + tl.arange(0, 4)[None, None, None, None, :]).to(tl.int32, bitcast=True)
        else:
            a = tl.load(pages_u8 + start + key * TOKEN_BYTES + k_hi * 16 + tl.arange(0, 16)[None, None, None, None, :])
        b = tl.load(pages_f32 + (block * s32_b + key0 * (TOKEN_BYTES // 4)) + keys_in_tile * (TOKEN_BYTES // 4) + 32)
    elif FMT == 1 and (ALU & 1) != 0:
        # the 128 key bytes as 32 int32 words per record: a loop-carried (prefetched) tile is then 16
        # registers a thread, not 64 one-byte values that the byte path unpacks and repacks every tile
        words = pages_f32 + (block * s32_b + key0 * (TOKEN_BYTES // 4)) + keys_in_tile * (TOKEN_BYTES // 4)
        a = tl.load(words[:, None] + tl.arange(0, 32)[None, :]).to(tl.int32, bitcast=True)
        b = tl.load(words + 32)
    elif FMT == 1:
        a = tl.load(rows + tl.arange(0, 128)[None, :])
        b = tl.load(pages_f32 + (block * s32_b + key0 * (TOKEN_BYTES // 4)) + keys_in_tile * (TOKEN_BYTES // 4) + 32)
    elif MX >= 2 and (ALU & 8) != 0:
        # int32 words (records are 4-byte aligned): per block 4 words of packed pairs, then the scale word
        words = pages_f32 + (block * s32_b + key0 * (TOKEN_BYTES // 4)) + keys_in_tile * (TOKEN_BYTES // 4)
        four = tl.arange(0, 4)[None, :]
        a = (tl.load(words[:, None] + four).to(tl.int32, bitcast=True),
             tl.load(words[:, None] + 4 + four).to(tl.int32, bitcast=True),
             tl.load(words[:, None] + 8 + four).to(tl.int32, bitcast=True),
             tl.load(words[:, None] + 12 + four).to(tl.int32, bitcast=True))
        b = tl.load(words + 16).to(tl.int32, bitcast=True)
    elif MX >= 2:  # a 16-byte load per key and block (a Triton tensor cannot be sliced later)
        pairs = tl.arange(0, 16)[None, :]
        a = (tl.load(rows + pairs), tl.load(rows + 16 + pairs), tl.load(rows + 32 + pairs),
             tl.load(rows + 48 + pairs))
        first_scale = pages_u8 + start + keys_in_tile * TOKEN_BYTES + 64
        b = (tl.load(first_scale), tl.load(first_scale + 1), tl.load(first_scale + 2), tl.load(first_scale + 3))
    else:
        a = tl.load(rows + tl.arange(0, 64)[None, :])
        b = tl.load(rows + 64 + tl.arange(0, 4)[None, :])
    return a, b, mapped


@triton.jit
def _tile_raw(pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt, req, tile, num_blocks, max_blocks,
              block_tokens, FMT: tl.constexpr, TOKEN_BYTES: tl.constexpr, BLOCK_N: tl.constexpr, MX: tl.constexpr,
              ALU: tl.constexpr):
    """:func:`_table_entry` then :func:`_tile_bytes`."""
    entry = _table_entry(block_table_ptr, stride_bt, req, tile, max_blocks, block_tokens, BLOCK_N, ALU)
    return _tile_bytes(pages_u8, s8_b, pages_f32, s32_b, entry, tile, num_blocks, block_tokens, FMT, TOKEN_BYTES,
                       BLOCK_N, MX, ALU)


@triton.jit
def _l2_prefetch(pages_u8, s8_b, entry, tile, num_blocks, block_tokens, TOKEN_BYTES: tl.constexpr,
                 BLOCK_N: tl.constexpr, ALU: tl.constexpr, L2_LINES: tl.constexpr):
    """Ask L2 for the bytes of key tile ``tile`` (in cache block ``entry``; an unmapped tile names block 0,
    as :func:`_tile_bytes` reads it): ``prefetch.global.L2`` on every 128-byte line of the tile, one line a
    lane (``L2_LINES`` lanes, a power of two past the tile's lines; the extra lanes repeat its last byte). No
    register waits on it and no value comes back, so bytes in flight grow without the registers a prefetched
    tile costs; every address lies inside the tile, so the hint never reaches outside the pages."""
    mapped = (entry >= 0) & (entry < num_blocks)
    block = tl.where(mapped, entry, 0).to(tl.int64)
    if (ALU & 4) != 0:
        key0 = 0
    else:
        first = tile * BLOCK_N
        key0 = first - (first // block_tokens) * block_tokens
    tile_bytes: tl.constexpr = BLOCK_N * TOKEN_BYTES
    lines = pages_u8 + (block * s8_b + key0 * TOKEN_BYTES) + tl.minimum(tl.arange(0, L2_LINES) * 128, tile_bytes - 1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [lines.to(tl.int64)],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _tile_operands(a, b, FMT: tl.constexpr, DOT: tl.constexpr, SCALED_DOT: tl.constexpr, MX: tl.constexpr,
                   ALU: tl.constexpr):
    """Raw tile bytes -> (MMA operand(s), per-key scale ``[BLOCK_N]``): FP8 keys as e4m3 (FP8 MMA) or
    exactly widened; MXFP4 packed for ``tl.dot_scaled``, decoded into (even dims, odd dims), or (``MX >= 2``)
    per scale block: ((four ``[BLOCK_N, 32]`` unscaled key blocks), (four ``[BLOCK_N]`` fp32 factors))."""
    if FMT == 2 and MX >= 5:
        rows: tl.constexpr = a[0].shape[0]
        # each block decoded once per tile and scaled once per tile: its values times the key's 2^(byte - 121)
        keys = (_scaled_block(a[0], b[0], DOT, MX), _scaled_block(a[1], b[1], DOT, MX),
                _scaled_block(a[2], b[2], DOT, MX), _scaled_block(a[3], b[3], DOT, MX))
        scale = tl.full([rows], 1.0, tl.float32)
    elif FMT == 2 and MX >= 2 and (ALU & 8) != 0:
        rows: tl.constexpr = a[0].shape[0]
        # as below, decoded on whole words; the scale word's byte k is block k's ue8m0 scale
        keys = ((_mma_block_words(a[0], DOT, MX, ALU), _mma_block_words(a[1], DOT, MX, ALU),
                 _mma_block_words(a[2], DOT, MX, ALU), _mma_block_words(a[3], DOT, MX, ALU)),
                (_block_factor(b & 0xFF), _block_factor((b >> 8) & 0xFF), _block_factor((b >> 16) & 0xFF),
                 _block_factor((b >> 24) & 0xFF)))
        scale = tl.full([rows], 1.0, tl.float32)
    elif FMT == 2 and MX >= 2:
        rows: tl.constexpr = a[0].shape[0]
        # each block decoded once per tile to e4m3 (exact), dims back in order (join even/odd, then a
        # reshape that keeps the pairs in-thread), cast to the MMA type; its ue8m0 scale and the decode's
        # 2^-6 become one per-key power of two applied to that block's MMA result: 2^(byte - 127 + 6)
        keys = ((_mma_block(a[0], DOT, MX), _mma_block(a[1], DOT, MX), _mma_block(a[2], DOT, MX),
                 _mma_block(a[3], DOT, MX)),
                (_block_factor(b[0]), _block_factor(b[1]), _block_factor(b[2]), _block_factor(b[3])))
        scale = tl.full([rows], 1.0, tl.float32)
    elif FMT == 2 and MX == 1:
        rows: tl.constexpr = a.shape[0]
        # per element: the shift decode (e4m3, exact) widened to fp32 times 2^(byte - 127 + 6), the
        # block's power of two built once per [key, block] from integer ops (not per element)
        even8, odd8 = _e2m1_as_e4m3(a)
        factor = _block_factor(b)  # [rows, 4]
        per_pair = tl.reshape(tl.broadcast_to(factor[:, :, None], [rows, 4, 16]), [rows, 64])
        even = even8.to(tl.float8e4nv, bitcast=True).to(tl.float32) * per_pair
        odd = odd8.to(tl.float8e4nv, bitcast=True).to(tl.float32) * per_pair
        if DOT == 0:
            even = even.to(tl.bfloat16)
            odd = odd.to(tl.bfloat16)
        keys = (even, odd)
        scale = tl.full([rows], 1.0, tl.float32)
    elif FMT == 1:
        if (ALU & 2) != 0:  # [k_hi, m3, m_hi, m_lo, k_lo] -> [BLOCK_N, 128]: register renaming only
            if (ALU & 1) != 0:
                a = _word_bytes_5d(a)
            tile_rows: tl.constexpr = a.shape[1] * a.shape[2] * a.shape[3]
            a = tl.reshape(tl.permute(a, (2, 1, 3, 0, 4)), [tile_rows, 128])
        elif (ALU & 1) != 0:  # int32 words -> their bytes, little-endian (key byte 4c + j is byte j of word c)
            a = _word_bytes(a)
        rows: tl.constexpr = a.shape[0]
        # a no-op on the e4m3-typed view (typed_keys), whose load then feeds the MMA directly
        keys = a.to(tl.float8e4nv, bitcast=True)
        if (ALU & 32) != 0:
            keys = keys.to(tl.float16)
        elif DOT == 0:
            keys = keys.to(tl.bfloat16)
        elif DOT == 2:
            keys = keys.to(tl.float32)
        scale = b
    else:
        rows: tl.constexpr = a.shape[0]
        if SCALED_DOT > 0:
            keys = (a, b)
        else:
            per_pair = tl.reshape(tl.broadcast_to(b[:, :, None], [rows, 4, 16]), [rows, 64])
            even = e2m1_ue8m0_value(a & 0xF, per_pair)
            odd = e2m1_ue8m0_value(a >> 4, per_pair)
            if DOT == 0:
                even = even.to(tl.bfloat16)
                odd = odd.to(tl.bfloat16)
            keys = (even, odd)
        scale = tl.full([rows], 1.0, tl.float32)
    return keys, scale


@triton.jit
def _word_bytes(words):
    """``[N, W]`` int32 words -> ``[N, 4 W]`` uint8, byte ``j`` of word ``c`` at column ``4 c + j``
    (little-endian memory order). The joins add in-thread dims, so the reshape moves no data."""
    rows: tl.constexpr = words.shape[0]
    cols: tl.constexpr = words.shape[1]
    # the 4 bytes stay in one thread, in order: shifts and truncations that LLVM folds back into the word
    return tl.reshape(_byte_pairs(words), [rows, 4 * cols])


@triton.jit
def _word_bytes_5d(words):
    """:func:`_word_bytes` for the ``[k_hi, m3, m_hi, m_lo, 4]`` words of the MMA-layout load (``ALU & 2``)."""
    d0: tl.constexpr = words.shape[0]
    d1: tl.constexpr = words.shape[1]
    d2: tl.constexpr = words.shape[2]
    d3: tl.constexpr = words.shape[3]
    d4: tl.constexpr = words.shape[4]
    return tl.reshape(_byte_pairs(words), [d0, d1, d2, d3, 4 * d4])


@triton.jit
def _byte_pairs(words):
    """int32 words -> uint8 ``[..., 2, 2]`` with byte ``2 i + j`` of each word at ``[..., i, j]`` (``tl.join``
    appends its new dim last, so the outer join pairs bytes (0, 1) / (2, 3) across its inputs: b0 with b1 is
    ``join(join(b0, b2), join(b1, b3))``; the other order swaps bytes 1 and 2, and then ptxas cannot fold the
    shifts and byte permutes back into the word either)."""
    b0 = (words & 0xFF).to(tl.uint8)
    b1 = ((words >> 8) & 0xFF).to(tl.uint8)
    b2 = ((words >> 16) & 0xFF).to(tl.uint8)
    b3 = ((words >> 24) & 0xFF).to(tl.uint8)
    return tl.join(tl.join(b0, b2), tl.join(b1, b3))


@triton.jit
def _mma_block(pairs, DOT: tl.constexpr, MX: tl.constexpr):
    """``[BLOCK_N, 16]`` packed e2m1 pairs -> ``[BLOCK_N, 32]`` keys times 2^-6 in the MMA type, dims in order."""
    even, odd = _e2m1_as_e4m3(pairs)
    rows: tl.constexpr = pairs.shape[0]
    block = tl.reshape(tl.join(even, odd), [rows, 32]).to(tl.float8e4nv, bitcast=True)
    return _mma_cast(block, DOT, MX)


@triton.jit
def _mma_block_words(words, DOT: tl.constexpr, MX: tl.constexpr, ALU: tl.constexpr):
    """``[BLOCK_N, 4]`` int32 words of packed e2m1 pairs (one 32-dim block) -> ``[BLOCK_N, 32]`` keys times 2^-6
    in the MMA type: dims in order, or with ``ALU & 16`` in word order (:func:`_word_order_dims`)."""
    even, odd = _e4m3_words(words)
    rows: tl.constexpr = words.shape[0]
    if (ALU & 16) != 0:  # word c's even bytes, then its odd bytes: column 8c + 4h + j
        block = _word_bytes(tl.reshape(tl.join(even, odd), [rows, 8]))
    else:  # byte j of word c's even / odd word at column 8c + 2j + h (the join of the two byte splits)
        block = tl.reshape(tl.join(_byte_pairs(even), _byte_pairs(odd)), [rows, 32])
    return _mma_cast(block.to(tl.float8e4nv, bitcast=True), DOT, MX)


@triton.jit
def _scaled_block(pairs, scale_byte, DOT: tl.constexpr, MX: tl.constexpr):
    """``[BLOCK_N, 16]`` packed pairs and ``[BLOCK_N]`` ue8m0 bytes -> ``[BLOCK_N, 32]`` scaled keys (bf16, or
    fp32 with ``DOT == 2``), exact: the e4m3 value times 2^(byte - 121) is the e2m1 value times 2^(byte - 127).
    ``MX == 6`` multiplies in bf16 (a power of two: exact while the product is a normal bf16, i.e. the
    scaled key above 2^-126, as in fp32)."""
    factor = _block_factor(scale_byte)[:, None]
    if DOT == 2:
        return _mma_block(pairs, 2, 0) * factor
    if MX == 6:
        return _mma_block(pairs, 0, 0) * factor.to(tl.bfloat16)
    return (_mma_block(pairs, 2, 0) * factor).to(tl.bfloat16)


@triton.jit(do_not_specialize=SIZE_ARGS)
def indexer_tiles_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 128] (fp8 or bf16; fp32/fp16 never come here)
    w_ptr, stride_wt,  # [T, H] fp32
    pages_u8, s8_b, pages_f32, s32_b,  # uint8 (or e4m3-typed) and fp32 views of the pages, block strides
    block_table_ptr, stride_bt,  # [B, max_blocks] int32, -1 unmapped
    req_ptr, pos_ptr, off_ptr, seg_ptr,  # [T] request, position, index in its request run; [T] segment starts
    out_ptr, stride_ot,  # [T, max_context] fp32
    T, max_context, num_blocks, max_blocks, block_tokens, n_tiles,
    H: tl.constexpr, FMT: tl.constexpr, DOT: tl.constexpr, TOKEN_BYTES: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, GROUP: tl.constexpr, TILES: tl.constexpr, LOOP: tl.constexpr,
    SCALED_DOT: tl.constexpr, MX: tl.constexpr, ALU: tl.constexpr, L2_AHEAD: tl.constexpr = 0,
    L2_LINES: tl.constexpr = 0,
):
    t0 = tl.load(seg_ptr + tl.program_id(0))
    if t0 < T:
        req = tl.load(req_ptr + t0)
        off0 = tl.load(off_ptr + t0)
        split: tl.constexpr = FMT == 2 and SCALED_DOT == 0 and MX < 2
        # the segment's members: explicit per-token operands (a Triton tensor cannot be sliced)
        ok0, pos0 = _member(req_ptr, pos_ptr, off_ptr, t0, 0, T, req, off0)
        q0, w0 = _load_q(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, t0, ok0, H, BLOCK_H, DOT, split, MX,
                         ALU)
        reach = pos0
        # members the segment cannot have (g >= GROUP): placeholders, never used (ok_g False)
        q1, w1, ok1, pos1 = q0, w0, ok0 & (t0 < 0), pos0
        q2, w2, ok2, pos2 = q0, w0, ok1, pos0
        q3, w3, ok3, pos3 = q0, w0, ok1, pos0
        q4, w4, ok4, pos4 = q0, w0, ok1, pos0
        q5, w5, ok5, pos5 = q0, w0, ok1, pos0
        q6, w6, ok6, pos6 = q0, w0, ok1, pos0
        q7, w7, ok7, pos7 = q0, w0, ok1, pos0
        if GROUP > 1:
            ok1, pos1 = _member(req_ptr, pos_ptr, off_ptr, t0, 1, T, req, off0)
            q1, w1 = _load_q(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, t0 + 1, ok1, H, BLOCK_H, DOT, split, MX,
                             ALU)
            reach = tl.maximum(reach, pos1)
        if GROUP > 2:
            ok2, pos2 = _member(req_ptr, pos_ptr, off_ptr, t0, 2, T, req, off0)
            q2, w2 = _load_q(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, t0 + 2, ok2, H, BLOCK_H, DOT, split, MX,
                             ALU)
            reach = tl.maximum(reach, pos2)
        if GROUP > 3:
            ok3, pos3 = _member(req_ptr, pos_ptr, off_ptr, t0, 3, T, req, off0)
            q3, w3 = _load_q(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, t0 + 3, ok3, H, BLOCK_H, DOT, split, MX,
                             ALU)
            reach = tl.maximum(reach, pos3)
        if GROUP > 4:
            ok4, pos4 = _member(req_ptr, pos_ptr, off_ptr, t0, 4, T, req, off0)
            q4, w4 = _load_q(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, t0 + 4, ok4, H, BLOCK_H, DOT, split, MX,
                             ALU)
            reach = tl.maximum(reach, pos4)
        if GROUP > 5:
            ok5, pos5 = _member(req_ptr, pos_ptr, off_ptr, t0, 5, T, req, off0)
            q5, w5 = _load_q(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, t0 + 5, ok5, H, BLOCK_H, DOT, split, MX,
                             ALU)
            reach = tl.maximum(reach, pos5)
        if GROUP > 6:
            ok6, pos6 = _member(req_ptr, pos_ptr, off_ptr, t0, 6, T, req, off0)
            q6, w6 = _load_q(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, t0 + 6, ok6, H, BLOCK_H, DOT, split, MX,
                             ALU)
            reach = tl.maximum(reach, pos6)
        if GROUP > 7:
            ok7, pos7 = _member(req_ptr, pos_ptr, off_ptr, t0, 7, T, req, off0)
            q7, w7 = _load_q(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, t0 + 7, ok7, H, BLOCK_H, DOT, split, MX,
                             ALU)
            reach = tl.maximum(reach, pos7)
        # key tiles per program: unrolled, the compile-time TILES; rolled, the run-time n_tiles (one compile
        # serves every chunk length the launcher picks)
        if LOOP == 0:
            count = TILES
        else:
            count = n_tiles
        first = tl.program_id(1) * count
        # tiles holding a visible key (s <= reach, s < max_context) get loads and MMAs; the rest -inf only
        last = tl.minimum(reach, max_context - 1)
        live = tl.minimum(tl.maximum(last // BLOCK_N + 1 - first, 0), count)
        req64 = req.to(tl.int64)
        if LOOP == 0:  # unrolled: ptxas may issue several tiles' loads ahead
            for i in tl.static_range(TILES):
                if i < live:
                    a, b, mapped = _tile_raw(pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt, req64,
                                             first + i, num_blocks, max_blocks, block_tokens, FMT, TOKEN_BYTES,
                                             BLOCK_N, MX, ALU)
                    _score_tile(first + i, a, b, mapped, q0, w0, q1, w1, q2, w2, q3, w3, q4, w4, q5, w5, q6, w6,
                                q7, w7, ok0, pos0, ok1, pos1, ok2, pos2, ok3, pos3, ok4, pos4, ok5, pos5, ok6, pos6,
                                ok7, pos7, t0, out_ptr, stride_ot, max_context, H, BLOCK_H, FMT, DOT, GROUP, SCALED_DOT,
                                MX, ALU)
        elif LOOP == 1:  # rolled, the next tile's bytes loaded into registers before this tile's MMAs
            if live > 0:  # (a chunk past the segment's reach prefetches nothing)
                a_n, b_n, mapped_n = _tile_raw(pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt, req64,
                                               first, num_blocks, max_blocks, block_tokens, FMT, TOKEN_BYTES, BLOCK_N,
                                               MX, ALU)
                # table entries one tile further ahead: a tile's key loads never wait on its table load
                entry = _table_entry(block_table_ptr, stride_bt, req64, first + tl.minimum(1, live - 1), max_blocks,
                                     block_tokens, BLOCK_N, ALU)
                # L2_AHEAD: tiles 2 .. L2_AHEAD - 1 asked of L2 now, tile i + L2_AHEAD in iteration i, each from a
                # table entry loaded one iteration earlier (the hint never waits on its own table load)
                pf_entry = entry
                if L2_AHEAD > 0:
                    for j in tl.static_range(2, L2_AHEAD):
                        pf = first + tl.minimum(j, live - 1)
                        _l2_prefetch(pages_u8, s8_b, _table_entry(block_table_ptr, stride_bt, req64, pf, max_blocks,
                                                                  block_tokens, BLOCK_N, ALU),
                                     pf, num_blocks, block_tokens, TOKEN_BYTES, BLOCK_N, ALU, L2_LINES)
                    pf_entry = _table_entry(block_table_ptr, stride_bt, req64, first + tl.minimum(L2_AHEAD, live - 1),
                                            max_blocks, block_tokens, BLOCK_N, ALU)
                for i in range(live):
                    a, b, mapped = a_n, b_n, mapped_n
                    # the last live tile re-reads itself (a cache hit) rather than fetch a tile it never uses
                    a_n, b_n, mapped_n = _tile_bytes(pages_u8, s8_b, pages_f32, s32_b, entry,
                                                     first + tl.minimum(i + 1, live - 1), num_blocks, block_tokens,
                                                     FMT, TOKEN_BYTES, BLOCK_N, MX, ALU)
                    entry = _table_entry(block_table_ptr, stride_bt, req64, first + tl.minimum(i + 2, live - 1),
                                         max_blocks, block_tokens, BLOCK_N, ALU)
                    if L2_AHEAD > 0:  # (past the last live tile the hint repeats it: a line already asked for)
                        _l2_prefetch(pages_u8, s8_b, pf_entry, first + tl.minimum(i + L2_AHEAD, live - 1), num_blocks,
                                     block_tokens, TOKEN_BYTES, BLOCK_N, ALU, L2_LINES)
                        pf_entry = _table_entry(block_table_ptr, stride_bt, req64,
                                                first + tl.minimum(i + L2_AHEAD + 1, live - 1), max_blocks,
                                                block_tokens, BLOCK_N, ALU)
                    _score_tile(first + i, a, b, mapped, q0, w0, q1, w1, q2, w2, q3, w3, q4, w4, q5, w5, q6, w6,
                                q7, w7, ok0, pos0, ok1, pos1, ok2, pos2, ok3, pos3, ok4, pos4, ok5, pos5, ok6, pos6,
                                ok7, pos7, t0, out_ptr, stride_ot, max_context, H, BLOCK_H, FMT, DOT, GROUP,
                                SCALED_DOT, MX, ALU)
        elif LOOP == 3:  # as 1, two tiles ahead
            if live > 0:
                a_n, b_n, mapped_n = _tile_raw(pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt, req64,
                                               first, num_blocks, max_blocks, block_tokens, FMT, TOKEN_BYTES, BLOCK_N,
                                               MX, ALU)
                a_nn, b_nn, mapped_nn = _tile_raw(pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt,
                                                  req64, first + tl.minimum(1, live - 1), num_blocks, max_blocks,
                                                  block_tokens, FMT, TOKEN_BYTES, BLOCK_N, MX, ALU)
                entry = _table_entry(block_table_ptr, stride_bt, req64, first + tl.minimum(2, live - 1), max_blocks,
                                     block_tokens, BLOCK_N, ALU)
                for i in range(live):
                    a, b, mapped = a_n, b_n, mapped_n
                    a_n, b_n, mapped_n = a_nn, b_nn, mapped_nn
                    a_nn, b_nn, mapped_nn = _tile_bytes(pages_u8, s8_b, pages_f32, s32_b, entry,
                                                        first + tl.minimum(i + 2, live - 1), num_blocks,
                                                        block_tokens, FMT, TOKEN_BYTES, BLOCK_N, MX, ALU)
                    entry = _table_entry(block_table_ptr, stride_bt, req64, first + tl.minimum(i + 3, live - 1),
                                         max_blocks, block_tokens, BLOCK_N, ALU)
                    _score_tile(first + i, a, b, mapped, q0, w0, q1, w1, q2, w2, q3, w3, q4, w4, q5, w5, q6, w6,
                                q7, w7, ok0, pos0, ok1, pos1, ok2, pos2, ok3, pos3, ok4, pos4, ok5, pos5, ok6, pos6,
                                ok7, pos7, t0, out_ptr, stride_ot, max_context, H, BLOCK_H, FMT, DOT, GROUP,
                                SCALED_DOT, MX, ALU)
        else:  # rolled, left to the software pipeliner (num_stages)
            for i in range(live):
                a, b, mapped = _tile_raw(pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt, req64,
                                         first + i, num_blocks, max_blocks, block_tokens, FMT, TOKEN_BYTES, BLOCK_N, MX,
                                         ALU)
                _score_tile(first + i, a, b, mapped, q0, w0, q1, w1, q2, w2, q3, w3, q4, w4, q5, w5, q6, w6,
                            q7, w7, ok0, pos0, ok1, pos1, ok2, pos2, ok3, pos3, ok4, pos4, ok5, pos5, ok6, pos6,
                            ok7, pos7, t0, out_ptr, stride_ot, max_context, H, BLOCK_H, FMT, DOT, GROUP, SCALED_DOT,
                            MX, ALU)
        dead = tl.full([BLOCK_N], float("-inf"), tl.float32)
        for i in range(live, count):
            s = (first + i) * BLOCK_N + tl.arange(0, BLOCK_N)
            _dead(out_ptr, stride_ot, t0, s, dead, max_context, ok0, ok1, ok2, ok3, ok4, ok5, ok6, ok7, GROUP)


@triton.jit
def _dead(out_ptr, stride_ot, t0, s, dead, max_context, ok0, ok1, ok2, ok3, ok4, ok5, ok6, ok7,
          GROUP: tl.constexpr):
    """-inf for every member token on a tile past the segment's furthest position."""
    out = out_ptr + t0.to(tl.int64) * stride_ot + s
    inside = s < max_context
    tl.store(out, dead, mask=inside & _lanes(ok0, s))
    if GROUP > 1:
        tl.store(out + stride_ot, dead, mask=inside & _lanes(ok1, s))
    if GROUP > 2:
        tl.store(out + 2 * stride_ot, dead, mask=inside & _lanes(ok2, s))
    if GROUP > 3:
        tl.store(out + 3 * stride_ot, dead, mask=inside & _lanes(ok3, s))
    if GROUP > 4:
        tl.store(out + 4 * stride_ot, dead, mask=inside & _lanes(ok4, s))
    if GROUP > 5:
        tl.store(out + 5 * stride_ot, dead, mask=inside & _lanes(ok5, s))
    if GROUP > 6:
        tl.store(out + 6 * stride_ot, dead, mask=inside & _lanes(ok6, s))
    if GROUP > 7:
        tl.store(out + 7 * stride_ot, dead, mask=inside & _lanes(ok7, s))


@triton.jit
def _score_tile(tile, a, b, mapped, q0, w0, q1, w1, q2, w2, q3, w3, q4, w4, q5, w5, q6, w6, q7, w7,
                ok0, pos0, ok1, pos1, ok2, pos2, ok3, pos3, ok4, pos4, ok5, pos5, ok6, pos6, ok7, pos7, t0,
                out_ptr, stride_ot, max_context, H: tl.constexpr, BLOCK_H: tl.constexpr, FMT: tl.constexpr,
                DOT: tl.constexpr, GROUP: tl.constexpr, SCALED_DOT: tl.constexpr, MX: tl.constexpr,
                ALU: tl.constexpr):
    """Scores of key tile ``tile`` (its raw bytes ``a``, ``b``) for every member token of the segment:
    one MMA (two for explicitly decoded MXFP4) per member; absent members skip theirs."""
    keys, scale = _tile_operands(a, b, FMT, DOT, SCALED_DOT, MX, ALU)
    BLOCK_N: tl.constexpr = scale.shape[0]
    s = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    seen = _lanes(mapped, s)
    _one(keys, scale, q0, w0, ok0, pos0, t0, s, seen, out_ptr, stride_ot, max_context, H, BLOCK_H,
         FMT, DOT, SCALED_DOT, MX, ALU)
    if GROUP > 1:
        if ok1:
            _one(keys, scale, q1, w1, ok1, pos1, t0 + 1, s, seen, out_ptr, stride_ot, max_context, H, BLOCK_H,
                 FMT, DOT, SCALED_DOT, MX, ALU)
    if GROUP > 2:
        if ok2:
            _one(keys, scale, q2, w2, ok2, pos2, t0 + 2, s, seen, out_ptr, stride_ot, max_context, H, BLOCK_H,
                 FMT, DOT, SCALED_DOT, MX, ALU)
    if GROUP > 3:
        if ok3:
            _one(keys, scale, q3, w3, ok3, pos3, t0 + 3, s, seen, out_ptr, stride_ot, max_context, H, BLOCK_H,
                 FMT, DOT, SCALED_DOT, MX, ALU)
    if GROUP > 4:
        if ok4:
            _one(keys, scale, q4, w4, ok4, pos4, t0 + 4, s, seen, out_ptr, stride_ot, max_context, H, BLOCK_H,
                 FMT, DOT, SCALED_DOT, MX, ALU)
    if GROUP > 5:
        if ok5:
            _one(keys, scale, q5, w5, ok5, pos5, t0 + 5, s, seen, out_ptr, stride_ot, max_context, H, BLOCK_H,
                 FMT, DOT, SCALED_DOT, MX, ALU)
    if GROUP > 6:
        if ok6:
            _one(keys, scale, q6, w6, ok6, pos6, t0 + 6, s, seen, out_ptr, stride_ot, max_context, H, BLOCK_H,
                 FMT, DOT, SCALED_DOT, MX, ALU)
    if GROUP > 7:
        if ok7:
            _one(keys, scale, q7, w7, ok7, pos7, t0 + 7, s, seen, out_ptr, stride_ot, max_context, H, BLOCK_H,
                 FMT, DOT, SCALED_DOT, MX, ALU)


@triton.jit
def _one(keys, scale, q, w_row, ok, pos, t, s, seen, out_ptr, stride_ot, max_context, H: tl.constexpr,
         BLOCK_H: tl.constexpr, FMT: tl.constexpr, DOT: tl.constexpr, SCALED_DOT: tl.constexpr,
         MX: tl.constexpr, ALU: tl.constexpr):
    """Token ``t``'s scores on this tile (``w_row``: its head weights, fp32 ``[H]``), stored with -inf
    where not ``seen`` (unmapped block) or past its position."""
    heads = tl.arange(0, BLOCK_H)
    w = tl.load(w_row + heads, mask=heads < H, other=0.0)
    score = _token_score(keys, scale, q, w, FMT, DOT, SCALED_DOT, MX, ALU)
    _store(out_ptr, stride_ot, t, ok, s, score, seen & (s <= pos), max_context, ALU)


def tile_keys(block_tokens: int, block_n: int) -> int:
    """Keys per tile for ``block_tokens``-token blocks: ``block_n`` capped at the largest power of two
    dividing the block (a tile never straddles two blocks); 0 when that is below 16 (the MMA's K/M)."""
    largest = block_tokens & -block_tokens if block_tokens > 0 else 0
    n = min(block_n, largest)
    return n if n >= 16 else 0


def serves(q, index_pages, index_fmt, dot, block_n) -> bool:
    """Whether this path takes the call (else the general kernel does)."""
    code = INDEX_CODES.get(index_fmt)
    if code not in (INDEX_FP8, INDEX_MXFP4) or dot not in (DOT_BF16, DOT_FP8):
        return False
    if q.dtype not in (torch.bfloat16, torch.float8_e4m3fn) or q.shape[1] > 64:
        return False
    if index_pages.shape[0] == 0 or index_pages.stride(1) != index_pages.shape[-1]:
        return False
    if not views_usable(index_pages):  # records at 4-byte aligned addresses (the kernel's loads assume it)
        return False
    return tile_keys(index_pages.shape[1], block_n) > 0


def _check_mxfp4_mode(mode, q, index_fmt, scaled_dot, alu=0) -> int:
    """``mode`` as the kernel's ``MX`` constexpr, or a ValueError naming what does not fit."""
    if mode not in MXFP4_MODES:
        raise ValueError(f"triton indexer_score: mxfp4_mode must be one of {sorted(MXFP4_MODES)} "
                         f"({', '.join(f'{k} {v}' for k, v in MXFP4_MODES.items())}), got {mode!r}")
    if mode == 0:
        return 0
    if index_fmt != "mxfp4":
        raise ValueError(f"triton indexer_score: mxfp4_mode {mode} ({MXFP4_MODES[mode]}) decodes MXFP4 keys, "
                         f"got index_fmt={index_fmt!r}")
    if scaled_dot:
        raise ValueError(f"triton indexer_score: mxfp4_mode {mode} ({MXFP4_MODES[mode]}) decodes the keys "
                         f"itself; it excludes tl.dot_scaled (scaled_dot=0), got scaled_dot={scaled_dot!r}")
    if mode == 4 and q.dtype != torch.float8_e4m3fn and not (q.dtype == torch.bfloat16 and alu & 128):
        raise ValueError(f"triton indexer_score: mxfp4_mode 4 ({MXFP4_MODES[4]}) multiplies FP8 queries (bf16 ones "
                         f"with alu flag 128, split into two e4m3 parts), got q of dtype {q.dtype} with alu={alu!r}")
    return mode


def fitting_alu(alu: int, index_fmt: str, block_n: int, block_tokens: int, mxfp4_mode: int = 0, *,
                dot: int, q_dtype: torch.dtype | None = None) -> int:
    """The flags of a configured ``alu`` that fit this call (what :func:`_check_alu` accepts), the others
    dropped: a backend configuration names its flags once for every call, and a call with other pages
    (MXFP4 rather than FP8 keys, a block of another size) or another MMA (``dot``) must take the path without
    them, not fail."""
    if index_fmt != "fp8":
        alu &= ~3
    if not (index_fmt == "fp8" and dot == DOT_BF16):
        alu &= ~32
    if not _hi_lo_fits(index_fmt, mxfp4_mode, dot, q_dtype) or alu & 32:
        alu &= ~128
    if not (index_fmt == "mxfp4" and 2 <= mxfp4_mode <= 4):
        alu &= ~24
    if not alu & 8:
        alu &= ~16
    if block_n != block_tokens:
        alu &= ~4
    return alu


def _hi_lo_fits(index_fmt, mxfp4_mode, dot, q_dtype) -> bool:
    """Whether ``ALU`` flag 128 (bf16 queries as e4m3 hi + lo for FP8 MMAs) fits a call: bf16 queries on FP8 keys
    (``dot`` DOT_BF16), or on MXFP4 keys decoded for FP8 MMAs (``mxfp4_mode`` 4). ``q_dtype`` None: as FP8 keys
    imply it (their bf16 queries take DOT_BF16, FP8 ones DOT_FP8)."""
    if q_dtype is not None and q_dtype != torch.bfloat16:
        return False
    if index_fmt == "fp8":
        return dot == DOT_BF16
    return index_fmt == "mxfp4" and mxfp4_mode == 4 and q_dtype is not None


def _check_alu(alu, index_fmt, block_n, block_tokens, mxfp4_mode=0, dot=DOT_BF16, q_dtype=None) -> None:
    """A ValueError naming the flag of ``alu`` (:data:`ALU_FLAGS`) that does not fit the call."""
    known = sum(ALU_FLAGS)
    if not isinstance(alu, int) or isinstance(alu, bool) or not 0 <= alu <= known:
        raise ValueError(f"triton indexer_score: alu must be an int in 0..{known}, a sum of the flags "
                         f"{'; '.join(f'{k} {v}' for k, v in ALU_FLAGS.items())}, got {alu!r}")
    if alu & 3 and index_fmt != "fp8":
        raise ValueError(f"triton indexer_score: alu flags 1 and 2 change how FP8 keys are loaded, "
                         f"got alu={alu} with index_fmt={index_fmt!r}")
    if alu & 24 and not (index_fmt == "mxfp4" and 2 <= mxfp4_mode <= 4):
        raise ValueError(f"triton indexer_score: alu flags 8 and 16 change how MXFP4 keys are loaded and decoded in "
                         f"mxfp4_mode 2..4, got alu={alu} with index_fmt={index_fmt!r}, mxfp4_mode={mxfp4_mode!r}")
    if alu & 16 and not alu & 8:
        raise ValueError(f"triton indexer_score: alu flag 16 ({ALU_FLAGS[16]}) orders the words of flag 8, "
                         f"got alu={alu} without flag 8")
    if alu & 32 and not (index_fmt == "fp8" and dot == DOT_BF16):
        raise ValueError(f"triton indexer_score: alu flag 32 ({ALU_FLAGS[32]}) takes bf16 queries on FP8 keys "
                         f"(dot=DOT_BF16), got alu={alu} with index_fmt={index_fmt!r}, dot={dot!r}")
    if alu & 128 and not _hi_lo_fits(index_fmt, mxfp4_mode, dot, q_dtype):
        raise ValueError(f"triton indexer_score: alu flag 128 ({ALU_FLAGS[128]}) takes bf16 queries on FP8 keys or "
                         f"on MXFP4 keys in mxfp4_mode 4, got alu={alu} with q of dtype {q_dtype}, "
                         f"index_fmt={index_fmt!r}, mxfp4_mode={mxfp4_mode!r}, dot={dot!r}")
    if alu & 128 and alu & 32:
        raise ValueError(f"triton indexer_score: alu flags 32 and 128 each choose the MMA of bf16 queries on FP8 keys "
                         f"(fp16, or two FP8 MMAs); got both (alu={alu})")
    if alu & 4 and block_n != block_tokens:
        raise ValueError(f"triton indexer_score: alu flag 4 ({ALU_FLAGS[4]}) needs key tiles of one whole "
                         f"block, got {block_n}-key tiles in {block_tokens}-token blocks")


def launch(q, weights, index_pages, block_table, req_ids, positions, run_offset, index_fmt, max_context, out, *,
           dot, block_n=64, group=5, tiles=4, loop=0, num_warps=4, num_stages=1, scaled_dot=0,
           typed_keys=False, mxfp4_mode=0, alu=0, starts=None, wide_tiles=None, l2_ahead=0, maxnreg=None,
           requests=None):
    """Run :func:`indexer_tiles_kernel` (the caller checked :func:`serves`). ``group`` tokens per
    segment (<= 8), ``tiles`` key tiles per program, ``loop``: 0 unrolled, 1 rolled with the next tile
    prefetched into registers (3: the next two), 2 rolled for the software pipeliner (``num_stages``); ``scaled_dot``:
    MXFP4 through ``tl.dot_scaled`` (1; 2 with fast_math), else decoded explicitly; ``typed_keys``: FP8
    keys read through an e4m3 view for FP8 MMAs (the MMA then takes them from shared memory; through the
    uint8 view they reach it from registers); ``mxfp4_mode`` (MXFP4 keys, ``scaled_dot=0``): one of
    :data:`MXFP4_MODES` (0, the default, as before); ``alu``: a sum of :data:`ALU_FLAGS` (0, the default,
    as before); ``starts``: the segment starts for ``group`` (:func:`segments.segment_plan`), computed from
    ``run_offset`` when not given; ``wide_tiles`` (rolled loops): longer key chunks for launches with programs
    to spare (:func:`tiles_per_program`); ``l2_ahead`` (``loop`` 1): ask L2 for the lines of the tile that
    many tiles ahead (0 off, 2..:data:`L2_AHEAD_MAX`; a hint: no score changes; CPU launches, which are the
    interpreter's and cannot run PTX, skip it, as they skip ``alu`` flag 64's PTX stores); ``maxnreg``: ptxas's
    register cap (None: its own choice; a lower cap fits more programs on a SM, spills permitting); ``requests``: the
    requests the tokens come from, for ``wide_tiles``' count of segments (default the block table's rows)."""
    q, weights = aligned_rows(q), aligned_rows(weights)  # (LAUNCHER_ALIGNED_ARGS)
    tokens, heads, _ = q.shape
    if not 1 <= group <= MAX_GROUP:
        raise ValueError(f"triton indexer_score: the block-tile path takes 1..{MAX_GROUP} tokens per segment "
                         f"(group), got {group}")
    if loop not in (0, 1, 2, 3):
        raise ValueError(f"triton indexer_score: tile_loop must be 0 (unrolled), 1 or 3 (rolled, prefetching one "
                         f"or two tiles) or 2 (rolled, software-pipelined), got {loop!r}")
    if l2_ahead and not (loop == 1 and 2 <= l2_ahead <= L2_AHEAD_MAX):
        raise ValueError(f"triton indexer_score: l2_ahead asks L2 for a tile 2..{L2_AHEAD_MAX} tiles ahead in the "
                         f"rolled prefetch loop (tile_loop 1), got l2_ahead={l2_ahead!r} with tile_loop={loop!r}")
    if wide_tiles is not None and (loop == 0 or wide_tiles < tiles):
        raise ValueError(f"triton indexer_score: wide_tiles (key tiles per program when the launch has programs to "
                         f"spare) needs a rolled loop (tile_loop 1..3) and at least tiles={tiles}, got "
                         f"wide_tiles={wide_tiles!r} with tile_loop={loop!r}")
    mx = _check_mxfp4_mode(mxfp4_mode, q, index_fmt, scaled_dot, alu)
    block_n = tile_keys(index_pages.shape[1], block_n)
    _check_alu(alu, index_fmt, block_n, index_pages.shape[1], mx, dot, q.dtype)
    dot = kernel_dot(dot, index_fmt, alu)
    block_h = max(16, triton.next_power_of_2(heads))
    u8 = index_pages.view(torch.float8_e4m3fn) if typed_keys and index_fmt == "fp8" and dot == DOT_FP8 \
        else index_pages
    if index_fmt == "fp8" or alu & 8:  # (MXFP4 with alu flag 8: its word loads)
        f32, s32_b = index_pages.view(torch.float32), index_pages.stride(0) // 4
    else:
        f32, s32_b = index_pages, 0  # never read
    seg = segment_starts(run_offset, group) if starts is None else starts
    # segments on axis 0 (no 65535 limit on prefill token counts; the programs of one key chunk run
    # together, so a prefill's segments share that chunk in L2), key chunks on axis 1
    # (axis 1 holds at most 65535: longer rows get more tiles per program; a score does not depend on it)
    if wide_tiles is not None:
        rows = block_table.shape[0] if requests is None else requests
        tiles = tiles_per_program(expected_segments(tokens, group, rows), max_context, block_n,
                                  tiles, wide_tiles)
    tiles = max(tiles, triton.cdiv(max_context, block_n * grid_limits.MAX_GRID_YZ))
    grid = (tokens, triton.cdiv(max_context, block_n * tiles))
    token_bytes = index_pages.shape[-1]
    if not runs_ptx(q.device):
        l2_ahead = 0  # (the hint changes no score)
        alu &= ~64  # tl.store writes the same values from a coalesced layout
    l2_lines = triton.next_power_of_2(triton.cdiv(block_n * token_bytes, 128) + 1) if l2_ahead else 0
    indexer_tiles_kernel[grid](
        q, q.stride(0), q.stride(1), weights, weights.stride(0),
        u8, index_pages.stride(0), f32, s32_b,
        block_table, block_table.stride(0),
        req_ids, positions, run_offset, seg,
        out, out.stride(0),
        tokens, max_context, index_pages.shape[0], block_table.shape[1], index_pages.shape[1], tiles,
        H=heads, FMT=INDEX_CODES[index_fmt], DOT=dot, TOKEN_BYTES=token_bytes, BLOCK_H=block_h,
        BLOCK_N=block_n, GROUP=group, TILES=tiles if loop == 0 else 0, LOOP=loop, SCALED_DOT=scaled_dot, MX=mx,
        ALU=alu, L2_AHEAD=l2_ahead, L2_LINES=l2_lines, num_warps=num_warps, num_stages=num_stages,
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )
    return out


def kernel_dot(dot: int, index_fmt: str, alu: int) -> int:
    """The kernel's ``DOT`` for a call's ``dot`` (``indexer.pick_dot``): FP8 keys with ``alu`` flag 128 take the FP8
    MMA path (the keys stay e4m3; the bf16 queries are split into e4m3 hi + lo, :func:`_e4m3_hi_lo`)."""
    return DOT_FP8 if alu & 128 and index_fmt == "fp8" else dot


def runs_ptx(device: torch.device) -> bool:
    """Whether launches on ``device`` run inline PTX (the L2 hint, ``ALU`` flag 64's stores): NVIDIA CUDA devices;
    the interpreter's CPU launches cannot, nor can a ROCm build (its devices are also ``cuda`` to torch)."""
    return device.type == "cuda" and torch.version.hip is None


def expected_segments(tokens: int, group: int, rows: int) -> int:
    """The segments a launch of ``tokens`` in segments of at most ``group`` over a block table of ``rows``
    requests has at least when every row has a token (a decode step's batch): ``ceil(tokens / group)``, and one
    per request. Counted without a device sync; an over-count only costs speed (:func:`tiles_per_program`)."""
    return max(-(-tokens // group), min(tokens, rows))


def tiles_per_program(segments: int, max_context: int, block_n: int, tiles: int, wide_tiles: int) -> int:
    """Key tiles per program for a launch of ``segments`` (:func:`expected_segments`): the largest of
    ``wide_tiles``, ``wide_tiles / 2``, ... (down to ``tiles``) that still gives :data:`WIDE_TILE_PROGRAMS`
    programs, else ``tiles``. Longer chunks cost fewer prologues and epilogues per key (the H200's 64-tile
    chunks ran 4% faster than 16 at one token, 128K keys, ninth session); short rows keep short chunks so they
    still fill the GPU. A score never depends on it."""
    chunk = wide_tiles
    while chunk > tiles:
        if segments * triton.cdiv(max_context, block_n * chunk) >= WIDE_TILE_PROGRAMS:
            return chunk
        chunk //= 2
    return tiles


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
