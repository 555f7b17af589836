"""Paged indexer score, block tiles with a segment's query tokens stacked along N: one MMA per key tile.

Same contract, calls and grid as :mod:`.indexer_decode` (whose launcher runs this kernel with ``stack > 0``),
for FP8 (132 B) keys with FP8 or bf16 queries. There, per 64-key tile, each member token of a segment runs
its own ``keys [BLOCK_N, 128] @ q_gᵀ [128, BLOCK_H]`` MMA (N = 32 at 32 heads; at 5 tokens five MMAs, each
re-reading the key operand) and its own relu / weight / head-sum pass. Here (the design of DeepGEMM's SM90
``fp8_paged_mqa_logits``: keys on the MMA's M side, tokens x heads on its N side) the members' queries are
loaded once per program into one ``[P * BLOCK_H, 128]`` operand (row ``g * BLOCK_H + h``: member ``g``'s
head ``h``), each tile runs ``keys @ q_stackᵀ -> [BLOCK_N, P * BLOCK_H]`` once, and each member's head
columns are summed by one of (``STACK``, :data:`STACK_MODES`):

1. relu x weight in registers (the weights re-read per tile, L1 hits), ``tl.reshape`` to
   ``[BLOCK_N, P, BLOCK_H]`` (no data movement: Triton gives the result a linear layout over the same
   registers) and ``tl.sum(axis=2)``;
2. relu x weight in registers, then a second MMA against the constant block-diagonal 0/1 matrix
   ``[P * BLOCK_H, 16]`` (column ``j`` sums member ``j``'s heads; 16 is the smallest dot N), its fp32
   operand split into bf16 hi + lo: two bf16 MMAs. The split keeps ~16 significant bits (relative error
   <= 2^-16 per term); products by 0/1 and the fp32 accumulation add no error;
3. relu only in registers, the second MMA against the block diagonal of the head weights, both sides
   split into bf16 hi + lo (lo·hi + hi·lo + hi·hi: three MMAs, relative error ~2^-15 per term); no
   per-element weight multiply and no weight loads per tile.

The per-key scale multiplies the ``[BLOCK_N, P]`` head sums, after the reduction (as DeepGEMM does).
bf16 hi + lo rather than tf32 (10 bits: 2^-11 per term, beyond the sweep's 1e-4 check) or fp16 (logits
of FP8 operands reach 448² x 128, beyond fp16's range).

Pieces. ``P`` (members per MMA) is a power of two, as Triton's shapes must be. A segment's member count
``n`` is known only on the device (a 1-token request's segment has one member whatever ``GROUP`` is), so
the program branches on it, uniformly, into a compile-time specialisation of the tile loop per case:
padded (``SPLIT`` off) ``n`` = 1, 2, 3-4, 5-8 run one piece of P = 1, 2, 4, 8 (padded rows: zero queries
and weights, never stored); with ``SPLIT`` ``n`` runs as its binary pieces (5 = 4 + 1, 3 = 2 + 1,
7 = 4 + 2 + 1), one MMA each and no padded rows (at 5 tokens N = 128 + 32 rather than 256: 5/8 of the MMA
work).

Each member's scores are then stored as in indexer_decode (one ``[BLOCK_N]`` row per member and tile).
The ``[BLOCK_N, P * BLOCK_H]`` fp32 accumulator costs P * BLOCK_H / 4 registers per thread at 4 warps (128 at
8 x 32): padded 5-token segments spill in modes 2 and 3 (sm_90 AOT compile), split ones do not.

Not claimed batch invariant: a token's score comes from an MMA of N = P x BLOCK_H, and P depends on its
segment (``scripts/h200/indexer_sweep.py`` reports whether the H200 gives the same bits anyway).

Exact-dot mode (``DOT == 2``, tests under ``TRITON_INTERPRET=1``): every MMA in fp32 (``ieee``), the head
sums' hi and lo parts widened back to fp32 (the same values: the interpreter's bf16 dots are wrong).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .indexer_decode import SIZE_ARGS, _lanes, _store, _table_entry, _tile_bytes, _tile_operands, _tile_raw

STACK_MODES = {
    0: "off: one MMA per member token (indexer_decode's kernel)",
    1: "stacked MMA; head sums by tl.reshape + tl.sum",
    2: "stacked MMA; head sums by a bf16 hi/lo MMA against a block-diagonal 0/1 matrix",
    3: "stacked MMA; head sums by a bf16 hi/lo MMA against the block-diagonal head weights",
}
HSUM_N = tl.constexpr(16)  # the head-sum MMA's N (Triton's smallest dot N): column j < P holds member j's sum
MAX_STACK_ROWS = 256  # P x BLOCK_H of one MMA: the widest Hopper MMA (wgmma N <= 256)


def largest_piece(group: int, split: bool) -> int:
    """Members in the widest MMA a segment of ``group`` tokens runs: its power-of-two padding, or with
    ``split`` its largest binary piece."""
    return 1 << (group.bit_length() - 1) if split else triton.next_power_of_2(group)


@triton.jit
def _members(req_ptr, pos_ptr, off_ptr, t0, T, req, off0, J0: tl.constexpr, P: tl.constexpr, C: tl.constexpr,
             GROUP: tl.constexpr):
    """Members ``J0 .. J0 + P - 1`` of the segment starting at token ``t0`` as ``[C]`` vectors (``C >= P``;
    lanes ``>= P`` never members): whether each is one (a token of request ``req`` at run offset
    ``off0 + J0 + j``, inside the segment's ``GROUP``) and its position (-1 when not)."""
    j = tl.arange(0, C)
    g = J0 + j
    t = t0 + g
    inside = (t < T) & (j < P) & (g < GROUP)
    tt = tl.where(inside, t, t0)
    ok = inside & (tl.load(req_ptr + tt) == req) & (tl.load(off_ptr + tt) == off0 + g)
    return ok, tl.where(ok, tl.load(pos_ptr + tt), -1)


@triton.jit
def _stack_queries(q_ptr, stride_qt, stride_qh, t0, n, H, J0: tl.constexpr, P: tl.constexpr, BLOCK_H: tl.constexpr,
                   DOT: tl.constexpr):
    """Members ``J0 .. J0 + P - 1``'s queries stacked (the segment has ``n``): ``[P * BLOCK_H, 128]`` in the
    MMA type, row ``g * BLOCK_H + h`` member ``J0 + g``'s head ``h``, zero for heads ``>= H`` and members
    ``>= n`` (padded rows)."""
    r = tl.arange(0, P * BLOCK_H)
    g = J0 + r // BLOCK_H
    h = r % BLOCK_H
    real = (g < n) & (h < H)
    rows = q_ptr + (t0 + tl.where(real, g, 0)).to(tl.int64) * stride_qt + h * stride_qh
    q = tl.load(rows[:, None] + tl.arange(0, 128)[None, :], mask=real[:, None], other=0.0)
    if DOT == 0:
        q = q.to(tl.bfloat16)
    elif DOT == 2:
        q = q.to(tl.float32)
    return q


@triton.jit
def _weights(seg, H: tl.constexpr, J0: tl.constexpr, P: tl.constexpr, BLOCK_H: tl.constexpr):
    """The stacked rows' head weights ``[P * BLOCK_H]`` fp32, zero on padded rows (whatever the weights of
    the tokens there: 0 · Inf would be NaN). ``seg``: the segment, (t0, member count n, pos_ptr, w_ptr,
    stride_wt)."""
    r = tl.arange(0, P * BLOCK_H)
    g = J0 + r // BLOCK_H
    h = r % BLOCK_H
    real = (g < seg[1]) & (h < H)
    return tl.load(seg[3] + (seg[0] + tl.where(real, g, 0)).to(tl.int64) * seg[4] + h, mask=real, other=0.0)


@triton.jit
def _split(x, DOT: tl.constexpr):
    """fp32 ``x`` -> (hi, lo) bf16 with ``hi + lo`` within ~2^-16 of ``x`` (fp32-widened with ``DOT == 2``)."""
    hi = x.to(tl.bfloat16)
    lo = (x - hi.to(tl.float32)).to(tl.bfloat16)
    if DOT == 2:
        return hi.to(tl.float32), lo.to(tl.float32)
    return hi, lo


@triton.jit
def _hdot(a, b, acc, DOT: tl.constexpr):
    """``acc + a @ b`` for the head sums (ieee fp32 in the exact-dot mode)."""
    if DOT == 2:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _piece_operands(q_ptr, stride_qt, stride_qh, seg, H: tl.constexpr, J0: tl.constexpr, P: tl.constexpr,
                    BLOCK_H: tl.constexpr, STACK: tl.constexpr, DOT: tl.constexpr):
    """One piece's per-program operands: (stacked queries, the head-sum MMA's block-diagonal operand
    ``[P * BLOCK_H, HSUM_N]`` as hi, lo). That operand has row ``g * BLOCK_H + h``'s one nonzero in column
    ``g``: 1 (``STACK == 2``; lo is 0) or the row's head weight (``STACK == 3``); unused with ``STACK == 1``."""
    q = _stack_queries(q_ptr, stride_qt, stride_qh, seg[0], seg[1], H, J0, P, BLOCK_H, DOT)
    r = tl.arange(0, P * BLOCK_H)
    own = (r // BLOCK_H)[:, None] == tl.arange(0, HSUM_N)[None, :]
    if STACK == 3:
        m_hi, m_lo = _split(tl.where(own, _weights(seg, H, J0, P, BLOCK_H)[:, None], 0.0), DOT)
    else:
        m_hi, m_lo = _split(tl.where(own, 1.0, 0.0), DOT)
    return q, m_hi, m_lo


@triton.jit
def _piece_sums(keys, scale, piece, seg, H: tl.constexpr, J0: tl.constexpr, P: tl.constexpr, BLOCK_H: tl.constexpr,
                STACK: tl.constexpr, DOT: tl.constexpr):
    """``Σ_h w[g, h] · relu(q[g, h] · k[s]) · scale[s]`` for the piece's members ``g`` on this tile:
    ``[BLOCK_N, P]`` fp32 (``STACK == 1``) or ``[BLOCK_N, HSUM_N]`` (columns ``>= P`` zero)."""
    if DOT == 2:
        logits = tl.dot(keys, tl.trans(piece[0]), input_precision="ieee")  # [BLOCK_N, P * BLOCK_H]
    else:
        logits = tl.dot(keys, tl.trans(piece[0]))
    BLOCK_N: tl.constexpr = logits.shape[0]
    zero = tl.zeros([BLOCK_N, HSUM_N], tl.float32)
    if STACK == 3:
        x_hi, x_lo = _split(tl.maximum(logits, 0.0), DOT)
        # small terms first: lo·hi and hi·lo, then hi·hi (lo·lo, ~2^-18 relative, is left out)
        sums = _hdot(x_hi, piece[1], _hdot(x_hi, piece[2], _hdot(x_lo, piece[1], zero, DOT), DOT), DOT)
    else:
        # the weights are re-read per tile (L1 hits), as indexer_decode does: held for the program they
        # would take P * BLOCK_H / 4 registers per thread at 4 warps
        x = tl.maximum(logits, 0.0) * _weights(seg, H, J0, P, BLOCK_H)[None, :]
        if STACK == 1:
            sums = tl.sum(tl.reshape(x, [BLOCK_N, P, BLOCK_H]), axis=2)  # in-thread adds and lane shuffles
        else:
            x_hi, x_lo = _split(x, DOT)
            sums = _hdot(x_hi, piece[1], _hdot(x_lo, piece[1], zero, DOT), DOT)
    return sums * scale[:, None]


@triton.jit
def _store_members(out_ptr, stride_ot, seg, J0: tl.constexpr, P: tl.constexpr, GROUP: tl.constexpr, sums, s, seen,
                   max_context):
    """Column ``j`` of ``sums`` -> member ``J0 + j``'s row, -inf where the block is not ``seen`` (unmapped,
    or a dead tile: past the segment's reach) or ``s`` is past the member's position. One 1-D store per
    member as in indexer_decode, its position a scalar load (an L1 hit): a 2-D store of the piece with
    member vectors held from the prologue made Triton convert the vectors, masks and pointers through
    shared memory on every tile."""
    C: tl.constexpr = sums.shape[1]
    cols = tl.arange(0, C)[None, :]
    for j in tl.static_range(P):
        if J0 + j < GROUP:  # (padded rows past GROUP are never members: nothing compiled for them)
            ok = J0 + j < seg[1]
            t = seg[0] + J0 + j
            pos = tl.load(seg[2] + tl.where(ok, t, seg[0]))
            # column j: a select and in-thread adds (plus lane shuffles where columns span lanes)
            score = tl.sum(tl.where(cols == j, sums, 0.0), axis=1)
            _store(out_ptr, stride_ot, t, ok, s, score, seen & (s <= pos), max_context)


@triton.jit
def _stack_tile(tile, a, b, mapped, pa, pb, pc, seg, out_ptr, stride_ot, max_context, H: tl.constexpr,
                P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, BLOCK_H: tl.constexpr, GROUP: tl.constexpr,
                STACK: tl.constexpr, DOT: tl.constexpr):
    """Scores of key tile ``tile`` (raw bytes ``a``, ``b``) for the segment ``seg`` (see :func:`_weights`):
    one stacked MMA per piece (``pa`` members 0 .. P0 - 1, ``pb`` the next P1, ``pc`` the next P2; a piece of
    0 members is absent)."""
    keys, scale = _tile_operands(a, b, 1, DOT, 0, 0)
    BLOCK_N: tl.constexpr = scale.shape[0]
    s = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    seen = _lanes(mapped, s)
    _store_members(out_ptr, stride_ot, seg, 0, P0, GROUP, _piece_sums(keys, scale, pa, seg, H, 0, P0, BLOCK_H, STACK,
                                                                       DOT), s, seen, max_context)
    if P1 > 0:
        _store_members(out_ptr, stride_ot, seg, P0, P1, GROUP, _piece_sums(keys, scale, pb, seg, H, P0, P1, BLOCK_H,
                                                                            STACK, DOT), s, seen, max_context)
    if P2 > 0:
        _store_members(out_ptr, stride_ot, seg, P0 + P1, P2, GROUP,
                       _piece_sums(keys, scale, pc, seg, H, P0 + P1, P2, BLOCK_H, STACK, DOT), s, seen, max_context)


@triton.jit
def _segment(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt, out_ptr,
             stride_ot, seg, req, reach, max_context, num_blocks, max_blocks, block_tokens, H: tl.constexpr,
             DOT: tl.constexpr, TOKEN_BYTES: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
             GROUP: tl.constexpr, TILES: tl.constexpr, LOOP: tl.constexpr, STACK: tl.constexpr, P0: tl.constexpr,
             P1: tl.constexpr, P2: tl.constexpr):
    """This program's key tiles for the segment ``seg`` (see :func:`_weights`; its members' furthest position
    ``reach``), its members run as pieces of P0, P1, P2 (0: none) members. The tile loops (``LOOP``) are
    indexer_decode's: 0 unrolled, 1 / 3 rolled prefetching one / two tiles into registers, 2 rolled for the
    software pipeliner."""
    pa = _piece_operands(q_ptr, stride_qt, stride_qh, seg, H, 0, P0, BLOCK_H, STACK, DOT)
    pb = pa  # placeholders for absent pieces, never used
    pc = pa
    if P1 > 0:
        pb = _piece_operands(q_ptr, stride_qt, stride_qh, seg, H, P0, P1, BLOCK_H, STACK, DOT)
    if P2 > 0:
        pc = _piece_operands(q_ptr, stride_qt, stride_qh, seg, H, P0 + P1, P2, BLOCK_H, STACK, DOT)
    first = tl.program_id(1) * TILES
    # tiles holding a visible key (s <= reach, s < max_context) get loads and MMAs; the rest -inf only
    last = tl.minimum(reach, max_context - 1)
    live = tl.minimum(tl.maximum(last // BLOCK_N + 1 - first, 0), TILES)
    req64 = req.to(tl.int64)
    if LOOP == 0:
        for i in tl.static_range(TILES):
            if i < live:
                a, b, mapped = _tile_raw(pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt, req64,
                                         first + i, num_blocks, max_blocks, block_tokens, 1, TOKEN_BYTES, BLOCK_N, 0)
                _stack_tile(first + i, a, b, mapped, pa, pb, pc, seg, out_ptr, stride_ot, max_context, H, P0, P1, P2,
                            BLOCK_H, GROUP, STACK, DOT)
    elif LOOP == 1:
        if live > 0:
            a_n, b_n, mapped_n = _tile_raw(pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt, req64,
                                           first, num_blocks, max_blocks, block_tokens, 1, TOKEN_BYTES, BLOCK_N, 0)
            entry = _table_entry(block_table_ptr, stride_bt, req64, first + tl.minimum(1, live - 1), max_blocks,
                                 block_tokens, BLOCK_N)
            for i in range(live):
                a, b, mapped = a_n, b_n, mapped_n
                a_n, b_n, mapped_n = _tile_bytes(pages_u8, s8_b, pages_f32, s32_b, entry,
                                                 first + tl.minimum(i + 1, live - 1), num_blocks, block_tokens, 1,
                                                 TOKEN_BYTES, BLOCK_N, 0)
                entry = _table_entry(block_table_ptr, stride_bt, req64, first + tl.minimum(i + 2, live - 1),
                                     max_blocks, block_tokens, BLOCK_N)
                _stack_tile(first + i, a, b, mapped, pa, pb, pc, seg, out_ptr, stride_ot, max_context, H, P0, P1, P2,
                            BLOCK_H, GROUP, STACK, DOT)
    elif LOOP == 3:
        if live > 0:
            a_n, b_n, mapped_n = _tile_raw(pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt, req64,
                                           first, num_blocks, max_blocks, block_tokens, 1, TOKEN_BYTES, BLOCK_N, 0)
            a_nn, b_nn, mapped_nn = _tile_raw(pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt, req64,
                                              first + tl.minimum(1, live - 1), num_blocks, max_blocks, block_tokens,
                                              1, TOKEN_BYTES, BLOCK_N, 0)
            entry = _table_entry(block_table_ptr, stride_bt, req64, first + tl.minimum(2, live - 1), max_blocks,
                                 block_tokens, BLOCK_N)
            for i in range(live):
                a, b, mapped = a_n, b_n, mapped_n
                a_n, b_n, mapped_n = a_nn, b_nn, mapped_nn
                a_nn, b_nn, mapped_nn = _tile_bytes(pages_u8, s8_b, pages_f32, s32_b, entry,
                                                    first + tl.minimum(i + 2, live - 1), num_blocks, block_tokens, 1,
                                                    TOKEN_BYTES, BLOCK_N, 0)
                entry = _table_entry(block_table_ptr, stride_bt, req64, first + tl.minimum(i + 3, live - 1),
                                     max_blocks, block_tokens, BLOCK_N)
                _stack_tile(first + i, a, b, mapped, pa, pb, pc, seg, out_ptr, stride_ot, max_context, H, P0, P1, P2,
                            BLOCK_H, GROUP, STACK, DOT)
    else:
        for i in range(live):
            a, b, mapped = _tile_raw(pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt, req64, first + i,
                                     num_blocks, max_blocks, block_tokens, 1, TOKEN_BYTES, BLOCK_N, 0)
            _stack_tile(first + i, a, b, mapped, pa, pb, pc, seg, out_ptr, stride_ot, max_context, H, P0, P1, P2,
                        BLOCK_H, GROUP, STACK, DOT)
    for i in range(live, TILES):
        s = (first + i) * BLOCK_N + tl.arange(0, BLOCK_N)
        # unseen: every member's row -inf (the column sums are never read)
        _store_members(out_ptr, stride_ot, seg, 0, P0 + P1 + P2, GROUP, tl.zeros([BLOCK_N, 1], tl.float32), s, s < 0,
                       max_context)


@triton.jit(do_not_specialize=SIZE_ARGS)
def indexer_stack_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 128] (fp8 or bf16; fp32 in the exact-dot mode)
    w_ptr, stride_wt,  # [T, H] fp32
    pages_u8, s8_b, pages_f32, s32_b,  # uint8 (or e4m3-typed) and fp32 views of the pages, block strides
    block_table_ptr, stride_bt,  # [B, max_blocks] int32, -1 unmapped
    req_ptr, pos_ptr, off_ptr, seg_ptr,  # [T] request, position, index in its request run; [T] segment starts
    out_ptr, stride_ot,  # [T, max_context] fp32
    T, max_context, num_blocks, max_blocks, block_tokens,
    H: tl.constexpr, DOT: tl.constexpr, TOKEN_BYTES: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr, TILES: tl.constexpr, LOOP: tl.constexpr, STACK: tl.constexpr, SPLIT: tl.constexpr,
):
    t0 = tl.load(seg_ptr + tl.program_id(0))
    if t0 < T:
        req = tl.load(req_ptr + t0)
        off0 = tl.load(off_ptr + t0)
        # members are a prefix of the segment (a request's run is contiguous): n of them
        ok, pos = _members(req_ptr, pos_ptr, off_ptr, t0, T, req, off0, 0, GROUP, 8, GROUP)
        n = tl.sum(ok.to(tl.int32), axis=0)
        reach = tl.max(pos, axis=0)
        seg = (t0, n, pos_ptr, w_ptr, stride_wt)
        # one arm per piece layout (uniform branches), compiled only for the counts GROUP allows
        if n == 1:
            _segment(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt,
                     out_ptr, stride_ot, seg, req, reach, max_context, num_blocks, max_blocks, block_tokens, H, DOT,
                     TOKEN_BYTES, BLOCK_H, BLOCK_N, GROUP, TILES, LOOP, STACK, 1, 0, 0)
        if GROUP >= 2:
            if n == 2:
                _segment(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, pages_f32, s32_b, block_table_ptr, stride_bt,
                         out_ptr, stride_ot, seg, req, reach, max_context, num_blocks, max_blocks, block_tokens, H, DOT,
                         TOKEN_BYTES, BLOCK_H, BLOCK_N, GROUP, TILES, LOOP, STACK, 2, 0, 0)
        if SPLIT:  # binary pieces, largest first
            if GROUP >= 3:
                if n == 3:
                    _segment(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, pages_f32, s32_b, block_table_ptr,
                             stride_bt, out_ptr, stride_ot, seg, req, reach, max_context, num_blocks, max_blocks,
                             block_tokens, H, DOT, TOKEN_BYTES, BLOCK_H, BLOCK_N, GROUP, TILES, LOOP, STACK, 2, 1, 0)
            if GROUP >= 4:
                if n == 4:
                    _segment(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, pages_f32, s32_b, block_table_ptr,
                             stride_bt, out_ptr, stride_ot, seg, req, reach, max_context, num_blocks, max_blocks,
                             block_tokens, H, DOT, TOKEN_BYTES, BLOCK_H, BLOCK_N, GROUP, TILES, LOOP, STACK, 4, 0, 0)
            if GROUP >= 5:
                if n == 5:
                    _segment(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, pages_f32, s32_b, block_table_ptr,
                             stride_bt, out_ptr, stride_ot, seg, req, reach, max_context, num_blocks, max_blocks,
                             block_tokens, H, DOT, TOKEN_BYTES, BLOCK_H, BLOCK_N, GROUP, TILES, LOOP, STACK, 4, 1, 0)
            if GROUP >= 6:
                if n == 6:
                    _segment(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, pages_f32, s32_b, block_table_ptr,
                             stride_bt, out_ptr, stride_ot, seg, req, reach, max_context, num_blocks, max_blocks,
                             block_tokens, H, DOT, TOKEN_BYTES, BLOCK_H, BLOCK_N, GROUP, TILES, LOOP, STACK, 4, 2, 0)
            if GROUP >= 7:
                if n == 7:
                    _segment(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, pages_f32, s32_b, block_table_ptr,
                             stride_bt, out_ptr, stride_ot, seg, req, reach, max_context, num_blocks, max_blocks,
                             block_tokens, H, DOT, TOKEN_BYTES, BLOCK_H, BLOCK_N, GROUP, TILES, LOOP, STACK, 4, 2, 1)
            if GROUP >= 8:
                if n == 8:
                    _segment(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, pages_f32, s32_b, block_table_ptr,
                             stride_bt, out_ptr, stride_ot, seg, req, reach, max_context, num_blocks, max_blocks,
                             block_tokens, H, DOT, TOKEN_BYTES, BLOCK_H, BLOCK_N, GROUP, TILES, LOOP, STACK, 8, 0, 0)
        else:  # one piece, padded to a power of two
            if GROUP >= 3:
                if (n == 3) | (n == 4):
                    _segment(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, pages_f32, s32_b, block_table_ptr,
                             stride_bt, out_ptr, stride_ot, seg, req, reach, max_context, num_blocks, max_blocks,
                             block_tokens, H, DOT, TOKEN_BYTES, BLOCK_H, BLOCK_N, GROUP, TILES, LOOP, STACK, 4, 0, 0)
            if GROUP >= 5:
                if n >= 5:
                    _segment(q_ptr, stride_qt, stride_qh, pages_u8, s8_b, pages_f32, s32_b, block_table_ptr,
                             stride_bt, out_ptr, stride_ot, seg, req, reach, max_context, num_blocks, max_blocks,
                             block_tokens, H, DOT, TOKEN_BYTES, BLOCK_H, BLOCK_N, GROUP, TILES, LOOP, STACK, 8, 0, 0)
