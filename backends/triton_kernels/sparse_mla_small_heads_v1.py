"""The first few-heads sparse MLA kernel, kept as the baseline that ``scripts/h200/small_heads_sweep.py``
times beside its successor (:mod:`.sparse_mla_small_heads`); no route launches it. On the H200 it ran
1.9 ms at 320 tokens x 2048 slots, 16 heads (255 registers and spills: the whole [64, 512] tile is
decoded in fp32 registers at once).


Same op as :mod:`.sparse_mla`: ``o[t, h] = softmax_s(scale · q[t, h] · kv[s]) · kv[s, :512]``,
``lse[t, h]`` natural log; -1 and out-of-range slots skipped; a row with no valid slot gives
``o = 0``, ``lse = -inf``.

Why a second kernel. At H = 16 a gathered latent row carries 16 · 1088 · 2 = 35 kFLOP for 576-1152
bytes: the op is bound by the gather, and what matters is that every row is read once for all
heads and that enough bytes are in flight. Design, per program = (one split of the slot list,
one token), all ``H`` heads (padded to ``BLOCK_H`` >= 16, the smallest MMA side):

- the logits are computed transposed, ``s^T [BLOCK_N, BLOCK_H] = kv [BLOCK_N, 576] · q^T``, and the
  output as ``o^T [512, BLOCK_H] += kv^T · p^T``: the gathered rows (and the 512 value columns) are
  the MMA's M side (64-row Hopper WGMMA tiles) and the few heads its N side. The loop-invariant q is
  then the B operand (it stays in shared memory, not 144 registers per thread as an A operand that
  every warp must hold whole), and the fp32 accumulator is ``512 · BLOCK_H / threads`` registers;
- the next block's raw record bytes can be loaded into registers before the current block is
  decoded (``PREFETCH``: register double buffering, independent of the software pipeliner), or
  staged through shared memory by the pipeliner (``num_stages`` >= 2);
- the split size is a fixed number of slots, never a function of the batch, so a row's result is
  bitwise the same whatever else is in the batch; ``splits > 1`` writes fp32 partials that
  :func:`.lse_combine.lse_combine` merges in split order.

Every latent format is decoded in registers from its raw codes (:func:`.sparse_mla.load_nope_raw`,
:func:`.sparse_mla.decode_nope`): bf16, fp8 (per-tensor scale folded into logits and output),
fp8_ds_mla (4 tile scales) and nvfp4 (e2m1 pairs with e4m3 block scales, e4m3 RoPE).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .bytes import LATENT_BF16, LATENT_CODES, LATENT_FP8, typed_views, views_usable
from .lse_combine import lse_combine
from .sparse_mla import LOG2E, NOPE, decode_nope, decode_rope, load_nope_raw, load_rope_raw, record_rows

MAX_HEADS = 64  # the fp32 accumulator is 512 x BLOCK_H; 64 heads need 8 warps to hold it

SIZE_ARGS = ("H", "K", "num_slots", "block_tokens", "split_size")


@triton.jit
def _slot_block(slot_row, n, end, num_slots):
    """Slots ``n`` [BLOCK_N] of one row (positions >= end read as -1) -> (safe int64 slot, valid)."""
    slot = tl.load(slot_row + n, mask=n < end, other=-1).to(tl.int64)
    valid = (slot >= 0) & (slot < num_slots)
    return tl.where(valid, slot, 0), valid


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
    FMT: tl.constexpr, AS_BF16: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    ALIGNED: tl.constexpr, PREFETCH: tl.constexpr,
):
    split = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    head_ok = heads < H
    dims = tl.arange(0, 512)
    # q^T: [576, BLOCK_H] as a 512 + 64 pair, padded heads read as 0 (their logits are 0, never stored)
    q_cols = q_ptr + t * stride_qt + heads[None, :] * stride_qh
    qt_nope = tl.load(q_cols + dims[:, None], mask=head_ok[None, :], other=0.0)
    qt_rope = tl.load(q_cols + 512 + tl.arange(0, 64)[:, None], mask=head_ok[None, :], other=0.0)
    if AS_BF16:
        qt_nope = qt_nope.to(tl.bfloat16)
        qt_rope = qt_rope.to(tl.bfloat16)
    else:
        qt_nope = qt_nope.to(tl.float32)
        qt_rope = qt_rope.to(tl.float32)

    value_scale = 1.0
    if FMT == 1:
        value_scale = tl.load(kv_scale_ptr)
    logit_scale = logit_scale * value_scale
    strides = (s8_b, s8_t, s16_b, s16_t, s32_b, s32_t)
    slot_row = slots_ptr + t * stride_st

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([512, BLOCK_H], tl.float32)  # o^T

    start = split * split_size
    end = tl.minimum(start + split_size, K)
    if PREFETCH:  # the first block's raw bytes; each step then loads the next before decoding its own
        slot, valid = _slot_block(slot_row, start + tl.arange(0, BLOCK_N), end, num_slots)
        rows = record_rows(slot, block_tokens, strides)
        codes, scales = load_nope_raw(pages_u8, pages_u16, pages_f32, rows, valid, 0, 512, FMT, ALIGNED)
        rope_codes = load_rope_raw(pages_u8, pages_u16, rows, valid, FMT, ALIGNED)
    for n0 in range(start, end, BLOCK_N):
        if PREFETCH:
            cur_valid, cur_codes, cur_scales, cur_rope = valid, codes, scales, rope_codes
            slot, valid = _slot_block(slot_row, n0 + BLOCK_N + tl.arange(0, BLOCK_N), end, num_slots)
            rows = record_rows(slot, block_tokens, strides)
            codes, scales = load_nope_raw(pages_u8, pages_u16, pages_f32, rows, valid, 0, 512, FMT, ALIGNED)
            rope_codes = load_rope_raw(pages_u8, pages_u16, rows, valid, FMT, ALIGNED)
        else:
            slot, cur_valid = _slot_block(slot_row, n0 + tl.arange(0, BLOCK_N), end, num_slots)
            rows = record_rows(slot, block_tokens, strides)
            cur_codes, cur_scales = load_nope_raw(pages_u8, pages_u16, pages_f32, rows, cur_valid, 0, 512, FMT,
                                                  ALIGNED)
            cur_rope = load_rope_raw(pages_u8, pages_u16, rows, cur_valid, FMT, ALIGNED)
        kv_nope = decode_nope(cur_codes, cur_scales, FMT, AS_BF16)  # [BLOCK_N, 512]
        kv_rope = decode_rope(cur_rope, FMT, AS_BF16)  # [BLOCK_N, 64]

        if AS_BF16:
            s = tl.dot(kv_nope, qt_nope)
            s = tl.dot(kv_rope, qt_rope, s)
        else:
            s = tl.dot(kv_nope, qt_nope, input_precision="ieee")
            s = tl.dot(kv_rope, qt_rope, s, input_precision="ieee")
        s = tl.where(cur_valid[:, None], s * logit_scale, float("-inf"))  # [BLOCK_N, BLOCK_H]

        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all-skipped head stays at p = 0
        p = tl.exp2(s - m_safe[None, :])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        if AS_BF16:
            acc = tl.dot(tl.trans(kv_nope), p.to(tl.bfloat16), acc * alpha[None, :])
        else:
            acc = tl.dot(tl.trans(kv_nope), p, acc * alpha[None, :], input_precision="ieee")
        m_i = m_new

    has_any = l_i > 0.0
    o = acc * (value_scale / tl.where(has_any, l_i, 1.0))[None, :]
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    lse = tl.where(has_any, (m_safe + tl.log2(tl.where(has_any, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
    o_cols = o_ptr + split * stride_os + t * stride_ot + heads[None, :] * stride_oh + dims[:, None]
    tl.store(o_cols, o.to(o_ptr.dtype.element_ty), mask=head_ok[None, :])
    tl.store(lse_ptr + split * stride_ls + t * stride_lt + heads, lse, mask=head_ok)


def block_heads(heads: int) -> int:
    """Heads per program: all of them, padded to a power of two >= 16 (the smallest MMA N side used)."""
    return max(16, triton.next_power_of_2(max(heads, 1)))


def hopper_config(heads: int, kv_fmt: str = "fp8_ds_mla", q_dtype: torch.dtype = torch.bfloat16) -> dict:
    """Launch parameters for an H100/H200, from per-row quantities only (batch invariant by construction).

    Chosen from bytes and registers, not yet measured (``scripts/h200/sparse_mla_bench.py`` sweeps
    the alternatives): 64 rows per step (one WGMMA M tile), 4 warps up to 16 heads (the o^T
    accumulator is 64 fp32 registers per thread), 8 warps above (32-64 heads: 64-128 registers);
    two pipeline stages put the next block's gather in flight (~42 KB of fp8_ds_mla rows) while this
    one is decoded; 512-slot splits give 4 splits at top-k 2048 (1280 programs at 320 tokens, 32 at
    8) for 4 x 32 KB of fp32 partials per (token, head) pair written and merged (about 20% on top of
    the gathered fp8_ds_mla bytes at 16 heads). fp32/fp16 queries take the exact fp32 dots, whose
    operands are twice as large: 16-row steps, one stage.
    """
    if q_dtype != torch.bfloat16:
        return dict(block_n=16, split_size=512, num_warps=4, num_stages=1, prefetch=False)
    return dict(block_n=64, split_size=512, num_warps=4 if heads <= 16 else 8, num_stages=2, prefetch=False)


def sparse_mla_small_heads(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, *, block_n=64, split_size=512,
                           num_warps=4, num_stages=2, prefetch=False, exact_fp32=None):
    """Launch :func:`sparse_mla_small_heads_kernel`.

    Args:
        q: ``[T, H, 576]`` bf16/fp16/fp32, ``H <= MAX_HEADS`` (unit stride in the last dim).
        kv_pages: ``[num_blocks, block_tokens, token_bytes]`` uint8 latent pages in ``kv_fmt`` (any
            strides: a view into a packed cache is read in place).
        slots: ``[T, K]`` int32/int64 physical slots; -1 or out of range = skipped.
        kv_fmt: ``"bf16"``, ``"fp8"``, ``"fp8_ds_mla"`` or ``"nvfp4"``.
        kv_scale: ``[]`` fp32 tensor scale for ``"fp8"``, else None.
        softmax_scale: float.
        block_n: slots per step (a power of two >= 16; 64 makes the gathered rows one WGMMA M tile).
        split_size: slots per split, a fixed count (batch invariance); a multiple of ``block_n`` keeps
            every split but the last full. None = one split.
        num_warps, num_stages: as Triton's; ``num_stages`` >= 2 lets the pipeliner stage the gathers.
        prefetch: load the next block's raw bytes into registers before decoding the current one.
        exact_fp32: compute the dots in fp32 (default: unless q is bf16).

    Returns:
        ``(o [T, H, 512] in q's dtype, lse [T, H] fp32)``.
    """
    tokens, heads, _ = q.shape
    if heads > MAX_HEADS:
        raise ValueError(f"triton sparse_mla_small_heads: q expected at most {MAX_HEADS} heads, got {heads}")
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"triton sparse_mla_small_heads: block_n expected a power of two >= 16, got {block_n}")
    k = slots.shape[1]
    fmt = LATENT_CODES[kv_fmt]
    as_bf16 = (q.dtype == torch.bfloat16) if exact_fp32 is None else not exact_fp32
    q = q if q.stride(-1) == 1 else q.contiguous()
    slots = slots if slots.stride(-1) == 1 else slots.contiguous()
    if split_size is None or split_size >= k:
        split_size, splits = max(k, 1), 1
    else:
        splits = triton.cdiv(k, split_size)
    out_dtype = q.dtype if splits == 1 else torch.float32
    o = torch.empty((splits, tokens, heads, NOPE), dtype=out_dtype, device=q.device)
    lse = torch.empty((splits, tokens, heads), dtype=torch.float32, device=q.device)
    if tokens == 0 or heads == 0:
        return o[0].to(q.dtype), lse[0]
    views = typed_views(kv_pages)
    if as_bf16 and fmt == LATENT_BF16 and views[1][0].dtype == torch.uint16:
        # bf16 words loaded as bf16: the decode is a same-type bitcast that feeds the MMA directly
        views[1] = (views[1][0].view(torch.bfloat16), views[1][1], views[1][2])
    sparse_mla_small_heads_kernel[(splits, tokens)](
        q, q.stride(0), q.stride(1),
        views[0][0], views[1][0], views[2][0], *(s for _, sb, st in views for s in (sb, st)),
        slots, slots.stride(0),
        kv_scale if fmt == LATENT_FP8 else lse,
        o, o.stride(0), o.stride(1), o.stride(2),
        lse, lse.stride(0), lse.stride(1),
        heads, k, kv_pages.shape[0] * kv_pages.shape[1], kv_pages.shape[1], split_size,
        softmax_scale * LOG2E,
        FMT=fmt, AS_BF16=as_bf16, BLOCK_H=block_heads(heads), BLOCK_N=block_n, ALIGNED=views_usable(kv_pages),
        PREFETCH=bool(prefetch), num_warps=num_warps, num_stages=num_stages,
    )
    if splits == 1:
        return o[0], lse[0]
    return lse_combine(o, lse, out_dtype=q.dtype)


def _check(device="cuda", dtype=torch.bfloat16, fmt="fp8_ds_mla", heads=16):
    """Compare with the reference on random inputs; returns (relative error of o, max |lse error|)."""
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    spec = latent_format(fmt)
    blocks, block_tokens, tokens, k = 8, 16, 3, 40
    scale = torch.tensor(0.05, device=device) if spec.needs_tensor_scale else None
    pages = spec.pack(torch.randn(blocks * block_tokens, 576, device=device), scale).view(blocks, block_tokens, -1)
    q = torch.randn(tokens, heads, 576, device=device).to(dtype)
    slots = torch.randint(-1, blocks * block_tokens, (tokens, k), device=device, dtype=torch.int32)
    o, lse = sparse_mla_small_heads(q, pages, slots, fmt, scale, 576**-0.5, block_n=16, split_size=16)
    o_ref, lse_ref = reference(q, pages, slots, fmt, scale, 576**-0.5)
    o_err = float((o.float() - o_ref.float()).norm() / o_ref.float().norm())
    finite = torch.isfinite(lse_ref)
    lse_err = float((lse[finite] - lse_ref[finite]).abs().max()) if bool(finite.any()) else 0.0
    return o_err, lse_err
