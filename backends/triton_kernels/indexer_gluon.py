"""Paged indexer score on FP8 and MXFP4 keys in Gluon: whole key tiles copied into shared memory, asynchronous MMAs.

Same contract as :func:`dsahal.backends.triton_kernels.indexer.indexer_score` for the calls this kernel takes
(:func:`refusal`): FP8 or bf16 queries ``[T, H <= 64, 128]`` on FP8 keys (132-byte records: 128 e4m3 codes, then the
fp32 key scale) or MXFP4 keys (68-byte records: 64 bytes of e2m1 pairs, then four UE8M0 scales, one a 32-dim block)
in packed pages whose blocks hold a multiple of 64 tokens at 16-byte aligned block starts, on an sm_90 GPU;
``score[t, s] = Σ_h w[t, h] · relu(q[t, h] · k[s]) · scale[s]`` (MXFP4: the block scales inside the dot product), -inf
past a token's position, on unmapped blocks and past ``max_context``.

Why a second block-tile kernel (:mod:`.indexer_decode` is the ``tl`` one). On the H200 (BENCHMARKS.md, eighteenth
session) the ``tl`` kernel reads keys at 83% of the copy ceiling at one token a request but 75% at two and 46% at
five, and Nsight Compute named two limits that ``tl`` cannot lift:

- at 1-2 tokens the L2 is the busiest unit (92-94%): every key byte is asked of it twice (the load and an L2 hint
  that keeps enough bytes in flight), and a record's 128 code bytes, 4-byte aligned, span five 32-byte sectors;
- at 5 tokens each token's MMA is waited on before its epilogue (``tl.dot`` outside a pipelined loop is
  synchronous), so a warp's five MMAs and five epilogues run one after another.

Here a 64-key tile (8,448 contiguous bytes inside one cache block) is copied whole into shared memory by 16-byte
``cp.async`` pieces, ``STAGES - 1`` tiles ahead (no hint: the copies themselves are the bytes in flight, each
sector asked for once), and read back through a padded shared layout (a row every 132 bytes, :func:`_code_layout`)
straight into the FP8 ``wgmma``'s register operand: the dims of a row are permuted (the same permutation on the
queries, so every dot product is the same sum) so that a thread's 32 bytes of a row are contiguous and a warp's
reads hit 32 different banks. The tokens' MMAs are issued asynchronously, ``DEPTH`` (2) in flight: token ``g``'s
epilogue (relu, head weights, the head sum, the key scale, the store) runs while token ``g + 1``'s MMA runs. bf16
queries are split per head into two exact e4m3 parts (:func:`_hi_lo`, as the ``tl`` kernel's flag 128): two MMAs a
token, or (``STACK``, the backend's launch since the twenty-second session) one MMA of twice the heads whose hi and lo
sums land in separate accumulator columns (the same sums, 10% fewer loop instructions at 2 tokens, 1.00-1.02x). Stages
are 8,448 bytes exactly (twentieth session: 16 KiB ones held 3 programs a SM at 2 tokens, these 5).

MXFP4 keys (``MX``, twentieth session): a 4,352-byte tile copied the same way; each tile's e2m1 codes are shifted into
e4m3 bytes (the code's value times 2^-6, exactly) in registers, a code word into two e4m3 words, and stored as the A
operands of four K = 32 MMAs, one a 32-dim scale block (:func:`_mx_operands`; the queries' dims in the same order,
:func:`mx_dim`), each into its own accumulator, the block scales then applied per key (Hopper's MMAs have no block
scales). bf16 queries: hi and lo parts a block, the lo MMA chained onto the hi one's accumulator (the ``tl`` kernel's
MXFP4 choice: four accumulators instead of eight). Since the twenty-third session (``MX_REG``, the backend's launch)
each lane decodes its rows' code word of each block straight into the FP8 wgmma's register operand
(:func:`_mx_registers`, column order :func:`mx_reg_dim`): no shared-memory round trip, no fence or barrier a tile,
1.11-1.19x on the H200.

``MX_FOLD`` (twenty-ninth session, the backend's MXFP4 launch since its R1 on the H200: 1.38x / 1.43x the unfolded
launch at 64 x 5 / the prefill with FP8 queries, 1.17-1.20x with bf16 ones from 2 tokens a request, 1.00x at 1; the
same checks against the float64 reference): each key's four block scales folded into its
decoded codes (:func:`_folded_tile_scores`): block ``b`` decoded through a per-key table as its values times
``2^(6 - (top - e_b))`` (``top`` the key's largest scale byte; :func:`_e2m1_folded`, two ``prmt`` byte lookups and two
sign gathers a code word), exact in e4m3 while a key's scales span at most ``FOLD_SPAN`` (11) binades, so the four
blocks' MMAs chain into one accumulator and the key's common factor ``2^(top - 133)`` goes on its score after the head
sum: no FMUL and three FFMA a score a token, one accumulator's registers. A tile holding a wider key is decoded at
distance 0 and scored block by block, one MMA at a time (:func:`_spread_tile_tokens`, the exact block scales), a
branch the whole warpgroup takes (each warp reads all 64 keys' scale words to decide it: no barrier). sm_90 (Triton
3.6), the fast path's main loop a 64-key tile: 271 / 318 / 478 instructions at 1 / 2 / 5 tokens with FP8 queries
against the unfolded launch's 284 / 398 / 753, 79 / 138 / 166 registers against 119 / 136 / 203 (bf16 queries 279 /
351 / 562 against 292 / 444 / 835, 79 / 150 / 206 registers against 119 / 181 / 246).

Keys are the MMA's M side (64 a tile), one token's heads its N side (``BLOCK_H``: the heads padded to a power of two
>= 16); the queries sit in shared memory (the ``wgmma`` B operand), one ``[BLOCK_H, 128]`` buffer a token (two for
bf16), loaded once a program, with the head weights. Every score is one key, one token: the same arithmetic whatever
the batch holds. (Not bit-equal to the ``tl`` kernel's, whose k order differs: the backend uses this kernel in default
mode only, where it measured faster: FP8 keys at every call length since the twenty-fifth session, 1-2 tokens a
request before (nineteenth and twentieth), MXFP4 keys at 1-2 tokens; BENCHMARKS.md.) ``TSTACK`` (FP8 queries) stacks
2 or 4 tokens of a segment on one MMA's N side, DeepGEMM's operand layout (:func:`_stacked_tile`): the same sums, 8
MMAs a 5-token tile instead of 20, not the backend's launch (no faster on the H200: the MMAs do not bound it).

``HSUM`` (twenty-sixth session; the backend's launch from 3 tokens a request with FP8 keys, and for MXFP4 keys): each
token's head sum on the tensor cores. Its relu'd accumulator ``[64, BLOCK_H]`` is the register A operand of a tf32
``wgmma`` (N = 8) against one ``[8, BLOCK_H]`` shared buffer of the segment's head weights (row ``g`` token ``g``'s,
rounded to tf32 once), whose column ``g`` is then token ``g``'s ``Σ_h w[h] · relu(acc[:, h])`` (:func:`_relu_operand`:
the reorder of a lane's columns into the operand's k order moves no data). It replaces a thread's 16-32 chained
``FFMA`` a token, the two shuffle rounds and the weights' shared-memory reads (the sm_90 loop 25-29% shorter); the
MMA reads each relu'd score as tf32 (low 13 mantissa bits dropped), so scores are within ~5e-4 of the reference
(normwise) instead of ~1.3e-4. Token ``g``'s scores are stored after token ``g + 1``'s MMA and ``g``'s head sum are
issued (:func:`_pending` counts the commit groups each wait leaves in flight).

``WS`` (twenty-seventh session; not the backend's launch): warp-specialised, one producer warp copying each tile
(``cp.async``, each lane's completion an arrival on the stage's ``full`` mbarrier, :func:`_ws_produce`) and the
warpgroup scoring (:func:`_ws_consume`: it waits for its stage's bytes only and frees the stage on ``empty`` once read
into registers), no CTA barrier a tile. Correct on the H200 on every edge case of the sweep, but 0.96-0.99x the
backend's launches: the program has 8 warps (``setmaxnreg`` works on warpgroups, so the producer's is padded), which
at 80 launch registers (the consumers 136) holds 3 programs a SM instead of 4, and the consumer's loop is only 8%
shorter (301 instructions a tile against 327; BENCHMARKS.md).

Grid and segments as :mod:`.indexer_decode`: axis 0 the segments (up to ``GROUP`` consecutive tokens of one request;
programs past the live ones exit), axis 1 chunks of ``n_tiles`` key tiles. Gluon has no interpreter: a CPU machine
compiles this kernel for sm_90 with Triton 3.6 (``python -m dsahal.backends.nvidia.aot --only "indexer Gluon"``; 3.9's
Gluon refuses its padded view, :func:`compile_failure`); its scores are checked on the H200 against the float64
reference (``scripts/h200/indexer_alu_sweep.py``, ``scripts/h200/mxfp4_indexer_sweep.py``) and by the conformance
suite through ``indexer_score``.
"""
from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mbarrier
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from dsahal.kernel_launch import triton_launch, wrap_launched

from . import grid as grid_limits
from .indexer_decode import expected_segments, runs_ptx, tiles_per_program
from .topk_groups import check_producer_maxima  # (maxima: whole groups of a 64-key tile, topk_groups.MAXIMA_GROUPS)

# Triton 3.6 (the H200's) names the copy async_copy_global_to_shared; later releases renamed it async_load
_async_copy = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # (renamed barrier the same way)

SIZE_ARGS = ("T", "max_context", "num_blocks", "max_blocks", "block_tokens", "n_tiles")
TILE = 64  # keys per tile: the wgmma's M
RECORD_BYTES = 132  # an FP8 key: 128 e4m3 codes, then its fp32 scale
MAX_HEADS = 64
MAX_GROUP = 8
DEFAULT_STAGES = 5
MAX_STAGES = 6

# A stage: one tile's 64 records as copied, 64 rows of 33 words (the 32 code words, then the scale word): 8,448 bytes
# exactly, a [2048]-word buffer whose padding (one word every 32 and one more every 1024) adds the 64 words past 2048
# (Gluon shapes are powers of two; 16 KiB stages held 3 programs a SM at 2 tokens, these 5: BENCHMARKS.md, twentieth
# session). Each stage its own buffer: the compiler's barrier analysis sees a buffer as a whole, so copies into one
# stage and reads of another need no barrier between them, and the loop over tiles is unrolled by the stage count
# (static buffer choice). A tile is copied as 512 pieces of 16 bytes and then 16 more (a masked cp.async piece still
# writes, zeros: one masked copy would need a larger buffer); the compiler puts a barrier between the two copies.
STAGE_WORDS = gl.constexpr(2048)  # + 64 padding words = 2,112 = 64 x 33
_STAGE = gl.constexpr(gl.PaddedSharedLayout([[32, 1], [1024, 1]], [[1 << b] for b in range(11)], [], [2048]))
_LINEAR = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
# MXFP4 keys (MX): 68-byte records (64 bytes of e2m1 pairs, then 4 UE8M0 block scales), a tile 64 rows of 17 words
# (4,352 bytes), a [1024]-word stage padded to 1,088 words as above, copied as 256 pieces and then 16
MX_RECORD_BYTES = 68
RECORDS = {"fp8": RECORD_BYTES, "mxfp4": MX_RECORD_BYTES}  # bytes a key, by index format
MX_STAGE_WORDS = gl.constexpr(1024)  # + 64 padding words = 1,088 = 64 x 17
_MX_STAGE = gl.constexpr(gl.PaddedSharedLayout([[16, 1], [512, 1]], [[1 << b] for b in range(10)], [], [1024]))
# a lane: word c of each block of a row (single words: rows 17 words apart are 4-byte aligned only; a layout with 4
# words a lane in a row compiled to 16-byte shared loads there, misaligned on the H200)
_MX_WORDS = gl.constexpr(gl.BlockedLayout([1, 1], [8, 4], [4, 1], [1, 0]))
# (MX_REG) a block's code words repeated over their 4 bytes, [64 keys, 4 c, 4 e]: a lane's rows as the FP8 wgmma's
# register operand takes them (16 w + r, + 8), word c of the block
_MX_REG_BYTES = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [0, 0, 2], [8, 0, 0]], lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
    warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 4, 4]))
# (MX_FOLD) a key's block scales folded into its decoded codes: the e4m3 bytes of e2m1 magnitudes 0-3 and 4-7 times 2^6
# (:func:`_fold_tables`), and the widest span of a key's four scale exponents the fold takes (every e2m1 value times
# 2^(6 - d) is a normal e4m3 number for d <= 11); a tile holding a wider key is scored block by block
FOLD_TABLE_LOW = gl.constexpr(0x6C686000)
FOLD_TABLE_HIGH = gl.constexpr(0x7C787470)
FOLD_SPAN = gl.constexpr(11)
# (MX_FOLD) the decode of :func:`_e2m1_folded`: $2 a code word, $6 / $10 its block's tables, $0 / $1 codes 0-3 / 4-7
FOLD_DECODE_PTX = gl.constexpr(
    "{\n\t.reg .b32 m, mh, w4, s;"
    "\n\tand.b32 m, $2, 0x77777777;\n\tshr.b32 mh, m, 16;"
    "\n\tprmt.b32 $0, $6, $10, m;\n\tprmt.b32 $1, $6, $10, mh;"
    "\n\tshl.b32 w4, $2, 4;"
    "\n\tprmt.b32 s, w4, $2, 0x5140;\n\tand.b32 s, s, 0x80808080;\n\tor.b32 $0, $0, s;"
    "\n\tprmt.b32 s, w4, $2, 0x7362;\n\tand.b32 s, s, 0x80808080;\n\tor.b32 $1, $1, s;\n\t}")
_COPY = gl.constexpr(gl.BlockedLayout([4], [32], [4], [0]))  # 16-byte pieces, 4 words a lane
_COPY_WARP = gl.constexpr(gl.BlockedLayout([4], [32], [1], [0]))  # (the same from one warp: WS's producer)
# relu keeps a NaN logit NaN (as the reference's torch.relu; PTX's plain max would return 0 for it)
_NAN_KEPT = gl.constexpr(triton.language.PropagateNan.ALL)


@gluon.jit
def _view_new(desc, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    return desc.reinterpret(dtype, shape, layout)


@gluon.jit
def _view_old(desc, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    return desc._reinterpret(dtype, shape, layout)


# a shared buffer seen with another type, shape and layout (Triton 3.6, the H200's, names it _reinterpret; later
# releases reinterpret): the unused one is never compiled
_view = _view_new if hasattr(gl.shared_memory_descriptor, "reinterpret") else _view_old


@gluon.constexpr_function
def _code_layout():
    """The codes of a stage as e4m3 ``[64 keys, 128 k]``: rows 132 bytes apart, and the MMA's k index permuted within
    a row. The FP8 ``wgmma`` register operand gives lane ``c = lane % 4`` the k indices ``32 s + 16 h + 4 c + b``
    (k-step s < 4, half h < 2, byte b < 4); they are read from byte ``32 c + 8 s + 4 h + b`` of the record (the bit
    permutation below, offset bit -> k bit), so a thread reads 8 consecutive words of each of its rows and the 32
    lanes of a warp (8 rows 33 words apart, c 8 words apart) read 32 different banks. :func:`dim_of_k` is the same
    permutation for the queries."""
    k_of_offset = [[0, 1], [0, 2], [0, 16], [0, 32], [0, 64], [0, 4], [0, 8]]
    rows = [[1 << r, 0] for r in range(6)]
    return gl.PaddedSharedLayout([[128, 4]], k_of_offset + rows, [], [64, 128])


@gluon.constexpr_function
def _scale_layout():
    """The 64 key scales of a stage as fp32 ``[64]``, viewed from its word 32: key ``r``'s at word ``32 + 33 r``."""
    return gl.PaddedSharedLayout([[1, 32]], [[1 << r] for r in range(6)], [], [64])


@gluon.constexpr_function
def _mma_layout(block_h):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, block_h, 32])


@gluon.constexpr_function
def _query_layout():
    return gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0])


@gluon.jit
def dim_of_k(k):
    """The record byte (dim) the MMA's k index ``k`` reads (:func:`_code_layout`): bits (b, c, h, s) of ``k`` =
    (bits 0-1, 2-3, 4, 5-6) -> ``32 c + 8 s + 4 h + b``."""
    return (k & 3) | (((k >> 4) & 1) << 2) | (((k >> 5) & 3) << 3) | (((k >> 2) & 3) << 5)


@gluon.jit
def _entry(block_table_ptr, stride_bt, req, tile, max_blocks, block_tokens, WHOLE: gl.constexpr):
    """Block-table entry of key tile ``tile`` (-1 past the table); ``WHOLE``: a tile is a whole block."""
    if WHOLE:
        logical = tile
    else:
        logical = tile * 64 // block_tokens
    in_table = logical < max_blocks
    entry = gl.load(block_table_ptr + req * stride_bt + gl.where(in_table, logical, 0))
    return gl.where(in_table, entry, -1)


@gluon.jit
def _issue(pages_i32, s32_b, entry, tile, num_blocks, block_tokens, stage, WHOLE: gl.constexpr, MX: gl.constexpr,
           COPY: gl.constexpr = _COPY):
    """Start the copy of key tile ``tile`` (in cache block ``entry``; an unmapped one reads block 0, scored -inf
    after) into ``stage``: its 528 pieces of 16 bytes (272 with ``MX``), 4-5 a thread of a warpgroup (``COPY``
    :data:`_COPY`), 16-17 a lane of one warp (:data:`_COPY_WARP`, the warp-specialised kernel's producer)."""
    WORDS: gl.constexpr = MX_STAGE_WORDS if MX else STAGE_WORDS
    RECORD: gl.constexpr = 17 if MX else 33  # words a record
    mapped = (entry >= 0) & (entry < num_blocks)
    block = gl.where(mapped, entry, 0).to(gl.int64)
    if WHOLE:
        key0 = 0
    else:
        first = tile * 64
        key0 = first - (first // block_tokens) * block_tokens
    src = pages_i32 + gl.multiple_of(block * s32_b + key0 * RECORD, 4)  # (16-byte aligned: the launcher checks)
    word = gl.arange(0, WORDS, COPY)
    _async_copy(_view(stage, gl.int32, [WORDS], _LINEAR), src + word)  # words 0..WORDS-1, then the 64 after
    tail = gl.arange(0, 64, COPY)
    _async_copy(_words(stage, WORDS).slice(WORDS, 64), src + WORDS + tail)


@gluon.jit
def _words(stage, WORDS: gl.constexpr):
    """A stage as linear int32 words from its start (``[2 * WORDS]``: a view to slice; words past the tile's are
    never touched)."""
    return _view(stage, gl.int32, [2 * WORDS], _LINEAR)


@gluon.jit
def _member(req_ptr, pos_ptr, off_ptr, t0, g: gl.constexpr, T, req, off0):
    """Token ``t0 + g``: (whether it belongs to the segment, its position; -1 when not). The Gluon twin of
    :func:`.indexer_decode._member` (a Gluon kernel cannot call a ``tl`` function)."""
    t = t0 + g
    inside = t < T
    tt = gl.where(inside, t, t0)
    ok = inside & (gl.load(req_ptr + tt) == req) & (gl.load(off_ptr + tt) == off0 + g)
    pos = gl.where(ok, gl.load(pos_ptr + tt), -1)
    return ok, pos


@gluon.jit
def _hi_lo(x):
    """bf16 query rows ``x`` (fp32 ``[BLOCK_H, 128]``) -> (hi, lo e4m3, down ``[BLOCK_H]``) with ``hi + lo / 16 = x ·
    up`` and ``down = 1 / up`` a power of two a row (NaN for a row holding Inf or NaN): two FP8 MMAs on the e4m3 keys
    then give the bf16 query's dot products from exact products. The same split as the ``tl`` kernel's
    (:func:`.indexer_decode._e4m3_hi_lo`, whose docstring has the exactness argument; ``LO_SCALE`` 16): ``up`` puts a
    row's largest magnitude in [2^7, 2^8); ``hi`` keeps 4 significant bits (rounded to nearest even on the fp32 bits,
    0 below 2^-6), ``lo`` 16 x the residual to multiples of 2^-9; no conversion rounds."""
    up, down = _row_scale(_row_amax(x))
    hi, lo = _split(x, up, 16.0)
    return hi, lo, down


@gluon.jit
def _row_amax(x):
    """Largest magnitude of each row of ``x`` ``[R, D]`` -> ``[R]``, Inf for a row holding NaN."""
    return gl.max(gl.where(x == x, gl.abs(x), float("inf")), axis=1)


@gluon.jit
def _row_scale(amax):
    """(up, down): per row a power of two putting ``amax`` in [2^7, 2^8), and its inverse (NaN where ``amax`` is
    Inf: a row holding Inf or NaN, whose e4m3 parts would hide it)."""
    biased = (amax.to(gl.int32, bitcast=True) >> 23) & 0xFF
    field = gl.minimum(261 - biased, 253)  # exponent field of 2^(134 - biased): amax * up in [2^7, 2^8)
    up = (field << 23).to(gl.float32, bitcast=True)
    down = ((254 - field) << 23).to(gl.float32, bitcast=True)
    return up, gl.where(amax < float("inf"), down, float("nan"))


@gluon.jit
def _split(x, up, LO: gl.constexpr):
    """Rows ``x`` (fp32 ``[R, D]``) times their ``up`` -> e4m3 (hi, lo) with ``hi + lo / LO`` the scaled rows: hi 4
    significant bits, lo ``LO`` x the residual to multiples of 2^-9 (exact for values above 2^-13 of the row's
    largest with ``LO`` 16, above 2^-9 with 1: the MXFP4 keys' chained MMAs, as the ``tl`` kernel's)."""
    scaled = x * up[:, None]
    bits = scaled.to(gl.int32, bitcast=True)
    hi = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(gl.float32, bitcast=True)
    hi = gl.where(gl.abs(scaled) >= 0.015625, hi, 0.0)
    rest = (scaled - hi) * LO
    lo = gl.floor(rest * 512.0 + 0.5) * 0.001953125
    return hi.to(gl.float8e4nv), lo.to(gl.float8e4nv)


@gluon.jit
def _codes(stage, DOT_A: gl.constexpr):
    """A stage's keys as the MMA's register operand (e4m3 ``[64, 128]``, k permuted: :func:`_code_layout`)."""
    return _view(stage, gl.float8e4nv, [64, 128], _code_layout()).load(DOT_A)


@gluon.jit
def _scales(stage, ROWS: gl.constexpr):
    """A stage's 64 key scales (fp32 ``[64]`` in ``ROWS``)."""
    return _view(_words(stage, STAGE_WORDS).slice(32, 32), gl.float32, [64], _scale_layout()).load(ROWS)


@gluon.constexpr_function
def _mx_code_layout():
    """The e2m1 pairs of an MXFP4 stage as int32 ``[64 keys, 16 words]``: rows 17 words apart (the 17th word holds the
    record's four UE8M0 scales)."""
    return gl.PaddedSharedLayout([[16, 1]], [[0, 1], [0, 2], [0, 4], [0, 8]] + [[1 << r, 0] for r in range(6)], [],
                                 [64, 16])


@gluon.constexpr_function
def _mx_scale_layout():
    """The 64 scale words of an MXFP4 stage as int32 ``[64]``, viewed from its word 16: key ``r``'s at word
    ``16 + 17 r``."""
    return gl.PaddedSharedLayout([[1, 16]], [[1 << r] for r in range(6)], [], [64])


@gluon.jit
def mx_dim(k):
    """The dim (within its 32-dim block) that byte ``k`` of a block's decoded row holds (:func:`_mx_operands`): byte
    ``4 w + b`` of word ``w = 2 c + h`` is code ``2 b + h`` of the block's code word ``c``, dim ``8 c + 2 b + h``."""
    return 8 * (k >> 3) + 2 * (k & 3) + ((k >> 2) & 1)


@gluon.jit
def _ue8m0(byte):
    """UE8M0 bytes (int32 ``[64]``) -> fp32 ``2^(byte - 127)`` (byte 0: 2^-127, a subnormal; 255: NaN, the OCP MX
    NaN scale, as the reference decodes it)."""
    return gl.where(byte == 0, 0x00400000, gl.where(byte == 255, 0x7FC00000, byte << 23)).to(gl.float32, bitcast=True)


@gluon.jit
def _mx_operands(stage, a_blocks, ROWS: gl.constexpr):
    """Decode an MXFP4 stage into the four 32-dim blocks' MMA operands and return the blocks' scales.

    Each e2m1 code (sign, 2 exponent bits, 1 mantissa bit) shifted into an e4m3 byte's sign and low magnitude bits is
    exactly the code's value times 2^-6 (subnormal codes included: both formats' subnormal steps then coincide), so
    a code word (8 codes, 4 bytes) becomes two e4m3 words by four shifts and masks: the low nibbles (codes 2b) and the
    high ones (2b + 1). They are stored, block by block, into ``a_blocks`` (e4m3 ``[4, 64, 32]``, the A operands of
    four K = 32 MMAs), word ``2 c + h`` of a block's row holding code word ``c``'s half ``h`` (:func:`mx_dim`: the
    queries' dims the same way). Returns the four scales (fp32 ``[64]`` each, in ``ROWS``); the 2^-6 is undone on
    the score."""
    w = _view(stage, gl.int32, [64, 16], _mx_code_layout()).load(_MX_WORDS)
    signs = -2139062144  # 0x80808080 as int32
    lo = ((w << 2) & 0x1C1C1C1C) | ((w << 4) & signs)
    hi = ((w >> 2) & 0x1C1C1C1C) | (w & signs)
    v = gl.reshape(gl.join(lo, hi), [64, 4, 4, 2])  # row, block, code word in the block, half
    v = gl.reshape(gl.permute(v, (1, 0, 2, 3)), [256, 8])  # (block, row) a row of 8 words (the 32 bytes)
    # (a [256, 32]-byte view of the [4, 64, 32] buffer: the same 32-byte swizzle, whose phase repeats every 8 rows)
    _view(a_blocks, gl.int32, [256, 8], gl.NVMMASharedLayout(32, 32)).store(v)
    return _mx_scales(stage, ROWS)


@gluon.jit
def _mx_scales(stage, ROWS: gl.constexpr):
    """An MXFP4 stage's four block scales (fp32 ``[64]`` each, in ``ROWS``)."""
    scales = _view(_words(stage, MX_STAGE_WORDS).slice(16, 16), gl.int32, [64], _mx_scale_layout()).load(ROWS)
    return (_ue8m0(scales & 0xFF), _ue8m0((scales >> 8) & 0xFF), _ue8m0((scales >> 16) & 0xFF),
            _ue8m0((scales >> 24) & 0xFF))


@gluon.jit
def mx_reg_dim(k):
    """The dim (within its 32-dim block) that column ``k`` of a block's register operand holds
    (:func:`_mx_registers`): ``k = e + 4 c + 16 a`` is nibble ``a`` of byte ``e`` of the block's code word ``c``, dim
    ``8 c + 2 e + a``."""
    return 8 * ((k >> 2) & 3) + 2 * (k & 3) + (k >> 4)


@gluon.jit
def _e2m1_as_e4m3(words):
    """Code words (int32, each repeated over a last axis of 4) -> (low nibbles, high nibbles) as e4m3: element ``e`` of
    the four is the code in byte ``e`` of the word times 2^-6, exactly (the sign and the 3 magnitude bits shifted into
    an e4m3 byte's sign and low magnitude bits: :func:`_mx_operands`'s decode)."""
    return gl.inline_asm_elementwise(
        "{\n\t.reg .b32 a, b;"
        "\n\tshl.b32 a, $2, 2;\n\tand.b32 a, a, 0x1C1C1C1C;\n\tshl.b32 b, $2, 4;\n\tand.b32 b, b, 0x80808080;"
        "\n\tor.b32 $0, a, b;"
        "\n\tshr.b32 a, $2, 2;\n\tand.b32 a, a, 0x1C1C1C1C;\n\tand.b32 b, $2, 0x80808080;\n\tor.b32 $1, a, b;\n\t}",
        "=r,=r,r,r,r,r", [words], dtype=(gl.float8e4nv, gl.float8e4nv), is_pure=True, pack=4)


@gluon.jit
def _mx_registers(stage, DOT_A: gl.constexpr):
    """An MXFP4 stage's keys as the four 32-dim blocks' register A operands (e4m3 ``[64, 32]`` each, the code values
    times 2^-6, columns in :func:`mx_reg_dim` order): each lane reads its rows' code word ``c`` of each block and
    decodes it in place, no shared-memory round trip (``_mx_operands`` stores the decoded keys for the MMAs to read)."""
    words = _view(stage, gl.int32, [64, 16], _mx_code_layout())
    out = ()
    for b in gl.static_range(4):
        w = words.slice(4 * b, 4, dim=1).load(gl.SliceLayout(2, _MX_REG_BYTES))  # [64 keys, 4 c]
        lo, hi = _e2m1_as_e4m3(w[:, :, None] + gl.zeros([64, 4, 4], gl.int32, _MX_REG_BYTES))  # (+ 0: folded)
        v = gl.reshape(gl.permute(gl.join(lo, hi), (0, 3, 1, 2)), [64, 32])  # [key, a, c, e]: k = e + 4 c + 16 a
        out = out + (gl.convert_layout(v, DOT_A, assert_trivial=True),)
    return out


@gluon.jit
def mx_fold_dim(k):
    """(``MX_FOLD``) The dim (within its 32-dim block) that column ``k`` of a block's folded register operand holds
    (:func:`_e2m1_folded`): ``k = e + 4 c + 16 a`` is byte ``e`` of output word ``a`` of the block's code word ``c``,
    its code ``4 a + e``: dim ``8 c + 4 a + e``."""
    return 8 * ((k >> 2) & 3) + 4 * (k >> 4) + (k & 3)


@gluon.jit
def _e2m1_folded(words, lut_low, lut_high):
    """(``MX_FOLD``) Code words (int32, each repeated over a last axis of 4, as :func:`_e2m1_as_e4m3`'s) -> (codes
    0-3, codes 4-7) of each word as e4m3 bytes looked up in a per-key table: ``lut_low`` / ``lut_high`` (int32, the
    same shape) hold the e4m3 bytes of magnitudes 0-3 / 4-7 (:func:`_fold_tables`). A ``prmt`` picks four bytes of
    the eight by four 3-bit magnitudes (the word's low or high 16 bits, signs masked off); a second ``prmt`` gathers
    the four codes' sign bits into their bytes' bit 7 (codes 0 and 2 from the word shifted left by 4, 1 and 3 as
    they are). 9 instructions a word against the shift decode's 7: the table carries the block's scale."""
    return gl.inline_asm_elementwise(FOLD_DECODE_PTX, "=r,=r,r,r,r,r,r,r,r,r,r,r,r,r", [words, lut_low, lut_high],
                                     dtype=(gl.float8e4nv, gl.float8e4nv), is_pure=True, pack=4)


@gluon.jit
def _fold_tables(exponent, top):
    """(``MX_FOLD``) A block's lookup tables (int32 ``(low, high)``) for its scale byte ``exponent``, ``top - exponent
    <= FOLD_SPAN`` binades below its key's largest ``top``: the e4m3 bytes of magnitudes 0-7 (0, 0.5, 1, 1.5, 2, 3, 4,
    6) times ``2^(6 - (top - exponent))``. Every one is a normal e4m3 number (the smallest, 0.5 x 2^-5, is e4m3's
    least normal), so the table is the one at distance 0 with the distance taken off each nonzero byte's exponent
    field (no borrow: each such byte's field is at least 12), one multiply-add a table."""
    distance = top - exponent
    return FOLD_TABLE_LOW - distance * 0x08080800, FOLD_TABLE_HIGH - distance * 0x08080808


@gluon.jit
def _mx_fold_exponents(stage, ROWL: gl.constexpr):
    """(``MX_FOLD``) An MXFP4 stage's four UE8M0 scale bytes a key (int32 ``[64]`` each, in ``ROWL``), their largest,
    and whether they span more than ``FOLD_SPAN`` binades (the key's codes cannot all be folded exactly)."""
    word = _view(_words(stage, MX_STAGE_WORDS).slice(16, 16), gl.int32, [64], _mx_scale_layout()).load(ROWL)
    e0, e1, e2, e3 = word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF, (word >> 24) & 0xFF
    top = gl.maximum(gl.maximum(e0, e1), gl.maximum(e2, e3))
    low = gl.minimum(gl.minimum(e0, e1), gl.minimum(e2, e3))
    return (e0, e1, e2, e3), top, top - low > FOLD_SPAN


@gluon.jit
def _fold_scale(top):
    """(``MX_FOLD``) The factor a folded key's scores take, from its largest scale byte ``top`` (int32 ``[64]``):
    block ``b``'s codes were decoded as their values times ``2^(6 - (top - e_b))``, so its true values are those
    times ``2^(e_b - 127) / 2^(6 - (top - e_b)) = 2^(top - 133)``, the same for every block: ``2^(top - 127)`` from
    the byte's bits (byte 0's raised to 2^-127's, its UE8M0 value, by an integer max; 255 is Inf there), times 2^-6
    plus 0 x itself, which turns 255's Inf into NaN (the OCP MX NaN scale, as the reference decodes it) and leaves
    the rest exact."""
    # (2^-127 as its bits: a subnormal literal would be taken as fp64)
    unit = gl.maximum(top << 23, 0x00400000).to(gl.float32, bitcast=True)
    return gl.fma(unit, 0.015625, unit * 0.0)


@gluon.jit
def _mx_folded_registers(stage, exps, top, DOT_A: gl.constexpr):
    """(``MX_FOLD``) An MXFP4 stage's keys as the four 32-dim blocks' register A operands (e4m3 ``[64, 32]`` each,
    columns in :func:`mx_fold_dim` order), block ``b``'s codes times ``2^(6 - (top - exps[b]))`` (int32 ``[64]`` each,
    in the stage's row slice of the decode layout; ``exps`` all ``top``: every block at distance 0): the same lanes
    and words as :func:`_mx_registers`."""
    words = _view(stage, gl.int32, [64, 16], _mx_code_layout())
    zero = gl.zeros([64, 4, 4], gl.int32, _MX_REG_BYTES)
    out = ()
    for b in gl.static_range(4):
        w = words.slice(4 * b, 4, dim=1).load(gl.SliceLayout(2, _MX_REG_BYTES))  # [64 keys, 4 c]
        low, high = _fold_tables(exps[b], top)
        lo, hi = _e2m1_folded(w[:, :, None] + zero, low[:, None, None] + zero, high[:, None, None] + zero)
        v = gl.reshape(gl.permute(gl.join(lo, hi), (0, 3, 1, 2)), [64, 32])  # [key, a, c, e]: k = e + 4 c + 16 a
        out = out + (gl.convert_layout(v, DOT_A, assert_trivial=True),)
    return out


@gluon.jit
def _epilogue(acc, w_s, key_scale, mapped, s, s0, ok, pos, t, out_ptr, stride_ot, maxima_ptr, stride_mt,
              MAXIMA_G: gl.constexpr, max_context, COLS: gl.constexpr):
    """One token's scores on a tile: ``Σ_h w[h] · relu(acc[:, h]) · scale``, -inf where not visible, stored (and
    their group maxima, :func:`_store_group_maxima`)."""
    relu = gl.maximum(acc, 0.0, propagate_nan=_NAN_KEPT)
    score = gl.sum(relu * w_s.load(COLS)[None, :], axis=1) * key_scale
    value = gl.where(mapped & (s <= pos), score, float("-inf"))
    row = out_ptr + gl.where(ok, t, 0).to(gl.int64) * stride_ot
    gl.store(row + s, value, mask=(s < max_context) & ok)
    if maxima_ptr is not None:
        _store_group_maxima(value, s, s0, ok, t, maxima_ptr, stride_mt, MAXIMA_G, max_context)


@gluon.jit
def _group_maxima_keys(value, s, s0, MAXIMA_G: gl.constexpr, max_context):
    """The fused indexer -> top-k (``maxima_ptr``): scores on a tile's 64 keys ``s`` (``s0`` the first), ``value``
    ``[64]`` or ``[64, C]`` (a column a token) -> the ``64 / MAXIMA_G`` maxima of their groups of ``MAXIMA_G``
    consecutive keys, each column on its own, as the top-k's groups method makes them
    (:func:`.topk_groups.group_max_kernel`: the order-preserving key of the largest score below ``max_context``, -0.0 as
    +0.0, NaN ignored unless all are, 0 for a group with no score above -inf): ``(keys [NG, C], group indices [NG],
    columns [C])``. A group's keys lie in one warp's rows for groups of up to 16 (the MMA layouts give a warp 16
    consecutive rows): a thread's rows, then shuffles, a column per register."""
    NG: gl.constexpr = 64 // MAXIMA_G
    if len(value.shape) == 1:
        value = value[:, None]
    C: gl.constexpr = value.shape[1]
    best = gl.max(gl.reshape(gl.where((s < max_context)[:, None], value, float("-inf")), [NG, MAXIMA_G, C]), axis=1)
    L: gl.constexpr = best.type.layout
    group = s0 // MAXIMA_G + gl.arange(0, NG, gl.SliceLayout(1, L))  # (s0: a multiple of 64)
    col = gl.arange(0, C, gl.SliceLayout(0, L))
    best = gl.where(best == 0.0, 0.0, best)  # (-0.0 and +0.0 one key, as the top-k's _sort_key)
    bits = best.to(gl.int32, bitcast=True)
    key = gl.where(best == float("-inf"), 0, bits ^ ((bits >> 31) | -2147483648))
    return key, group, col


@gluon.jit
def _store_group_maxima(value, s, s0, ok, t, maxima_ptr, stride_mt, MAXIMA_G: gl.constexpr, max_context,
                        COL: gl.constexpr = 0):
    """Token ``t``'s group maxima (:func:`_group_maxima_keys`) stored at ``maxima[t, s // MAXIMA_G]``: its scores
    ``value [64]``, or column ``COL`` of ``value [64, C]`` (every column reduced, one stored)."""
    key, group, col = _group_maxima_keys(value, s, s0, MAXIMA_G, max_context)
    row = maxima_ptr + gl.where(ok, t, 0).to(gl.int64) * stride_mt
    gl.store(row + group[:, None] + col[None, :] * 0, key,
             mask=((group * MAXIMA_G < max_context) & ok)[:, None] & (col == COL)[None, :])


@gluon.jit
def _store_segment_group_maxima(value, s, s0, oks, t0, maxima_ptr, stride_mt, MAXIMA_G: gl.constexpr, max_context,
                                GROUP: gl.constexpr):
    """(``HSUM``) The segment's tokens' group maxima in one reduction: ``value [64, 8]`` holds token ``t0 + g``'s
    scores in column ``g`` (``oks[g]``: whether it is a member), each column reduced on its own
    (:func:`_group_maxima_keys`) and stored at ``maxima[t0 + g, s // MAXIMA_G]``: the same shuffles as one token's."""
    key, group, col = _group_maxima_keys(value, s, s0, MAXIMA_G, max_context)
    member = col < 0
    for g in gl.static_range(GROUP):
        member = member | ((col == g) & oks[g])
    rows = gl.where(member, t0 + col, 0).to(gl.int64) * stride_mt
    gl.store(maxima_ptr + rows[None, :] + group[:, None], key,
             mask=(group * MAXIMA_G < max_context)[:, None] & member[None, :])


@gluon.constexpr_function
def _sum_layout():
    """The head sum's MMA (``HSUM``): tf32 ``wgmma`` of N = 8, K = 8 a step."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 8])


@gluon.jit
def head_of_k(k):
    """The head that the head-sum MMA's k index ``k`` holds (``HSUM``): ``k = 8 i + 4 j + c`` is head ``8 i + 2 c +
    j``, the token MMA's accumulator column that lane ``c`` holds as its tf32 A operand's k index
    (:func:`_relu_operand`; the weights' rows in the same order)."""
    return (k >> 3) * 8 + 2 * (k & 3) + ((k >> 2) & 1)


@gluon.jit
def _relu_operand(acc, BLOCK_H: gl.constexpr):
    """relu of a token's accumulator ``[64, BLOCK_H]`` as the head-sum MMA's tf32 A operand, columns in
    :func:`head_of_k` order: a thread's columns ``8 i + 2 c + j`` of the token MMA's layout are the k indices ``8 i +
    4 j + c`` that the tf32 operand gives lane ``c``, so the reordering moves no data (the conversion is asserted
    trivial)."""
    relu = gl.maximum(acc, 0.0, propagate_nan=_NAN_KEPT)
    a = gl.reshape(gl.permute(gl.reshape(relu, [64, BLOCK_H // 8, 4, 2]), (0, 1, 3, 2)), [64, BLOCK_H])
    return gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=_sum_layout(), k_width=1),
                             assert_trivial=True)


@gluon.jit
def _tf32(x):
    """fp32 -> the nearest tf32 (10 mantissa bits, ties away from zero; NaN and Inf kept), as fp32 bits."""
    return gl.inline_asm_elementwise("cvt.rna.tf32.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def _sum_weights(ws, BLOCK_H: gl.constexpr, GROUP: gl.constexpr, WL: gl.constexpr):
    """The segment's head weights (``ws``: fp32 ``[BLOCK_H]`` in ``WL`` a token) as the head-sum MMA's B operand,
    ``[8, BLOCK_H]`` in shared memory: row ``g`` token ``g``'s weights rounded to tf32, in :func:`head_of_k` order
    (zeros past the segment). Every token's MMA reads the whole buffer; its column ``g`` is its scores."""
    W2: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    rows = gl.zeros([8, BLOCK_H], gl.float32, W2)
    g_of_row = gl.arange(0, 8, gl.SliceLayout(1, W2))
    for g in gl.static_range(GROUP):
        # index 8 i + 2 c + j -> 8 i + 4 j + c (head_of_k's inverse: a register permutation, once a program)
        ordered = gl.reshape(gl.permute(gl.reshape(_tf32(ws[g]), [BLOCK_H // 8, 4, 2]), (0, 2, 1)), [BLOCK_H])
        rows = gl.where((g_of_row == g)[:, None], gl.convert_layout(ordered, gl.SliceLayout(0, W2))[None, :], rows)
    return gl.allocate_shared_memory(gl.float32, [8, BLOCK_H],
                                     gl.NVMMASharedLayout.get_default_for([8, BLOCK_H], gl.float32), rows)


@gluon.jit
def _head_sum_store(out8, g: gl.constexpr, key_scale, mapped, s, s0, ok, pos, t, out_ptr, stride_ot, maxima_ptr,
                    stride_mt, MAXIMA_G: gl.constexpr, max_context):
    """Token ``g``'s scores from its head-sum MMA's result ``out8`` ``[64, 8]`` (column ``g``; the others are its
    relu scores against the other tokens' weights, not stored): times the key scale, -inf where not visible, stored
    (and their group maxima, :func:`_store_group_maxima`, unless ``maxima_ptr`` is None); returned (``[64, 8]``, the
    other columns as they are)."""
    cols = gl.arange(0, 8, gl.SliceLayout(0, _sum_layout()))
    value = gl.where((mapped & (s <= pos))[:, None], out8 * key_scale[:, None], float("-inf"))
    row = out_ptr + gl.where(ok, t, 0).to(gl.int64) * stride_ot
    gl.store(row + s[:, None] + cols[None, :] * 0, value, mask=((s < max_context) & ok)[:, None] & (cols == g)[None, :])
    if maxima_ptr is not None:
        _store_group_maxima(value, s, s0, ok, t, maxima_ptr, stride_mt, MAXIMA_G, max_context, g)
    return value


@gluon.jit
def _block(a, b: gl.constexpr, MX_REG: gl.constexpr):
    """Block ``b``'s keys as an MMA's A operand: a register tensor of ``a`` (``MX_REG``) or a shared buffer of it."""
    if MX_REG:
        return a[b]
    else:
        return a.index(b)


@gluon.jit
def _token_mmas(a, qs, qs_lo, g: gl.constexpr, zeros, HI_LO: gl.constexpr, MX: gl.constexpr, STACK: gl.constexpr,
                MX_REG: gl.constexpr = False, CHAINED: gl.constexpr = False):
    """Token ``g``'s MMA(s) on the tile's keys ``a``, issued asynchronously: one, or (``HI_LO``) the hi and lo parts'
    into separate accumulators (chained, the FP8 accumulator's precision cost 4.3e-4 relative error on the H200), or
    (``STACK``) into separate columns of one (``zeros`` then ``[64, 2 BLOCK_H]``)."""
    if STACK:
        out = warpgroup_mma(a, qs[g].permute((1, 0)), zeros, use_acc=False, is_async=True)
    elif CHAINED:  # (MX_FOLD) every block's MMA (hi then lo with HI_LO) into one accumulator: one handle
        out = zeros
        for b in gl.static_range(4):
            out = warpgroup_mma(_block(a, b, MX_REG), qs[g][b].permute((1, 0)), out, use_acc=b > 0, is_async=True)
            if HI_LO:
                out = warpgroup_mma(_block(a, b, MX_REG), qs_lo[g][b].permute((1, 0)), out, is_async=True)
    elif MX and HI_LO:  # a block's lo MMA chained onto its hi MMA's accumulator (lo unscaled: _split's LO 1)
        out = ()
        for b in gl.static_range(4):
            acc = warpgroup_mma(_block(a, b, MX_REG), qs[g][b].permute((1, 0)), zeros, use_acc=False, is_async=True)
            out = out + (warpgroup_mma(_block(a, b, MX_REG), qs_lo[g][b].permute((1, 0)), acc, is_async=True),)
    elif MX:  # a: the blocks' operands (shared memory, or registers with MX_REG), qs[g] the token's four blocks
        out = (warpgroup_mma(_block(a, 0, MX_REG), qs[g][0].permute((1, 0)), zeros, use_acc=False, is_async=True),
               warpgroup_mma(_block(a, 1, MX_REG), qs[g][1].permute((1, 0)), zeros, use_acc=False, is_async=True),
               warpgroup_mma(_block(a, 2, MX_REG), qs[g][2].permute((1, 0)), zeros, use_acc=False, is_async=True),
               warpgroup_mma(_block(a, 3, MX_REG), qs[g][3].permute((1, 0)), zeros, use_acc=False, is_async=True))
    elif HI_LO:
        out = (warpgroup_mma(a, qs[g].permute((1, 0)), zeros, use_acc=False, is_async=True),
               warpgroup_mma(a, qs_lo[g].permute((1, 0)), zeros, use_acc=False, is_async=True))
    else:
        out = warpgroup_mma(a, qs[g].permute((1, 0)), zeros, use_acc=False, is_async=True)
    return out


@gluon.constexpr_function
def _issued_after(g, depth, group, per_token):
    """Commit groups issued after token ``g``'s when its MMAs are waited on: tokens up to ``g + depth - 1``."""
    return (min(g + depth, group) - g - 1) * per_token


@gluon.constexpr_function
def _pending(g, depth, group, per_token, hsum):
    """Commit groups left pending when token ``g``'s MMAs are waited on: :func:`_issued_after`; with ``hsum``, when
    they and token ``g - 1``'s head sum are: at ``g`` 0 the other first tokens' MMAs; after, at depth 1 none (token
    ``g``'s MMAs were issued before ``g - 1``'s head sum), deeper token ``g + depth - 1``'s (issued after it)."""
    if not hsum or g == 0:
        return _issued_after(g, depth, group, per_token)
    return per_token if depth > 1 and g - 1 + depth < group else 0


@gluon.constexpr_function
def _units(group, tstack):
    """MMAs a tile with ``TSTACK`` tokens a MMA (``TSTACK`` 1: one a token): ``cdiv(group, tstack)``."""
    return -(-group // tstack)


@gluon.constexpr_function
def _unit_tokens(u, group, tstack):
    """Tokens of unit ``u`` (the stacked MMA over tokens ``u * tstack ..``)."""
    return min(tstack, group - u * tstack)


@gluon.constexpr_function
def _unit_width(u, group, tstack):
    """Token columns of unit ``u``'s MMA: its tokens padded to a power of two (Gluon's shapes are; the padded rows of
    its query buffer are zeros, their columns never read)."""
    n = min(tstack, group - u * tstack)
    return 1 << (n - 1).bit_length()


@gluon.jit
def _token_columns(acc, WIDTH: gl.constexpr, BLOCK_H: gl.constexpr):
    """A stacked MMA's accumulator ``[64, WIDTH * BLOCK_H]`` (token ``j``'s heads in columns ``j * BLOCK_H ..``) ->
    ``WIDTH`` per-token accumulators ``[64, BLOCK_H]`` in the one-token MMA layout. A thread holds columns
    ``8 i + 2 (lane % 4) + {0, 1}``: token ``j``'s are its registers ``i`` in ``[j BLOCK_H / 8, (j + 1) BLOCK_H / 8)``,
    so the split moves no data (each conversion asserted trivial)."""
    MMA: gl.constexpr = _mma_layout(BLOCK_H)
    if WIDTH == 1:
        out = (acc,)
    elif WIDTH == 2:
        a0, a1 = gl.split(gl.permute(gl.reshape(acc, [64, 2, BLOCK_H]), (0, 2, 1)))
        out = (gl.convert_layout(a0, MMA, assert_trivial=True), gl.convert_layout(a1, MMA, assert_trivial=True))
    else:  # 4: token j = 2 hb + lb
        even, odd = gl.split(gl.permute(gl.reshape(acc, [64, 2, 2, BLOCK_H]), (0, 3, 1, 2)))  # lb 0 / 1: [64, H, hb]
        a0, a2 = gl.split(even)
        a1, a3 = gl.split(odd)
        out = (gl.convert_layout(a0, MMA, assert_trivial=True), gl.convert_layout(a1, MMA, assert_trivial=True),
               gl.convert_layout(a2, MMA, assert_trivial=True), gl.convert_layout(a3, MMA, assert_trivial=True))
    return out


@gluon.jit
def _stacked_tile(a, qs, w_s, key_scale, mapped, s, s0, oks, poss, t0, out_ptr, stride_ot, maxima_ptr, stride_mt,
                  MAXIMA_G: gl.constexpr, max_context,
                  BLOCK_H: gl.constexpr, GROUP: gl.constexpr, DEPTH: gl.constexpr, TSTACK: gl.constexpr):
    """FP8 queries, ``TSTACK`` tokens a MMA (DeepGEMM's operand layout: the keys the M side, tokens x heads the N
    side): one wide MMA per unit of tokens (``qs[u]`` ``[width * BLOCK_H, 128]``), ``DEPTH`` units in flight, each
    unit's tokens' epilogues once it lands."""
    U: gl.constexpr = _units(GROUP, TSTACK)
    D: gl.constexpr = DEPTH if DEPTH < U else U
    units = ()
    for u in gl.static_range(D):
        units = units + (_unit_mma(a, qs, u, GROUP, TSTACK, BLOCK_H),)
    for u in gl.static_range(U):
        acc = warpgroup_mma_wait(_issued_after(u, D, U, 1), deps=[units[u]])
        if u + D < U:
            units = units + (_unit_mma(a, qs, u + D, GROUP, TSTACK, BLOCK_H),)
        cols = _token_columns(acc, _unit_width(u, GROUP, TSTACK), BLOCK_H)
        for j in gl.static_range(_unit_tokens(u, GROUP, TSTACK)):
            _epilogue(cols[j], w_s[u * TSTACK + j], key_scale, mapped, s, s0, oks[u * TSTACK + j], poss[u * TSTACK + j],
                      t0 + u * TSTACK + j, out_ptr, stride_ot, maxima_ptr, stride_mt, MAXIMA_G, max_context,
                      gl.SliceLayout(0, _mma_layout(BLOCK_H)))


@gluon.jit
def _unit_mma(a, qs, u: gl.constexpr, GROUP: gl.constexpr, TSTACK: gl.constexpr, BLOCK_H: gl.constexpr):
    """Issue unit ``u``'s stacked MMA on the tile's keys ``a`` (asynchronously, into a fresh accumulator)."""
    N: gl.constexpr = _unit_width(u, GROUP, TSTACK) * BLOCK_H
    zeros = gl.zeros([64, N], gl.float32, _mma_layout(N))
    return warpgroup_mma(a, qs[u].permute((1, 0)), zeros, use_acc=False, is_async=True)


@gluon.jit
def _unit_queries(rows_q, u: gl.constexpr, GROUP: gl.constexpr, TSTACK: gl.constexpr, BLOCK_H: gl.constexpr,
                  QL: gl.constexpr):
    """Unit ``u``'s queries in shared memory: ``[width * BLOCK_H, 128]`` e4m3, token ``j``'s ``rows_q`` at rows ``j *
    BLOCK_H ..``, the padding rows zero."""
    N: gl.constexpr = _unit_width(u, GROUP, TSTACK) * BLOCK_H
    unit = gl.allocate_shared_memory(gl.float8e4nv, [N, 128],
                                     gl.NVMMASharedLayout.get_default_for([N, 128], gl.float8e4nv),
                                     gl.zeros([N, 128], gl.float8e4nv, QL))
    for j in gl.static_range(_unit_tokens(u, GROUP, TSTACK)):
        unit.slice(j * BLOCK_H, BLOCK_H).store(rows_q[u * TSTACK + j])
    return unit


@gluon.jit
def _tile(i, live, first, here, refill, ahead_entry, qs, qs_lo, w_s, oks, poss, t0, pages_i32, s32_b, block_table_ptr,
          stride_bt, req64, num_blocks, max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr, stride_mt,
          MAXIMA_G: gl.constexpr, max_context, a_blocks,
          BLOCK_H: gl.constexpr, GROUP: gl.constexpr, STAGES: gl.constexpr, DEPTH: gl.constexpr,
          WHOLE: gl.constexpr, HI_LO: gl.constexpr, MX: gl.constexpr, STACK: gl.constexpr,
          MX_REG: gl.constexpr = False, TSTACK: gl.constexpr = 1, HSUM: gl.constexpr = False,
          MX_FOLD: gl.constexpr = False):
    """Key tile ``i`` from stage ``here``; the tile ``STAGES - 1`` ahead is copied into ``refill`` (the stage read by
    tile ``i - 1``). Returns the table entry of the tile copied next."""
    async_copy.wait_group(STAGES - 2)  # this thread's pieces of tile i have landed
    _barrier()  # everyone's have; every warp is done reading the stage refilled next
    ahead = i + STAGES - 1
    if ahead < live:
        _issue(pages_i32, s32_b, ahead_entry, first + ahead, num_blocks, block_tokens, refill, WHOLE, MX)
    async_copy.commit_group()
    ahead_entry = _entry(block_table_ptr, stride_bt, req64, first + gl.minimum(ahead + 1, live - 1), max_blocks,
                         block_tokens, WHOLE)
    if MX_FOLD:
        _folded_tile_scores(i, first, here, qs, qs_lo, w_s, oks, poss, t0, block_table_ptr, stride_bt, req64,
                            num_blocks, max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr, stride_mt, MAXIMA_G,
                            max_context, BLOCK_H, GROUP,
                            DEPTH, WHOLE, HI_LO)
    else:
        _tile_scores(i, first, here, a_blocks, here, qs, qs_lo, w_s, oks, poss, t0, block_table_ptr, stride_bt,
                     req64, num_blocks, max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr, stride_mt, MAXIMA_G,
                     max_context, BLOCK_H, GROUP,
                     DEPTH, WHOLE, HI_LO, MX, STACK, MX_REG, TSTACK, HSUM, False)
    return ahead_entry


@gluon.jit
def _tile_scores(i, first, here, a_blocks, release, qs, qs_lo, w_s, oks, poss, t0, block_table_ptr, stride_bt, req64,
                 num_blocks, max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr, stride_mt,
                 MAXIMA_G: gl.constexpr, max_context, BLOCK_H: gl.constexpr,
                 GROUP: gl.constexpr, DEPTH: gl.constexpr, WHOLE: gl.constexpr, HI_LO: gl.constexpr,
                 MX: gl.constexpr, STACK: gl.constexpr, MX_REG: gl.constexpr, TSTACK: gl.constexpr,
                 HSUM: gl.constexpr, RELEASE: gl.constexpr):
    """Key tile ``i``'s scores from stage ``here`` (landed and visible to every thread): the MMAs and epilogues.
    ``RELEASE`` (the warp-specialised kernel): once every thread has read the stage into registers the warpgroup
    arrives on the mbarrier ``release`` (Triton's ``mbarrier.arrive``: the warpgroup's barrier, then one elected
    arrival), freeing the stage for the producer's next copy."""
    MMA: gl.constexpr = _mma_layout(BLOCK_H)
    DOT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4)
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    COLS: gl.constexpr = gl.SliceLayout(0, MMA)
    if MX and MX_REG:  # the keys decoded into the blocks' register operands
        block_scales = _mx_scales(here, ROWS)
        a = _mx_registers(here, DOT_A)
        key_scale = 64.0  # (the codes decoded as value x 2^-6)
    elif MX:  # the keys decoded into the blocks' operands (shared memory), visible to the MMAs' async proxy
        block_scales = _mx_operands(here, a_blocks, ROWS)
        fence_async_shared()
        _barrier()
        a = a_blocks
        key_scale = 64.0  # (the codes decoded as value x 2^-6)
    else:
        a = _codes(here, DOT_A)
        block_scales = ()  # (MXFP4 keys' only)
        key_scale = 1.0  # (read from the stage below: the key scales' layout is the epilogue's)
    if HSUM and TSTACK == 1:
        SUM_ROWS: gl.constexpr = gl.SliceLayout(1, _sum_layout())  # the head sums' MMA (tf32, N = 8): its rows
    if RELEASE:  # the stage read into registers (codes, key scales), then freed
        if not MX:
            if HSUM and TSTACK == 1:
                key_scale = _scales(here, SUM_ROWS)
            else:
                key_scale = _scales(here, ROWS)
        mbarrier.arrive(release)
    if TSTACK > 1:  # FP8 queries, tokens stacked on the MMA's N side
        if not RELEASE:
            key_scale = _scales(here, ROWS)
        entry = _entry(block_table_ptr, stride_bt, req64, first + i, max_blocks, block_tokens, WHOLE)
        s = (first + i) * 64 + gl.arange(0, 64, ROWS)
        _stacked_tile(a, qs, w_s, key_scale, (entry >= 0) & (entry < num_blocks), s, (first + i) * 64, oks, poss, t0,
                      out_ptr,
                      stride_ot, maxima_ptr, stride_mt, MAXIMA_G, max_context, BLOCK_H, GROUP, DEPTH, TSTACK)
    else:  # a MMA (or two, or four) a token
        _tokens(a, block_scales, key_scale, here, qs, qs_lo, w_s, oks, poss, t0, i, first, block_table_ptr, stride_bt,
                req64, num_blocks, max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr, stride_mt, MAXIMA_G,
                max_context, BLOCK_H, GROUP, DEPTH,
                WHOLE, HI_LO, MX, STACK, MX_REG, HSUM, RELEASE, False)


@gluon.jit
def _folded_tile_scores(i, first, here, qs, qs_lo, w_s, oks, poss, t0, block_table_ptr, stride_bt, req64, num_blocks,
                        max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr, stride_mt, MAXIMA_G: gl.constexpr,
                        max_context, BLOCK_H: gl.constexpr,
                        GROUP: gl.constexpr, DEPTH: gl.constexpr, WHOLE: gl.constexpr, HI_LO: gl.constexpr):
    """(``MX_FOLD``) MXFP4 key tile ``i``'s scores with each key's block scales folded into its decoded codes.

    Block ``b`` of a key whose largest scale byte is ``top`` is decoded through the table for distance ``top - e_b``
    (:func:`_fold_tables`): its values times ``2^(e_b - 127)`` times ``2^(133 - top)``, exact in e4m3 while the
    key's four bytes span at most ``FOLD_SPAN`` binades. Then every block's MMA chains into one accumulator and the
    key's common factor ``2^(top - 133)`` goes on its score after the head sum (relu and the head sum commute with a
    positive factor; NaN for a 255 byte): no per-block accumulators, no four-way sum a token (the unfolded kernel's
    FMUL and three FFMA per score a token). A tile holding a wider key (the conformance suite's outlier keys, one
    element 1000x the rest, come within a binade of the span on either side; keys at 2^-127 / 2^60 block scales pass
    it) is decoded with every distance 0 and scored block by block as the unfolded kernel does (its exact block
    scales, :func:`_mx_scales`): the choice is the tile's, one branch."""
    MMA: gl.constexpr = _mma_layout(BLOCK_H)
    DOT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4)
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    ROWL: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, _MX_REG_BYTES))  # the decode's rows
    SUM_ROWS: gl.constexpr = gl.SliceLayout(1, _sum_layout())
    exps, top, _ = _mx_fold_exponents(here, ROWL)
    # whether the tile holds a key wider than the fold takes, from each warp's own read of all 64 keys' scales: the
    # reduction stays inside the warp (no shared-memory round or barrier), the warps reaching the same answer
    _, _, wide = _mx_fold_exponents(here, gl.BlockedLayout([2], [32], [4], [0]))
    if gl.max(wide.to(gl.int32), axis=0) == 0:  # no key of the tile spans more than FOLD_SPAN binades
        a = _mx_folded_registers(here, exps, top, DOT_A)
        key_scale = gl.convert_layout(_fold_scale(top), SUM_ROWS)
        _tokens(a, (), key_scale, here, qs, qs_lo, w_s, oks, poss, t0, i, first, block_table_ptr, stride_bt, req64,
                num_blocks, max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr, stride_mt, MAXIMA_G, max_context,
                BLOCK_H, GROUP, DEPTH, WHOLE,
                HI_LO, True, False, True, True, False, True)
    else:  # every block at distance 0 (its values times 2^6), scored block by block
        _spread_tile_tokens(_mx_folded_registers(here, (top, top, top, top), top, DOT_A), _mx_scales(here, ROWS), qs,
                            qs_lo, w_s, oks, poss, t0, i, first, block_table_ptr, stride_bt, req64, num_blocks,
                            max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr, stride_mt, MAXIMA_G, max_context,
                            BLOCK_H, GROUP, WHOLE, HI_LO)


@gluon.jit
def _spread_tile_tokens(a, block_scales, qs, qs_lo, w_s, oks, poss, t0, i, first, block_table_ptr, stride_bt, req64,
                        num_blocks, max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr, stride_mt,
                        MAXIMA_G: gl.constexpr, max_context, BLOCK_H: gl.constexpr,
                        GROUP: gl.constexpr, WHOLE: gl.constexpr, HI_LO: gl.constexpr):
    """(``MX_FOLD``) A tile holding a key whose scales span more than ``FOLD_SPAN`` binades, its codes decoded at
    distance 0 (``a``: the blocks' values times 2^6): each token's blocks one MMA at a time, each summed into the
    token's accumulator with its exact block scale (``block_scales``, :func:`_mx_scales`), then its head sum, its
    scores times 2^-6. Sequential (every MMA waited on): the rare tile's path, kept to two accumulators' registers so
    that the kernel's register count is the folded path's."""
    MMA: gl.constexpr = _mma_layout(BLOCK_H)
    SUM_ROWS: gl.constexpr = gl.SliceLayout(1, _sum_layout())
    zeros = gl.zeros([64, BLOCK_H], gl.float32, MMA)
    sum_zeros = gl.zeros([64, 8], gl.float32, _sum_layout())
    key_scale = gl.full([64], 0.015625, gl.float32, SUM_ROWS)
    s = (first + i) * 64 + gl.arange(0, 64, SUM_ROWS)
    entry = _entry(block_table_ptr, stride_bt, req64, first + i, max_blocks, block_tokens, WHOLE)
    mapped = (entry >= 0) & (entry < num_blocks)
    for g in gl.static_range(GROUP):
        total = zeros
        for b in gl.static_range(4):
            acc = warpgroup_mma(a[b], qs[g][b].permute((1, 0)), zeros, use_acc=False, is_async=True)
            if HI_LO:  # (lo unscaled: _split's LO 1)
                acc = warpgroup_mma(a[b], qs_lo[g][b].permute((1, 0)), acc, is_async=True)
            total = total + warpgroup_mma_wait(0, deps=[acc]) * block_scales[b][:, None]
        summed = warpgroup_mma(_relu_operand(total, BLOCK_H), w_s.permute((1, 0)), sum_zeros, use_acc=False,
                               is_async=True)
        _head_sum_store(warpgroup_mma_wait(0, deps=[summed]), g, key_scale, mapped, s, (first + i) * 64, oks[g],
                        poss[g], t0 + g,
                        out_ptr, stride_ot, maxima_ptr, stride_mt, MAXIMA_G, max_context)


@gluon.jit
def _tokens(a, block_scales, key_scale, here, qs, qs_lo, w_s, oks, poss, t0, i, first, block_table_ptr, stride_bt,
            req64, num_blocks, max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr, stride_mt,
            MAXIMA_G: gl.constexpr, max_context, BLOCK_H: gl.constexpr,
            GROUP: gl.constexpr, DEPTH: gl.constexpr, WHOLE: gl.constexpr, HI_LO: gl.constexpr, MX: gl.constexpr,
            STACK: gl.constexpr, MX_REG: gl.constexpr, HSUM: gl.constexpr, RELEASE: gl.constexpr,
            CHAINED: gl.constexpr):
    """The segment's tokens on key tile ``i`` (keys ``a``, TSTACK 1): each token's MMA (or two, or four), ``DEPTH`` in
    flight, and its epilogue. MXFP4 keys (``MX``): the four blocks' MMAs into their own accumulators, summed with
    ``block_scales``, the scores times 64 (:func:`_mx_registers`' codes are the values times 2^-6); ``CHAINED``
    (:func:`_folded_tile_scores`, every key's scales folded into its codes) the four chained into one accumulator,
    the scores times ``key_scale`` (:func:`_fold_scale`, in the head sums' rows)."""
    MMA: gl.constexpr = _mma_layout(BLOCK_H)
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    COLS: gl.constexpr = gl.SliceLayout(0, MMA)
    if HSUM:
        SUM_ROWS: gl.constexpr = gl.SliceLayout(1, _sum_layout())  # the head sums' MMA (tf32, N = 8): its rows
    if STACK:
        zeros = gl.zeros([64, 2 * BLOCK_H], gl.float32, _mma_layout(2 * BLOCK_H))
    else:
        zeros = gl.zeros([64, BLOCK_H], gl.float32, MMA)
    D: gl.constexpr = DEPTH if DEPTH < GROUP else GROUP
    # MMAs (commit groups) a token: bf16 queries as hi and lo parts (one, stacked); MXFP4 keys one a 32-dim block
    P: gl.constexpr = (8 if HI_LO else 4) if MX else (2 if HI_LO and not STACK else 1)
    toks = ()
    for g in gl.static_range(D):  # the first D tokens' MMAs in flight before the first epilogue
        toks = toks + (_token_mmas(a, qs, qs_lo, g, zeros, HI_LO, MX, STACK, MX_REG, CHAINED),)
    if HSUM:  # the head sums' MMA (tf32, N = 8)
        sum_zeros = gl.zeros([64, 8], gl.float32, _sum_layout())
        sum_cols = gl.arange(0, 8, gl.SliceLayout(0, _sum_layout()))
        segment = gl.full([64, 8], float("-inf"), gl.float32, _sum_layout())  # (the group maxima's scores)
        s = (first + i) * 64 + gl.arange(0, 64, SUM_ROWS)
        if MX:  # (CHAINED: the keys' own factors, given)
            if not CHAINED:
                key_scale = gl.full([64], 64.0, gl.float32, SUM_ROWS)  # (the codes decoded as value x 2^-6)
        elif not RELEASE:
            key_scale = _scales(here, SUM_ROWS)
    else:
        s = (first + i) * 64 + gl.arange(0, 64, ROWS)
        if not (MX or RELEASE):
            key_scale = _scales(here, ROWS)
    entry = _entry(block_table_ptr, stride_bt, req64, first + i, max_blocks, block_tokens, WHOLE)
    mapped = (entry >= 0) & (entry < num_blocks)
    for g in gl.static_range(GROUP):
        # tokens 0 .. min(g + D, GROUP) - 1 issued; wait for token g's, then issue token g + D's before g's epilogue
        # (HSUM: and token g - 1's head sum, issued at depth 1 after token g's MMAs, deeper before token g + D -
        # 1's; each token's scores stored one token later, after the next head sum's issue)
        if CHAINED:  # the blocks' MMAs chained into one accumulator
            acc = warpgroup_mma_wait(_pending(g, D, GROUP, P, HSUM), deps=[toks[g]])
        elif MX:
            acc0, acc1, acc2, acc3 = warpgroup_mma_wait(_pending(g, D, GROUP, P, HSUM),
                                                        deps=[toks[g][0], toks[g][1], toks[g][2], toks[g][3]])
            acc = (acc0 * block_scales[0][:, None] + acc1 * block_scales[1][:, None]
                   + acc2 * block_scales[2][:, None] + acc3 * block_scales[3][:, None])
        elif STACK:  # columns 0 .. BLOCK_H - 1 hi, the rest lo: a thread holds column n and n + BLOCK_H
            both = warpgroup_mma_wait(_pending(g, D, GROUP, P, HSUM), deps=[toks[g]])
            acc_hi, acc_lo = gl.split(gl.permute(gl.reshape(both, [64, 2, BLOCK_H]), (0, 2, 1)))
            acc = gl.convert_layout(acc_hi + acc_lo * 0.0625, MMA)
        elif HI_LO:
            acc_hi, acc_lo = warpgroup_mma_wait(_pending(g, D, GROUP, P, HSUM), deps=[toks[g][0], toks[g][1]])
            acc = acc_hi + acc_lo * 0.0625  # (lo is 16 x the residual)
        else:
            acc = warpgroup_mma_wait(_pending(g, D, GROUP, P, HSUM), deps=[toks[g]])
        if HSUM:  # relu(acc) . w on the tensor cores
            if g > 0:
                # (retired by the wait above: no stall)
                done = warpgroup_mma_wait(_pending(g, D, GROUP, P, HSUM), deps=[summed])
            if D == 1:  # token g + 1's MMAs first: they run during this token's relu and the last one's store
                if g + 1 < GROUP:
                    toks = toks + (_token_mmas(a, qs, qs_lo, g + 1, zeros, HI_LO, MX, STACK, MX_REG, CHAINED),)
                summed = warpgroup_mma(_relu_operand(acc, BLOCK_H), w_s.permute((1, 0)), sum_zeros,
                                       use_acc=False, is_async=True)
            else:  # the head sum first: waiting for it then leaves D - 1 tokens' MMAs in flight
                summed = warpgroup_mma(_relu_operand(acc, BLOCK_H), w_s.permute((1, 0)), sum_zeros,
                                       use_acc=False, is_async=True)
                if g + D < GROUP:
                    toks = toks + (_token_mmas(a, qs, qs_lo, g + D, zeros, HI_LO, MX, STACK, MX_REG, CHAINED),)
            # (the group maxima: each token's scores gathered into its column of `segment`, one reduction a tile)
            if g > 0:
                value = _head_sum_store(done, g - 1, key_scale, mapped, s, (first + i) * 64, oks[g - 1], poss[g - 1],
                                        t0 + g - 1, out_ptr, stride_ot, None, stride_mt, MAXIMA_G, max_context)
                segment = gl.where((sum_cols == g - 1)[None, :], value, segment)
            if g == GROUP - 1:
                done = warpgroup_mma_wait(0, deps=[summed])
                value = _head_sum_store(done, g, key_scale, mapped, s, (first + i) * 64, oks[g], poss[g], t0 + g,
                                        out_ptr, stride_ot, None, stride_mt, MAXIMA_G, max_context)
                if maxima_ptr is not None:
                    segment = gl.where((sum_cols == g)[None, :], value, segment)
                    _store_segment_group_maxima(segment, s, (first + i) * 64, oks, t0, maxima_ptr, stride_mt,
                                                MAXIMA_G, max_context, GROUP)
        else:
            if g + D < GROUP:
                toks = toks + (_token_mmas(a, qs, qs_lo, g + D, zeros, HI_LO, MX, STACK, MX_REG, CHAINED),)
            _epilogue(acc, w_s[g], key_scale, mapped, s, (first + i) * 64, oks[g], poss[g], t0 + g, out_ptr, stride_ot,
                      maxima_ptr, stride_mt, MAXIMA_G, max_context,
                      COLS)


@gluon.jit
def _ws_consume(bufs, full, empty, live, first, qs, qs_lo, w_s, oks, poss, t0, block_table_ptr, stride_bt, req64,
                num_blocks, max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr, stride_mt,
                MAXIMA_G: gl.constexpr, max_context, BLOCK_H: gl.constexpr,
                GROUP: gl.constexpr, STAGES: gl.constexpr, DEPTH: gl.constexpr, WHOLE: gl.constexpr,
                HI_LO: gl.constexpr, MX: gl.constexpr, STACK: gl.constexpr, MX_REG: gl.constexpr,
                HSUM: gl.constexpr):
    """(``WS``) The scoring warpgroup: tile ``i`` waits for its stage's copies (``full``, phase ``i // STAGES``), reads
    the stage into registers, frees it (``empty``) and scores it; no warp ever waits for another's copies."""
    for i0 in range(0, live, STAGES):  # unrolled by the stages: tile i0 + u reads bufs[u]
        phase = (i0 // STAGES) & 1
        for u in gl.static_range(STAGES):
            if i0 + u < live:
                mbarrier.wait(full.index(u), phase)
                _tile_scores(i0 + u, first, bufs[u], bufs[0], empty.index(u), qs, qs_lo, w_s, oks, poss, t0,
                             block_table_ptr, stride_bt, req64, num_blocks, max_blocks, block_tokens, out_ptr,
                             stride_ot, maxima_ptr, stride_mt, MAXIMA_G, max_context, BLOCK_H, GROUP, DEPTH, WHOLE,
                             HI_LO, MX, STACK, MX_REG, 1, HSUM,
                             True)


@gluon.jit
def stage_mbarriers(STAGES: gl.constexpr, PRODUCER_THREADS: gl.constexpr):
    """A producer's handover of ``STAGES`` shared-memory stages: ``(full, empty)``, each ``[STAGES, 1]`` mbarriers.
    ``full[j]`` completes once each of the producer's ``PRODUCER_THREADS`` threads has arrived (its copies landed:
    ``cp.async.mbarrier.arrive.noinc``), ``empty[j]`` on the consuming warpgroup's one arrival once it has read the
    stage. Every warp of the program past the initialisation before either is used."""
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(full.index(j), count=PRODUCER_THREADS)
        mbarrier.init(empty.index(j), count=1)
    _barrier()
    return full, empty


@gluon.jit
def _ws_produce(bufs, full, empty, live, first, pages_i32, s32_b, block_table_ptr, stride_bt, req64, num_blocks,
                max_blocks, block_tokens, STAGES: gl.constexpr, WHOLE: gl.constexpr, MX: gl.constexpr):
    """(``WS``) The producer warp: tile ``i`` waits for its stage to be free (``empty``; the first round passes),
    copies it with ``cp.async`` and has each lane arrive on ``full`` once its pieces have landed
    (``cp.async.mbarrier.arrive.noinc``). The next tile's table entry is loaded one tile ahead."""
    entry = _entry(block_table_ptr, stride_bt, req64, first, max_blocks, block_tokens, WHOLE)
    for i0 in range(0, live, STAGES):
        phase = (i0 // STAGES) & 1
        for u in gl.static_range(STAGES):
            if i0 + u < live:
                ahead = _entry(block_table_ptr, stride_bt, req64, first + gl.minimum(i0 + u + 1, live - 1),
                               max_blocks, block_tokens, WHOLE)
                mbarrier.wait(empty.index(u), phase ^ 1)
                _issue(pages_i32, s32_b, entry, first + i0 + u, num_blocks, block_tokens, bufs[u], WHOLE, MX,
                       _COPY_WARP)
                async_copy.mbarrier_arrive(full.index(u), increment_count=False)
                entry = ahead


@gluon.jit(do_not_specialize=SIZE_ARGS)
def indexer_gluon_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 128] e4m3, or bf16 with HI_LO
    w_ptr, stride_wt,  # [T, H] fp32
    pages_i32, s32_b,  # the pages as int32 words, block stride in words (a multiple of 4)
    block_table_ptr, stride_bt,  # [B, max_blocks] int32, -1 unmapped
    req_ptr, pos_ptr, off_ptr, seg_ptr,  # [T] request, position, index in its request run; [T] segment starts
    out_ptr, stride_ot,  # [T, max_context] fp32
    maxima_ptr, stride_mt,  # [T, >= cdiv(max_context, MAXIMA_G)] int32 group maxima' keys, or None (none made)
    T, max_context, num_blocks, max_blocks, block_tokens, n_tiles,
    H: gl.constexpr, BLOCK_H: gl.constexpr, GROUP: gl.constexpr, STAGES: gl.constexpr,
    DEPTH: gl.constexpr = 8,  # token MMAs in flight at once (the accumulators' registers)
    WHOLE: gl.constexpr = False,  # a tile is a whole cache block (block_tokens == 64): no division per tile
    HI_LO: gl.constexpr = False,  # bf16 queries, each split into e4m3 hi + lo parts (_hi_lo): two MMAs a token
    MX: gl.constexpr = False,  # MXFP4 keys (68-byte records): four K = 32 MMAs a token, one a block (two with HI_LO)
    STACK: gl.constexpr = False,  # (HI_LO, FP8 keys) a token's hi and lo parts as one N = 2 BLOCK_H MMA
    MX_REG: gl.constexpr = False,  # (MX) the decoded keys as register operands, not through shared memory
    TSTACK: gl.constexpr = 1,  # (FP8 queries, FP8 keys) tokens a MMA: their heads side by side on its N side
    HSUM: gl.constexpr = False,  # (TSTACK 1) each token's head sum as a tf32 MMA: relu(scores) x weights
    WS: gl.constexpr = False,  # (TSTACK 1, FP8 keys) a producer warp copying, mbarriers per stage
    PRODUCER_REGS: gl.constexpr = 40,  # (WS) the producer warp's registers
    MX_FOLD: gl.constexpr = False,  # (MX, MX_REG, HSUM) block scales folded into the codes: _folded_tile_scores
    MAXIMA_G: gl.constexpr = 16,  # (maxima_ptr) keys a group maximum covers: 8, 16, 32 or 64 (_store_group_maxima)
):
    MMA: gl.constexpr = _mma_layout(BLOCK_H)
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)  # [64] per key
    QL: gl.constexpr = _query_layout()
    Q_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 128], gl.float8e4nv)
    QB_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 32], gl.float8e4nv)
    Q2_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * BLOCK_H, 128], gl.float8e4nv)
    WL: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])

    t0 = gl.load(seg_ptr + gl.program_id(0))
    if t0 < T:
        req = gl.load(req_ptr + t0)
        off0 = gl.load(off_ptr + t0)
        qh = gl.arange(0, BLOCK_H, gl.SliceLayout(1, QL))
        qk = dim_of_k(gl.arange(0, 128, gl.SliceLayout(0, QL)))
        if MX_FOLD:
            qb = mx_fold_dim(gl.arange(0, 32, gl.SliceLayout(0, QL)))
        elif MX_REG:
            qb = mx_reg_dim(gl.arange(0, 32, gl.SliceLayout(0, QL)))
        else:
            qb = mx_dim(gl.arange(0, 32, gl.SliceLayout(0, QL)))
        heads = gl.arange(0, BLOCK_H, WL)
        # the segment's members: ok and position (registers), queries and head weights (shared memory) a token
        oks = ()
        poss = ()
        ws = ()
        qs = ()  # the queries (FP8), or their hi parts (bf16, HI_LO); qs_lo their lo parts
        qs_lo = ()
        reach = -1
        for g in gl.static_range(GROUP):
            ok, pos = _member(req_ptr, pos_ptr, off_ptr, t0, g, T, req, off0)
            t = gl.where(ok, t0 + g, 0).to(gl.int64)
            rows = q_ptr + t * stride_qt + qh[:, None] * stride_qh
            wv = gl.load(w_ptr + t * stride_wt + heads, mask=(heads < H) & ok, other=0.0)
            if MX:  # a [BLOCK_H, 32] buffer a block, its dims in the decoded keys' order (mx_dim)
                if HI_LO:  # one power of two a row over its 128 dims (the row's inverse on its weight)
                    up, down = _row_scale(_row_amax(gl.load(rows + qk[None, :], mask=((qh < H) & ok)[:, None],
                                                            other=0.0).to(gl.float32)))
                    wv = wv * gl.convert_layout(down, WL)
                blocks = ()
                blocks_lo = ()
                for b in gl.static_range(4):
                    qv = gl.load(rows + 32 * b + qb[None, :], mask=((qh < H) & ok)[:, None], other=0.0)
                    if HI_LO:
                        hi, lo = _split(qv.to(gl.float32), up, 1.0)
                        blocks = blocks + (gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, 32], QB_SMEM, hi),)
                        blocks_lo = blocks_lo + (gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, 32], QB_SMEM, lo),)
                    else:
                        blocks = blocks + (gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, 32], QB_SMEM, qv),)
                qs = qs + (blocks,)
                qs_lo = qs_lo + (blocks_lo,)
            elif HI_LO:  # the row scale's inverse goes on the head's weight
                qv = gl.load(rows + qk[None, :], mask=((qh < H) & ok)[:, None], other=0.0)
                hi, lo, down = _hi_lo(qv.to(gl.float32))
                if STACK:  # the hi rows, then the lo rows: one MMA a token, hi and lo in their own columns
                    both = gl.allocate_shared_memory(gl.float8e4nv, [2 * BLOCK_H, 128], Q2_SMEM)
                    both.slice(0, BLOCK_H).store(hi)
                    both.slice(BLOCK_H, BLOCK_H).store(lo)
                    qs = qs + (both,)
                else:
                    qs = qs + (gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, 128], Q_SMEM, hi),)
                    qs_lo = qs_lo + (gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, 128], Q_SMEM, lo),)
                wv = wv * gl.convert_layout(down, WL)
            elif TSTACK > 1:  # token g's rows of its unit's buffer (allocated zero, below)
                qs = qs + (gl.load(rows + qk[None, :], mask=((qh < H) & ok)[:, None], other=0.0),)
            else:
                qv = gl.load(rows + qk[None, :], mask=((qh < H) & ok)[:, None], other=0.0)
                qs = qs + (gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, 128], Q_SMEM, qv),)
            if HSUM:
                ws = ws + (wv,)  # (one shared buffer for the segment, below)
            else:
                ws = ws + (gl.allocate_shared_memory(gl.float32, [BLOCK_H], _LINEAR, wv),)
            oks = oks + (ok,)
            poss = poss + (pos,)
            reach = gl.maximum(reach, pos)
        if HSUM:
            ws = _sum_weights(ws, BLOCK_H, GROUP, WL)
        if TSTACK > 1:  # a [width * BLOCK_H, 128] buffer a unit of TSTACK tokens, token j's rows at j * BLOCK_H
            rows_q = qs
            qs = ()
            for u in gl.static_range(_units(GROUP, TSTACK)):
                qs = qs + (_unit_queries(rows_q, u, GROUP, TSTACK, BLOCK_H, QL),)
        fence_async_shared()  # the queries' stores, before the MMAs read them through the async proxy
        _barrier()

        count = n_tiles
        first = gl.program_id(1) * count
        last = gl.minimum(reach, max_context - 1)
        live = gl.minimum(gl.maximum(last // 64 + 1 - first, 0), count)
        req64 = req.to(gl.int64)

        bufs = ()
        for j in gl.static_range(STAGES):
            if MX:
                bufs = bufs + (gl.allocate_shared_memory(gl.int32, [MX_STAGE_WORDS], _MX_STAGE),)
            else:
                bufs = bufs + (gl.allocate_shared_memory(gl.int32, [STAGE_WORDS], _STAGE),)
        if MX and not MX_REG:  # the four blocks' decoded keys, one tile at a time
            a_blocks = gl.allocate_shared_memory(gl.float8e4nv, [4, 64, 32], gl.NVMMASharedLayout(32, 8))
        else:
            a_blocks = bufs[0]  # (unused)
        if WS:  # one producer warp copying, this warpgroup scoring, the stages handed over by mbarriers
            full, empty = stage_mbarriers(STAGES, 32)  # (the producer's 32 lanes)
            gl.warp_specialize([
                (_ws_consume, (bufs, full, empty, live, first, qs, qs_lo, ws, oks, poss, t0, block_table_ptr,
                               stride_bt, req64, num_blocks, max_blocks, block_tokens, out_ptr, stride_ot, maxima_ptr,
                               stride_mt, MAXIMA_G, max_context,
                               BLOCK_H, GROUP, STAGES, DEPTH, WHOLE, HI_LO, MX, STACK, MX_REG, HSUM)),
                (_ws_produce, (bufs, full, empty, live, first, pages_i32, s32_b, block_table_ptr, stride_bt, req64,
                               num_blocks, max_blocks, block_tokens, STAGES, WHOLE, MX)),
            ], [1], [PRODUCER_REGS])
        else:
            for j in gl.static_range(STAGES - 1):
                if j < live:
                    _issue(pages_i32, s32_b, _entry(block_table_ptr, stride_bt, req64, first + j, max_blocks,
                                                    block_tokens, WHOLE), first + j, num_blocks, block_tokens, bufs[j],
                           WHOLE, MX)
                async_copy.commit_group()
            # the table entry of the tile copied next, loaded one tile ahead (a copy never waits on its lookup)
            ahead_entry = _entry(block_table_ptr, stride_bt, req64, first + gl.minimum(STAGES - 1, live - 1),
                                 max_blocks, block_tokens, WHOLE)
            for i0 in range(0, live, STAGES):  # unrolled by the stages: tile i0 + u reads bufs[u]
                for u in gl.static_range(STAGES):
                    if i0 + u < live:
                        ahead_entry = _tile(i0 + u, live, first, bufs[u], bufs[(u + STAGES - 1) % STAGES],
                                            ahead_entry, qs, qs_lo, ws, oks, poss, t0, pages_i32, s32_b,
                                            block_table_ptr, stride_bt, req64, num_blocks, max_blocks, block_tokens,
                                            out_ptr, stride_ot, maxima_ptr, stride_mt, MAXIMA_G, max_context, a_blocks,
                                            BLOCK_H, GROUP, STAGES, DEPTH,
                                            WHOLE, HI_LO, MX, STACK, MX_REG, TSTACK, HSUM, MX_FOLD)
            async_copy.wait_group(0)
        dead = gl.full([64], float("-inf"), gl.float32, ROWS)
        keys = gl.arange(0, 64, ROWS)
        for i in range(live, count):
            s = (first + i) * 64 + keys
            for g in gl.static_range(GROUP):
                row = out_ptr + gl.where(oks[g], t0 + g, 0).to(gl.int64) * stride_ot
                gl.store(row + s, dead, mask=(s < max_context) & oks[g])
                if maxima_ptr is not None:  # (key 0: no score above -inf)
                    _store_group_maxima(dead, s, (first + i) * 64, oks[g], t0 + g, maxima_ptr, stride_mt, MAXIMA_G,
                                        max_context)


# Whether this process's Triton compiles the kernel, by query kind (hi_lo) -> "" or the compiler's message. Triton 3.6
# (the H200's) is verified there; another release is asked once, by compiling the kernel for sm_90 (3.9 refuses the
# padded view of a stage: "cannot reinterpret between padded and non-padded layouts"), so a release that rejects it
# makes the calls take the tl kernel instead of failing mid-serving.
VERIFIED_TRITON = ("3.6.",)
_COMPILE_FAILURES: dict = {}


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    """A CUDA device's compute capability, asked of the driver once (the refusal runs on every call)."""
    return torch.cuda.get_device_capability(index)


def refusal(q: torch.Tensor, index_pages: torch.Tensor, index_fmt: str, group: int = 1) -> str:
    """Why this kernel does not take the call ("" when it does)."""
    if index_fmt not in RECORDS:
        return f"{index_fmt} keys: the Gluon indexer reads FP8 and MXFP4 keys"
    if q.dtype not in (torch.float8_e4m3fn, torch.bfloat16):
        return f"{str(q.dtype).replace('torch.', '')} queries: the Gluon indexer takes FP8 or bf16 queries"
    if q.dim() != 3 or q.shape[2] != 128 or not 1 <= q.shape[1] <= MAX_HEADS:
        return f"q of shape {list(q.shape)}: the Gluon indexer takes [T, 1..{MAX_HEADS}, 128]"
    if not (runs_ptx(q.device) and runs_ptx(index_pages.device)):
        return "the Gluon indexer runs on NVIDIA CUDA tensors only"
    major, minor = _capability(q.device.index)
    if major != 9:
        return f"sm_{major}{minor}: the Gluon indexer's wgmma is Hopper's (sm_90)"
    record = RECORDS[index_fmt]
    if index_pages.dtype != torch.uint8 or index_pages.dim() != 3 or index_pages.shape[2] != record:
        return (f"pages {index_pages.dtype} {list(index_pages.shape)}: the Gluon indexer reads {index_fmt} keys as "
                f"uint8 [blocks, tokens, {record}]")
    if index_pages.shape[0] == 0 or index_pages.shape[1] % TILE:
        return f"{index_pages.shape[1]}-token blocks: the Gluon indexer copies whole {TILE}-key tiles of a block"
    if index_pages.stride(2) != 1 or index_pages.stride(1) != record:
        return f"page strides {index_pages.stride()}: the Gluon indexer reads packed records"
    if index_pages.data_ptr() % 16 or index_pages.stride(0) % 16:
        return (f"pages at byte {index_pages.data_ptr() % 16} of 16, block stride {index_pages.stride(0)}: the Gluon "
                f"indexer copies 16-byte pieces")
    if not 1 <= group <= MAX_GROUP:
        return f"{group} tokens a segment: the Gluon indexer takes 1..{MAX_GROUP}"
    return ""


def launch(q, weights, index_pages, block_table, req_ids, positions, run_offset, max_context, out, *, starts,
           group, index_fmt="fp8", tiles=16, wide_tiles=64, stages=DEFAULT_STAGES, depth=2, stacked=False,
           mx_registers=False, token_stack=1, maxnreg=None, head_sum_mma=False, warp_specialized=False,
           producer_regs=40, num_warps=4, refusal_checked=False, mx_fold=False, requests=None, maxima=None,
           maxima_group=16):
    """Run :func:`indexer_gluon_kernel` (a call :func:`refusal` names a reason for raises).

    Args:
        q: ``[T, H, 128]`` float8_e4m3fn or bf16 (split into two e4m3 parts, :func:`_hi_lo`), unit stride in the
            last dim. weights: ``[T, H]`` fp32, unit last stride.
        index_pages: ``[num_blocks, block_tokens, 132]`` uint8 FP8 keys (``[..., 68]`` MXFP4 keys with
            ``index_fmt="mxfp4"``), packed, 16-byte aligned blocks, ``block_tokens % 64 == 0``.
        block_table: ``[B, max_blocks]`` int32, -1 unmapped. req_ids, positions, run_offset, starts: ``[T]`` int32
            (run offsets and segment starts from :func:`.segments.segment_plan` for ``group``).
        max_context: output width. out: ``[T, max_context]`` fp32, unit last stride.
        group: tokens per segment (1..8). tiles: key tiles per program (64 keys each); wide_tiles: up to that many
            when the launch has programs to spare (:func:`.indexer_decode.tiles_per_program`; None: ``tiles``).
            stages: tiles in flight (2..6). depth: token MMAs in flight at once (1..8: each holds an accumulator).
            stacked: bf16 queries on FP8 keys, a token's hi and lo parts as one MMA of twice the heads (their sums
            in separate columns: the same scores); ignored otherwise. mx_registers: MXFP4 keys decoded straight
            into the MMAs' register operands (no shared-memory round trip); ignored for FP8 keys.
            token_stack: FP8 queries on FP8 keys, up to that many tokens of a segment as one MMA (their heads side
            by side on its N side, at most 128 columns: 1, 2 or 4; the same sums as one MMA a token); ignored
            otherwise. depth then counts those MMAs. maxnreg: ptxas's register cap (None: its own choice).
            head_sum_mma: each token's head sum as a tf32 MMA (module docstring, ``HSUM``: scores within ~5e-4 of the
            reference instead of ~1.3e-4); ignored with token_stack > 1. Checked on the H200 with FP8 queries,
            stacked bf16 queries and MXFP4 keys (the backend's launches); bf16 queries unstacked on FP8 keys take
            the same code (two commit groups a token) but were not run there.
            warp_specialized: (``WS``) one producer warp copies the tiles and signals each stage's arrival on an
            mbarrier, the warpgroup only scores (no CTA barrier a tile); FP8 keys, token_stack 1 (checked on the H200
            with FP8 and stacked bf16 queries; not the backend's launch: 0.96-0.99x). The kernel then has 8 warps
            (the producer's warpgroup padded: ``setmaxnreg`` is a warpgroup's); maxnreg is the launch's registers a
            thread, the consumers taking what the producer (producer_regs) and the idle warps (24) leave.
        refusal_checked: the caller ran :func:`refusal` on these tensors already and it named no reason (the
            backend's calls: :func:`.indexer._gluon_plan`), so it is not run again (~2 us of host a call).
        mx_fold: MXFP4 keys with ``mx_registers`` and ``head_sum_mma``: each key's four block scales folded into
            its decoded codes, one MMA accumulator a token and no per-score sum over the blocks
            (:func:`_folded_tile_scores`; a tile holding a key whose scales span more than ``FOLD_SPAN`` binades is
            scored block by block); ignored for FP8 keys. Checked and timed on the H200 (twenty-ninth session).
        requests: the requests the tokens come from, for ``wide_tiles``' count of segments (default the block
            table's rows; :func:`.indexer.indexer_score`'s ``requests``).
        maxima: the fused indexer -> top-k: a contiguous ``[T, >= cdiv(max_context, maxima_group)]`` int32 tensor
            that the kernel fills with the maxima of each token's groups of ``maxima_group`` (8, 16, 32 or 64)
            consecutive scores, as the top-k's groups method makes them for itself
            (:func:`.topk_groups.group_max_kernel`; :func:`.topk_groups.maxima_layout`), so that it need not read the
            scores for them: column ``j`` the order-preserving key of the largest of scores ``j G .. j G + G - 1``
            below ``max_context`` (0 where none is above -inf). Columns past ``cdiv(max_context, G)`` are not
            written. A token's scores past its position are -inf, so a row's maxima are those the top-k makes for
            it with its length ``min(position + 1, max_context)``.

    Returns:
        ``out``.
    """
    name = "triton indexer_score (gluon)"
    reason = "" if refusal_checked else refusal(q, index_pages, index_fmt, group)
    if reason:
        raise ValueError(f"{name}: {reason}")
    for arg, tensor in (("q", q), ("weights", weights), ("block_table", block_table), ("out", out)):
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name}: {arg} expected unit stride in its last dim, got strides {tensor.stride()}")
    if not 2 <= stages <= MAX_STAGES:
        raise ValueError(f"{name}: stages expected 2..{MAX_STAGES}, got {stages}")
    if not 1 <= depth <= MAX_GROUP:
        raise ValueError(f"{name}: depth expected 1..{MAX_GROUP}, got {depth}")
    if token_stack not in (1, 2, 4):
        raise ValueError(f"{name}: token_stack expected 1, 2 or 4, got {token_stack!r}")
    if maxnreg is not None and not (isinstance(maxnreg, int) and 24 <= maxnreg <= 255):
        raise ValueError(f"{name}: maxnreg expected None or an int in 24..255, got {maxnreg!r}")
    if num_warps != 4:
        raise ValueError(f"{name}: one warpgroup a program (num_warps=4), got {num_warps}")
    tokens = q.shape[0]
    meta = launch_meta(q, index_pages, group, stages, depth, stacked, mx_registers, token_stack, head_sum_mma,
                       warp_specialized, producer_regs, mx_fold)
    if mx_fold and meta["MX"] and not (meta["MX_REG"] and meta["HSUM"]):
        raise ValueError(f"{name}: mx_fold expected mx_registers=True and head_sum_mma=True (the folded scores are "
                         f"the head sums' MMA's), got mx_registers={mx_registers!r}, head_sum_mma={head_sum_mma!r}")
    if meta["WS"] and (meta["TSTACK"] > 1 or meta["MX"]):  # (MXFP4 keys compile but were not run with it)
        raise ValueError(f"{name}: warp_specialized expected token_stack 1 and FP8 keys, got token_stack "
                         f"{token_stack}, {index_fmt} keys")
    if not (isinstance(producer_regs, int) and 24 <= producer_regs <= 256 and producer_regs % 8 == 0):
        raise ValueError(f"{name}: producer_regs expected a multiple of 8 in 24..256, got {producer_regs!r}")
    if meta["TSTACK"] * meta["BLOCK_H"] > 128:  # (an MMA's N and its accumulator's registers)
        raise ValueError(f"{name}: token_stack {token_stack} at {q.shape[1]} heads (padded to {meta['BLOCK_H']}) "
                         f"expected at most 128 columns a MMA, got {meta['TSTACK'] * meta['BLOCK_H']}")
    if maxima is not None:
        check_producer_maxima(name, "maxima", maxima, maxima_group, tokens, max_context, out.device)
        meta["MAXIMA_G"] = maxima_group
    if maxnreg:
        meta["maxnreg"] = maxnreg
    failure = compile_failure(meta["HI_LO"], meta["MX"], meta["HSUM"], meta["MX_FOLD"])
    if failure:
        raise ValueError(f"{name}: this Triton ({triton.__version__}) does not compile the kernel: {failure}")
    if wide_tiles is not None:
        rows = block_table.shape[0] if requests is None else requests
        tiles = tiles_per_program(expected_segments(tokens, group, rows), max_context, TILE, tiles,
                                  wide_tiles)
    tiles = max(tiles, triton.cdiv(max_context, TILE * grid_limits.MAX_GRID_YZ))
    grid = (tokens, triton.cdiv(max_context, TILE * tiles))
    indexer_gluon_kernel[grid](
        q, q.stride(0), q.stride(1), weights, weights.stride(0),
        index_pages.view(torch.int32), index_pages.stride(0) // 4,
        block_table, block_table.stride(0),
        req_ids, positions, run_offset, starts,
        out, out.stride(0), maxima, 0 if maxima is None else maxima.stride(0),
        tokens, max_context, index_pages.shape[0], block_table.shape[1], index_pages.shape[1], tiles, **meta)
    return out


def launch_meta(q: torch.Tensor, index_pages: torch.Tensor, group: int, stages: int, depth: int = 2,
                stacked: bool = False, mx_registers: bool = False, token_stack: int = 1,
                head_sum_mma: bool = False, warp_specialized: bool = False, producer_regs: int = 40,
                mx_fold: bool = False) -> dict:
    """The kernel's constexprs (and warps) for a call."""
    hi_lo, mx = q.dtype == torch.bfloat16, index_pages.shape[2] == MX_RECORD_BYTES
    tstack = token_stack if group > 1 and not (hi_lo or mx) else 1
    return dict(H=q.shape[1], BLOCK_H=max(16, triton.next_power_of_2(q.shape[1])), GROUP=group, STAGES=stages,
                DEPTH=depth, WHOLE=index_pages.shape[1] == TILE, HI_LO=hi_lo, MX=mx,
                STACK=bool(stacked) and hi_lo and not mx, MX_REG=bool(mx_registers) and mx,
                TSTACK=tstack, HSUM=bool(head_sum_mma) and tstack == 1, WS=bool(warp_specialized),
                PRODUCER_REGS=producer_regs, MX_FOLD=bool(mx_fold) and mx and bool(mx_registers) and bool(head_sum_mma),
                num_warps=4)


def compile_failure(hi_lo: bool, mx: bool = False, head_sum: bool = False, fold: bool = False) -> str:
    """"" if this process's Triton compiles the kernel (FP8 queries, or bf16 ones with ``hi_lo``; MXFP4 keys with
    ``mx``, decoded into register operands as the backend launches them; the head sums as MMAs with ``head_sum``; the
    MXFP4 keys' folded scales with ``fold``, which needs both),
    else the compiler's message: :data:`VERIFIED_TRITON` releases are taken as compiling it; another is asked once a
    combination, by compiling a one-token variant for sm_90 (the head-sum MMA's operand reorder is asserted free of
    data movement: a release that cannot prove it refuses that variant, and those calls fall back)."""
    if triton.__version__.startswith(VERIFIED_TRITON):
        return ""
    fold = bool(fold) and mx and head_sum
    key = (hi_lo, mx, head_sum, fold)
    if key not in _COMPILE_FAILURES:
        from triton.backends.compiler import GPUTarget
        from triton.experimental.gluon._runtime import GluonASTSource

        kernel = triton_launch(indexer_gluon_kernel)  # (the Gluon function behind the launch cache)
        constexprs = dict(H=32, BLOCK_H=32, GROUP=1, STAGES=3, DEPTH=2, WHOLE=True, HI_LO=hi_lo, MX=mx,
                          STACK=hi_lo and not mx, MX_REG=mx, TSTACK=1, HSUM=head_sum, WS=False, PRODUCER_REGS=40,
                          MX_FOLD=fold, maxima_ptr=None, MAXIMA_G=16)
        pointers = dict(q_ptr="bf16" if hi_lo else "fp8e4nv", w_ptr="fp32", pages_i32="i32", block_table_ptr="i32",
                        req_ptr="i32", pos_ptr="i32", off_ptr="i32", seg_ptr="i32", out_ptr="fp32")
        signature = {arg: "constexpr" if arg in constexprs else ("*" + pointers[arg] if arg in pointers else "i32")
                     for arg in kernel.arg_names}
        try:
            triton.compile(GluonASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                           target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
            _COMPILE_FAILURES[key] = ""
        except Exception as exc:  # noqa: BLE001 - any compiler error: the calls fall back, its message is kept
            _COMPILE_FAILURES[key] = " ".join(str(exc).split())[-300:] or type(exc).__name__
    return _COMPILE_FAILURES[key]


# the launch cache (dsahal.kernel_launch) for this module's kernel: 33-80 us less host time a call than Triton's own
# launch of a Gluon kernel (H200, twenty-first session, scripts/h200/gluon_launch.py), the same outputs bit for bit
wrap_launched(globals())
