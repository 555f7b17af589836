"""Few-heads sparse MLA on fp8_ds_mla latents in Gluon: the gather staged by ``cp.async``, one warp per 128-dim tile.

Same op and arithmetic as :mod:`.sparse_mla_small_heads_raw` (``o[t, h] = softmax_s(scale · q[t, h] · kv[s]) ·
kv[s, :512]``, ``lse`` natural log, -1 and out-of-range slots skipped, a row with no valid slot gives ``o = 0``,
``lse = -inf``; e4m3 codes widened to fp16 exactly, each 128-dim tile's scale ``σ[s, c]`` applied after the logit
MMA and folded into ``P`` for the value MMA as ``P_c = p · σ_c / M_c``, ``M_c`` the running largest tile-c scale;
the queries scaled per head by a power of two into fp16's range), for bf16 queries on H200-class GPUs.

Why Gluon. The Triton kernels of this op wait: the raw kernel issues ~2,160 instructions a warp per 64-slot step at
two programs of four warps a SM, ~10 cycles apart (the H200 measured 0.457 ms at 64 x 5 tokens, H = 16, against
FlashMLA's 0.297 with its heads padded to 64), and a rewrite in ``tl`` with the four tiles as the batch of 3-D MMAs
(sixteenth session) gave the same time: each step's gather is loaded into registers and waited on before any MMA.
Here the schedule is explicit:

- the gather of step ``i + STAGES - 1`` (each record's 512 code bytes, 4 tile scales and 64 RoPE words, 16-byte
  ``cp.async`` copies, zero-filled for skipped slots; the step's slot indices loaded one issue earlier) is in
  flight while step ``i`` computes;
- warp ``w`` owns part ``w`` of the nope dims (a 128-dim tile, or half of one with two warps a tile): it widens the
  codes its own lanes copied (the same thread layout as the copy, so no barrier between the two), stores its fp16
  part once and reads it back as both MMA operands by ``ldmatrix`` (``.trans`` for the values); its queries stay in
  registers, or in shared memory (``Q_SMEM``: fewer registers, more programs a SM);
- the logits are ``mma.sync`` products of 16 heads by ``BLOCK_N`` slots per part, summed over the warps; the RoPE
  dims are split 16 a warp over the first four.

Measured on the H200 (BENCHMARKS.md, sixteenth session, 64 x 5 tokens x 2048 slots): 0.426 ms at H = 16 (16-slot
steps, 3 stages, the queries in shared memory, 168 registers: three programs a SM), 1.09x the raw kernel, 0.71x
FlashMLA with its heads padded to 64: still latency-bound, each step's chain (copy wait, widening, both MMAs, the
cross-warp logit sum, softmax) exposed at 12 warps a SM.

One program = (one split of the slot list, one token), heads padded to 16; ``splits > 1`` writes fp32 partials that
:func:`.lse_combine.lse_combine` merges in split order (a fixed slot count per split: a row's result does not depend
on the batch). Gluon has no interpreter: CPU runs cannot execute this kernel; its sm_90 compile is checked on any
machine (``python -m dsahal.backends.nvidia.aot``, ``tests/test_sparse_mla_gluon.py``), its results on the H200
(``scripts/h200/gluon_check.py`` against the float64 reference, ``scripts/h200/small_heads_sweep.py``) and by the
conformance suite, its route (``gluon_few_heads``) forced, in both modes (eighteenth session).
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from dsahal.kernel_launch import wrap_launched

from . import grid as launch_grid
from .balanced import launch_programs
from .bytes import row_alignment
from .indexer_decode import runs_ptx
from .lse_combine import lse_combine
from .partials import bounded_partials
from .sparse_mla import LOG2E
from .sparse_mla_small_heads_raw import check_launch, unit_stride_and_outputs

# Triton 3.6 (the H200's) names the copy async_copy_global_to_shared; later releases renamed it async_load
_async_copy = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # (renamed barrier the same way)

SIZE_ARGS = ("H", "K", "num_slots", "block_tokens", "split_size")
MAX_HEADS = 16  # the heads are the MMAs' M side: one m16 tile
BLOCK_H = gl.constexpr(16)  # heads padded to one m16 MMA tile
DEFAULT_BLOCK_N, DEFAULT_STAGES, DEFAULT_SPLIT = 16, 4, 1  # the launcher's defaults

# Layouts, built per (SPLIT, BLOCK_N): the MMAs are batched over B = 4 * SPLIT parts of the 512 nope dims, one warp
# each (part w: dims w * D .. w * D + D - 1, D = 128 / SPLIT, inside tile w // SPLIT): [part, head, slot or dim].
_RAW_SMEM = gl.constexpr(gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[2, 1, 0]))
_F16_SMEM = gl.constexpr(gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[2, 1, 0]))
_ROPE_SMEM = gl.constexpr(gl.SwizzledSharedLayout(vec=8, per_phase=4, max_phase=2, order=[2, 1, 0]))
_SCALE_SMEM = gl.constexpr(gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=1, order=[1, 0]))
# (a staged buffer's layout is its one stage's: the leading stage dimension is outside it; lanes write and read
# 16-byte pieces of rows 64-128 bytes apart: the XOR swizzle spreads a warp's over the banks)


@gluon.constexpr_function
def _mma(parts):
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[parts, 1, 1], instr_shape=[1, 16, 8])


@gluon.constexpr_function
def _pieces(parts, block_n, width):
    """A copy's layout for ``[part, slot, element]`` tiles of 16-byte pieces of ``width`` elements: lane l of warp w
    holds slot ``l % block_n``'s pieces of part w (one slot index and one record address a lane; with fewer slots
    than lanes, a slot's pieces split over 32 / block_n lanes). A lane widens exactly the bytes it copied."""
    rows = min(32, block_n)
    return gl.BlockedLayout([1, 1, width], [1, rows, 32 // rows], [parts, 1, 1], [2, 1, 0])


@gluon.constexpr_function
def _scales(parts, block_n):
    """Tile scales ``[slot, part]`` (part w's tile's scale; at 4 parts one 16-byte piece a slot), spread over the
    warps' lanes (a small tensor: lanes and warps beyond its elements copy the same bytes again)."""
    rows = min(32, block_n)
    return gl.BlockedLayout([1, 4], [rows, 32 // rows], [1, parts], [1, 0])


@gluon.constexpr_function
def _queries(parts, dims):
    """Queries ``[part, head, dim]`` as loaded: 8 values a lane."""
    return gl.BlockedLayout([1, 1, 8], [1, 256 // dims, dims // 8], [parts, 1, 1], [2, 1, 0])


@gluon.jit
def _slots(slot_row, n0, end, layout: gl.constexpr, BLOCK_N: gl.constexpr):
    """Slots ``n0 .. n0 + BLOCK_N`` of the token's list in ``layout`` (-1 past the split's end)."""
    n = n0 + gl.arange(0, BLOCK_N, layout)
    return gl.load(slot_row + n, mask=n < end, other=-1)


@gluon.jit
def _rows(slot, num_slots, s8_b, s8_t, block_tokens, FLAT: gl.constexpr, OFF32: gl.constexpr):
    """Physical slots -> (record byte offsets, 16-byte aligned (int32 with ``OFF32``, else int64; 0 for a skipped
    slot), whether each is a valid slot)."""
    ok = (slot >= 0) & (slot < num_slots)
    safe = gl.where(ok, slot, 0)
    if OFF32:  # the pool spans < 2 GiB: 32-bit byte offsets
        if FLAT:  # blocks back to back: one multiply
            row = safe * s8_t
        else:
            row = (safe // block_tokens) * s8_b + (safe % block_tokens) * s8_t
    elif FLAT:
        row = safe.to(gl.int64) * s8_t
    else:
        row = (safe // block_tokens).to(gl.int64) * s8_b + (safe % block_tokens).to(gl.int64) * s8_t
    return gl.multiple_of(row, 16), ok


@gluon.jit
def _issue(pages_u8, slot, num_slots, s8_b, s8_t, block_tokens, codes, rope, scales, FLAT: gl.constexpr,
           OFF32: gl.constexpr, SPLIT: gl.constexpr, BLOCK_N: gl.constexpr):
    """Start the copies of one step's records (``slot [BLOCK_N]``, in the codes layout's slot slice) into one stage
    (``codes [B, BLOCK_N, D]`` uint8, ``rope [B, BLOCK_N, 16]`` bf16 (parts >= 4 hold no RoPE dims), ``scales
    [BLOCK_N, B]`` fp32 (part w's tile scale) views); skipped slots are zero-filled."""
    B: gl.constexpr = 4 * SPLIT
    D: gl.constexpr = 128 // SPLIT
    CODES: gl.constexpr = _pieces(B, BLOCK_N, 16)
    ROPE: gl.constexpr = _pieces(B, BLOCK_N, 8)
    SCALES: gl.constexpr = _scales(B, BLOCK_N)
    row, ok = _rows(slot, num_slots, s8_b, s8_t, block_tokens, FLAT, OFF32)
    part = gl.arange(0, B, gl.SliceLayout(1, gl.SliceLayout(2, CODES)))
    byte = gl.arange(0, D, gl.SliceLayout(0, gl.SliceLayout(1, CODES)))
    _async_copy(codes, pages_u8 + row[None, :, None] + (part * D)[:, None, None] + byte[None, None, :],
                mask=ok[None, :, None])
    # (the same lanes hold the same slots in the other two layouts: these conversions move nothing)
    row_r = gl.convert_layout(row, gl.SliceLayout(0, gl.SliceLayout(2, ROPE)))
    ok_r = gl.convert_layout(ok, gl.SliceLayout(0, gl.SliceLayout(2, ROPE)))
    part = gl.arange(0, B, gl.SliceLayout(1, gl.SliceLayout(2, ROPE)))
    dim = gl.arange(0, 16, gl.SliceLayout(0, gl.SliceLayout(1, ROPE)))
    words = (pages_u8 + row_r[None, :, None]).to(gl.pointer_type(gl.bfloat16), bitcast=True)  # (rows 16-B aligned)
    _async_copy(rope, words + 264 + (part * 16)[:, None, None] + dim[None, None, :],  # RoPE at byte 528
                mask=ok_r[None, :, None] & (part < 4)[:, None, None])
    row_s = gl.convert_layout(row, gl.SliceLayout(1, SCALES))
    ok_s = gl.convert_layout(ok, gl.SliceLayout(1, SCALES))
    part = gl.arange(0, B, gl.SliceLayout(0, SCALES))
    ptr = (pages_u8 + row_s[:, None]).to(gl.pointer_type(gl.float32), bitcast=True) + 128 + (part // SPLIT)[None, :]
    _async_copy(scales, ptr, mask=ok_s[:, None])  # (the tile scales at byte 512: part w's is tile w // SPLIT's)


@gluon.jit
def _as_f16(codes):
    """e4m3 bytes -> fp16, exact: one ``cvt.rn.f16x2.e4m3x2`` per two values."""
    return gl.inline_asm_elementwise(
        "{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, $2;\n\tcvt.rn.f16x2.e4m3x2 $0, lo;"
        "\n\tcvt.rn.f16x2.e4m3x2 $1, hi;\n\t}", "=r,=r,r", [codes], dtype=gl.float16, is_pure=True, pack=4)


@gluon.jit(do_not_specialize=SIZE_ARGS)
def sparse_mla_gluon_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 576] bf16
    pages_u8, s8_b, s8_t,  # latent pages [num_blocks, block_tokens, 656] uint8, strides in bytes (multiples of 16)
    slots_ptr, stride_st,  # slots [T, K] int32/int64
    o_ptr, stride_os, stride_ot, stride_oh,  # o [splits, T, H, 512] (fp32 partials or bf16)
    lse_ptr, stride_ls, stride_lt,  # lse [splits, T, H] fp32
    H, K, num_slots, block_tokens, split_size,
    logit_scale,  # softmax_scale · log2(e)
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    FLAT: gl.constexpr,  # record s at byte s * s8_t (blocks back to back)
    OFF32: gl.constexpr,  # every record's byte offset fits int32 (a pool under 2 GiB)
    LAZY: gl.constexpr,  # rescale the accumulator only when a kept maximum must move (else every step)
    Q_SMEM: gl.constexpr = False,  # the fp16 queries in shared memory, not registers
    SPLIT: gl.constexpr = 1,  # warps per 128-dim tile (num_warps = 4 * SPLIT)
):
    B: gl.constexpr = 4 * SPLIT  # parts of the nope dims, one warp each
    D: gl.constexpr = 128 // SPLIT  # dims a part
    MMA: gl.constexpr = _mma(B)
    DOT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    DOT_B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    CODES: gl.constexpr = _pieces(B, BLOCK_N, 16)
    SLOTS: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, CODES))  # a step's slots as the copies hold them
    QUERY: gl.constexpr = _queries(B, D)
    QROPE: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 16, 2], [B, 1, 1], [2, 1, 0])
    HEADS: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(0, MMA))  # [16] per-head state (m, l)
    PART_ROWS: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(1, MMA))  # [B] per-part state (M_c)
    split = gl.program_id(0)
    t = gl.program_id(1).to(gl.int64)

    # queries of part w: [B, 16, D], each head scaled by 2^e into fp16's range (exact for bf16 values)
    qp = gl.arange(0, B, gl.SliceLayout(1, gl.SliceLayout(2, QUERY)))
    qh = gl.arange(0, BLOCK_H, gl.SliceLayout(0, gl.SliceLayout(2, QUERY)))
    qd = gl.arange(0, D, gl.SliceLayout(0, gl.SliceLayout(1, QUERY)))
    q_rows = q_ptr + t * stride_qt + qh[None, :, None] * stride_qh
    qf = gl.load(q_rows + (qp * D)[:, None, None] + qd[None, None, :], mask=(qh < H)[None, :, None],
                 other=0.0).to(gl.float32)
    amax = gl.max(gl.max(gl.abs(qf), axis=2), axis=0)
    biased = (amax.to(gl.int32, bitcast=True) >> 23) & 0xFF
    biased = gl.minimum(gl.maximum(biased, 15), 254)
    q_up = ((2 * 127 + 14 - biased) << 23).to(gl.float32, bitcast=True)  # 2^(14 - (biased - 127))
    q_down = ((biased - 14) << 23).to(gl.float32, bitcast=True)
    q16 = (qf * q_up[None, :, None]).to(gl.float16)
    if Q_SMEM:  # kept in shared memory and read by ldmatrix each step: fewer registers
        q_s = gl.allocate_shared_memory(gl.float16, [B, BLOCK_H, D], _F16_SMEM, q16)
    else:
        q16 = gl.convert_layout(q16, DOT_A)
    # the RoPE queries [B, 16, 16]: part w < 4 holds dims 16w .. 16w + 15 of the 64, parts >= 4 none (zeros)
    rp = gl.arange(0, B, gl.SliceLayout(1, gl.SliceLayout(2, QROPE)))
    rh = gl.arange(0, BLOCK_H, gl.SliceLayout(0, gl.SliceLayout(2, QROPE)))
    rd = gl.arange(0, 16, gl.SliceLayout(0, gl.SliceLayout(1, QROPE)))
    qr = gl.load(q_ptr + t * stride_qt + rh[None, :, None] * stride_qh + 512 + (rp * 16)[:, None, None]
                 + rd[None, None, :], mask=(rh < H)[None, :, None] & (rp < 4)[:, None, None], other=0.0)
    qr16 = gl.convert_layout(qr, DOT_A)
    head_scale = gl.convert_layout(logit_scale * q_down, gl.SliceLayout(0, gl.SliceLayout(2, MMA)))

    codes_s = gl.allocate_shared_memory(gl.uint8, [STAGES, B, BLOCK_N, D], _RAW_SMEM)
    rope_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, B, BLOCK_N, 16], _ROPE_SMEM)
    scale_s = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N, B], _SCALE_SMEM)
    f16_s = gl.allocate_shared_memory(gl.float16, [B, BLOCK_N, D], _F16_SMEM)

    slot_row = slots_ptr + t * stride_st
    start = split * split_size
    end = gl.minimum(start + split_size, K)
    steps = gl.cdiv(end - start, BLOCK_N)
    for j in gl.static_range(STAGES - 1):
        if j < steps:
            _issue(pages_u8, _slots(slot_row, start + j * BLOCK_N, end, SLOTS, BLOCK_N), num_slots, s8_b, s8_t,
                   block_tokens, codes_s.index(j), rope_s.index(j), scale_s.index(j), FLAT, OFF32, SPLIT, BLOCK_N)
        async_copy.commit_group()
    # the slot indices one issue ahead: a step's copies never wait on the load of its indices
    ahead_slots = _slots(slot_row, start + (STAGES - 1) * BLOCK_N, end, SLOTS, BLOCK_N)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, HEADS)
    l_i = gl.zeros([BLOCK_H], gl.float32, HEADS)
    big = gl.zeros([B], gl.float32, PART_ROWS)
    acc = gl.zeros([B, BLOCK_H, D], gl.float32, MMA)
    for i in range(steps):
        stage = i % STAGES
        async_copy.wait_group(STAGES - 2)  # this thread's copies of step i have landed
        _barrier()  # everyone's have; and every warp is done with step i - 1's stage
        ahead = i + STAGES - 1
        if ahead < steps:
            nxt = ahead % STAGES
            _issue(pages_u8, ahead_slots, num_slots, s8_b, s8_t, block_tokens, codes_s.index(nxt),
                   rope_s.index(nxt), scale_s.index(nxt), FLAT, OFF32, SPLIT, BLOCK_N)
        async_copy.commit_group()
        ahead_slots = _slots(slot_row, start + (ahead + 1) * BLOCK_N, end, SLOTS, BLOCK_N)

        # warp w widens its own part's codes (the bytes its lanes copied) and stores them once as fp16
        f16_s.store(_as_f16(codes_s.index(stage).load(CODES)))
        _barrier()  # (ldmatrix reads other lanes' stores)
        keys_t = f16_s.permute((0, 2, 1)).load(DOT_B)  # [B, D, BLOCK_N]
        rope_t = rope_s.index(stage).permute((0, 2, 1)).load(DOT_B)  # [B, 16, BLOCK_N]
        sigma = scale_s.index(stage).permute((1, 0)).load(gl.SliceLayout(1, MMA))  # [B, BLOCK_N]: part w's tile's
        zeros = gl.zeros([B, BLOCK_H, BLOCK_N], gl.float32, MMA)
        if Q_SMEM:
            s_nope = mma_v2(q_s.load(DOT_A), keys_t, zeros)
        else:
            s_nope = mma_v2(q16, keys_t, zeros)
        s_rope = mma_v2(qr16, rope_t, zeros)
        s3 = s_nope * sigma[:, None, :] * head_scale[None, :, None] + s_rope * logit_scale
        s = gl.sum(s3, axis=0)  # [16, BLOCK_N]: the parts' partial logits
        n = start + i * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(0, gl.SliceLayout(0, MMA)))
        slot = gl.load(slot_row + n, mask=n < end, other=-1)
        s = gl.where(((slot >= 0) & (slot < num_slots))[None, :], s, float("-inf"))

        m_blk = gl.max(s, axis=1)
        sig_blk = gl.max(sigma, axis=1)
        if LAZY:
            # the kept maxima move only when a head's logit passes its kept maximum by 2^8 or a tile's scale passes
            # 2^7 times its kept one: p = 2^(s - m) <= 2^8 and P_c = p · σ / M_c <= 2^15 stay inside fp16, and the
            # accumulator is rescaled on those steps only (softmax and output are the same sums)
            grow_m = gl.max(m_blk - m_i, axis=0)  # NaN while every head is still empty: no move
            grow_s = gl.max(sig_blk - big * 128.0, axis=0)
            if (grow_m > 8.0) | (grow_s > 0.0):
                m_new = gl.maximum(m_i, m_blk)
                alpha = gl.exp2(m_i - gl.where(m_new == float("-inf"), 0.0, m_new))
                big_new = gl.maximum(big, sig_blk)
                keep = gl.convert_layout(alpha, gl.SliceLayout(0, gl.SliceLayout(2, MMA)))
                grow = gl.convert_layout(big / gl.where(big_new > 0.0, big_new, 1.0),
                                         gl.SliceLayout(1, gl.SliceLayout(2, MMA)))
                acc = acc * (keep[None, :, None] * grow[:, None, None])
                l_i = l_i * alpha
                m_i = m_new
                big = big_new
            m_safe = gl.where(m_i == float("-inf"), 0.0, m_i)  # an all-skipped head stays at p = 0
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i + gl.sum(p, axis=1)
            big_div = gl.where(big > 0.0, big, 1.0)  # no valid slot with a nonzero scale yet: p · 0 = 0
        else:
            m_new = gl.maximum(m_i, m_blk)
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # an all-skipped head stays at p = 0
            p = gl.exp2(s - m_safe[:, None])
            alpha = gl.exp2(m_i - m_safe)
            l_i = l_i * alpha + gl.sum(p, axis=1)
            big_new = gl.maximum(big, sig_blk)
            big_div = gl.where(big_new > 0.0, big_new, 1.0)  # no valid slot with a nonzero scale yet: p · 0 = 0
            keep = gl.convert_layout(alpha, gl.SliceLayout(0, gl.SliceLayout(2, MMA)))
            grow = gl.convert_layout(big / big_div, gl.SliceLayout(1, gl.SliceLayout(2, MMA)))
            acc = acc * (keep[None, :, None] * grow[:, None, None])
            big = big_new
            m_i = m_new
        ratio = gl.convert_layout(sigma / big_div[:, None], gl.SliceLayout(1, MMA))
        p16 = gl.convert_layout((gl.expand_dims(p, 0) * ratio[:, None, :]).to(gl.float16), DOT_A)
        acc = mma_v2(p16, f16_s.load(DOT_B), acc)  # values [B, BLOCK_N, D]
    async_copy.wait_group(0)

    has_any = l_i > 0.0
    m_safe = gl.where(m_i == float("-inf"), 0.0, m_i)
    lse = gl.where(has_any, (m_safe + gl.log2(gl.where(has_any, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
    norm = gl.convert_layout(1.0 / gl.where(has_any, l_i, 1.0), gl.SliceLayout(0, gl.SliceLayout(2, MMA)))
    big_o = gl.convert_layout(big, gl.SliceLayout(1, gl.SliceLayout(2, MMA)))
    out = acc * (norm[None, :, None] * big_o[:, None, None])
    op = gl.arange(0, B, gl.SliceLayout(1, gl.SliceLayout(2, MMA)))
    oh = gl.arange(0, BLOCK_H, gl.SliceLayout(0, gl.SliceLayout(2, MMA)))
    od = gl.arange(0, D, gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
    o_rows = o_ptr + split.to(gl.int64) * stride_os + t * stride_ot + oh[None, :, None] * stride_oh
    gl.store(o_rows + (op * D)[:, None, None] + od[None, None, :], out.to(o_ptr.dtype.element_ty),
             mask=(oh < H)[None, :, None])
    lh = gl.arange(0, BLOCK_H, HEADS)
    gl.store(lse_ptr + split * stride_ls + t * stride_lt + lh, lse, mask=lh < H)


RECORD_BYTES = {"fp8_ds_mla": 656, "nvfp4": 352, "fp8": 576}  # the record formats the Gluon few-heads kernels read


def _heads_spec(max_heads) -> str:
    """The query shape a kernel takes, in words: ``[T, <= max_heads, 576]`` (``[T, H, 576]`` for None: any)."""
    return f"[T, {'H' if max_heads is None else f'<= {max_heads}'}, 576]"


def records_refusal(q: torch.Tensor, kv_pages: torch.Tensor, kv_fmt: str, slots, kernel: str,
                    fmt: str = "fp8_ds_mla", max_heads: int | None = MAX_HEADS) -> str:
    """Why a Gluon few-heads kernel (this one, :mod:`.sparse_mla_wgmma`, :mod:`.sparse_mla_wgmma_fp4`) does not take a
    call ("" when it does), ``kernel`` naming it in the reason: bf16 queries ``[T, <= max_heads, 576]`` (any head
    count for None: the wgmma kernels run groups of 16) on an NVIDIA GPU and ``fmt`` pages ``[blocks, tokens, record
    bytes]`` uint8 whose records start 16-byte aligned (the ``cp.async`` pieces)."""
    record = RECORD_BYTES[fmt]
    if kv_fmt != fmt:
        return f"{kv_fmt} latents: {kernel} reads {fmt} records"
    if q.dim() != 3 or (max_heads is not None and q.shape[1] > max_heads) or q.shape[2] != 576:
        return f"q of shape {list(q.shape)}: {kernel} takes {_heads_spec(max_heads)}"
    if q.dtype != torch.bfloat16:
        return f"{str(q.dtype).replace('torch.', '')} queries: {kernel} takes bf16"
    if not all(runs_ptx(t.device) for t in (q, kv_pages) + (() if slots is None else (slots,))):
        return f"{kernel} runs on NVIDIA CUDA tensors only"
    if kv_pages.dtype != torch.uint8 or kv_pages.dim() != 3 or kv_pages.shape[2] != record:
        return f"pages {kv_pages.dtype} {list(kv_pages.shape)}: {kernel} reads uint8 [blocks, tokens, {record}]"
    align = row_alignment(kv_pages)
    if align < 16:
        return f"records aligned to {align} byte(s): {kernel} copies 16-byte pieces"
    return ""


def unserved(name: str, q, kv_pages, kv_fmt: str, why: str, fmt: str = "fp8_ds_mla",
             max_heads: int | None = MAX_HEADS) -> ValueError:
    """The launcher's error for a call its kernel refuses (``why``): what it takes and what it got."""
    return ValueError(f"{name}: expected bf16 q {_heads_spec(max_heads)} on an NVIDIA GPU and {fmt} uint8 pages "
                      f"[num_blocks, block_tokens, {RECORD_BYTES[fmt]}] with 16-byte aligned records, got q {q.dtype} "
                      f"{list(q.shape)} on {q.device}, kv_fmt {kv_fmt!r}, pages {kv_pages.dtype} {list(kv_pages.shape)} "
                      f"aligned to {row_alignment(kv_pages)} byte(s) ({why})")


@gluon.jit
def head_group(q_ptr, stride_qh, o_ptr, stride_oh, lse_ptr, H, BLOCK_H: gl.constexpr):
    """This program's group of ``BLOCK_H`` heads (grid axis 2 of :func:`launch_over_tokens` with ``head_group``):
    ``(q_ptr, o_ptr, lse_ptr)`` moved to the group's first head, and the call's heads from there on."""
    group = gl.program_id(2)
    return (q_ptr + group * BLOCK_H * stride_qh, o_ptr + group * BLOCK_H * stride_oh, lse_ptr + group * BLOCK_H,
            H - group * BLOCK_H)


def launch_over_tokens(kernel, q, kv_pages, slots, o, lse, splits: int, sizes: tuple, meta: dict,
                       record_bytes: int = 656, head_group: int | None = None, programs: int | None = None):
    """Launch a Gluon few-heads ``kernel`` (this module's signature) over the tokens, ``splits`` programs a token (grid
    axis 1 in slices of at most 65,535 tokens) and, with ``head_group``, one program a group of that many heads (grid
    axis 2: the kernel offsets its queries and outputs by its group and serves ``H - group · head_group`` heads of
    them), the pages' geometry (records of ``record_bytes``) as ``FLAT`` / ``OFF32`` constexprs; then the splits' fp32
    partials merged in split order. With ``programs`` (a kernel with the balanced schedule, :mod:`.balanced`; ``o``
    and ``lse`` then hold :func:`.balanced.parts_bound` parts a row) one launch of that many programs (fewer for a
    call of fewer 64-slot steps) a head group, ``BALANCED`` set. Returns ``(o [T, H, 512], lse [T, H])``."""
    blocks, block_tokens = kv_pages.shape[0], kv_pages.shape[1]
    s8_b, s8_t = kv_pages.stride(0), kv_pages.stride(1)
    last = (blocks - 1) * s8_b + (block_tokens - 1) * s8_t + record_bytes  # one past the furthest record's last byte
    meta = dict(meta, FLAT=s8_b == block_tokens * s8_t, OFF32=last < 2**31)
    sizes = (sizes[0], sizes[1], blocks * block_tokens, block_tokens, *sizes[2:])
    groups = 1 if head_group is None else -(-q.shape[1] // head_group)
    if programs is not None and slots.shape[1] > 0:  # (no slots: no steps to share; the fixed launch empties the rows)
        kernel[(launch_programs(q.shape[0], slots.shape[1], programs), 1, groups)](
            q, q.stride(0), q.stride(1), kv_pages, s8_b, s8_t, slots, slots.stride(0),
            o, o.stride(0), o.stride(1), o.stride(2), lse, lse.stride(0), lse.stride(1), *sizes,
            **dict(meta, BALANCED=True))
    else:
        for first, stop in launch_grid.ranges(q.shape[0]):  # (CUDA: <= 65535 programs on grid axis 1)
            kernel[(splits, stop - first, groups)](
                q[first:stop], q.stride(0), q.stride(1),
                kv_pages, s8_b, s8_t,
                slots[first:stop], slots.stride(0),
                o[:, first:stop], o.stride(0), o.stride(1), o.stride(2),
                lse[:, first:stop], lse.stride(0), lse.stride(1),
                *sizes, **meta)
    if splits == 1:
        return o[0], lse[0]
    return lse_combine(o, lse, out_dtype=q.dtype)


def refusal(q: torch.Tensor, kv_pages: torch.Tensor, kv_fmt: str, slots: torch.Tensor | None = None) -> str:
    """Why this kernel does not take the call ("" when it does): :func:`records_refusal`. The route's verifier
    reports this reason; the launcher raises on it."""
    return records_refusal(q, kv_pages, kv_fmt, slots, "the Gluon kernel")


def serves(q: torch.Tensor, kv_pages: torch.Tensor, kv_fmt: str) -> bool:
    """Whether this kernel takes the call (:func:`refusal` has no reason)."""
    return not refusal(q, kv_pages, kv_fmt)


@bounded_partials
def sparse_mla_gluon(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, *, block_n=DEFAULT_BLOCK_N,
                     stages=DEFAULT_STAGES, split_size=512, maxnreg=None, lazy=True, q_smem=False,
                     warps_per_tile=DEFAULT_SPLIT):
    """Launch :func:`sparse_mla_gluon_kernel` (the caller checked :func:`serves`; a call it does not serve raises).

    Args:
        q: ``[T, H, 576]`` bf16 on a CUDA device, ``H <= MAX_HEADS``.
        kv_pages: ``[num_blocks, block_tokens, 656]`` uint8 fp8_ds_mla pages, records 16-byte aligned (any strides
            that keep them so: a view into a packed cache is read in place).
        slots: ``[T, K]`` int32/int64 physical slots; -1 or out of range = skipped.
        kv_fmt: must be ``"fp8_ds_mla"``.
        kv_scale: unused by the format (None).
        softmax_scale: float.
        block_n: slots per step (16, 32 or 64).
        stages: steps whose gathers are in flight at once (2..4).
        split_size: slots per split, a fixed count (batch invariance); None = one split.
        maxnreg: ptxas's register cap (None: its own choice; a lower cap fits more programs on a SM).
        lazy: move the kept softmax maximum and tile-scale maxima only past 2^8 / 2^7 of the kept ones.
        q_smem: keep the fp16 queries in shared memory (read each step) rather than in registers.
        warps_per_tile: 1 or 2 warps per 128-dim tile (4 or 8 warps a program; 2 halves each warp's accumulator).

    Returns:
        ``(o [T, H, 512] bf16, lse [T, H] fp32)``.
    """
    name = "triton sparse_mla_gluon"
    why = refusal(q, kv_pages, kv_fmt)
    if why:
        raise unserved(name, q, kv_pages, kv_fmt, why)
    tokens, heads, _ = q.shape
    check_launch(name, heads, block_n, split_size)
    if block_n not in (16, 32, 64):
        raise ValueError(f"{name}: block_n expected 16, 32 or 64, got {block_n}")
    if not 2 <= stages <= 4:
        raise ValueError(f"{name}: stages expected 2..4, got {stages}")
    if warps_per_tile not in (1, 2):
        raise ValueError(f"{name}: warps_per_tile expected 1 or 2, got {warps_per_tile}")
    k = slots.shape[1]
    q, slots, split_size, splits, o, lse = unit_stride_and_outputs(q, slots, split_size)
    if tokens == 0 or heads == 0:
        return o[0].to(q.dtype), lse[0]
    meta = dict(BLOCK_N=block_n, STAGES=stages, LAZY=bool(lazy), Q_SMEM=bool(q_smem), SPLIT=warps_per_tile,
                num_warps=4 * warps_per_tile, **({"maxnreg": maxnreg} if maxnreg else {}))
    return launch_over_tokens(sparse_mla_gluon_kernel, q, kv_pages, slots, o, lse, splits,
                              (heads, k, split_size, softmax_scale * LOG2E), meta)


# the launch cache (dsahal.kernel_launch) for this module's kernel: 33-80 us less host time a call than Triton's own
# launch of a Gluon kernel (H200, twenty-first session, scripts/h200/gluon_launch.py), the same outputs bit for bit
wrap_launched(globals())
