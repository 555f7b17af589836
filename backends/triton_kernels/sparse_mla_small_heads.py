"""Sparse MLA for few heads (H <= 64; built for the 12- and 16-head TP slices): memory-bound design.

Same op as :mod:`.sparse_mla`: ``o[t, h] = softmax_s(scale · q[t, h] · kv[s]) · kv[s, :512]``,
``lse[t, h]`` natural log; -1 and out-of-range slots skipped; a row with no valid slot gives
``o = 0``, ``lse = -inf``.

Why a second kernel. At H = 16 a gathered latent row carries 16 · 1088 · 2 = 35 kFLOP for 352-1152
bytes: the op is bound by the gather, and what matters is that every row is read once for all heads
and that enough bytes are in flight on every SM. One program = (one token, one split of its slot
list), all ``H`` heads padded to ``BLOCK_H`` (16 up to 16 heads: the smallest MMA side).

Per step of ``BLOCK_N`` (16-64) slots:

- the raw record bytes of the step are loaded once; with ``GATHER_FIRST`` all four 128-dim chunks and
  the RoPE dims are issued before any is decoded (a step's whole gather in flight at once), else each
  chunk just before its dot (fewer live registers);
- the logits are accumulated chunk by chunk, ``s^T [BLOCK_N, BLOCK_H] = Σ_c kv_c [BLOCK_N, 128] ·
  q_c^T [128, BLOCK_H] + kv_rope · q_rope^T``, so no more than one decoded 128-dim chunk is widened
  at a time (the first kernel, :mod:`.sparse_mla_small_heads_v1`, decoded the whole ``[64, 512]``
  tile in fp32: 255 registers and spills);
- the output is four ``o_c^T [128, BLOCK_H]`` accumulators, ``o_c^T += kv_c^T · p^T``: the same
  decoded chunk feeds both MMAs (``REUSE``), or the chunk's bytes are read again (L1 hits) and decoded
  a second time (``REUSE=False``). The two MMAs want the chunk in two register layouts, so reusing it
  keeps two copies of all four chunks live across the softmax: 255 registers and spills at 32-slot
  steps in the sm_90 compile, against 179-221 and none when re-read.

The split size is a fixed number of slots, never a function of the batch, so a row's result is
bitwise the same whatever else is in the batch; ``splits > 1`` writes fp32 partials that
:func:`.lse_combine.lse_combine` merges in split order.

Every latent format is decoded in registers from its raw codes (:func:`.sparse_mla.load_nope_raw`,
:func:`.sparse_mla.decode_nope`): bf16, fp8 (per-tensor scale folded into logits and output),
fp8_ds_mla (a chunk is one 128-dim tile with its fp32 scale) and nvfp4 (e2m1 pairs, e4m3 block scales,
e4m3 RoPE).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import grid as launch_grid
from .bytes import LATENT_BF16, LATENT_CODES, LATENT_FP8, typed_views, views_usable
from .lse_combine import lse_combine
from .partials import bounded_partials
from .sparse_mla import LOG2E, NOPE, decode_nope, decode_rope, load_nope_raw, load_rope_raw, record_rows
# (MAX_HEADS: this module's public name, kept; the raw module holds it)
from .sparse_mla_small_heads_raw import (  # noqa: F401
    MAX_HEADS, check_launch, sparse_mla_small_heads_raw, unit_stride_and_outputs)
from dsahal.kernel_launch import wrap_launched

CHUNK = 128  # nope dims per chunk: one fp8_ds_mla tile, eight nvfp4 blocks
RAW_MAX_HEADS = 16  # fp8_ds_mla heads the raw-e4m3 kernel serves by default (hopper_config: it spills above)

SIZE_ARGS = ("H", "K", "num_slots", "block_tokens", "split_size")  # (zero: specialised as a multiple of 16)


@triton.jit
def _q_chunk(q_cols, d0, D: tl.constexpr, head_ok, AS_BF16: tl.constexpr):
    """q^T dims ``[d0, d0 + D)`` of one token: ``[D, BLOCK_H]``, padded heads read as 0."""
    values = tl.load(q_cols + d0 + tl.arange(0, D)[:, None], mask=head_ok[None, :], other=0.0)
    if AS_BF16:
        values = values.to(tl.bfloat16)
    else:
        values = values.to(tl.float32)
    return values


@triton.jit
def _dot(a, b, acc, AS_BF16: tl.constexpr):
    if AS_BF16:
        out = tl.dot(a, b, acc)
    else:
        out = tl.dot(a, b, acc, input_precision="ieee")
    return out


@triton.jit
def _reload(pages_u8, pages_u16, pages_f32, rows, valid, c0, FMT: tl.constexpr, AS_BF16: tl.constexpr,
            ALIGNED: tl.constexpr):
    codes, scales = load_nope_raw(pages_u8, pages_u16, pages_f32, rows, valid, c0, 128, FMT, ALIGNED)
    return decode_nope(codes, scales, FMT, AS_BF16)


# the cache's arguments, and those the launcher makes aligned on every call (compile_budget: batch-invariant mode keeps
# their facts; with none the sm_90 main loop at H = 32, fp8_ds_mla, ran 5,053 instructions against 2,724)
CACHE_ARGS = {"sparse_mla_small_heads_kernel": ("pages_u8", "pages_u16", "pages_f32", "s8_b", "s8_t", "s16_b", "s16_t",
                                                "s32_b", "s32_t")}
LAUNCHER_ALIGNED_ARGS = {"sparse_mla_small_heads_kernel": ("q_ptr", "stride_qt", "stride_qh", "o_ptr", "stride_os",
                                                           "stride_ot", "stride_oh", "zero")}


@triton.jit(do_not_specialize=SIZE_ARGS)
def sparse_mla_small_heads_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 576]
    pages_u8, pages_u16, pages_f32,  # the latent pages [num_blocks, block_tokens, token_bytes] as 3 typed views
    s8_b, s8_t, s16_b, s16_t, s32_b, s32_t,  # (block, token) strides of each view, in its elements
    slots_ptr, stride_st,  # slots [T, K] int32/int64
    kv_scale_ptr,  # [] fp32 tensor scale of the fp8 format (read in-kernel: no host sync)
    o_ptr, stride_os, stride_ot, stride_oh,  # o [splits, T, H, 512] (fp32 partials or q's dtype)
    lse_ptr, stride_ls, stride_lt,  # lse [splits, T, H] fp32
    H, K, num_slots, block_tokens, split_size,
    logit_scale,  # softmax_scale · log2(e)
    zero,  # 0, unknown to the compiler: the re-read chunks (REUSE=False) are then not merged with the first read
    FMT: tl.constexpr, AS_BF16: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    ALIGNED: tl.constexpr, REUSE: tl.constexpr,
    GATHER_FIRST: tl.constexpr,  # issue all of a step's record loads before the first decode (more bytes in flight)
):
    split = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    head_ok = heads < H
    q_cols = q_ptr + t * stride_qt + heads[None, :] * stride_qh
    # q^T in four 128-dim chunks and the RoPE dims: loop invariant B operands
    q0 = _q_chunk(q_cols, 0, 128, head_ok, AS_BF16)
    q1 = _q_chunk(q_cols, 128, 128, head_ok, AS_BF16)
    q2 = _q_chunk(q_cols, 256, 128, head_ok, AS_BF16)
    q3 = _q_chunk(q_cols, 384, 128, head_ok, AS_BF16)
    qr = _q_chunk(q_cols, 512, 64, head_ok, AS_BF16)

    value_scale = 1.0
    if FMT == 1:
        value_scale = tl.load(kv_scale_ptr)
    logit_scale = logit_scale * value_scale
    strides = (s8_b, s8_t, s16_b, s16_t, s32_b, s32_t)
    zero = tl.multiple_of(zero, 16)
    slot_row = slots_ptr + t * stride_st

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([128, BLOCK_H], tl.float32)  # o^T, dims 0..127
    acc1 = tl.zeros([128, BLOCK_H], tl.float32)
    acc2 = tl.zeros([128, BLOCK_H], tl.float32)
    acc3 = tl.zeros([128, BLOCK_H], tl.float32)

    start = split * split_size
    end = tl.minimum(start + split_size, K)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        slot = tl.load(slot_row + n, mask=n < end, other=-1).to(tl.int64)
        valid = (slot >= 0) & (slot < num_slots)
        slot = tl.where(valid, slot, 0)
        rows = record_rows(slot, block_tokens, strides)
        if GATHER_FIRST:  # the whole step's gather issued before the first decode waits on it
            c0, k0 = load_nope_raw(pages_u8, pages_u16, pages_f32, rows, valid, 0, 128, FMT, ALIGNED)
            c1, k1 = load_nope_raw(pages_u8, pages_u16, pages_f32, rows, valid, 128, 128, FMT, ALIGNED)
            c2, k2 = load_nope_raw(pages_u8, pages_u16, pages_f32, rows, valid, 256, 128, FMT, ALIGNED)
            c3, k3 = load_nope_raw(pages_u8, pages_u16, pages_f32, rows, valid, 384, 128, FMT, ALIGNED)
            kv_rope = decode_rope(load_rope_raw(pages_u8, pages_u16, rows, valid, FMT, ALIGNED), FMT, AS_BF16)
            s = _dot(kv_rope, qr, tl.zeros([BLOCK_N, BLOCK_H], tl.float32), AS_BF16)
            kv0 = decode_nope(c0, k0, FMT, AS_BF16)  # [BLOCK_N, 128]
            s = _dot(kv0, q0, s, AS_BF16)
            kv1 = decode_nope(c1, k1, FMT, AS_BF16)
            s = _dot(kv1, q1, s, AS_BF16)
            kv2 = decode_nope(c2, k2, FMT, AS_BF16)
            s = _dot(kv2, q2, s, AS_BF16)
            kv3 = decode_nope(c3, k3, FMT, AS_BF16)
            s = _dot(kv3, q3, s, AS_BF16)
        else:  # each chunk read just before its dot: fewer raw bytes live, less in flight
            kv_rope = decode_rope(load_rope_raw(pages_u8, pages_u16, rows, valid, FMT, ALIGNED), FMT, AS_BF16)
            s = _dot(kv_rope, qr, tl.zeros([BLOCK_N, BLOCK_H], tl.float32), AS_BF16)
            kv0 = _reload(pages_u8, pages_u16, pages_f32, rows, valid, 0, FMT, AS_BF16, ALIGNED)
            s = _dot(kv0, q0, s, AS_BF16)
            kv1 = _reload(pages_u8, pages_u16, pages_f32, rows, valid, 128, FMT, AS_BF16, ALIGNED)
            s = _dot(kv1, q1, s, AS_BF16)
            kv2 = _reload(pages_u8, pages_u16, pages_f32, rows, valid, 256, FMT, AS_BF16, ALIGNED)
            s = _dot(kv2, q2, s, AS_BF16)
            kv3 = _reload(pages_u8, pages_u16, pages_f32, rows, valid, 384, FMT, AS_BF16, ALIGNED)
            s = _dot(kv3, q3, s, AS_BF16)
        s = tl.where(valid[:, None], s * logit_scale, float("-inf"))  # [BLOCK_N, BLOCK_H]

        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all-skipped head stays at p = 0
        p = tl.exp2(s - m_safe[None, :])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        if AS_BF16:
            p = p.to(tl.bfloat16)
        if not REUSE:  # the chunks' bytes again (just read: L1 hits), so no decoded chunk lives across the softmax
            kv0 = _reload(pages_u8 + zero, pages_u16 + zero, pages_f32 + zero, rows, valid, 0, FMT, AS_BF16,
                          ALIGNED)
        acc0 = _dot(tl.trans(kv0), p, acc0 * alpha[None, :], AS_BF16)
        if not REUSE:
            kv1 = _reload(pages_u8 + zero, pages_u16 + zero, pages_f32 + zero, rows, valid, 128, FMT, AS_BF16,
                          ALIGNED)
        acc1 = _dot(tl.trans(kv1), p, acc1 * alpha[None, :], AS_BF16)
        if not REUSE:
            kv2 = _reload(pages_u8 + zero, pages_u16 + zero, pages_f32 + zero, rows, valid, 256, FMT, AS_BF16,
                          ALIGNED)
        acc2 = _dot(tl.trans(kv2), p, acc2 * alpha[None, :], AS_BF16)
        if not REUSE:
            kv3 = _reload(pages_u8 + zero, pages_u16 + zero, pages_f32 + zero, rows, valid, 384, FMT, AS_BF16,
                          ALIGNED)
        acc3 = _dot(tl.trans(kv3), p, acc3 * alpha[None, :], AS_BF16)
        m_i = m_new

    has_any = l_i > 0.0
    norm = (value_scale / tl.where(has_any, l_i, 1.0))[None, :]
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    lse = tl.where(has_any, (m_safe + tl.log2(tl.where(has_any, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
    dims = tl.arange(0, 128)[:, None]
    # split as int64: split * stride_os (T · H · 512) wraps int32 from split 3 of a 44K-token call at 32 heads
    # (top-k 2048 in 512-slot splits) or split 2 of a 64K-token one
    o_cols = o_ptr + split.to(tl.int64) * stride_os + t * stride_ot + heads[None, :] * stride_oh + dims
    out_ty = o_ptr.dtype.element_ty
    tl.store(o_cols, (acc0 * norm).to(out_ty), mask=head_ok[None, :])
    tl.store(o_cols + 128, (acc1 * norm).to(out_ty), mask=head_ok[None, :])
    tl.store(o_cols + 256, (acc2 * norm).to(out_ty), mask=head_ok[None, :])
    tl.store(o_cols + 384, (acc3 * norm).to(out_ty), mask=head_ok[None, :])
    tl.store(lse_ptr + split * stride_ls + t * stride_lt + heads, lse, mask=head_ok)


def block_heads(heads: int) -> int:
    """Heads per program: all of them, padded to a power of two >= 16 (the smallest MMA N side used)."""
    return max(16, triton.next_power_of_2(max(heads, 1)))


def hopper_config(heads: int, kv_fmt: str = "fp8_ds_mla", q_dtype: torch.dtype = torch.bfloat16) -> dict:
    """Launch parameters for an H100/H200, from per-row quantities only (batch invariant by construction).

    Chosen from the sm_90 compile of the local Triton (registers, spills, shared memory), pending the
    H200 sweep (``scripts/h200/small_heads_sweep.py``): 32-slot steps; two pipeline stages, with which
    the software pipeliner stages a step's gathered rows in shared memory through cp.async (the next
    step's bytes in flight while this one computes): fp8_ds_mla 163 registers and 57 KB, nvfp4 168 and
    46 KB (three programs per SM), bf16 139 and 122 KB; fp8 spilled with two stages (255 registers),
    so it issues the whole step's gather first in one stage (218 registers). Chunks are re-read for the
    value MMA rather than kept (reuse: 255 registers and spills). 4 warps up to 16 heads, 8 above
    (32 heads, two stages: 164 registers, 77 KB). 512-slot splits
    (4 splits at top-k 2048: 1280 programs at 320 tokens; the fp32 partials add 2 x 4 x 32 KB per
    token at 16 heads, about 20% on top of the gathered fp8_ds_mla bytes). fp32/fp16 queries take
    the exact fp32 dots, whose operands are twice as large: 16-slot steps.

    fp8_ds_mla at <= 16 heads (bf16 queries) takes the raw-e4m3 kernel (:mod:`.sparse_mla_small_heads_raw`:
    fp16 MMAs on the e4m3 codes, the tile scales after the logit MMA and folded into P), 64-slot steps, no
    staging: on the H200 (2026-12-01, ``small_heads_sweep.py``, 320 tokens x 2048 slots) 0.457 ms at H = 16
    and 0.451 at H = 12 against this kernel's 0.926 / 0.921. Above 16 heads it spills (sm_90 compile:
    255 registers, 136-312 B of stack in every 32-head variant tried), so 17-32 heads stay here.
    """
    if q_dtype != torch.bfloat16:
        return dict(block_n=16, split_size=512, num_warps=4, num_stages=1, reuse=False, gather_first=False)
    if kv_fmt == "fp8_ds_mla" and heads <= RAW_MAX_HEADS:
        return dict(block_n=64, split_size=512, num_warps=4, num_stages=1, reuse=False, gather_first=False,
                    raw_fp8=True)
    staged = kv_fmt != "fp8"
    return dict(block_n=32, split_size=512, num_warps=4 if heads <= 16 else 8, num_stages=2 if staged else 1,
                reuse=False, gather_first=True)


@bounded_partials
def sparse_mla_small_heads(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, *, block_n=32, split_size=512,
                           num_warps=4, num_stages=1, reuse=False, gather_first=True, exact_fp32=None,
                           prefetch=None, raw_fp8=False, maxnreg=None):
    """Launch :func:`sparse_mla_small_heads_kernel`.

    Args:
        q: ``[T, H, 576]`` bf16/fp16/fp32, ``H <= MAX_HEADS`` (unit stride in the last dim).
        kv_pages: ``[num_blocks, block_tokens, token_bytes]`` uint8 latent pages in ``kv_fmt`` (any
            strides: a view into a packed cache is read in place).
        slots: ``[T, K]`` int32/int64 physical slots; -1 or out of range = skipped.
        kv_fmt: ``"bf16"``, ``"fp8"``, ``"fp8_ds_mla"`` or ``"nvfp4"``.
        kv_scale: ``[]`` fp32 tensor scale for ``"fp8"``, else None.
        softmax_scale: float.
        block_n: slots per step (a power of two >= 16).
        split_size: slots per split, a fixed count (batch invariance); a multiple of ``block_n`` keeps
            every split but the last full. None = one split.
        num_warps, num_stages: as Triton's.
        reuse: one decode of each chunk feeds both MMAs (else the chunk is re-read and decoded again).
        gather_first: issue all of a step's record loads before the first decode.
        exact_fp32: compute the dots in fp32 (default: unless q is bf16).
        prefetch: the first kernel's name for loading a step's bytes ahead of its decode; when given,
            it sets ``gather_first``.
        raw_fp8: fp8_ds_mla only: run :mod:`.sparse_mla_small_heads_raw` instead (e4m3 codes fed raw to
            fp16 MMAs, tile scales applied after them; ``block_n``, ``split_size``, ``num_warps``,
            ``num_stages``, ``reuse`` and ``gather_first`` carry over, ``exact_fp32``/``prefetch`` do not apply).
        maxnreg: the raw kernel's register cap (ptxas; None: its own choice); not taken by the chunked kernel.

    Returns:
        ``(o [T, H, 512] in q's dtype, lse [T, H] fp32)``.
    """
    if raw_fp8:
        return sparse_mla_small_heads_raw(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, block_n=block_n,
                                          split_size=split_size, num_warps=num_warps, num_stages=num_stages,
                                          reuse=reuse, gather_first=gather_first, maxnreg=maxnreg)
    if maxnreg is not None:
        raise ValueError(f"triton sparse_mla_small_heads: maxnreg caps the raw e4m3 kernel's registers (raw_fp8=True), "
                         f"got maxnreg={maxnreg!r} with raw_fp8=False")
    if prefetch is not None:
        gather_first = bool(prefetch)
    tokens, heads, _ = q.shape
    check_launch("triton sparse_mla_small_heads", heads, block_n, split_size)
    k = slots.shape[1]
    fmt = LATENT_CODES[kv_fmt]
    as_bf16 = (q.dtype == torch.bfloat16) if exact_fp32 is None else not exact_fp32
    q, slots, split_size, splits, o, lse = unit_stride_and_outputs(q, slots, split_size)
    if tokens == 0 or heads == 0:
        return o[0].to(q.dtype), lse[0]
    views = typed_views(kv_pages)
    if as_bf16 and fmt == LATENT_BF16 and views[1][0].dtype == torch.uint16:
        # bf16 words loaded as bf16: the decode is a same-type bitcast that feeds the MMA directly
        views[1] = (views[1][0].view(torch.bfloat16), views[1][1], views[1][2])
    scale = kv_scale if fmt == LATENT_FP8 else lse
    meta = dict(FMT=fmt, AS_BF16=as_bf16, BLOCK_H=block_heads(heads), BLOCK_N=block_n, ALIGNED=views_usable(kv_pages),
                REUSE=bool(reuse), GATHER_FIRST=bool(gather_first), num_warps=num_warps, num_stages=num_stages)
    sizes = (heads, k, kv_pages.shape[0] * kv_pages.shape[1], kv_pages.shape[1], split_size, softmax_scale * LOG2E)
    if tokens <= launch_grid.MAX_GRID_YZ:
        _launch(q, views, slots, scale, o, lse, splits, sizes, meta)
    else:  # tokens on grid axis 1 (CUDA: <= 65535 programs): one launch per range of tokens, same programs
        for start, stop in launch_grid.ranges(tokens):
            _launch(q[start:stop], views, slots[start:stop], scale, o[:, start:stop], lse[:, start:stop], splits,
                    sizes, meta)
    if splits == 1:
        return o[0], lse[0]
    return lse_combine(o, lse, out_dtype=q.dtype)


def _launch(q, views, slots, scale, o, lse, splits, sizes, meta):
    """One launch over the tokens of ``q [T', H, 576]``, ``slots [T', K]``, ``o [splits, T', H, 512]`` and
    ``lse [splits, T', H]`` (all sliced alike along T; the pages, indexed by slot, whole)."""
    sparse_mla_small_heads_kernel[(splits, q.shape[0])](
        q, q.stride(0), q.stride(1),
        views[0][0], views[1][0], views[2][0], *(s for _, sb, st in views for s in (sb, st)),
        slots, slots.stride(0),
        scale,
        o, o.stride(0), o.stride(1), o.stride(2),
        lse, lse.stride(0), lse.stride(1),
        *sizes, 0,
        **meta,
    )


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
