"""Few-heads sparse MLA on fp8_ds_mla latents in Gluon, the slots as the logit ``wgmma``'s M side.

Same op and arithmetic contract as :mod:`.sparse_mla_gluon` (``o[t, h] = softmax_s(scale · q[t, h] · kv[s]) ·
kv[s, :512]``, ``lse`` natural log, -1 and out-of-range slots skipped, a row with no valid slot gives ``o = 0``,
``lse = -inf``), for bf16 queries on H200-class GPUs, 16 heads a program (a call of more runs a program a group of
16 heads, each gathering the records again).

Per-tensor FP8 records (``FP8``: 576 e4m3 codes times one fp32 tensor scale, read in the kernel) take the same path:
the 512 value dims as above with every tile scale the tensor scale (``P_c = p``, the output times the scale), the 64
RoPE codes read into registers and widened like the others, against the queries' RoPE dims scaled with the rest
(1.9-2.4x the general Triton kernel; the nvidia route takes them up to 32 heads: ``config.WGMMA_ROUTE_MAX_HEADS``).

Why another layout. FlashMLA computes 64 heads x 64 slots a step; a tensor-parallel slice has 12 or 16 heads, so it
pads them to 64 and does 4-5x the work. Our earlier few-heads kernels put the heads on the MMAs' M side (``mma.sync``
m16), widened every e4m3 code to fp16 in shared memory for both MMAs and summed the four 128-dim parts' logits across
warps: a long dependent chain each step, latency-bound at 0.71x FlashMLA (BENCHMARKS.md, sixteenth session). Here,
as DeepGEMM's indexer does with keys, a step's 64 gathered slots are the M side of Hopper's ``wgmma``:

- the gather: a step's records (512 code bytes, 4 tile scales, 64 RoPE values each) copied by 16-byte ``cp.async``
  pieces straight into 128-byte-swizzled shared tiles, ``STAGES - 1`` steps ahead, each instruction a warp covering
  whole records (skipped slots zero-filled; the slot indices loaded a step before their copies, a thread's as whole
  words); the first steps' copies are issued before the queries are loaded and split, so those overlap their flight;
- the logits ``S^T [64 slots, 16 heads]``: each 128-dim tile's codes as two chunks of 64 dims, each read from shared
  memory into registers (a lane's 16 bytes of a slot one 16-byte load, :data:`_CHUNK_BASES`), widened exactly to fp16
  (``cvt.rn.f16x2.e4m3x2``) in the register A layout of an fp16 ``wgmma`` against the queries scaled per head by a
  power of two into fp16 (both in one permuted column order, :func:`logit_dim`), the chunk read while the MMA before
  it runs; the tile's two chunks sum into its accumulator, scaled by its per-slot scale ``σ[s, c]`` (a row of the
  accumulator is a slot: one multiply); the 64 RoPE dims one bf16 ``wgmma``. Until the thirty-seventh session these
  were FP8 MMAs on the codes as copied, against the queries split into e4m3 hi + lo parts: Hopper's FP8 MMAs
  accumulate at reduced precision (a logit off by about 2^-13 of its products' magnitudes), and rows whose logits
  reach thousands with near-tied maxima got softmax weights far from the reference's (a batch-invariant conformance
  example: o off by 3.6e-2, the bound 1.56e-2); fp16 MMAs accumulate in full fp32;
- the online softmax over the 64 rows of a step (one cross-warp maximum a step), ``P_c = p · σ_c / M_c`` per tile
  stored as fp16 ``[4, 64, 16]``, ``M_c`` the largest tile-c scale of the split's slots so far (a running maximum: each
  warp reduces the step's scales from shared memory by itself, :func:`_step_scale_maxima`; when it rises the tile's
  accumulated values take ``M_old / M_new``, :func:`_raise_maximum`, as the softmax's rescale does; the output takes
  ``M_c`` at the end);
- the values: warp ``c`` owns the 128 dims of tile ``c``: ``o_c [16 heads, 128] += P_c^T · V_c`` by ``mma.sync``
  m16n8k16, its B operand (``V_c``, slots x dims) read from the very tile the logit MMA read, through a view
  (:func:`_value_view`) that undoes the swizzle and permutes the dims so each 32-bit shared load holds the 4 dims
  one lane needs for 4 different n-tiles at one slot (bank-conflict free); two slots' words paired byte by byte by two
  ``prmt`` and widened by one ``cvt.rn.f16x2.e4m3x2`` a B register (:func:`_value_operand`, forty-third session: 64
  fewer ``PRMT`` a step a warp than re-pairing the fp16 halves after); the output columns are un-permuted in registers
  (:func:`value_dim`, :data:`_OUT`) and stored 16 bytes at a time;
- the producer (``WS``, the route's launch since the forty-third session): a second warpgroup loads the slot indices
  and issues the copies, handing each stage over by mbarriers (:func:`_ws_produce`, :func:`_ws_consume`), which takes
  about 340 of the step's 1,478 instructions a warp off the computing warpgroup; the same results bit for bit, 1.4%
  faster on the balanced schedule and 4-8% on fixed splits (H100).

Measured (BENCHMARKS.md, 64 x 5 tokens x 2048 slots): on the H200 (twenty-fourth session) 0.266 / 0.245 ms at H = 16 /
12, 1.12x / 1.21x FlashMLA with its heads padded; on an H100 (thirty-sixth session: the split's tile-scale maxima a
running maximum, the work outside the loop from 29% of the warps' stall samples to 12.5%) 0.2331 / 0.2299 ms, 1.34x /
1.36x FlashMLA; with the fp16 logits (thirty-seventh session, same run as the FP8 ones) 0.2406 / 0.2379 ms against
0.2337 / 0.2316 (0.97x), 1.31x / 1.32x FlashMLA. Latency-bound at two programs of four warps a SM (247 registers, 41 KB
stages): the gathers' copies in flight per SM, and now the e4m3 -> fp16 conversions (18.7% of the stall samples).
lse within 1e-6 of the float64 reference (FlashMLA's 2e-6; 2-5e-4 with the FP8 logits), o within 6e-4.

One program = (one split of the slot list, one token), heads padded to 16; ``splits > 1`` writes fp32 partials that
:func:`.lse_combine.lse_combine` merges in split order (a fixed slot count a split: a row's result does not depend
on the batch). Gluon has no interpreter: a CPU machine compiles the kernel for sm_90 with Triton 3.6
(``python -m dsahal.backends.nvidia.aot --only "wgmma"``); its results are checked on the H200 against the float64
reference (``scripts/h200/wgmma_mla_check.py``) and by the conformance suite through the route.
"""
from __future__ import annotations

import functools
import inspect

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mbarrier, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from dsahal.kernel_launch import wrap_launched

from .indexer_gluon import _row_amax, _view, stage_mbarriers
from .sparse_mla import LOG2E
from .partials import bounded_partials
from .sparse_mla_gluon import (RECORD_BYTES, _as_f16, _rows, head_group, launch_over_tokens, records_refusal,
                               unserved)
from .sparse_mla_small_heads_raw import check_launch, programs_per_group, unit_stride_and_outputs

# Triton 3.6 (the H200's) names the copy async_copy_global_to_shared; later releases renamed it async_load
_async_copy = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # (renamed barrier the same way)

SIZE_ARGS = ("H", "K", "num_slots", "block_tokens", "split_size", "tokens", "parts")
# a program's heads: the logit MMA's N side and the value MMA's M side (m16); a call of more heads runs a program a
# group of 16 (each gathering the records again)
HEAD_GROUP = 16
TILE = gl.constexpr(64)  # slots a step: the logit wgmma's M
DEFAULT_STAGES, DEFAULT_SPLIT_SIZE = 2, 1024  # the H200's fastest at 64 x 5 and 64 x 8 tokens (BENCHMARKS.md)
DEFAULT_PRODUCER_REGS = 40  # (ws) the producer warpgroup's registers a thread: the computing one gets 256 - 40
# (H100, forty-third session: 1-3% faster than 32 or 24 at 64 x 5 and 64 x 8)
BLOCK_H = gl.constexpr(16)

# shared layouts: a stage's codes [4 tiles, 64 slots, 128 bytes] (128-byte rows, their 16-byte pieces swizzled by the
# slot: both reads below bank-conflict free) and RoPE values [64, 64] bf16 (the RoPE wgmma's A operand), its tile
# scales [4, 64] fp32; the fp16 P_c [4, 64 slots, 16 heads]
_CODES = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=3))  # [STAGES, 4, 64, 128]
_ROPE = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
_SCALES = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))  # [STAGES, 4, 64]
_SCALE_ROW = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))  # [4 * 64]
# a stage's tile scales [4, 64] whole in every warp, so each warp finds a step's largest per tile by itself (no
# cross-warp exchange): a thread holds 8 consecutive slots of one tile (two 16-byte loads; a quarter warp reads 8
# groups of one tile: no bank conflict), the lanes 8 slot groups x 4 tiles
_SCALES_ALL = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [0, 4]], lane_bases=[[0, 8], [0, 16], [0, 32], [1, 0], [2, 0]],
    warp_bases=[[0, 0], [0, 0]], block_bases=[], shape=[4, 64]))
_P = gl.constexpr(gl.SwizzledSharedLayout(vec=8, per_phase=4, max_phase=2, order=[2, 1, 0]))
_Q = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))  # [16, 64] fp16 / bf16
# (FP8, per-tensor records) the RoPE codes [64 slots, 64] e4m3, row-major (read into registers like the codes)
_ROPE8 = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))

# The logits' A operands: each 128-dim tile's codes as two chunks of 64 dims, read from shared memory into registers
# and widened exactly to fp16 (cvt.rn.f16x2.e4m3x2), then one fp16 wgmma a chunk, accumulated in full fp32 (Hopper's
# FP8 MMAs accumulate at reduced precision: a logit lost about 2^-13 of its products' magnitudes, and rows whose
# logits reach thousands while the largest two are that close got softmax weights far from the reference's:
# o off by 3.6e-2 on a conformance example, H100, thirty-seventh session). Chunk h of tile t holds the 16-byte pieces
# 2 c + h (c = 0..3) of each slot's 128 bytes: a thread (lane % 4 = c) reads its 16 consecutive bytes of a slot in
# one 16-byte load, the two slots of a quarter warp hit pieces of opposite parity (the swizzle XORs the slot into the
# piece index): no bank conflict. The view [8 chunks (2 t + h), 64 slots, 4 c, 16 bytes] of a stage (offset bit ->
# index: bytes 0-3, piece bit 0 the chunk's h, bits 1-2 c; a slot's bits 0-2 flip piece bits 0-2, so they carry the
# chunk's h and c along; tiles 8 KB apart):
_CHUNK_BASES = gl.constexpr([[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4], [0, 0, 0, 8],
                             [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 2, 0],
                             [1, 1, 0, 0], [0, 2, 1, 0], [0, 4, 2, 0], [0, 8, 0, 0], [0, 16, 0, 0], [0, 32, 0, 0],
                             [2, 0, 0, 0], [4, 0, 0, 0]])
# (FP8 records) the RoPE codes [1, 64 slots, 4 c, 16 bytes], row-major: slots 64 bytes apart, so the quarter warp's two
# slots fill the 32 banks
_ROPE8_BASES = gl.constexpr([[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4], [0, 0, 0, 8], [0, 0, 1, 0], [0, 0, 2, 0],
                             [0, 1, 0, 0], [0, 2, 0, 0], [0, 4, 0, 0], [0, 8, 0, 0], [0, 16, 0, 0], [0, 32, 0, 0]])
# A chunk as loaded, u8 [1, 64 slots, 4 c, 16 j]: the fp16 wgmma's register A layout with its columns permuted so
# that a lane's 16 values of a slot are 16 consecutive bytes (the same lanes and warps: lane l the slots l // 4 and
# l // 4 + 8 of its warp's 16, c = l % 4). Column k = e + 2 c + 8 hh + 16 b reads byte j = e + 2 hh + 4 b of piece c
# (logit_dim); the queries are stored through the same permutation.
_CHUNK_LOAD = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4], [0, 0, 0, 8], [0, 8, 0, 0]],
    lane_bases=[[0, 0, 1, 0], [0, 0, 2, 0], [0, 1, 0, 0], [0, 2, 0, 0], [0, 4, 0, 0]],
    warp_bases=[[0, 16, 0, 0], [0, 32, 0, 0]], block_bases=[], shape=[1, 64, 4, 16]))
# [rows, 4 c, 4 b, 2 hh, 2 e] (the 16 bytes j = e + 2 hh + 4 b of piece c) into column order k = e + 2 c + 8 hh + 16 b
_TO_COLUMNS = gl.constexpr((0, 2, 3, 1, 4))

# copies: 16-byte pieces, each instruction a warp covering whole records (a slot's 512 code bytes over the 32 lanes, 4
# slots' RoPE values, 8 slots' 4 scales). A record is 656 bytes, so every other one starts 16 bytes into a 32-byte
# sector: pieces of half rows split those sectors between two instructions, each requesting them from the L2 (H200,
# this session's R1: 1.7-4.4% slower, the same results bit for bit)
# (each thread's slots consecutive, so the slot indices of a step load as whole 16-byte words: thirty-sixth session)
_CODES_COPY = gl.constexpr(gl.BlockedLayout([1, 16, 16], [4, 1, 8], [1, 4, 1], [2, 0, 1]))  # [4, 64, 128] bytes
_ROPE_COPY = gl.constexpr(gl.BlockedLayout([4, 8], [4, 8], [4, 1], [1, 0]))  # [64, 64] bf16
_SCALE_COPY = gl.constexpr(gl.BlockedLayout([1, 2], [4, 8], [1, 4], [0, 1]))  # [4, 64] fp32
_ROPE8_COPY = gl.constexpr(gl.BlockedLayout([2, 16], [8, 4], [4, 1], [1, 0]))  # [64, 64] e4m3 (FP8 records)
# the queries as loaded: [16 heads, 4, 16] runs of 16 consecutive dims (a thread's 8 of them: one 16-byte load)
_QUERY = gl.constexpr(gl.BlockedLayout([1, 1, 8], [4, 4, 2], [4, 1, 1], [2, 1, 0]))

# The value operand. mma.sync's B fragment gives lane (r = lane // 4, c = lane % 4) the columns n = 8 j + r of the
# n-tiles j and the slots 2c, 2c + 1, 2c + 8, 2c + 9 of a 16-slot chunk. Column n = 8 j + r of part (tile) c reads
# dim byte 4 (8 (j // 4) + r) + j % 4 of the tile (value_dim): the 4 n-tiles j = 4i .. 4i + 3 of a lane are 4
# consecutive bytes, one 32-bit load. _LOAD is mma.sync's B layout with those 4 n-tiles as its first registers (the
# same lanes and warps hold the same elements: the conversion to the B layout only re-pairs 16-bit halves).
_LOAD = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 8], [0, 0, 16], [0, 1, 0], [0, 8, 0], [0, 0, 32], [0, 0, 64]],
    lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]],
    warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[4, 16, 128]))
# The codes of a stage seen as [part, slot, n]: offset bit -> index. Bytes 0-1 of a 4-byte word are n + 8, n + 16,
# bytes 2-4 n + 1, 2, 4 (the lane row), bytes 5-6 n + 32, 64; a row is 128 bytes (one slot); the 128-byte swizzle XORs
# a slot's low 3 bits into its 16-byte piece index (byte bits 4-6: n + 4, 32, 64); tiles 8 KB apart.
_VALUE_BASES = gl.constexpr([[0, 0, 8], [0, 0, 16], [0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 32], [0, 0, 64],
                             [0, 1, 4], [0, 2, 32], [0, 4, 64], [0, 8, 0], [0, 16, 0], [0, 32, 0],
                             [1, 0, 0], [2, 0, 0]])
# The output [4 parts, 16 heads, 128 dims] as the value MMA's accumulator holds it once its columns are un-permuted
# (value_dim: column n = 32 a + 8 b + r is dim 32 a + 4 r + b), with the registers ordered so each thread's 8
# consecutive dims come first: two 16-byte stores a run. mma.sync's accumulator gives lane l the columns 2 (l % 4) +
# {0, 1} of each 8-column n-tile at rows l // 4 and l // 4 + 8; the n-tiles are registers, the warps the parts.
_OUT = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 8, 0], [0, 0, 32], [0, 0, 64]],
    lane_bases=[[0, 0, 8], [0, 0, 16], [0, 1, 0], [0, 2, 0], [0, 4, 0]],
    warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[4, 16, 128]))


@gluon.constexpr_function
def _pv_layout():
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1], instr_shape=[1, 16, 8])


@gluon.constexpr_function
def _logit_layout():
    """The logit wgmmas' accumulator ``[64 slots, 16 heads]`` (fp16 / bf16 MMAs: K = 16 an instruction)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])


def value_dim(n):
    """The dim (within its 128-dim tile) that value column ``n`` holds: ``4 (8 (j // 4) + r) + j % 4`` for ``n = 8 j +
    r`` (the permutation :data:`_VALUE_BASES` reads; the output is stored through it)."""
    return 4 * (8 * (n >> 5) + (n & 7)) + ((n >> 3) & 3)


@gluon.jit
def _slot_pairs_f16(even, odd):
    """Two slots' value words (e4m3 ``even`` = slot ``s``, ``odd`` = slot ``s + 1``, each 4 bytes: the dims ``n0 + 8 m``,
    ``m = 0..3``) -> fp16 pairs, each 32-bit register one dim at both slots (mma.sync's B fragment pairs): two ``prmt``
    put the two slots' bytes of a dim side by side, then one ``cvt.rn.f16x2.e4m3x2`` a pair (exact). Returns ``(a,
    b)``, each in its input's place but holding, at element ``m = m0 + 2 m1``, slot ``s + m0``'s value of dim ``n0 + 8
    m1`` (``a``) or ``n0 + 8 (2 + m1)`` (``b``): :func:`_value_operand` puts them back in order."""
    return gl.inline_asm_elementwise(
        "{\n\t.reg .b32 x0, x1;\n\t.reg .b16 l0, h0, l1, h1;\n\tprmt.b32 x0, $4, $5, 0x5140;"
        "\n\tprmt.b32 x1, $4, $5, 0x7362;\n\tmov.b32 {l0, h0}, x0;\n\tmov.b32 {l1, h1}, x1;"
        "\n\tcvt.rn.f16x2.e4m3x2 $0, l0;\n\tcvt.rn.f16x2.e4m3x2 $1, h0;\n\tcvt.rn.f16x2.e4m3x2 $2, l1;"
        "\n\tcvt.rn.f16x2.e4m3x2 $3, h1;\n\t}",
        "=r,=r,=r,=r,r,r", [even, odd], dtype=(gl.float16, gl.float16), is_pure=True, pack=4)


@gluon.jit
def _value_operand(x, DOT_B: gl.constexpr):
    """16 slots' value codes (u8 ``[4 parts, 16 slots, 128 n]`` as loaded in :data:`_LOAD`) widened exactly to fp16 as
    the value MMA's B operand: the slots' bytes paired before the conversion (:func:`_slot_pairs_f16`: one ``prmt`` a
    word instead of one a converted pair after it, 64 fewer a step a warp), the result's elements put back in order by
    a reshape and a permutation of registers (no data moves: asserted)."""
    even, odd = gl.split(gl.permute(gl.reshape(x, [4, 8, 2, 128]), (0, 1, 3, 2)))  # slots 2 a, 2 a + 1: [4, 8, 128]
    a, b = _slot_pairs_f16(even, odd)
    # a / b at n = 32 i + 16 m1 + 8 m0 + r hold slot 2 a + m0, dim 32 i + 16 t + 8 m1 + r (t = 0 for a, 1 for b)
    both = gl.reshape(gl.join(a, b), [4, 8, 4, 2, 2, 8, 2])  # p, a, i, m1, m0, r, t
    v = gl.reshape(gl.permute(both, (0, 1, 4, 2, 6, 3, 5)), [4, 16, 128])  # p, (a, m0), (i, t, m1, r)
    return gl.convert_layout(v, DOT_B, assert_trivial=True)


@gluon.jit
def _scale_row(scales, c: gl.constexpr):
    """Tile ``c``'s scales of a stage (``[4, 64]`` fp32) as ``[64]``."""
    return _view(scales, gl.float32, [4 * TILE], _SCALE_ROW).slice(c * TILE, TILE)


@gluon.jit
def _value_view(codes):
    """A stage's codes (e4m3 ``[4, 64, 128]``, swizzled) as the value operand's ``[part, slot, n]`` bytes."""
    return _view(codes, gl.uint8, [4, 64, 128], gl.SharedLinearLayout(_VALUE_BASES))


def logit_dim(chunk, k):
    """The dim (0..511) that column ``k`` (0..63) of chunk ``chunk`` (``2 t + h``: tile ``t``'s pieces ``2 c + h``)
    holds: ``k = e + 2 c + 8 hh + 16 b`` is byte ``e + 2 hh + 4 b`` of piece ``2 c + h`` of tile ``t``."""
    t, h = chunk >> 1, chunk & 1
    e, c, hh, b = k & 1, (k >> 1) & 3, (k >> 3) & 1, k >> 4
    return 128 * t + 16 * (2 * c + h) + e + 2 * hh + 4 * b


@gluon.jit
def _columns(x, DOT_A: gl.constexpr):
    """A chunk's e4m3 bytes as loaded (u8 ``[64, 4 c, 16 j]``) widened exactly to fp16 and put in column order (a
    register permutation, :data:`_TO_COLUMNS`): the fp16 wgmma's register A operand ``[64, 64]``."""
    v = gl.reshape(_as_f16(x), [TILE, 4, 4, 2, 2])  # slot, c, b, hh, e
    return gl.convert_layout(gl.reshape(gl.permute(v, _TO_COLUMNS.value), [TILE, 64]), DOT_A, assert_trivial=True)


@gluon.jit
def _code_chunk(codes, chunk: gl.constexpr, DOT_A: gl.constexpr):
    """Chunk ``chunk`` of a stage's codes (e4m3 ``[4, 64, 128]``, swizzled) as the register A operand (fp16 ``[64
    slots, 64]``, columns in :func:`logit_dim` order)."""
    view = _view(codes, gl.uint8, [8, TILE, 4, 16], gl.SharedLinearLayout(_CHUNK_BASES))
    return _columns(gl.reshape(view.slice(chunk, 1, dim=0).load(_CHUNK_LOAD), [TILE, 4, 16]), DOT_A)


@gluon.jit
def _rope8_operand(rope, DOT_A: gl.constexpr):
    """(FP8 records) A stage's RoPE codes (e4m3 ``[64, 64]``, row-major) as the register A operand (fp16, columns:
    byte ``e + 2 hh + 4 b`` of piece ``c`` at ``k = e + 2 c + 8 hh + 16 b``, as the chunks')."""
    view = _view(rope, gl.uint8, [1, TILE, 4, 16], gl.SharedLinearLayout(_ROPE8_BASES))
    return _columns(gl.reshape(view.load(_CHUNK_LOAD), [TILE, 4, 16]), DOT_A)


@gluon.jit
def _logit_chunk(codes, chunk: gl.constexpr, q_s, pending, zeros, LOGIT_A: gl.constexpr):
    """Chunk ``chunk``'s logit MMA (``[64 slots, 16 heads]``): its codes read into registers while ``pending`` (the
    MMA issued before) runs, then ``pending`` waited for (its register operand freed: one MMA in flight) and the
    chunk's issued, from zero for a tile's first chunk, onto ``pending`` (its tile's first) for the second. Returns
    (``pending`` complete, the chunk's MMA in flight)."""
    a = _code_chunk(codes, chunk, LOGIT_A)
    done = warpgroup_mma_wait(0, deps=[pending])
    if chunk % 2 == 0:
        mma = warpgroup_mma(a, q_s.index(chunk).permute((1, 0)), zeros, use_acc=False, is_async=True)
    else:
        mma = warpgroup_mma(a, q_s.index(chunk).permute((1, 0)), done, is_async=True)
    return done, mma


@gluon.jit
def _query_runs(q_rows, head_ok, first: gl.constexpr, stride: gl.constexpr):
    """bf16 ``[16 heads, 4, 16]``: the 4 runs of 16 consecutive query dims starting at ``first + stride r``
    (``q_rows [16, 1, 1]`` the heads' rows, ``head_ok`` the heads that exist)."""
    r = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(2, _QUERY)))
    j = gl.arange(0, 16, gl.SliceLayout(0, gl.SliceLayout(1, _QUERY)))
    return gl.load(q_rows + (first + stride * r)[None, :, None] + j[None, None, :], mask=head_ok, other=0.0)


@gluon.jit
def _runs_amax(x):
    """Largest magnitude of each head's values in ``x`` (``[16, 4, 16]``) -> fp32 ``[16]``, Inf for one holding NaN."""
    return _row_amax(gl.reshape(x.to(gl.float32), [BLOCK_H, 64]))


@gluon.jit
def _row_scale16(amax):
    """(up, down): per row a power of two putting ``amax`` in [2^13, 2^14) (fp16 then holds the row and twice it), and
    its inverse (NaN where ``amax`` is Inf: a row holding Inf or NaN); at most 2^126 (a zero row stays zero)."""
    biased = (amax.to(gl.int32, bitcast=True) >> 23) & 0xFF
    field = gl.minimum(267 - biased, 253)  # exponent field of 2^(140 - biased)
    up = (field << 23).to(gl.float32, bitcast=True)
    down = ((254 - field) << 23).to(gl.float32, bitcast=True)
    return up, gl.where(amax < float("inf"), down, float("nan"))


@gluon.jit
def _store_columns(x, up, dst):
    """Query runs (``x`` bf16 ``[16, 4 c, 16 j]``, :func:`_query_runs`) times ``up`` (per head) in fp16, in the
    chunks' column order (:data:`_TO_COLUMNS`): the logit wgmma's B operand ``[16, 64]``."""
    v = gl.reshape(x.to(gl.float32) * up[:, None, None], [BLOCK_H, 4, 4, 2, 2])  # h, c, b, hh, e
    dst.store(gl.reshape(gl.permute(v, _TO_COLUMNS.value), [BLOCK_H, 64]).to(gl.float16))


@gluon.jit
def _per_part(v0, v1, v2, v3, layout: gl.constexpr):
    """Four scalars as a ``[4]`` tensor in ``layout``."""
    c = gl.arange(0, 4, layout)
    return gl.where(c == 0, v0, gl.where(c == 1, v1, gl.where(c == 2, v2, v3)))


@gluon.jit
def _step_scale_maxima(scales):
    """The largest scale magnitude of each 128-dim tile over a step's 64 slots (``scales [4, 64]`` fp32 in shared
    memory, skipped slots zero-filled): four scalars, every warp reducing its own copy (no cross-warp exchange, no
    barrier). Magnitudes: the format's scales are positive, but a record with a negative one still gets
    ``|P_c| <= 1`` and the reference's sign."""
    sc = gl.abs(scales.load(_SCALES_ALL))
    top = gl.max(sc, axis=1)
    part = gl.arange(0, 4, gl.SliceLayout(1, _SCALES_ALL))
    return (gl.max(gl.where(part == 0, top, 0.0), axis=0), gl.max(gl.where(part == 1, top, 0.0), axis=0),
            gl.max(gl.where(part == 2, top, 0.0), axis=0), gl.max(gl.where(part == 3, top, 0.0), axis=0))


@gluon.jit
def _raise_maximum(m, step_max):
    """A tile's running scale maximum ``m`` after a step whose largest is ``step_max``: ``(new m, old / new`` (the
    factor the accumulated values of the tile take: they were weighted by ``σ / old``), ``1 / new)``; 1 while every
    scale so far is 0 (no weight yet)."""
    new = gl.maximum(m, step_max)
    inverse = gl.where(new > 0.0, 1.0 / gl.where(new > 0.0, new, 1.0), 1.0)
    return new, gl.where(new == m, 1.0, m * inverse), inverse


@gluon.jit
def _slot_rows(slot_row, n0, end, layout: gl.constexpr):
    """Slots ``n0 .. n0 + 64`` of the token's list in ``layout`` (-1 past the split's end): unmasked (16-byte words
    where ``n0`` is known a multiple of 64, ``ALIGNED``) unless the split ends inside the step."""
    n = n0 + gl.arange(0, TILE, layout)
    if n0 + TILE <= end:
        rows = gl.load(slot_row + n)
    else:
        rows = gl.load(slot_row + n, mask=n < end, other=-1)
    return rows


@gluon.jit
def _copy_slots(slot_row, n0, end, FP8: gl.constexpr):
    """Slots ``n0 .. n0 + 64`` as the three copies of :func:`_issue` hold them (loaded a step before they are issued:
    the copies never wait on the load of their slot indices); FP8 records have no scales (the third the codes')."""
    codes = _slot_rows(slot_row, n0, end, gl.SliceLayout(0, gl.SliceLayout(2, _CODES_COPY)))
    if FP8:
        rope = _slot_rows(slot_row, n0, end, gl.SliceLayout(1, _ROPE8_COPY))
        scales = codes
    else:
        rope = _slot_rows(slot_row, n0, end, gl.SliceLayout(1, _ROPE_COPY))
        scales = _slot_rows(slot_row, n0, end, gl.SliceLayout(0, _SCALE_COPY))
    return codes, rope, scales


@gluon.jit
def _issue(pages_u8, slots_c, slots_r, slots_s, num_slots, s8_b, s8_t, block_tokens, codes, rope, scales,
           FLAT: gl.constexpr, OFF32: gl.constexpr, FP8: gl.constexpr):
    """Start the copies of one step's records (its slots as :func:`_copy_slots` gives them) into one stage: ``codes [4,
    64, 128]`` e4m3 (tile c's bytes of the slots at ``[c]``), ``rope [64, 64]`` bf16 (FP8 records: e4m3, at byte 512),
    ``scales [4, 64]`` fp32 (tile c's scales at ``[c]``; none in FP8 records); skipped slots zero-filled."""
    row, ok = _rows(slots_c, num_slots, s8_b, s8_t, block_tokens, FLAT, OFF32)
    part = gl.arange(0, 4, gl.SliceLayout(1, gl.SliceLayout(2, _CODES_COPY)))
    byte = gl.arange(0, 128, gl.SliceLayout(0, gl.SliceLayout(1, _CODES_COPY)))
    src = pages_u8 + row[None, :, None] + (part * 128)[:, None, None] + byte[None, None, :]
    # one copy for the stage's four tiles (the compiler orders copies into one buffer by barriers between them)
    _async_copy(codes, src.to(gl.pointer_type(gl.float8e4nv), bitcast=True), mask=ok[None, :, None])
    row_r, ok_r = _rows(slots_r, num_slots, s8_b, s8_t, block_tokens, FLAT, OFF32)
    if FP8:
        rope_byte = gl.arange(0, 64, gl.SliceLayout(0, _ROPE8_COPY))
        rope_src = pages_u8 + row_r[:, None] + 512 + rope_byte[None, :]  # the RoPE codes at byte 512
        _async_copy(rope, rope_src.to(gl.pointer_type(gl.float8e4nv), bitcast=True), mask=ok_r[:, None])
    else:
        dim = gl.arange(0, 64, gl.SliceLayout(0, _ROPE_COPY))
        words = (pages_u8 + row_r[:, None]).to(gl.pointer_type(gl.bfloat16), bitcast=True)
        _async_copy(rope, words + 264 + dim[None, :], mask=ok_r[:, None])  # RoPE at byte 528
        row_s, ok_s = _rows(slots_s, num_slots, s8_b, s8_t, block_tokens, FLAT, OFF32)
        part = gl.arange(0, 4, gl.SliceLayout(1, _SCALE_COPY))
        floats = (pages_u8 + row_s[None, :]).to(gl.pointer_type(gl.float32), bitcast=True) + 128  # scales at byte 512
        _async_copy(scales, floats + part[:, None], mask=ok_s[None, :])


@gluon.jit
def online_softmax(s, m_i, l_acc):
    """One step of the online softmax over a step's logits ``s [64 slots, 16 heads]`` (log2 units, -inf skipped):
    ``m_i [16]`` the heads' running maxima, ``l_acc [64, 16]`` per-thread partial sums of p. Returns ``(p, alpha, m_i,
    l_acc)``: the step's weights, the factor the accumulated values take, the new maxima and sums (a head with no
    valid slot yet keeps p = 0)."""
    m_new = gl.maximum(m_i, gl.max(s, axis=0))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # an all-skipped head stays at p = 0
    p = gl.exp2(s - m_safe[None, :])
    alpha = gl.exp2(m_i - m_safe)
    return p, alpha, m_new, l_acc * alpha[None, :] + p


@gluon.jit
def softmax_totals(l_acc, m_i, numerator: gl.constexpr):
    """After the last step: ``(lse [16]`` natural log, -inf for a head with no valid slot, ``numerator / l [16]``,
    ``numerator`` there)."""
    l_i = gl.sum(l_acc, axis=0)
    has_any = l_i > 0.0
    m_safe = gl.where(m_i == float("-inf"), 0.0, m_i)
    lse = gl.where(has_any, (m_safe + gl.log2(gl.where(has_any, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
    return lse, numerator / gl.where(has_any, l_i, 1.0)


@gluon.jit
def program_steps(tokens, K):
    """The balanced schedule (:mod:`.balanced`): this program's global steps ``[g0, g1)`` of the call's ``total = T ·
    S`` (program ``p`` of ``P = num_programs(0)`` takes ``[p · total // P, (p + 1) · total // P)``), and ``S``, a
    row's steps: int32 (a call's steps are far fewer than 2^31: its slot indices alone would take 2^37 bytes), the
    products int64."""
    S = gl.cdiv(K, TILE)
    total = tokens * S
    p = gl.program_id(0).to(gl.int64)
    P = gl.num_programs(0)
    return (p * total // P).to(gl.int32), ((p + 1) * total // P).to(gl.int32), S, total


@gluon.jit
def piece(t, g0, g1, S, total, K):
    """Row ``t``'s piece of this program's steps ``[g0, g1)`` (:func:`.balanced.pieces`' twin): ``(first slot, end
    slot, part)``, int32; the part is this program's index past the one holding the row's first step."""
    P = gl.num_programs(0)
    first = (((t * S + 1).to(gl.int64) * P - 1) // total).to(gl.int32)
    start = gl.maximum(g0 - t * S, 0) * TILE
    end = gl.minimum(gl.minimum(g1 - t * S, S) * TILE, K)
    return start, end, gl.program_id(0) - first


@gluon.jit
def mark_unused_parts(lse_row, stride_ls, part, parts, head_ok):
    """A row's last piece on the balanced schedule (part ``part`` of the ``parts`` the partials hold): ``lse = -inf``
    into its row's unused parts ``part + 1 ..`` (``lse_row`` its heads' lse pointers in part 0), so the merge skips them
    without reading their outputs."""
    minus_inf = gl.where(head_ok, float("-inf"), 0.0)  # (the heads' layout, fp32)
    for unused in range(part + 1, parts):
        gl.store(lse_row + unused * stride_ls, minus_inf, mask=head_ok)


@gluon.jit
def _queries(q_ptr, stride_qt, stride_qh, t, H, q_s, q_rope, logit_scale, kv_scale_ptr, FP8: gl.constexpr):
    """Row ``t``'s queries into ``q_s`` / ``q_rope``: each head scaled by a power of two into fp16 (its largest in
    [2^13, 2^14): exact but for values below 2^-27 of it), in the chunks' column order; FP8 records: the RoPE dims
    too (e4m3 codes), fp8_ds_mla: the RoPE dims as they are (bf16 values, a bf16 MMA). Returns ``(head_scale [16]``
    (the logits' factor a head, NaN for a head holding Inf or NaN), the tiles' first running scale maximum: FP8 the
    tensor scale, else 0). The caller has every warp past its previous MMA on the buffers."""
    HEADS: gl.constexpr = gl.SliceLayout(0, _logit_layout())
    qh = gl.arange(0, BLOCK_H, gl.SliceLayout(1, gl.SliceLayout(2, _QUERY)))
    q_rows = q_ptr + t * stride_qt + qh[:, None, None] * stride_qh
    head_ok = (qh < H)[:, None, None]
    runs = ()
    for chunk in gl.static_range(8):  # chunk 2 t + h: dims 128 t + 16 h + 32 c + j
        runs = runs + (_query_runs(q_rows, head_ok, 128 * (chunk // 2) + 16 * (chunk % 2), 32),)
    rope_runs = _query_runs(q_rows, head_ok, 512, 16)  # dims 512 + 16 c + j
    amax = _runs_amax(runs[0])
    for chunk in gl.static_range(1, 8):
        amax = gl.maximum(amax, _runs_amax(runs[chunk]))
    if FP8:
        amax = gl.maximum(amax, _runs_amax(rope_runs))
    up, down = _row_scale16(amax)
    up = gl.convert_layout(up, gl.SliceLayout(1, gl.SliceLayout(2, _QUERY)))
    for chunk in gl.static_range(8):
        _store_columns(runs[chunk], up, q_s.index(chunk))
    if FP8:
        _store_columns(rope_runs, up, q_rope)
        kv_scale = gl.load(kv_scale_ptr)
        head_scale = gl.convert_layout(down * (kv_scale * logit_scale), HEADS)  # every code x the tensor scale
        first_maximum = kv_scale
    else:
        q_rope.store(gl.reshape(rope_runs, [BLOCK_H, 64]))
        head_scale = gl.convert_layout(down * logit_scale, HEADS)
        first_maximum = logit_scale * 0.0  # (an fp32 scalar: loop-carried)
    fence_async_shared()  # the queries' stores, before the first wgmma reads them (after the next barrier)
    return head_scale, first_maximum


@gluon.jit
def _step(i, issue_ahead, ahead_c, ahead_r, ahead_s, next_row, next_n0, next_end, here, here_row, here_n0, here_end,
          pages_u8, s8_b, s8_t, num_slots, block_tokens, logit_scale, head_scale, m_i, l_acc, acc, b0, b1, b2, b3,
          codes_s, rope_s, scale_s, p_s, q_s, q_rope, STAGES: gl.constexpr, FLAT: gl.constexpr, OFF32: gl.constexpr,
          FP8: gl.constexpr):
    """One 64-slot step of a piece: the ``i``-th a program runs (its stage ``i % STAGES``), whose slots ``here`` are
    (-1 skipped); the copies of the step ``STAGES - 1`` ahead (slots ``ahead_*``) issued when ``issue_ahead``, then the
    slot indices of the step after that (``next_row`` from slot ``next_n0``, up to ``next_end``) loaded, and those of
    the next step (``here_row`` / ``here_n0`` / ``here_end``) for its mask; the logits, online softmax and value MMAs.
    Returns the carried state: ``(ahead_c, ahead_r, ahead_s, here, m_i, l_acc, acc, b0, b1, b2, b3)``."""
    ROWS: gl.constexpr = gl.SliceLayout(1, _logit_layout())  # [64] per slot
    stage = i % STAGES
    async_copy.wait_group(STAGES - 2)  # this thread's copies of step i have landed
    fence_async_shared()  # (cp.async writes through the generic proxy, the wgmma reads through the async one)
    _barrier()  # everyone's have; every warp is done with step i - 1's stage and P
    if issue_ahead:
        nxt = (i + STAGES - 1) % STAGES
        _issue(pages_u8, ahead_c, ahead_r, ahead_s, num_slots, s8_b, s8_t, block_tokens, codes_s.index(nxt),
               rope_s.index(nxt), scale_s.index(nxt), FLAT, OFF32, FP8)
    async_copy.commit_group()
    ahead_c, ahead_r, ahead_s = _copy_slots(next_row, next_n0, next_end, FP8)
    valid = (here >= 0) & (here < num_slots)
    here = _slot_rows(here_row, here_n0, here_end, ROWS)
    m_i, l_acc, acc, b0, b1, b2, b3 = _step_math(
        codes_s.index(stage), rope_s.index(stage), scale_s.index(stage), valid, logit_scale, head_scale, m_i, l_acc,
        acc, b0, b1, b2, b3, p_s, q_s, q_rope, FP8)
    return ahead_c, ahead_r, ahead_s, here, m_i, l_acc, acc, b0, b1, b2, b3


@gluon.jit
def _step_math(codes, rope, scales, valid, logit_scale, head_scale, m_i, l_acc, acc, b0, b1, b2, b3, p_s, q_s, q_rope,
               FP8: gl.constexpr):
    """A step's arithmetic on its stage (landed and visible to every warp; the warps past their previous step's reads
    of ``p_s``): the logits of its slots (``valid`` ``[64]``: the slots not skipped), the online softmax and the value
    MMAs. Returns ``(m_i, l_acc, acc, b0, b1, b2, b3)``."""
    W: gl.constexpr = _logit_layout()  # the logit MMAs' accumulators [64 slots, 16 heads]
    LOGIT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=W, k_width=2)  # their register A operands
    ROWS: gl.constexpr = gl.SliceLayout(1, W)  # [64] per slot
    PV: gl.constexpr = _pv_layout()  # the value MMA's accumulator [4 parts, 16 heads, 128 n]
    DOT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=PV, k_width=2)
    DOT_B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=PV, k_width=2)
    PV_HEADS: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, PV))
    PV_PARTS: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, PV))
    zeros = gl.zeros([TILE, BLOCK_H], gl.float32, W)  # (the first chunk MMAs' unread accumulator)
    # the RoPE MMA, then the chunks' (each read into registers while the MMA before it runs)
    if FP8:
        ar = warpgroup_mma(_rope8_operand(rope, LOGIT_A), q_rope.permute((1, 0)), zeros, use_acc=False,
                           is_async=True)
    else:
        ar = warpgroup_mma(rope, q_rope.permute((1, 0)), zeros, use_acc=False, is_async=True)
        s0 = _scale_row(scales, 0).load(ROWS)  # σ_c of the step's slots
        s1 = _scale_row(scales, 1).load(ROWS)
        s2 = _scale_row(scales, 2).load(ROWS)
        s3 = _scale_row(scales, 3).load(ROWS)
        t0, t1, t2, t3 = _step_scale_maxima(scales)
        b0, f0, r0 = _raise_maximum(b0, t0)
        b1, f1, r1 = _raise_maximum(b1, t1)
        b2, f2, r2 = _raise_maximum(b2, t2)
        b3, f3, r3 = _raise_maximum(b3, t3)
    ar, a0 = _logit_chunk(codes, 0, q_s, ar, zeros, LOGIT_A)  # tile t's sum a_t: its chunks 2 t and 2 t + 1
    _, a0 = _logit_chunk(codes, 1, q_s, a0, zeros, LOGIT_A)
    a0, a1 = _logit_chunk(codes, 2, q_s, a0, zeros, LOGIT_A)
    _, a1 = _logit_chunk(codes, 3, q_s, a1, zeros, LOGIT_A)
    a1, a2 = _logit_chunk(codes, 4, q_s, a1, zeros, LOGIT_A)
    _, a2 = _logit_chunk(codes, 5, q_s, a2, zeros, LOGIT_A)
    a2, a3 = _logit_chunk(codes, 6, q_s, a2, zeros, LOGIT_A)
    _, a3 = _logit_chunk(codes, 7, q_s, a3, zeros, LOGIT_A)
    a3 = warpgroup_mma_wait(0, deps=[a3])
    if FP8:
        s = (a0 + a1 + a2 + a3 + ar) * head_scale[None, :]
    else:
        nope = a0 * s0[:, None] + a1 * s1[:, None] + a2 * s2[:, None] + a3 * s3[:, None]
        s = nope * head_scale[None, :] + ar * logit_scale
    s = gl.where(valid[:, None], s, float("-inf"))

    p, alpha, m_i, l_acc = online_softmax(s, m_i, l_acc)
    # [64, 16, 2, 2] with P_c at [.., c % 2, c // 2] (join adds its dim last), as [4, 64, 16] in tile order
    if FP8:
        pc = gl.join(gl.join(p, p), gl.join(p, p))
        acc = acc * gl.convert_layout(alpha, PV_HEADS)[None, :, None]
    else:
        pc = gl.join(gl.join(p * (s0 * r0)[:, None], p * (s1 * r1)[:, None]),
                     gl.join(p * (s2 * r2)[:, None], p * (s3 * r3)[:, None]))
        # (the factor per part and head first: 2 a thread, then one multiply a value)
        factor = gl.convert_layout(alpha, PV_HEADS)[None, :] * _per_part(f0, f1, f2, f3, PV_PARTS)[:, None]
        acc = acc * factor[:, :, None]
    p_s.store(gl.reshape(gl.permute(pc, (3, 2, 0, 1)), [4, TILE, BLOCK_H]).to(gl.float16))
    _barrier()  # every warp's P stored

    values = _value_view(codes)
    for kk in gl.static_range(4):  # 16 slots at a time: the B operand's registers
        v = _value_operand(values.slice(16 * kk, 16, dim=1).load(_LOAD), DOT_B)
        pa = p_s.slice(16 * kk, 16, dim=1).permute((0, 2, 1)).load(DOT_A)  # [4, 16 heads, 16 slots]
        acc = mma_v2(pa, v, acc)
    return m_i, l_acc, acc, b0, b1, b2, b3


@gluon.jit
def _store_piece(acc, l_acc, m_i, b0, b1, b2, b3, o_ptr, stride_os, stride_ot, stride_oh, lse_ptr, stride_ls,
                 stride_lt, H, parts, t, part, row_ends, BALANCED: gl.constexpr):
    """A piece's result as part ``part`` of row ``t``: the fp32 partial (or, with one part, the final bf16 row) and
    its lse; on the balanced schedule the row's last piece (``row_ends``) marks its unused parts ``lse = -inf``."""
    W: gl.constexpr = _logit_layout()
    HEADS: gl.constexpr = gl.SliceLayout(0, W)  # [16] per head
    PV: gl.constexpr = _pv_layout()
    PV_HEADS: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, PV))
    PV_PARTS: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, PV))
    lse, inv_l = softmax_totals(l_acc, m_i, 1.0)
    norm = gl.convert_layout(inv_l, PV_HEADS)
    out = acc * (norm[None, :, None] * _per_part(b0, b1, b2, b3, PV_PARTS)[:, None, None])
    # the columns un-permuted in registers (n = 32 a + 8 b + r holds dim 32 a + 4 r + b: value_dim), so each thread's
    # values are runs of 4 consecutive dims: 16-byte stores
    out = gl.reshape(gl.permute(gl.reshape(out, [4, BLOCK_H, 4, 4, 8]), (0, 1, 2, 4, 3)), [4, BLOCK_H, 128])
    out = gl.convert_layout(out, _OUT)  # (the same registers in another order: no data moves)
    op = gl.arange(0, 4, gl.SliceLayout(1, gl.SliceLayout(2, _OUT)))
    oh = gl.arange(0, BLOCK_H, gl.SliceLayout(0, gl.SliceLayout(2, _OUT)))
    od = gl.arange(0, 128, gl.SliceLayout(0, gl.SliceLayout(1, _OUT)))
    o_rows = o_ptr + part.to(gl.int64) * stride_os + t * stride_ot + oh[None, :, None] * stride_oh
    gl.store(o_rows + (op * 128)[:, None, None] + od[None, None, :], out.to(o_ptr.dtype.element_ty),
             mask=(oh < H)[None, :, None])
    lh = gl.arange(0, BLOCK_H, HEADS)
    gl.store(lse_ptr + part * stride_ls + t * stride_lt + lh, lse, mask=lh < H)
    if BALANCED and row_ends:  # the row's last piece
        mark_unused_parts(lse_ptr + t * stride_lt + lh, stride_ls, part, parts, lh < H)


@gluon.jit
def _fresh_state(first_maximum):
    """A piece's starting softmax state: ``(m_i [16] -inf, l_acc [64, 16] 0``, the tiles' running scale maxima ``b0 ..
    b3 = first_maximum``, ``acc [4, 16, 128] 0)`` (the order the loops carry them in: the fixed launch's compile)."""
    W: gl.constexpr = _logit_layout()
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(0, W))
    l_acc = gl.zeros([TILE, BLOCK_H], gl.float32, W)  # per-thread partial sums of p, summed at the end
    acc = gl.zeros([4, BLOCK_H, 128], gl.float32, _pv_layout())
    return m_i, l_acc, first_maximum, first_maximum, first_maximum, first_maximum, acc


@gluon.jit
def _reduce_split(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, s8_t, slots_ptr, stride_st, o_ptr, stride_os,
                  stride_ot, stride_oh, lse_ptr, stride_ls, stride_lt, H, K, num_slots, block_tokens, parts,
                  logit_scale, kv_scale_ptr, t, start, end, part, codes_s, rope_s, scale_s, p_s, q_s, q_rope,
                  STAGES: gl.constexpr, FLAT: gl.constexpr, OFF32: gl.constexpr, FP8: gl.constexpr,
                  ALIGNED: gl.constexpr, BALANCED: gl.constexpr):
    """Row ``t``'s slots ``start .. end`` (a split, or a piece of the balanced schedule run on its own): the first
    steps' gathers issued, the queries scaled into ``q_s`` / ``q_rope`` (overlapping their flight), the steps, the
    partial stored as part ``part`` (the balanced schedule's row's last piece marks its unused parts).
    M_c, the largest tile-c scale of the split's slots so far (a running maximum, raised step by step): P_c = p · σ_c /
    M_c <= 1 in fp16, the accumulated values of tile c taking M_old / M_new when it rises, the output times M_c at the
    end; FP8 records: P_c = p, the output times the tensor scale."""
    ROWS: gl.constexpr = gl.SliceLayout(1, _logit_layout())
    slot_row = slots_ptr + t * stride_st
    if ALIGNED:
        start = gl.multiple_of(start, 64)
    steps = gl.cdiv(end - start, TILE)
    for j in gl.static_range(STAGES - 1):
        if j < steps:
            sc, sr, ss = _copy_slots(slot_row, start + j * TILE, end, FP8)
            _issue(pages_u8, sc, sr, ss, num_slots, s8_b, s8_t, block_tokens, codes_s.index(j), rope_s.index(j),
                   scale_s.index(j), FLAT, OFF32, FP8)
        async_copy.commit_group()
    ahead_c, ahead_r, ahead_s = _copy_slots(slot_row, start + (STAGES - 1) * TILE, end, FP8)
    here = _slot_rows(slot_row, start, end, ROWS)  # step 0's slots, for its mask
    head_scale, first_maximum = _queries(q_ptr, stride_qt, stride_qh, t, H, q_s, q_rope, logit_scale, kv_scale_ptr,
                                         FP8)
    m_i, l_acc, b0, b1, b2, b3, acc = _fresh_state(first_maximum)
    for i in range(steps):
        ahead = i + STAGES - 1
        ahead_c, ahead_r, ahead_s, here, m_i, l_acc, acc, b0, b1, b2, b3 = _step(
            i, ahead < steps, ahead_c, ahead_r, ahead_s, slot_row, start + (ahead + 1) * TILE, end, here, slot_row,
            start + (i + 1) * TILE, end, pages_u8, s8_b, s8_t, num_slots, block_tokens, logit_scale, head_scale, m_i,
            l_acc, acc, b0, b1, b2, b3, codes_s, rope_s, scale_s, p_s, q_s, q_rope, STAGES, FLAT, OFF32, FP8)
    async_copy.wait_group(0)
    _store_piece(acc, l_acc, m_i, b0, b1, b2, b3, o_ptr, stride_os, stride_ot, stride_oh, lse_ptr, stride_ls,
                 stride_lt, H, parts, t, part, end == K, BALANCED)



# --- the warp-specialised launch (``WS``): a producer warpgroup gathers, the warpgroup computes ------------------------
# A step's 1,478 instructions a warp (sm_90 SASS, forty-third session) held about 340 of the gathers' own: the slot
# indices' loads, their record offsets and masks, the copies' addresses and the copies. With ``WS`` a second warpgroup
# (the producer) does all of that, the computing warpgroup waits for a stage's ``full`` mbarrier (each producer thread
# arrives once its copies have landed: ``cp.async.mbarrier.arrive.noinc``) and frees it on ``empty`` once its value
# MMAs have read it.
# The producer's copy layouts (a warpgroup: Triton gives a worker partition's warpgroup its registers whole, so all four
# warps copy): a step's records as 4 rounds of 16 slots, 8 lanes a slot (a lane one 16-byte piece of a 128-byte tile
# row or RoPE row), so a thread copies 4 slots (lane // 8 + 4 warp + 16 r) whose four tiles' pieces are one address and
# three constant offsets: few registers (the producer's 24-40 leave the warpgroup 216-232 under two programs a SM).
_CODES_COPY_W = gl.constexpr(gl.BlockedLayout([1, 1, 16], [1, 4, 8], [1, 4, 1], [2, 1, 0]))  # [4, 64, 128] bytes
_ROPE_COPY_W = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))  # [64, 64] bf16
_ROPE8_COPY_W = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0]))  # [64, 64] e4m3 (FP8 records)


@gluon.jit
def _ws_issue(pages_u8, slot_row, n0, end, num_slots, s8_b, s8_t, block_tokens, codes, rope, scales,
              FLAT: gl.constexpr, OFF32: gl.constexpr, FP8: gl.constexpr):
    """(``WS``, the producer) Start the copies of the step of slots ``n0 .. n0 + 64`` (-1 past ``end``) into one
    stage, as :func:`_issue` does from the warpgroup: ``codes [4, 64, 128]``, ``rope [64, 64]``, ``scales [4, 64]``
    (none in FP8 records); skipped slots zero-filled."""
    slots_c = _slot_rows(slot_row, n0, end, gl.SliceLayout(0, gl.SliceLayout(2, _CODES_COPY_W)))
    row, ok = _rows(slots_c, num_slots, s8_b, s8_t, block_tokens, FLAT, OFF32)
    part = gl.arange(0, 4, gl.SliceLayout(1, gl.SliceLayout(2, _CODES_COPY_W)))
    byte = gl.arange(0, 128, gl.SliceLayout(0, gl.SliceLayout(1, _CODES_COPY_W)))
    src = pages_u8 + row[None, :, None] + (part * 128)[:, None, None] + byte[None, None, :]
    _async_copy(codes, src.to(gl.pointer_type(gl.float8e4nv), bitcast=True), mask=ok[None, :, None])
    if FP8:
        slots_r = _slot_rows(slot_row, n0, end, gl.SliceLayout(1, _ROPE8_COPY_W))
        row_r, ok_r = _rows(slots_r, num_slots, s8_b, s8_t, block_tokens, FLAT, OFF32)
        rope_byte = gl.arange(0, 64, gl.SliceLayout(0, _ROPE8_COPY_W))
        rope_src = pages_u8 + row_r[:, None] + 512 + rope_byte[None, :]  # the RoPE codes at byte 512
        _async_copy(rope, rope_src.to(gl.pointer_type(gl.float8e4nv), bitcast=True), mask=ok_r[:, None])
    else:
        row_r = gl.convert_layout(row, gl.SliceLayout(1, _ROPE_COPY_W))  # (the same lanes' slots: no data moves)
        ok_r = gl.convert_layout(ok, gl.SliceLayout(1, _ROPE_COPY_W))
        dim = gl.arange(0, 64, gl.SliceLayout(0, _ROPE_COPY_W))
        words = (pages_u8 + row_r[:, None]).to(gl.pointer_type(gl.bfloat16), bitcast=True)
        _async_copy(rope, words + 264 + dim[None, :], mask=ok_r[:, None])  # RoPE at byte 528
        slots_s = _slot_rows(slot_row, n0, end, gl.SliceLayout(0, _SCALE_COPY))  # (4 warps already)
        row_s, ok_s = _rows(slots_s, num_slots, s8_b, s8_t, block_tokens, FLAT, OFF32)
        part_s = gl.arange(0, 4, gl.SliceLayout(1, _SCALE_COPY))
        floats = (pages_u8 + row_s[None, :]).to(gl.pointer_type(gl.float32), bitcast=True) + 128  # scales at byte 512
        _async_copy(scales, floats + part_s[:, None], mask=ok_s[None, :])


@gluon.jit
def _ws_produce_piece(pages_u8, s8_b, s8_t, slot_row, start, end, num_slots, block_tokens, i, codes_s, rope_s,
                      scale_s, full, empty, STAGES: gl.constexpr, FLAT: gl.constexpr, OFF32: gl.constexpr,
                      FP8: gl.constexpr, ALIGNED: gl.constexpr):
    """(``WS``, the producer) The steps of one piece (slots ``start .. end`` of a row), the program's ``i``-th step
    onwards: each waits for its stage to be free (``empty``; the first round passes), is copied, and each thread arrives
    on the stage's ``full`` once its copies have landed. Returns the program's next step number."""
    if ALIGNED:  # (the slot indices' loads as whole 16-byte words)
        start = gl.multiple_of(start, 64)
    for n0 in range(start, end, TILE):
        stage = i % STAGES
        mbarrier.wait(empty.index(stage), ((i // STAGES) & 1) ^ 1)
        _ws_issue(pages_u8, slot_row, n0, end, num_slots, s8_b, s8_t, block_tokens, codes_s.index(stage),
                  rope_s.index(stage), scale_s.index(stage), FLAT, OFF32, FP8)
        async_copy.mbarrier_arrive(full.index(stage), increment_count=False)
        i += 1
    return i


@gluon.jit
def _ws_produce(pages_u8, s8_b, s8_t, slots_ptr, stride_st, K, num_slots, block_tokens, split_size, tokens, codes_s,
                rope_s, scale_s, full, empty, STAGES: gl.constexpr, FLAT: gl.constexpr, OFF32: gl.constexpr,
                FP8: gl.constexpr, ALIGNED: gl.constexpr, BALANCED: gl.constexpr):
    """(``WS``) The producer: the program's pieces in the warpgroup's order (:func:`_ws_consume`)."""
    i = 0
    if BALANCED:
        g0, g1, S, total = program_steps(tokens, K)
        for t in range(g0 // S, (g1 - 1) // S + 1):
            start, end, part = piece(t, g0, g1, S, total, K)
            i = _ws_produce_piece(pages_u8, s8_b, s8_t, slots_ptr + t.to(gl.int64) * stride_st, start, end,
                                  num_slots, block_tokens, i, codes_s, rope_s, scale_s, full, empty, STAGES, FLAT,
                                  OFF32, FP8, True)
    else:
        start = gl.program_id(0) * split_size
        _ws_produce_piece(pages_u8, s8_b, s8_t, slots_ptr + gl.program_id(1).to(gl.int64) * stride_st, start,
                          gl.minimum(start + split_size, K), num_slots, block_tokens, i, codes_s, rope_s, scale_s,
                          full, empty, STAGES, FLAT, OFF32, FP8, ALIGNED)


@gluon.jit
def _ws_consume_piece(q_ptr, stride_qt, stride_qh, slots_ptr, stride_st, o_ptr, stride_os, stride_ot, stride_oh,
                      lse_ptr, stride_ls, stride_lt, H, K, num_slots, parts, logit_scale, kv_scale_ptr, t, start, end,
                      part, i, codes_s, rope_s, scale_s, p_s, q_s, q_rope, full, empty, STAGES: gl.constexpr,
                      FP8: gl.constexpr, ALIGNED: gl.constexpr, BALANCED: gl.constexpr):
    """(``WS``, the warpgroup) Row ``t``'s slots ``start .. end`` as :func:`_reduce_split` reduces them, the program's
    ``i``-th step onwards, each step's stage waited for on ``full`` and freed on ``empty`` once read. Returns the
    program's next step number."""
    ROWS: gl.constexpr = gl.SliceLayout(1, _logit_layout())
    slot_row = slots_ptr + t * stride_st
    if ALIGNED:
        start = gl.multiple_of(start, 64)
    here = _slot_rows(slot_row, start, end, ROWS)  # the first step's slots, for its mask
    _barrier()  # every warp past its previous piece's MMAs on the queries
    head_scale, first_maximum = _queries(q_ptr, stride_qt, stride_qh, t, H, q_s, q_rope, logit_scale, kv_scale_ptr,
                                         FP8)
    _barrier()  # the queries stored (and fenced) before any warp's first wgmma reads them
    m_i, l_acc, b0, b1, b2, b3, acc = _fresh_state(first_maximum)
    for n0 in range(start, end, TILE):
        stage = i % STAGES
        valid = (here >= 0) & (here < num_slots)
        here = _slot_rows(slot_row, n0 + TILE, end, ROWS)
        mbarrier.wait(full.index(stage), (i // STAGES) & 1)
        fence_async_shared()  # (the producer's cp.async writes are generic-proxy ones; the RoPE wgmma reads async)
        m_i, l_acc, acc, b0, b1, b2, b3 = _step_math(
            codes_s.index(stage), rope_s.index(stage), scale_s.index(stage), valid, logit_scale, head_scale, m_i,
            l_acc, acc, b0, b1, b2, b3, p_s, q_s, q_rope, FP8)
        mbarrier.arrive(empty.index(stage))  # (after the warpgroup's barrier: every warp done with the stage and P)
        i += 1
    _store_piece(acc, l_acc, m_i, b0, b1, b2, b3, o_ptr, stride_os, stride_ot, stride_oh, lse_ptr, stride_ls,
                 stride_lt, H, parts, t, part, end == K, BALANCED)
    return i


@gluon.jit
def _ws_consume(q_ptr, stride_qt, stride_qh, slots_ptr, stride_st, o_ptr, stride_os, stride_ot, stride_oh, lse_ptr,
                stride_ls, stride_lt, H, K, num_slots, split_size, parts, tokens, logit_scale, kv_scale_ptr, codes_s,
                rope_s, scale_s, p_s, q_s, q_rope, full, empty, STAGES: gl.constexpr, FP8: gl.constexpr,
                ALIGNED: gl.constexpr, BALANCED: gl.constexpr):
    """(``WS``) The warpgroup: the program's pieces (the balanced schedule's, or its fixed split)."""
    i = 0
    if BALANCED:
        g0, g1, S, total = program_steps(tokens, K)
        for t in range(g0 // S, (g1 - 1) // S + 1):
            start, end, part = piece(t, g0, g1, S, total, K)
            i = _ws_consume_piece(q_ptr, stride_qt, stride_qh, slots_ptr, stride_st, o_ptr, stride_os, stride_ot,
                                  stride_oh, lse_ptr, stride_ls, stride_lt, H, K, num_slots, parts, logit_scale,
                                  kv_scale_ptr, t.to(gl.int64), start, end, part, i, codes_s, rope_s, scale_s, p_s,
                                  q_s, q_rope, full, empty, STAGES, FP8, True, True)
    else:
        split = gl.program_id(0)
        start = split * split_size
        _ws_consume_piece(q_ptr, stride_qt, stride_qh, slots_ptr, stride_st, o_ptr, stride_os, stride_ot, stride_oh,
                          lse_ptr, stride_ls, stride_lt, H, K, num_slots, parts, logit_scale, kv_scale_ptr,
                          gl.program_id(1).to(gl.int64), start, gl.minimum(start + split_size, K), split, i, codes_s,
                          rope_s, scale_s, p_s, q_s, q_rope, full, empty, STAGES, FP8, ALIGNED, False)


@gluon.jit(do_not_specialize=SIZE_ARGS)
def sparse_mla_wgmma_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 576] bf16
    pages_u8, s8_b, s8_t,  # latent pages [num_blocks, block_tokens, 656] uint8, strides in bytes (multiples of 16)
    slots_ptr, stride_st,  # slots [T, K] int32/int64
    o_ptr, stride_os, stride_ot, stride_oh,  # o [splits, T, H, 512] (fp32 partials or bf16)
    lse_ptr, stride_ls, stride_lt,  # lse [splits, T, H] fp32
    H, K, num_slots, block_tokens, split_size,
    logit_scale,  # softmax_scale · log2(e)
    kv_scale_ptr,  # [] fp32 tensor scale of FP8 records (read in-kernel: no host sync; unread for fp8_ds_mla)
    tokens, parts,  # (the balanced schedule's) this launch's tokens, parts a row (o, lse's first dim)
    STAGES: gl.constexpr,
    FLAT: gl.constexpr,  # record s at byte s * s8_t (blocks back to back)
    OFF32: gl.constexpr,  # every record's byte offset fits int32 (a pool under 2 GiB)
    FP8: gl.constexpr = False,  # per-tensor FP8 records (576 e4m3 codes x kv_scale) instead of fp8_ds_mla's
    ALIGNED: gl.constexpr = False,  # every split starts at a multiple of 64 slots (the slot indices' loads vectorised)
    BALANCED: gl.constexpr = False,  # the balanced schedule (.balanced): grid axis 0 its programs, axis 1 one
    WS: gl.constexpr = False,  # a producer warpgroup gathering, one computing (_ws_produce, _ws_consume)
    PRODUCER_REGS: gl.constexpr = 40,  # (WS) the producer's registers (DEFAULT_PRODUCER_REGS)
):
    """Fixed splits (grid: splits, tokens, head groups): program (split, t) reduces row t's slots split · split_size
    onwards; or (``BALANCED``; grid: programs, 1, head groups) program p its share of the call's 64-slot steps, a
    piece a row it meets (:mod:`.balanced`), each piece run as a split of its own (a program's steps as one stream,
    its gathers running ahead across its pieces, gave the same bits and was 5-8% slower on the H200: forty-first
    session)."""
    q_ptr, o_ptr, lse_ptr, H = head_group(q_ptr, stride_qh, o_ptr, stride_oh, lse_ptr, H, BLOCK_H)
    # the first steps' gathers first: the queries' loads and split below overlap their flight (a program's work
    # outside its loop was 29% of the warps' stall samples, H100, thirty-sixth session)
    codes_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, 4, TILE, 128], _CODES)
    if FP8:
        rope_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, TILE, 64], _ROPE8)
        scale_s = rope_s  # (FP8 records have no scales: _issue never writes this one, the loop never reads it)
    else:
        rope_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, TILE, 64], _ROPE)
        scale_s = gl.allocate_shared_memory(gl.float32, [STAGES, 4, TILE], _SCALES)
    p_s = gl.allocate_shared_memory(gl.float16, [4, TILE, BLOCK_H], _P)
    q_s = gl.allocate_shared_memory(gl.float16, [8, BLOCK_H, 64], _Q)  # the queries, in the chunks' column order
    if FP8:  # the queries' RoPE dims: fp16 against the e4m3 codes, bf16 values as they are against fp8_ds_mla's bf16
        q_rope = gl.allocate_shared_memory(gl.float16, [BLOCK_H, 64], _Q)
    else:
        q_rope = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 64], _Q)

    if WS:
        full, empty = stage_mbarriers(STAGES, 128)  # (the producer warpgroup's 128 threads)
        gl.warp_specialize([
            (_ws_consume, (q_ptr, stride_qt, stride_qh, slots_ptr, stride_st, o_ptr, stride_os, stride_ot, stride_oh,
                           lse_ptr, stride_ls, stride_lt, H, K, num_slots, split_size, parts, tokens, logit_scale,
                           kv_scale_ptr, codes_s, rope_s, scale_s, p_s, q_s, q_rope, full, empty, STAGES, FP8,
                           ALIGNED, BALANCED)),
            (_ws_produce, (pages_u8, s8_b, s8_t, slots_ptr, stride_st, K, num_slots, block_tokens, split_size, tokens,
                           codes_s, rope_s, scale_s, full, empty, STAGES, FLAT, OFF32, FP8, ALIGNED, BALANCED)),
        ], [4], [PRODUCER_REGS])
    elif BALANCED:
        g0, g1, S, total = program_steps(tokens, K)
        for t in range(g0 // S, (g1 - 1) // S + 1):
            start, end, part = piece(t, g0, g1, S, total, K)
            _barrier()  # every warp done with the previous piece's stages, P and queries
            _reduce_split(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, s8_t, slots_ptr, stride_st, o_ptr, stride_os,
                          stride_ot, stride_oh, lse_ptr, stride_ls, stride_lt, H, K, num_slots, block_tokens, parts,
                          logit_scale, kv_scale_ptr, t.to(gl.int64), start, end, part, codes_s, rope_s, scale_s, p_s,
                          q_s, q_rope, STAGES, FLAT, OFF32, FP8, True, True)
    else:
        split = gl.program_id(0)
        start = split * split_size
        if ALIGNED:
            start = gl.multiple_of(start, 64)
        _reduce_split(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, s8_t, slots_ptr, stride_st, o_ptr, stride_os,
                      stride_ot, stride_oh, lse_ptr, stride_ls, stride_lt, H, K, num_slots, block_tokens, parts,
                      logit_scale, kv_scale_ptr, gl.program_id(1).to(gl.int64), start,
                      gl.minimum(start + split_size, K), split, codes_s, rope_s, scale_s, p_s, q_s, q_rope, STAGES,
                      FLAT, OFF32, FP8, ALIGNED, False)


FORMATS = ("fp8_ds_mla", "fp8")  # the record formats this kernel reads (fp8: per-tensor scaled, 576 bytes)


@functools.lru_cache(maxsize=None)
def producer_refusal() -> str:
    """Why this Triton cannot compile the producer launch (``ws``), "" when it can: the launch is written in Gluon's
    ``warp_specialize(functions_and_args, worker_num_warps, worker_num_regs)`` (Triton 3.6, the H200's, and 3.9 compile
    it; earlier releases took the partitions as separate arguments). Asked once a process."""
    params = list(inspect.signature(gl.warp_specialize).parameters)
    if params[:3] != ["functions_and_args", "worker_num_warps", "worker_num_regs"]:
        return (f"Triton {triton.__version__}'s gl.warp_specialize takes ({', '.join(params[:3])}, ...), not the "
                "(functions_and_args, worker_num_warps, worker_num_regs) the producer launch is written in")
    return ""


def refusal(q: torch.Tensor, kv_pages: torch.Tensor, kv_fmt: str, slots: torch.Tensor | None = None) -> str:
    """Why this kernel does not take the call ("" when it does): the Gluon few-heads kernels' shared conditions
    (:func:`.sparse_mla_gluon.records_refusal`) on fp8_ds_mla or per-tensor FP8 records. The route's verifier
    reports this reason; the launcher raises on it."""
    if kv_fmt not in FORMATS:
        return f"{kv_fmt} latents: the wgmma few-heads kernel reads {' or '.join(FORMATS)} records"
    return records_refusal(q, kv_pages, kv_fmt, slots, "the wgmma few-heads kernel", fmt=kv_fmt, max_heads=None)


def serves(q: torch.Tensor, kv_pages: torch.Tensor, kv_fmt: str) -> bool:
    """Whether this kernel takes the call (:func:`refusal` has no reason)."""
    return not refusal(q, kv_pages, kv_fmt)


@bounded_partials
def sparse_mla_wgmma(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, *, stages=DEFAULT_STAGES,
                     split_size=DEFAULT_SPLIT_SIZE, maxnreg=None, programs=None, ws=False, producer_regs=None):
    """Launch :func:`sparse_mla_wgmma_kernel` (a call :func:`serves` refuses raises, naming what it got).

    Args:
        q: ``[T, H, 576]`` bf16 on a CUDA device, any ``H`` (groups of 16 heads, one program each: every group
            gathers the slots' records again; the L2 serves some of them).
        kv_pages: ``[num_blocks, block_tokens, 656]`` uint8 fp8_ds_mla pages or ``[.., 576]`` per-tensor FP8 ones,
            records 16-byte aligned (any strides that keep them so: a view into a packed cache is read in place).
        slots: ``[T, K]`` int32/int64 physical slots; -1 or out of range = skipped.
        kv_fmt: ``"fp8_ds_mla"`` or ``"fp8"``.
        kv_scale: ``"fp8"``: the ``[]`` fp32 tensor scale on q's device (read in the kernel); else None.
        softmax_scale: float.
        stages: 64-slot steps whose gathers are in flight at once, 2 or 3 (41 KB of shared memory each: two
            stages let two programs share a SM).
        split_size: slots per split, a fixed count (batch invariance); None = one split a token.
        maxnreg: ptxas's register cap (None: its own choice).
        programs: the balanced schedule (:mod:`.balanced`; default mode only: its split points follow the batch):
            this many programs in all (as many as run at once; divided among the groups of 16 heads) share the
            call's 64-slot steps (``split_size`` then unused); None: fixed splits.
        ws: a producer warpgroup gathers the records, one computes (``WS``; the same results bit for bit; two
            stages only).
        producer_regs: (``ws``) the producer's registers a thread (the computing warpgroup gets 256 less them,
            under a launch cap of 128: two programs a SM).

    Returns:
        ``(o [T, H, 512] bf16, lse [T, H] fp32)``.
    """
    name = "triton sparse_mla_wgmma"
    why = refusal(q, kv_pages, kv_fmt)
    if why:
        raise unserved(name, q, kv_pages, kv_fmt, why, fmt=kv_fmt if kv_fmt in FORMATS else FORMATS[0],
                       max_heads=None)
    fp8 = kv_fmt == "fp8"
    if fp8 and not (isinstance(kv_scale, torch.Tensor) and kv_scale.dtype == torch.float32
                    and kv_scale.numel() == 1 and kv_scale.device == q.device):
        got = (f"{kv_scale.dtype} {list(kv_scale.shape)} on {kv_scale.device}" if isinstance(kv_scale, torch.Tensor)
               else type(kv_scale).__name__)
        raise ValueError(f"{name}: kv_scale expected a float32 tensor of one element on {q.device} for fp8 "
                         f"latents, got {got}")
    tokens, heads, _ = q.shape
    check_launch(name, heads, 64, split_size, max_heads=None)
    if stages not in (2, 3):
        raise ValueError(f"{name}: stages expected 2 or 3, got {stages}")
    if ws and producer_refusal():
        raise ValueError(f"{name}: ws (the producer warpgroup) needs another Triton: {producer_refusal()}")
    if ws and stages != 2:  # (two stages keep two programs a SM; the only launch checked on a GPU)
        raise ValueError(f"{name}: ws (the producer warpgroup) expected stages=2, got stages={stages}")
    if ws and producer_regs is not None and (not isinstance(producer_regs, int) or not 24 <= producer_regs <= 128
                                             or producer_regs % 8):
        raise ValueError(f"{name}: producer_regs expected a multiple of 8 in 24..128 (setmaxnreg's steps), "
                         f"got {producer_regs!r}")
    programs = programs_per_group(name, programs, heads, HEAD_GROUP)
    k = slots.shape[1]
    q, slots, split_size, splits, o, lse = unit_stride_and_outputs(q, slots, split_size, programs)
    if tokens == 0 or heads == 0:
        return o[0].to(q.dtype), lse[0]
    meta = dict(STAGES=stages, FP8=fp8, ALIGNED=splits == 1 or split_size % 64 == 0, BALANCED=False, num_warps=4,
                WS=bool(ws), PRODUCER_REGS=producer_regs or DEFAULT_PRODUCER_REGS,
                **({"maxnreg": maxnreg} if maxnreg else {}))
    if ws:  # the launch's cap: 8 warps x 128 registers, two programs a SM (setmaxnreg moves them to the warpgroup)
        meta.setdefault("maxnreg", 128)
    # (fp8_ds_mla: the kernel reads no tensor scale; q stands in for the pointer)
    scale_arg = kv_scale.reshape(()) if fp8 else q
    sizes = (heads, k, split_size, softmax_scale * LOG2E, scale_arg, tokens, splits)
    return launch_over_tokens(sparse_mla_wgmma_kernel, q, kv_pages, slots, o, lse, splits, sizes, meta,
                              record_bytes=RECORD_BYTES[kv_fmt], head_group=HEAD_GROUP, programs=programs)


# the launch cache (dsahal.kernel_launch) for this module's kernel: 33-80 us less host time a call than Triton's own
# launch of a Gluon kernel (H200, twenty-first session, scripts/h200/gluon_launch.py), the same outputs bit for bit
wrap_launched(globals())
