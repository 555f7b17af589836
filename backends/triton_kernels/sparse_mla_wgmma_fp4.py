"""Few-heads sparse MLA on NVFP4 latents (352-byte records) in Gluon, the slots as the logit ``wgmma``'s M side.

Same op and arithmetic contract as :mod:`.sparse_mla_wgmma` (``o[t, h] = softmax_s(scale · q[t, h] · kv[s]) ·
kv[s, :512]``, ``lse`` natural log, -1 and out-of-range slots skipped, a row with no valid slot gives ``o = 0``,
``lse = -inf``), for bf16 queries of at most 16 heads on Hopper, on the NVFP4 record of :mod:`dsahal.formats.fp4`
(256 bytes of e2m1 pairs, 64 e4m3 RoPE values, 32 e4m3 scales, one per 16 nope dims).

Why a kernel of its own. Hopper's MMAs have no block scales and a scale here covers 16 dims (the FP8 MMA's K is 32),
so the fp8_ds_mla kernel's "MMA the codes as copied, scale the tile's sum" does not apply. Every value is widened
once per MMA instead, exactly:

- an e2m1 code shifted into an e4m3 byte is its value times 2^-6 (subnormal codes included: the indexer's MXFP4
  trick), ``cvt.rn.f16x2.e4m3x2`` widens two such bytes to fp16, and one ``mul.f16x2`` by ``(σ · 2^7, ...)`` gives
  ``2 · code · σ`` exactly in fp16 (at most 5 significant bits, within [2^-9, 5376] for every e4m3 scale, subnormal
  ones included): 7 integer instructions, 4 conversions and 4 multiplies a 32-bit word of 8 codes (:func:`_decode`);
- the logits ``S^T [64 slots, 16 heads]``: eight fp16 ``wgmma`` of K = 64 (A from registers: the decoded codes; B the
  queries in shared memory, scaled per head by a power of two into fp16) and one for the 64 RoPE dims (their e4m3
  values widened the same way), all into one fp32 accumulator (fp16 MMAs accumulate at full fp32 precision, unlike
  the FP8 ones: no hi / lo query split);
- the values: ``o [16 heads, 512] += P^T · V`` by ``mma.sync`` m16n8k16, warp ``w`` the 128 dims of tile ``w``, its B
  operand decoded from the same shared bytes a second time, a lane's 16 columns one 16-dim scale block of one slot
  (one 8-byte load and one scale a slot), two slots' bytes paired per register by the decode.

Both MMAs read the dims in permuted orders (:func:`logit_dim`, :func:`value_dim`) chosen so that each thread's codes
are contiguous bytes and each decoded register is one MMA register (no data moves between the decode and the MMA):
the queries are loaded through the first, the output stored through the second. The stage's codes sit 256 bytes a
slot with their 16-byte pieces XOR-swizzled by the slot (the comment above the views below) so both reads are
bank-conflict free.

Measured on the H200 (BENCHMARKS.md, twenty-third session, 64 x 5 tokens x 2048 slots): 0.225 / 0.206 ms at H = 16 /
12 (three programs a SM), 3.8-4.2x the Triton few-heads kernel and 1.32x / 1.44x FlashMLA's time on the same tokens
as fp8_ds_mla with its heads padded; 25-27% of the copy ceiling on the gathered bytes, ALU-bound on the decode (about
960 of a step's 1,671 instructions a warp). o within 1.7e-3, lse within 2e-6 of the float64 reference. On an H100
(thirty-seventh session, GPU time, the same bits as before): the first copies issued before the queries are loaded,
the slot indices loaded as whole words (a thread's slots consecutive), the queries loaded as runs of 16 dims and put
in column order by a register permutation, the output stored 16 bytes at a time: 0.2360 -> 0.1877 ms at 64 x 5 H = 16
(1.26x), 1.16x at H = 12, 1.25x at 64 x 8, 1.44x at 16 tokens, 1.03x at 64 x 1; 1.66x FlashMLA's padded time on the
same tokens as fp8_ds_mla.

One program = (one split of the slot list, one token), heads padded to 16; ``splits > 1`` writes fp32 partials that
:func:`.lse_combine.lse_combine` merges in split order (a fixed slot count a split: a row's result does not depend on
the batch). Gluon has no interpreter: a CPU machine compiles the kernel for sm_90 with Triton 3.6 (``python -m
dsahal.backends.nvidia.aot --only "nvfp4"``); its results are checked on the H200 against the float64 reference
(``scripts/h200/wgmma_fp4_check.py``) and by the conformance suite through the route.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from dsahal.kernel_launch import wrap_launched

from .indexer_gluon import _view
from .sparse_mla import LOG2E
from .partials import bounded_partials
from .sparse_mla_gluon import _as_f16, _rows, head_group, launch_over_tokens, records_refusal, unserved
from .sparse_mla_small_heads_raw import check_launch, programs_per_group, unit_stride_and_outputs
from .sparse_mla_wgmma import (_QUERY, _logit_layout, _query_runs, _row_scale16, _runs_amax,
                               mark_unused_parts, online_softmax, piece, program_steps, softmax_totals)

_async_copy = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

RECORD = 352  # bytes a record: codes [0, 256), RoPE e4m3 [256, 320), scales e4m3 [320, 352)
SIZE_ARGS = ("H", "K", "num_slots", "block_tokens", "split_size", "tokens", "parts")
HEAD_GROUP = 16  # a program's heads (a call of more runs a program a group of 16)
DEFAULT_STAGES, DEFAULT_SPLIT_SIZE = 3, 1024
TILE = gl.constexpr(64)  # slots a step: the logit wgmma's M
BLOCK_H = gl.constexpr(16)
SCALE_UP = gl.constexpr(128.0)  # the scales times 2^7 in fp16 (448 · 2^7 < 65504): decoded values are 2 · code · σ


# A stage's codes sit 256 bytes a slot, the 16-byte piece p of slot R at piece p ^ g(R), g(R) = (R & 6) ^ ((R & 1) << 2):
# the logit read (slots R and R + 1 a load phase, a lane's 4 consecutive pieces) and the value read (slots R, R + 2,
# R + 4, R + 6, two pieces each) then each hit 32 distinct banks. The three views below are that one placement seen
# with different indices (offset bit -> index; a slot's bit 0 flips piece bit 2, bit 1 piece bit 1, bit 2 piece bit 2).


@gluon.constexpr_function
def _logit_view_layout():
    """The codes of a stage as u8 ``[8 h, 64 R, 4 c, 2 g0, 4 e]``: byte ``e`` of word ``g0 + 2 g1`` of the 16-byte piece
    ``c`` of tile ``t`` (128 dims, 64 bytes) of slot ``R``, ``h = g1 + 2 t`` (a tile's half: 64 dims)."""
    return gl.SharedLinearLayout([
        [0, 0, 0, 0, 1], [0, 0, 0, 0, 2],  # offset bits 0-1: e
        [0, 0, 0, 1, 0], [1, 0, 0, 0, 0],  # 2: g0, 3: g1
        [0, 0, 1, 0, 0], [0, 0, 2, 0, 0],  # 4-5: piece bits 0-1 (c)
        [2, 0, 0, 0, 0], [4, 0, 0, 0, 0],  # 6-7: piece bits 2-3 (t)
        [2, 1, 0, 0, 0],  # 8: slot 1 (its pieces XOR 4: t + 1)
        [0, 2, 2, 0, 0],  # 9: slot 2 (XOR 2: c + 2)
        [2, 4, 0, 0, 0],  # 10: slot 4 (XOR 4)
        [0, 8, 0, 0, 0], [0, 16, 0, 0, 0], [0, 32, 0, 0, 0]])


@gluon.constexpr_function
def _value_view_layout():
    """The codes of a stage as u8 ``[64 R, 4 w, 8 r, 8 e]``: byte ``e`` of the 8 holding dims ``16 r .. 16 r + 15`` of
    tile ``w`` (its scale block ``r``) of slot ``R`` (the same swizzle)."""
    return gl.SharedLinearLayout([
        [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4],  # offset bits 0-2: e
        [0, 0, 1, 0],  # 3: r bit 0
        [0, 0, 2, 0], [0, 0, 4, 0],  # 4-5: piece bits 0-1 (r bits 1-2)
        [0, 1, 0, 0], [0, 2, 0, 0],  # 6-7: piece bits 2-3 (w)
        [1, 1, 0, 0],  # 8: slot 1 (pieces XOR 4: w + 1)
        [2, 0, 4, 0],  # 9: slot 2 (XOR 2: r + 4)
        [4, 1, 0, 0],  # 10: slot 4 (XOR 4)
        [8, 0, 0, 0], [16, 0, 0, 0], [32, 0, 0, 0]])


@gluon.constexpr_function
def _copy_view_layout():
    """The codes of a stage as the copies write them: u8 ``[64 R, 256]`` (the same swizzle)."""
    return gl.SharedLinearLayout([
        [0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [0, 32], [0, 64], [0, 128],
        [1, 64], [2, 32], [4, 64], [8, 0], [16, 0], [32, 0]])


# a stage's scales, 32 bytes a slot (row-major): for the logits u8 [64 R, 4 c, 8 h] (block 8 t + 2 c + g1 for
# h = g1 + 2 t), for the values u8 [64 R, 4 w, 8 r] (block 8 w + r)
_LOGIT_SCALES = gl.constexpr(gl.SharedLinearLayout([
    [0, 0, 1], [0, 1, 0], [0, 2, 0], [0, 0, 2], [0, 0, 4],
    [1, 0, 0], [2, 0, 0], [4, 0, 0], [8, 0, 0], [16, 0, 0], [32, 0, 0]]))
_VALUE_SCALES = gl.constexpr(gl.SharedLinearLayout([
    [0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 1, 0], [0, 2, 0],
    [1, 0, 0], [2, 0, 0], [4, 0, 0], [8, 0, 0], [16, 0, 0], [32, 0, 0]]))
# a stage's RoPE values, 64 bytes a slot (row-major), as u8 [64 R, 4 c, 16 b]
_ROPE_VIEW = gl.constexpr(gl.SharedLinearLayout([
    [0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 1, 0], [0, 2, 0],
    [1, 0, 0], [2, 0, 0], [4, 0, 0], [8, 0, 0], [16, 0, 0], [32, 0, 0]]))
# a stage's rows as copied (the [STAGES, 64, n] buffers, and a stage's [64, n]): row-major, unswizzled
_ROW_MAJOR = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
_P = gl.constexpr(gl.SwizzledSharedLayout(vec=8, per_phase=4, max_phase=2, order=[1, 0]))  # [64 slots, 16 heads]
_Q = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))  # [16 heads, 64] fp16

# register layouts: a warp's 16 slots (lanes r and the row + 8 register) as the wgmma's A rows, lane c = lane % 4
_LOGIT_CODES = gl.constexpr(gl.DistributedLinearLayout(  # u8 [64 R, 4 c, 2 g0, 4 e]: a lane's 8 bytes a slot
    reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 1, 0], [8, 0, 0, 0]],
    lane_bases=[[0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
    warp_bases=[[16, 0, 0, 0], [32, 0, 0, 0]], block_bases=[], shape=[64, 4, 2, 4]))
_LOGIT_LOAD = gl.constexpr(gl.DistributedLinearLayout(  # the same as loaded from a half's view u8 [1, 64, 4, 2, 4]
    reg_bases=[[0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 8, 0, 0, 0]],
    lane_bases=[[0, 0, 1, 0, 0], [0, 0, 2, 0, 0], [0, 1, 0, 0, 0], [0, 2, 0, 0, 0], [0, 4, 0, 0, 0]],
    warp_bases=[[0, 16, 0, 0, 0], [0, 32, 0, 0, 0]], block_bases=[], shape=[1, 64, 4, 2, 4]))
_LOGIT_SCALE_LOAD = gl.constexpr(gl.DistributedLinearLayout(  # a step's logit scales u8 [64 R, 4 c, 8 h]
    reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [8, 0, 0]],
    lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
    warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 4, 8]))
_ROPE_CODES = gl.constexpr(gl.DistributedLinearLayout(  # u8 [64 R, 4 c, 16 b]: a lane's 16 bytes a slot
    reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [8, 0, 0]],
    lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
    warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 4, 16]))
# the value operand's bytes u8 [16 slots, 4 w, 8 r, 8 e] of a 16-slot chunk: mma.sync's B fragment gives lane (r, c)
# the slots 2c, 2c + 1, 2c + 8, 2c + 9; loaded a slot's 8 bytes at a time, decoded with the slot pairs first
_VALUE_LOAD = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4], [1, 0, 0, 0], [8, 0, 0, 0]],
    lane_bases=[[2, 0, 0, 0], [4, 0, 0, 0], [0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 4, 0]],
    warp_bases=[[0, 1, 0, 0], [0, 2, 0, 0]], block_bases=[], shape=[16, 4, 8, 8]))
_VALUE_CODES = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4], [8, 0, 0, 0]],
    lane_bases=[[2, 0, 0, 0], [4, 0, 0, 0], [0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 4, 0]],
    warp_bases=[[0, 1, 0, 0], [0, 2, 0, 0]], block_bases=[], shape=[16, 4, 8, 8]))

# copies: 16-byte pieces, each instruction a warp covering whole records' parts (2 slots' codes, 8 slots' RoPE values,
# 16 slots' scales), each thread's slots consecutive (8, 2, 1), so a step's slot indices load as whole words (where the
# split starts at a multiple of 64 slots: ALIGNED) instead of one 4-byte load a slot (thirty-seventh session)
_CODES_COPY = gl.constexpr(gl.BlockedLayout([8, 16], [2, 16], [4, 1], [1, 0]))  # [64, 256]
_ROPE_COPY = gl.constexpr(gl.BlockedLayout([2, 16], [8, 4], [4, 1], [1, 0]))  # [64, 64]
_SCALE_COPY = gl.constexpr(gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0]))  # [64, 32]
# Register permutations (reshape, permute, reshape: no data moves) into the logit MMAs' column orders, applied alike
# to the decoded codes and to the queries (their columns must meet): [rows, 4 c, 2 g0, 2 e1, 2 e0, 2 a] (a half's 16
# consecutive dims j = a + 2 e0 + 4 e1 + 8 g0 of each 32-dim piece c) into logit_dim's k = e0 + 2 c + 8 e1 + 16 a + 32
# g0; [rows, 4 c, 2 b3, 2 b2, 2 b1, 2 b0] (RoPE dim 16 c + b) into rope_dim's k = b0 + 2 c + 8 b1 + 16 b2 + 32 b3. And
# the output's [16 heads, 8 e, 2 a, 4 w, 8 r] (column n = r + 8 w + 32 a + 64 e) into dim order 128 w + 16 r + 2 e + a
# (value_dim).
_TO_LOGIT_COLUMNS = gl.constexpr((0, 2, 5, 3, 1, 4))
_TO_ROPE_COLUMNS = gl.constexpr((0, 2, 3, 4, 1, 5))
_COLUMNS_TO_DIMS = gl.constexpr((0, 3, 4, 1, 2))
# The output [16 heads, 512 dims] as the value MMA's accumulator holds it once its columns are un-permuted (column n =
# r + 8 w + 32 a + 64 e is dim 128 w + 16 r + 2 e + a: value_dim), the registers ordered so each thread's 16
# consecutive dims come first. mma.sync's accumulator (warps along N) gives lane l the columns 2 (l % 4) + {0, 1} of
# each 8-column n-tile at rows l // 4 and l // 4 + 8, warp w the n-tiles 4 j + w: column bits 1-2 the lane's, 3-4 the
# warp's, bit 0 and 5-8 registers.
_OUT = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [8, 0]],
    lane_bases=[[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[0, 128], [0, 256]], block_bases=[], shape=[16, 512]))


@gluon.constexpr_function
def _pv_layout():
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])


def logit_dim(t, g1, k):
    """The nope dim that column ``k`` (0..63) of the logit MMA of tile ``t``'s half ``g1`` reads: ``k = e0 + 2 c + 8 e1
    + 16 a + 32 g0`` is nibble ``a`` of byte ``e0 + 2 e1`` of word ``g0 + 2 g1`` of piece ``c``."""
    c = (k >> 1) & 3
    byte = (k & 1) + 2 * ((k >> 3) & 1)
    word = ((k >> 5) & 1) + 2 * g1
    return 128 * t + 32 * c + 8 * word + 2 * byte + ((k >> 4) & 1)


def rope_dim(k):
    """The RoPE dim (0..63) that column ``k`` of the RoPE MMA reads: ``k = b0 + 2 c + 8 (b >> 1)`` is byte ``b`` of
    piece ``c``."""
    return 16 * ((k >> 1) & 3) + (k & 1) + 2 * (k >> 3)


def value_dim(n):
    """The nope dim that value column ``n`` (0..511) holds: ``n = r + 8 w + 32 a + 64 e`` is nibble ``a`` of byte ``e``
    of the 8 bytes of tile ``w``'s scale block ``r``."""
    r = n & 7
    w = (n >> 3) & 3
    return 128 * w + 16 * r + 2 * (n >> 6) + ((n >> 5) & 1)


@gluon.jit
def _decode(codes, scales):
    """e2m1 codes -> fp16 ``2 · code · σ``, exactly: ``codes`` u8 (two codes a byte), ``scales`` fp16 ``σ · 2^7`` (the
    first two of each four elements used for all four bytes: a pair of elements shares its bytes' scale pair) ->
    (low nibbles, high nibbles), fp16 each, element for element. A byte's codes shifted into e4m3 bytes are their
    values times 2^-6; ``cvt.rn.f16x2.e4m3x2`` widens two, ``mul.f16x2`` applies the scales."""
    return gl.inline_asm_elementwise(
        "{\n\t.reg .b32 a, b, l, h;\n\t.reg .b16 l0, l1, h0, h1;"
        "\n\tshl.b32 a, $4, 2;\n\tand.b32 a, a, 0x1C1C1C1C;\n\tshl.b32 b, $4, 4;\n\tand.b32 b, b, 0x80808080;"
        "\n\tor.b32 l, a, b;"
        "\n\tshr.b32 a, $4, 2;\n\tand.b32 a, a, 0x1C1C1C1C;\n\tand.b32 b, $4, 0x80808080;\n\tor.b32 h, a, b;"
        "\n\tmov.b32 {l0, l1}, l;\n\tmov.b32 {h0, h1}, h;"
        "\n\tcvt.rn.f16x2.e4m3x2 $0, l0;\n\tcvt.rn.f16x2.e4m3x2 $1, l1;"
        "\n\tcvt.rn.f16x2.e4m3x2 $2, h0;\n\tcvt.rn.f16x2.e4m3x2 $3, h1;"
        "\n\tmul.rn.f16x2 $0, $0, $5;\n\tmul.rn.f16x2 $1, $1, $5;"
        "\n\tmul.rn.f16x2 $2, $2, $5;\n\tmul.rn.f16x2 $3, $3, $5;\n\t}",
        "=r,=r,=r,=r,r,r,r", [codes, scales], dtype=(gl.float16, gl.float16), is_pure=True, pack=4)


@gluon.jit
def _scales16(byte_scales):
    """e4m3 scale bytes -> fp16 ``σ · 2^7`` (exact; NaN stays NaN)."""
    return byte_scales.to(gl.float8e4nv, bitcast=True).to(gl.float16) * SCALE_UP


@gluon.jit
def _logit_scales(scales_v):
    """A stage's scales for the logit operands: fp16 ``σ · 2^7``, one ``[64 R, 4 c]`` tensor per half ``h = 0..7``
    (block ``8 t + 2 c + g1`` for ``h = g1 + 2 t``), each in the slice layout :func:`_logit_operand` broadcasts."""
    s = _scales16(scales_v.load(_LOGIT_SCALE_LOAD))  # [64 R, 4 c, 8 h]
    s = gl.reshape(s, [TILE, 4, 2, 2, 2])  # R, c, t1, t0, g1
    e, o = gl.split(s)  # g1 = 0 / 1: [64, 4, 2, 2]
    e0, e1 = gl.split(gl.reshape(e, [TILE, 4, 2, 2]))  # (t0)
    o0, o1 = gl.split(gl.reshape(o, [TILE, 4, 2, 2]))
    e00, e10 = gl.split(e0)  # (t1)
    e01, e11 = gl.split(e1)
    o00, o10 = gl.split(o0)
    o01, o11 = gl.split(o1)
    L: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, _LOGIT_CODES))
    return (gl.convert_layout(e00, L, assert_trivial=True), gl.convert_layout(o00, L, assert_trivial=True),
            gl.convert_layout(e01, L, assert_trivial=True), gl.convert_layout(o01, L, assert_trivial=True),
            gl.convert_layout(e10, L, assert_trivial=True), gl.convert_layout(o10, L, assert_trivial=True),
            gl.convert_layout(e11, L, assert_trivial=True), gl.convert_layout(o11, L, assert_trivial=True))


@gluon.jit
def _logit_operand(codes_v, s, h: gl.constexpr, DOT_A: gl.constexpr):
    """Half ``h`` (``g1 + 2 t``) of a stage's codes (64 dims of 64 slots; ``s`` its scales, :func:`_logit_scales`) as
    the logit wgmma's register A operand (fp16 ``[64, 64]``, columns in :func:`logit_dim` order)."""
    x = gl.reshape(codes_v.slice(h, 1, dim=0).load(_LOGIT_LOAD), [TILE, 4, 2, 4])  # u8 [64 R, 4 c, 2 g0, 4 e]
    lo, hi = _decode(gl.convert_layout(x, _LOGIT_CODES, assert_trivial=True), s[:, :, None, None])
    v = gl.reshape(gl.join(lo, hi), [TILE, 4, 2, 2, 2, 2])  # R, c, g0, e1, e0, a
    v = gl.reshape(gl.permute(v, _TO_LOGIT_COLUMNS.value), [TILE, 64])  # k = e0 + 2 c + 8 e1 + 16 a + 32 g0
    return gl.convert_layout(v, DOT_A, assert_trivial=True)


@gluon.jit
def _rope_operand(rope_v, DOT_A: gl.constexpr):
    """A stage's RoPE values (e4m3, 64 a slot) as the RoPE wgmma's register A operand (fp16 ``[64, 64]``, exact,
    columns in :func:`rope_dim` order)."""
    x = _as_f16(rope_v.load(_ROPE_CODES).to(gl.float8e4nv, bitcast=True))  # [64 R, 4 c, 16 b]
    v = gl.reshape(x, [TILE, 4, 2, 2, 2, 2])  # R, c, b3, b2, b1, b0
    v = gl.reshape(gl.permute(v, _TO_ROPE_COLUMNS.value), [TILE, 64])  # k = b0 + 2 c + 8 b1 + 16 b2 + 32 b3
    return gl.convert_layout(v, DOT_A, assert_trivial=True)


@gluon.jit
def _value_operand(values_v, vscales_v, kk: gl.constexpr, DOT_B: gl.constexpr):
    """Slots ``16 kk .. 16 kk + 15`` of a stage as the value MMA's B operand (fp16 ``[16, 512]``, columns in
    :func:`value_dim` order)."""
    x = gl.convert_layout(values_v.slice(16 * kk, 16, dim=0).load(_VALUE_LOAD), _VALUE_CODES, assert_trivial=True)
    s = vscales_v.slice(16 * kk, 16, dim=0).load(gl.SliceLayout(3, _VALUE_CODES))  # [16 slots, 4 w, 8 r]
    lo, hi = _decode(x, _scales16(s)[:, :, :, None])
    v = gl.permute(gl.join(lo, hi), (0, 3, 4, 1, 2))  # [16 slots, 8 e, 2 a, 4 w, 8 r]
    return gl.convert_layout(gl.reshape(v, [16, 512]), DOT_B, assert_trivial=True)


@gluon.jit
def _copy_slots(slot_row, n0, end):
    """Slots ``n0 .. n0 + 64`` of the token's list (-1 past the split's end) as the three copies of :func:`_issue` hold
    them (loaded a step before they are issued: the copies never wait on the load of their slot indices): unmasked
    (16-byte words where ``n0`` is known a multiple of 64, ``ALIGNED``) unless the split ends inside the step. One
    branch for the three (not :func:`.sparse_mla_wgmma._slot_rows` three times: under the 168-register cap three
    branches spilled 40 bytes, one 16)."""
    n_c = n0 + gl.arange(0, TILE, gl.SliceLayout(1, _CODES_COPY))
    n_r = n0 + gl.arange(0, TILE, gl.SliceLayout(1, _ROPE_COPY))
    n_s = n0 + gl.arange(0, TILE, gl.SliceLayout(1, _SCALE_COPY))
    if n0 + TILE <= end:
        c = gl.load(slot_row + n_c)
        r = gl.load(slot_row + n_r)
        s = gl.load(slot_row + n_s)
    else:
        c = gl.load(slot_row + n_c, mask=n_c < end, other=-1)
        r = gl.load(slot_row + n_r, mask=n_r < end, other=-1)
        s = gl.load(slot_row + n_s, mask=n_s < end, other=-1)
    return c, r, s


@gluon.jit
def _issue(pages_u8, slots_c, slots_r, slots_s, num_slots, s8_b, s8_t, block_tokens, codes, rope, scales,
           FLAT: gl.constexpr, OFF32: gl.constexpr):
    """Start the copies of one step's records into one stage: ``codes [64, 256]`` (swizzled), ``rope [64, 64]``,
    ``scales [64, 32]`` u8; skipped slots zero-filled."""
    row, ok = _rows(slots_c, num_slots, s8_b, s8_t, block_tokens, FLAT, OFF32)
    byte = gl.arange(0, 256, gl.SliceLayout(0, _CODES_COPY))
    _async_copy(codes, pages_u8 + row[:, None] + byte[None, :], mask=ok[:, None])
    row_r, ok_r = _rows(slots_r, num_slots, s8_b, s8_t, block_tokens, FLAT, OFF32)
    byte_r = gl.arange(0, 64, gl.SliceLayout(0, _ROPE_COPY))
    _async_copy(rope, pages_u8 + row_r[:, None] + 256 + byte_r[None, :], mask=ok_r[:, None])
    row_s, ok_s = _rows(slots_s, num_slots, s8_b, s8_t, block_tokens, FLAT, OFF32)
    byte_s = gl.arange(0, 32, gl.SliceLayout(0, _SCALE_COPY))
    _async_copy(scales, pages_u8 + row_s[:, None] + 320 + byte_s[None, :], mask=ok_s[:, None])


@gluon.jit
def _store_half(x, up, dst):
    """The query dims of one half of a tile (``x`` bf16 ``[16, 4 c, 16 j]``, dim ``32 c + j`` past the half's start,
    :func:`_query_runs`) in :func:`logit_dim`'s column order times ``up``, fp16 ``[16, 64]``: ``j = a + 2 e0 + 4 e1 + 8
    g0`` is column ``e0 + 2 c + 8 e1 + 16 a + 32 g0`` (a register permutation)."""
    v = gl.reshape(x.to(gl.float32) * up[:, None, None], [BLOCK_H, 4, 2, 2, 2, 2])  # h, c, g0, e1, e0, a
    dst.store(gl.reshape(gl.permute(v, _TO_LOGIT_COLUMNS.value), [BLOCK_H, 64]).to(gl.float16))


@gluon.jit
def _rope_columns(x):
    """The RoPE query dims (``x`` ``[16, 4 c, 16 b]``, dim ``16 c + b``) in :func:`rope_dim`'s column order
    (``[16, 64]``, as :func:`_rope_operand` puts the codes)."""
    return gl.reshape(gl.permute(gl.reshape(x, [BLOCK_H, 4, 2, 2, 2, 2]), _TO_ROPE_COLUMNS.value), [BLOCK_H, 64])


@gluon.jit
def _queries(q_ptr, stride_qt, stride_qh, t, H, q_s, q_rope_s, logit_scale):
    """Row ``t``'s queries into ``q_s`` / ``q_rope_s``: each head scaled by a power of two over its 576 dims into fp16
    (its largest in [2^13, 2^14)), the RoPE part twice that (the decoded values are 2 · code · σ, the RoPE ones
    exact); loaded as runs of consecutive dims, put in the MMAs' column orders by register permutations. Returns the
    logits' factor a head (``[16]``, NaN for a head holding Inf or NaN). The caller has every warp past its previous
    MMA on the buffers."""
    qh = gl.arange(0, BLOCK_H, gl.SliceLayout(1, gl.SliceLayout(2, _QUERY)))
    q_rows = q_ptr + t * stride_qt + qh[:, None, None] * stride_qh
    head_ok = (qh < H)[:, None, None]
    halves = ()
    for h in gl.static_range(8):  # half h = g1 + 2 t of tile t: dims 128 t + 16 g1 + 32 c + j
        halves = halves + (_query_runs(q_rows, head_ok, 128 * (h // 2) + 16 * (h % 2), 32),)
    q_rope = _query_runs(q_rows, head_ok, 512, 16)
    amax = _runs_amax(q_rope)
    for h in gl.static_range(8):
        amax = gl.maximum(amax, _runs_amax(halves[h]))
    up, down = _row_scale16(amax)
    up = gl.convert_layout(up, gl.SliceLayout(1, gl.SliceLayout(2, _QUERY)))
    for h in gl.static_range(8):
        _store_half(halves[h], up, q_s.index(h))
    q_rope_s.store(_rope_columns((q_rope.to(gl.float32) * (2.0 * up)[:, None, None]).to(gl.float16)))
    fence_async_shared()  # the queries' stores, before the first wgmma reads them (after the next barrier)
    # (/ 2: the decoded values' 2)
    return gl.convert_layout(down * (logit_scale * 0.5), gl.SliceLayout(0, _logit_layout()))


@gluon.jit
def _here(slot_row, n0, end):
    """Slots ``n0 .. n0 + 64`` of a row's list as the logits' rows (-1 from ``end`` on): a step's mask."""
    here_n = n0 + gl.arange(0, TILE, gl.SliceLayout(1, _logit_layout()))
    return gl.load(slot_row + here_n, mask=here_n < end, other=-1)


@gluon.jit
def _stage_views(codes_s, rope_s, scale_s, j):
    """Stage ``j``'s buffers as :func:`_issue` writes them."""
    return (_view(codes_s.index(j), gl.uint8, [64, 256], _copy_view_layout()),
            _view(rope_s.index(j), gl.uint8, [64, 64], _ROW_MAJOR),
            _view(scale_s.index(j), gl.uint8, [64, 32], _ROW_MAJOR))


@gluon.jit
def _step(i, issue_ahead, ahead_c, ahead_r, ahead_s, next_row, next_n0, next_end, here, here_row, here_n0, here_end,
          pages_u8, s8_b, s8_t, num_slots, block_tokens, head_scale, m_i, l_acc, acc, codes_s, rope_s, scale_s, p_s,
          q_s, q_rope_s, STAGES: gl.constexpr, FLAT: gl.constexpr, OFF32: gl.constexpr, IN_FLIGHT: gl.constexpr):
    """One 64-slot step, as the fp8_ds_mla kernel's ``_step``, on NVFP4 records. Returns ``(ahead_c, ahead_r,
    ahead_s, here, m_i, l_acc, acc)``."""
    W: gl.constexpr = _logit_layout()  # the logit accumulator [64 slots, 16 heads]
    DOT_Q: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=W, k_width=2)
    PV: gl.constexpr = _pv_layout()  # the value accumulator [16 heads, 512]
    DOT_P: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=PV, k_width=2)
    DOT_V: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=PV, k_width=2)
    PV_HEADS: gl.constexpr = gl.SliceLayout(1, PV)
    zeros = gl.zeros([TILE, BLOCK_H], gl.float32, W)  # (the RoPE MMA's unread accumulator)
    stage = i % STAGES
    async_copy.wait_group(STAGES - 2)  # this thread's copies of step i have landed
    _barrier()  # everyone's have; every warp is done with step i - 1's stage and P
    if issue_ahead:
        codes_n, rope_n, scale_n = _stage_views(codes_s, rope_s, scale_s, (i + STAGES - 1) % STAGES)
        _issue(pages_u8, ahead_c, ahead_r, ahead_s, num_slots, s8_b, s8_t, block_tokens, codes_n, rope_n, scale_n,
               FLAT, OFF32)
    async_copy.commit_group()
    ahead_c, ahead_r, ahead_s = _copy_slots(next_row, next_n0, next_end)
    valid = (here >= 0) & (here < num_slots)
    here = _here(here_row, here_n0, here_end)

    codes_flat = codes_s.index(stage)
    codes_v = _view(codes_flat, gl.uint8, [8, 64, 4, 2, 4], _logit_view_layout())
    hs = _logit_scales(_view(scale_s.index(stage), gl.uint8, [64, 4, 8], _LOGIT_SCALES))
    s_acc = warpgroup_mma(_rope_operand(_view(rope_s.index(stage), gl.uint8, [64, 4, 16], _ROPE_VIEW), DOT_Q),
                          q_rope_s.permute((1, 0)), zeros, use_acc=False, is_async=True)
    for c in gl.static_range(8):
        a = _logit_operand(codes_v, hs[c], c, DOT_Q)  # (decoded while the previous MMA runs)
        s_acc = warpgroup_mma_wait(IN_FLIGHT - 1, deps=[s_acc])  # (the earlier ones' register operands free)
        s_acc = warpgroup_mma(a, q_s.index(c).permute((1, 0)), s_acc, is_async=True)
    s_acc = warpgroup_mma_wait(0, deps=[s_acc])
    s = s_acc * head_scale[None, :]
    s = gl.where(valid[:, None], s, float("-inf"))

    p, alpha, m_i, l_acc = online_softmax(s, m_i, l_acc)
    p_s.store(p.to(gl.float16))
    acc = acc * gl.convert_layout(alpha, PV_HEADS)[:, None]
    _barrier()  # every warp's P stored

    values_v = _view(codes_flat, gl.uint8, [64, 4, 8, 8], _value_view_layout())
    vscales_v = _view(scale_s.index(stage), gl.uint8, [64, 4, 8], _VALUE_SCALES)
    for kk in gl.static_range(4):  # 16 slots at a time: the B operand's registers
        pa = p_s.slice(16 * kk, 16, dim=0).permute((1, 0)).load(DOT_P)  # [16 heads, 16 slots]
        acc = mma_v2(pa, _value_operand(values_v, vscales_v, kk, DOT_V), acc)
    return ahead_c, ahead_r, ahead_s, here, m_i, l_acc, acc


@gluon.jit
def _store_piece(acc, l_acc, m_i, o_ptr, stride_os, stride_ot, stride_oh, lse_ptr, stride_ls, stride_lt, H, parts, t,
                 part, row_ends, BALANCED: gl.constexpr):
    """A piece's result as part ``part`` of row ``t`` (the fp32 partial, or with one part the final bf16 row) and its
    lse; on the balanced schedule the row's last piece (``row_ends``) marks its unused parts ``lse = -inf``."""
    PV_HEADS: gl.constexpr = gl.SliceLayout(1, _pv_layout())
    HEADS: gl.constexpr = gl.SliceLayout(0, _logit_layout())
    lse, half_inv_l = softmax_totals(l_acc, m_i, 0.5)  # (0.5: the decoded values' 2)
    norm = gl.convert_layout(half_inv_l, PV_HEADS)
    out = acc * norm[:, None]
    # the columns un-permuted in registers (n = r + 8 w + 32 a + 64 e holds dim 128 w + 16 r + 2 e + a: value_dim), so
    # each thread's values are runs of 16 consecutive dims: 16-byte stores
    out = gl.reshape(gl.permute(gl.reshape(out, [BLOCK_H, 8, 2, 4, 8]), _COLUMNS_TO_DIMS.value), [BLOCK_H, 512])
    out = gl.convert_layout(out, _OUT)  # (the same registers in another order: no data moves)
    oh = gl.arange(0, BLOCK_H, gl.SliceLayout(1, _OUT))
    od = gl.arange(0, 512, gl.SliceLayout(0, _OUT))
    o_rows = o_ptr + part.to(gl.int64) * stride_os + t * stride_ot + oh[:, None] * stride_oh
    gl.store(o_rows + od[None, :], out.to(o_ptr.dtype.element_ty), mask=(oh < H)[:, None])
    lh = gl.arange(0, BLOCK_H, HEADS)
    gl.store(lse_ptr + part * stride_ls + t * stride_lt + lh, lse, mask=lh < H)
    if BALANCED and row_ends:  # the row's last piece
        mark_unused_parts(lse_ptr + t * stride_lt + lh, stride_ls, part, parts, lh < H)


@gluon.jit
def _fresh_state():
    """A piece's starting softmax state: ``(m_i [16] -inf, l_acc [64, 16] 0, acc [16, 512] 0)``."""
    W: gl.constexpr = _logit_layout()
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(0, W))
    l_acc = gl.zeros([TILE, BLOCK_H], gl.float32, W)  # per-thread partial sums of p, summed at the end
    return m_i, l_acc, gl.zeros([BLOCK_H, 512], gl.float32, _pv_layout())


@gluon.jit
def _reduce_split(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, s8_t, slots_ptr, stride_st, o_ptr, stride_os,
                  stride_ot, stride_oh, lse_ptr, stride_ls, stride_lt, H, K, num_slots, block_tokens, parts,
                  logit_scale, t, start, end, part, codes_s, rope_s, scale_s, p_s, q_s, q_rope_s,
                  STAGES: gl.constexpr, FLAT: gl.constexpr, OFF32: gl.constexpr, IN_FLIGHT: gl.constexpr,
                  ALIGNED: gl.constexpr, BALANCED: gl.constexpr):
    """Row ``t``'s slots ``start .. end`` (a split, or a piece run on its own), as the fp8_ds_mla kernel's
    ``_reduce_split``."""
    slot_row = slots_ptr + t * stride_st
    if ALIGNED:
        start = gl.multiple_of(start, 64)
    steps = gl.cdiv(end - start, TILE)
    for j in gl.static_range(STAGES - 1):
        if j < steps:
            sc, sr, ss = _copy_slots(slot_row, start + j * TILE, end)
            codes_j, rope_j, scale_j = _stage_views(codes_s, rope_s, scale_s, j)
            _issue(pages_u8, sc, sr, ss, num_slots, s8_b, s8_t, block_tokens, codes_j, rope_j, scale_j, FLAT, OFF32)
        async_copy.commit_group()
    ahead_c, ahead_r, ahead_s = _copy_slots(slot_row, start + (STAGES - 1) * TILE, end)
    here = _here(slot_row, start, end)  # step 0's slots, for its mask
    head_scale = _queries(q_ptr, stride_qt, stride_qh, t, H, q_s, q_rope_s, logit_scale)
    m_i, l_acc, acc = _fresh_state()
    for i in range(steps):
        ahead = i + STAGES - 1
        ahead_c, ahead_r, ahead_s, here, m_i, l_acc, acc = _step(
            i, ahead < steps, ahead_c, ahead_r, ahead_s, slot_row, start + (ahead + 1) * TILE, end, here, slot_row,
            start + (i + 1) * TILE, end, pages_u8, s8_b, s8_t, num_slots, block_tokens, head_scale, m_i, l_acc, acc,
            codes_s, rope_s, scale_s, p_s, q_s, q_rope_s, STAGES, FLAT, OFF32, IN_FLIGHT)
    async_copy.wait_group(0)
    _store_piece(acc, l_acc, m_i, o_ptr, stride_os, stride_ot, stride_oh, lse_ptr, stride_ls, stride_lt, H, parts, t,
                 part, end == K, BALANCED)


@gluon.jit(do_not_specialize=SIZE_ARGS)
def sparse_mla_wgmma_fp4_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 576] bf16
    pages_u8, s8_b, s8_t,  # latent pages [num_blocks, block_tokens, 352] uint8, strides in bytes (multiples of 16)
    slots_ptr, stride_st,  # slots [T, K] int32/int64
    o_ptr, stride_os, stride_ot, stride_oh,  # o [splits, T, H, 512] (fp32 partials or bf16)
    lse_ptr, stride_ls, stride_lt,  # lse [splits, T, H] fp32
    H, K, num_slots, block_tokens, split_size,
    logit_scale,  # softmax_scale · log2(e)
    tokens, parts,  # (the balanced schedule's) this launch's tokens, parts a row (o, lse's first dim)
    STAGES: gl.constexpr,
    FLAT: gl.constexpr,  # record s at byte s * s8_t (blocks back to back)
    OFF32: gl.constexpr,  # every record's byte offset fits int32 (a pool under 2 GiB)
    IN_FLIGHT: gl.constexpr = 1,  # logit MMAs in flight (each holds its decoded operand's 16 registers)
    ALIGNED: gl.constexpr = False,  # every split starts at a multiple of 64 slots (the slot indices' loads vectorised)
    BALANCED: gl.constexpr = False,  # the balanced schedule (.balanced): grid axis 0 its programs, axis 1 one
):
    """Fixed splits or the balanced schedule, as :func:`.sparse_mla_wgmma.sparse_mla_wgmma_kernel`."""
    q_ptr, o_ptr, lse_ptr, H = head_group(q_ptr, stride_qh, o_ptr, stride_oh, lse_ptr, H, BLOCK_H)
    # the first steps' gathers first: the queries' loads and scaling below overlap their flight (as the fp8_ds_mla
    # kernel's, thirty-sixth session)
    codes_s = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 256], _ROW_MAJOR)
    rope_s = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 64], _ROW_MAJOR)
    scale_s = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 32], _ROW_MAJOR)
    p_s = gl.allocate_shared_memory(gl.float16, [TILE, BLOCK_H], _P)
    q_s = gl.allocate_shared_memory(gl.float16, [8, BLOCK_H, 64], _Q)  # the queries, in the MMAs' column orders
    q_rope_s = gl.allocate_shared_memory(gl.float16, [BLOCK_H, 64], _Q)

    if BALANCED:
        g0, g1, S, total = program_steps(tokens, K)
        for t in range(g0 // S, (g1 - 1) // S + 1):
            start, end, part = piece(t, g0, g1, S, total, K)
            _barrier()  # every warp done with the previous piece's stages, P and queries
            _reduce_split(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, s8_t, slots_ptr, stride_st, o_ptr, stride_os,
                          stride_ot, stride_oh, lse_ptr, stride_ls, stride_lt, H, K, num_slots, block_tokens, parts,
                          logit_scale, t.to(gl.int64), start, end, part, codes_s, rope_s, scale_s, p_s, q_s, q_rope_s,
                          STAGES, FLAT, OFF32, IN_FLIGHT, True, True)
    else:
        split = gl.program_id(0)
        start = split * split_size
        if ALIGNED:
            start = gl.multiple_of(start, 64)
        _reduce_split(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, s8_t, slots_ptr, stride_st, o_ptr, stride_os,
                      stride_ot, stride_oh, lse_ptr, stride_ls, stride_lt, H, K, num_slots, block_tokens, parts,
                      logit_scale, gl.program_id(1).to(gl.int64), start, gl.minimum(start + split_size, K), split,
                      codes_s, rope_s, scale_s, p_s, q_s, q_rope_s, STAGES, FLAT, OFF32, IN_FLIGHT, ALIGNED, False)


def refusal(q: torch.Tensor, kv_pages: torch.Tensor, kv_fmt: str, slots: torch.Tensor | None = None) -> str:
    """Why this kernel does not take the call ("" when it does): the Gluon few-heads kernels' shared conditions on
    NVFP4 records (:func:`.sparse_mla_gluon.records_refusal`). The route's verifier reports it; the launcher raises."""
    return records_refusal(q, kv_pages, kv_fmt, slots, "the wgmma NVFP4 kernel", fmt="nvfp4", max_heads=None)


def serves(q: torch.Tensor, kv_pages: torch.Tensor, kv_fmt: str) -> bool:
    """Whether this kernel takes the call (:func:`refusal` has no reason)."""
    return not refusal(q, kv_pages, kv_fmt)


@bounded_partials
def sparse_mla_wgmma_fp4(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, *, stages=DEFAULT_STAGES,
                         split_size=DEFAULT_SPLIT_SIZE, maxnreg=None, in_flight=1, programs=None):
    """Launch :func:`sparse_mla_wgmma_fp4_kernel` (a call :func:`serves` refuses raises, naming what it got).

    Args:
        q: ``[T, H, 576]`` bf16 on a CUDA device, any ``H`` (groups of 16 heads, one program each: every group
            gathers the slots' records again; the L2 serves some of them).
        kv_pages: ``[num_blocks, block_tokens, 352]`` uint8 NVFP4 pages, records 16-byte aligned (any strides that
            keep them so: a view into a packed cache is read in place).
        slots: ``[T, K]`` int32/int64 physical slots; -1 or out of range = skipped.
        kv_fmt: must be ``"nvfp4"``.
        kv_scale: unused by the format (None).
        softmax_scale: float.
        stages: 64-slot steps whose gathers are in flight at once, 2 to 4 (22.5 KB of shared memory each).
        split_size: slots per split, a fixed count (batch invariance); None = one split a token.
        maxnreg: ptxas's register cap (None: its own choice).
        in_flight: logit MMAs in flight while the next 64 dims decode, 1 or 2 (221 / 229 registers at 3 stages).
        programs: the balanced schedule (:mod:`.balanced`; default mode only: its split points follow the batch):
            this many programs in all (as many as run at once; divided among the groups of 16 heads) share the
            call's 64-slot steps (``split_size`` then unused); None: fixed splits.

    Returns:
        ``(o [T, H, 512] bf16, lse [T, H] fp32)``.
    """
    name = "triton sparse_mla_wgmma_fp4"
    why = refusal(q, kv_pages, kv_fmt)
    if why:
        raise unserved(name, q, kv_pages, kv_fmt, why, fmt="nvfp4", max_heads=None)
    tokens, heads, _ = q.shape
    check_launch(name, heads, 64, split_size, max_heads=None)
    if stages not in (2, 3, 4):
        raise ValueError(f"{name}: stages expected 2, 3 or 4, got {stages}")
    if in_flight not in (1, 2):
        raise ValueError(f"{name}: in_flight expected 1 or 2, got {in_flight}")
    programs = programs_per_group(name, programs, heads, HEAD_GROUP)
    k = slots.shape[1]
    q, slots, split_size, splits, o, lse = unit_stride_and_outputs(q, slots, split_size, programs)
    if tokens == 0 or heads == 0:
        return o[0].to(q.dtype), lse[0]
    meta = dict(STAGES=stages, IN_FLIGHT=in_flight, ALIGNED=splits == 1 or split_size % 64 == 0, BALANCED=False,
                num_warps=4,
                **({"maxnreg": maxnreg} if maxnreg else {}))
    return launch_over_tokens(sparse_mla_wgmma_fp4_kernel, q, kv_pages, slots, o, lse, splits,
                              (heads, k, split_size, softmax_scale * LOG2E, tokens, splits), meta, record_bytes=RECORD,
                              head_group=HEAD_GROUP, programs=programs)


wrap_launched(globals())
