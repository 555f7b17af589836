"""Sparse MLA over paged latents: each query token attends to its own list of cache slots.

``o[t, h] = softmax_s(scale · q[t, h] · kv[s]) · kv[s, :512]`` and ``lse[t, h]`` (natural log),
for the slots ``s`` of ``slots[t]``; -1 (and any out-of-range slot) is skipped; a row with no
valid slot gives ``o = 0``, ``lse = -inf``.

One program owns ``BLOCK_H`` heads of one token and one split of its slot list. It gathers
``BLOCK_N`` latent rows at a time, computes the 576-dim logits as a 512 + 64 pair of dots and keeps
an online softmax (flash-attention style) with a ``[BLOCK_H, 512]`` fp32 accumulator. With more
than one split, each split writes fp32 partials and :mod:`.lse_combine` merges them; the split
size is a fixed number of slots, so a row's result does not depend on the rest of the batch.

Latents (bf16, fp8, fp8_ds_mla, nvfp4) are loaded as raw codes (:func:`load_nope_raw`,
:func:`load_rope_raw`) and decoded in registers (:func:`decode_nope`, :func:`decode_rope`); block
scales keep a block axis so each is loaded once per row and broadcast in registers. The helpers are
shared with :mod:`.sparse_mla_small_heads`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import grid as launch_grid
from .bytes import (LATENT_BF16, LATENT_CODES, LATENT_FP8, load_f32_bytewise, load_u16_bytewise, typed_views,
                    views_usable, widen_bf16)
from .alignment import aligned_rows
from .lse_combine import lse_combine
from .partials import bounded_partials
from dsahal.kernel_launch import wrap_launched

NOPE = 512
ROPE = 64
LOG2E = 1.4426950408889634


@triton.jit
def record_rows(slot, block_tokens, strides):
    """Physical slots [BLOCK_N] (int64, already made safe) -> each record's start in the uint8, uint16
    and fp32 views, in that view's elements."""
    block = slot // block_tokens
    offset = slot % block_tokens
    s8_b, s8_t, s16_b, s16_t, s32_b, s32_t = strides
    return block * s8_b + offset * s8_t, block * s16_b + offset * s16_t, block * s32_b + offset * s32_t


@triton.jit
def load_nope_raw(pages_u8, pages_u16, pages_f32, rows, valid, c0, C: tl.constexpr, FMT: tl.constexpr,
                  ALIGNED: tl.constexpr):
    """The stored codes of nope dims ``[c0, c0 + C)`` of the records at ``rows`` (:func:`record_rows`),
    undecoded, and their scales: ``(codes, scales)``; invalid rows read as 0. ``c0`` is a multiple
    of C, C of 128. Shapes (BLOCK_N = len(valid)):

    - bf16: codes ``[BLOCK_N, C]`` uint16 words; scales unused
    - fp8: codes ``[BLOCK_N, C]`` e4m3 bytes; scales unused (the tensor scale is the caller's)
    - fp8_ds_mla: codes ``[BLOCK_N, C/128, 128]`` e4m3 bytes, scales ``[BLOCK_N, C/128, 1]`` fp32
    - nvfp4: codes ``[BLOCK_N, C/16, 8]`` bytes of two e2m1 each, scales ``[BLOCK_N, C/16, 1]`` e4m3 bytes

    Block-scaled codes keep a block axis so that the scale broadcasts inside each thread's registers
    (no scale per element is ever loaded: that was a 4-byte load per fp8 value).
    """
    row8, row16, row32 = rows
    m = valid[:, None]
    cols = c0 + tl.arange(0, C)
    unused = valid.to(tl.float32)
    if FMT == 0:
        if ALIGNED:
            codes = tl.load(pages_u16 + row16[:, None] + cols[None, :], mask=m, other=0)
        else:  # records at odd addresses (a pool with a lead byte): assemble words from bytes
            codes = load_u16_bytewise(pages_u8 + row8[:, None] + 2 * cols[None, :], m)
        scales = unused
    elif FMT == 1:
        codes = tl.load(pages_u8 + row8[:, None] + cols[None, :], mask=m, other=0)
        scales = unused
    elif FMT == 2:  # 4 tiles of 128 e4m3 at bytes 0..511, their fp32 scales at bytes 512..527
        tiles = c0 // 128 + tl.arange(0, C // 128)
        m3 = valid[:, None, None]
        byte = tiles[None, :, None] * 128 + tl.arange(0, 128)[None, None, :]
        codes = tl.load(pages_u8 + row8[:, None, None] + byte, mask=m3, other=0)
        if ALIGNED:
            scales = tl.load(pages_f32 + row32[:, None, None] + 128 + tiles[None, :, None], mask=m3, other=0.0)
        else:
            scales = load_f32_bytewise(pages_u8 + row8[:, None, None] + 512 + 4 * tiles[None, :, None], m3)
    else:  # nvfp4: 32 blocks of 16 dims = 8 bytes at bytes 0..255, e4m3 block scales at bytes 320..351
        blocks = c0 // 16 + tl.arange(0, C // 16)
        m3 = valid[:, None, None]
        byte = blocks[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
        codes = tl.load(pages_u8 + row8[:, None, None] + byte, mask=m3, other=0)
        scales = tl.load(pages_u8 + row8[:, None, None] + 320 + blocks[None, :, None], mask=m3, other=0)
    return codes, scales


@triton.jit
def load_rope_raw(pages_u8, pages_u16, rows, valid, FMT: tl.constexpr, ALIGNED: tl.constexpr):
    """The stored codes of the 64 RoPE dims: ``[BLOCK_N, 64]`` uint16 bf16 words (bf16, fp8_ds_mla)
    or e4m3 bytes (fp8, nvfp4); invalid rows read as 0."""
    row8, row16, _ = rows
    m = valid[:, None]
    cols = tl.arange(0, 64)
    # RoPE starts at: bf16 word 512 (byte 1024), fp8 byte 512, fp8_ds_mla word 264 (byte 528), nvfp4 byte 256
    if FMT == 0:
        word0 = 512
    else:
        word0 = 264
    if FMT == 1:
        byte0 = 512
    else:
        byte0 = 256
    if FMT == 1 or FMT == 3:
        codes = tl.load(pages_u8 + row8[:, None] + byte0 + cols[None, :], mask=m, other=0)
    elif ALIGNED:
        codes = tl.load(pages_u16 + row16[:, None] + word0 + cols[None, :], mask=m, other=0)
    else:
        codes = load_u16_bytewise(pages_u8 + row8[:, None] + 2 * word0 + 2 * cols[None, :], m)
    return codes


@triton.jit
def e2m1_to_f32(nibbles):
    """e2m1 codes (0..15, any int dtype) -> fp32, exactly: the 3 magnitude bits placed as an fp16
    exponent/mantissa pair give ``value · 2^-14`` (0.5 becomes the fp16 subnormal 2^-15, which fp16
    never flushes), the sign bit goes to bit 15."""
    c = nibbles.to(tl.int32)
    half_bits = (((c & 7) << 9) | ((c & 8) << 12)).to(tl.uint16)
    return half_bits.to(tl.float16, bitcast=True).to(tl.float32) * 16384.0


@triton.jit
def decode_nope(codes, scales, FMT: tl.constexpr, AS_BF16: tl.constexpr):
    """:func:`load_nope_raw`'s ``(codes, scales)`` -> values ``[BLOCK_N, C]``, bf16 when ``AS_BF16``
    else fp32, except for the per-tensor FP8 scale (the caller folds it into logits and output).
    Exact: block-scaled values have at most 6 significant bits (nvfp4) and the fp8_ds_mla product
    is rounded once, like the format's own decode."""
    if FMT == 0:
        values = widen_bf16(codes, AS_BF16)
    elif FMT == 1:
        values = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    elif FMT == 2:
        tiles = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scales
        values = tl.reshape(tiles, [tiles.shape[0], tiles.shape[1] * tiles.shape[2]])
    else:
        scale = scales.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        lo = e2m1_to_f32(codes & 15) * scale  # dim 2i: low nibble
        hi = e2m1_to_f32(codes >> 4) * scale  # dim 2i + 1: high nibble
        pairs = tl.interleave(lo, hi)  # [BLOCK_N, C/16, 16], each thread keeps its pairs
        values = tl.reshape(pairs, [pairs.shape[0], pairs.shape[1] * pairs.shape[2]])
    if AS_BF16:
        values = values.to(tl.bfloat16)
    else:
        values = values.to(tl.float32)
    return values


@triton.jit
def decode_rope(codes, FMT: tl.constexpr, AS_BF16: tl.constexpr):
    """:func:`load_rope_raw`'s codes -> ``[BLOCK_N, 64]`` bf16 or fp32 (exact either way)."""
    if FMT == 0 or FMT == 2:
        values = widen_bf16(codes, AS_BF16)  # a bitcast when the words are already bf16 (bf16 view)
    else:
        values = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    if AS_BF16:
        values = values.to(tl.bfloat16)
    return values


# Counts and sizes that vary from call to call are not specialised on (Triton would compile a
# variant per value pattern: ==1, multiple of 16); strides stay specialised for wide loads.
SIZE_ARGS = ("H", "K", "num_slots", "block_tokens", "split_size")
# the arguments that describe the cache, the same whichever rows a batch holds (compile_budget: batch-invariant mode
# keeps their alignment facts)
CACHE_ARGS = {"sparse_mla_kernel": ("pages_u8", "pages_u16", "pages_f32", "s8_b", "s8_t", "s16_b", "s16_t", "s32_b",
                                    "s32_t")}
# the arguments :func:`sparse_mla` makes 16-byte aligned (pointers) and multiples of 16 (strides) on every call: the
# queries (:func:`.alignment.aligned_rows`) and the outputs it allocates. compile_budget: batch-invariant mode
# keeps their facts too; without them the sm_90 main loop (H = 128, fp8_ds_mla) ran 1.54x the default compile's
# instructions.
LAUNCHER_ALIGNED_ARGS = {"sparse_mla_kernel": ("q_ptr", "stride_qt", "stride_qh", "o_ptr", "stride_os", "stride_ot",
                                               "stride_oh")}


@triton.jit(do_not_specialize=SIZE_ARGS)
def sparse_mla_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 576]
    pages_u8, pages_u16, pages_f32,  # the latent pages [num_blocks, block_tokens, token_bytes] as 3 typed views
    s8_b, s8_t, s16_b, s16_t, s32_b, s32_t,  # (block, token) strides of each view, in its elements
    slots_ptr, stride_st,  # slots [T, K] int32/int64
    kv_scale_ptr,  # [] fp32 tensor scale of the fp8 format (read in-kernel: no host sync)
    o_ptr, stride_os, stride_ot, stride_oh,  # o [splits, T, H, 512] (fp32 partials or q's dtype)
    lse_ptr, stride_ls, stride_lt,  # lse [splits, T, H] fp32
    H, K, num_slots, block_tokens, split_size,
    logit_scale,  # softmax_scale · log2(e), applied to q·kv
    FMT: tl.constexpr, AS_BF16: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    ALIGNED: tl.constexpr,  # every record 4-byte aligned: typed views; else byte loads
    V_SPLIT: tl.constexpr,  # programs sharing a head block, each accumulating 512 / V_SPLIT value columns
):
    pid_h = tl.program_id(0) // V_SPLIT
    v_part = tl.program_id(0) % V_SPLIT
    VD: tl.constexpr = 512 // V_SPLIT
    v_cols = v_part * VD + tl.arange(0, VD)  # the value columns this program accumulates and writes
    t = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)

    heads = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    nope_cols = tl.arange(0, 512)
    rope_cols = tl.arange(0, 64)
    q_rows = q_ptr + t * stride_qt + heads[:, None] * stride_qh
    q_nope = tl.load(q_rows + nope_cols[None, :], mask=head_ok[:, None], other=0.0)
    q_rope = tl.load(q_rows + 512 + rope_cols[None, :], mask=head_ok[:, None], other=0.0)
    if AS_BF16:
        q_nope = q_nope.to(tl.bfloat16)
        q_rope = q_rope.to(tl.bfloat16)
    else:
        q_nope = q_nope.to(tl.float32)
        q_rope = q_rope.to(tl.float32)

    value_scale = 1.0
    if FMT == 1:
        value_scale = tl.load(kv_scale_ptr)
    logit_scale = logit_scale * value_scale

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, VD], tl.float32)

    start = split * split_size
    end = tl.minimum(start + split_size, K)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        slot = tl.load(slots_ptr + t * stride_st + n, mask=n < end, other=-1).to(tl.int64)
        valid = (slot >= 0) & (slot < num_slots)
        slot = tl.where(valid, slot, 0)
        rows = record_rows(slot, block_tokens, (s8_b, s8_t, s16_b, s16_t, s32_b, s32_t))
        codes, scales = load_nope_raw(pages_u8, pages_u16, pages_f32, rows, valid, 0, 512, FMT, ALIGNED)
        kv_nope = decode_nope(codes, scales, FMT, AS_BF16)
        kv_rope = decode_rope(load_rope_raw(pages_u8, pages_u16, rows, valid, FMT, ALIGNED), FMT, AS_BF16)

        if AS_BF16:
            s = tl.dot(q_nope, tl.trans(kv_nope))
            s = tl.dot(q_rope, tl.trans(kv_rope), s)
        else:
            s = tl.dot(q_nope, tl.trans(kv_nope), input_precision="ieee")
            s = tl.dot(q_rope, tl.trans(kv_rope), s, input_precision="ieee")
        s = tl.where(valid[None, :], s * logit_scale, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all-skipped row stays at p = 0
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if V_SPLIT == 1:
            values = kv_nope
        else:  # this program's value columns of the same rows again (just read: cache hits)
            codes, scales = load_nope_raw(pages_u8, pages_u16, pages_f32, rows, valid, v_part * VD, VD, FMT, ALIGNED)
            values = decode_nope(codes, scales, FMT, AS_BF16)
        if AS_BF16:
            acc = tl.dot(p.to(tl.bfloat16), values, acc * alpha[:, None])
        else:
            acc = tl.dot(p, values, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new

    has_any = l_i > 0.0
    o = acc * (value_scale / tl.where(has_any, l_i, 1.0))[:, None]
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    lse = tl.where(has_any, (m_safe + tl.log2(tl.where(has_any, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
    # split as int64: the fp32 partials [S, T, H, 512] put split 2 at 2^31 elements already at 16K tokens x 128
    # heads (the batch-invariant mode's 512-slot splits of top-k 2048), where split * stride_os wraps in int32
    o_rows = o_ptr + split.to(tl.int64) * stride_os + t * stride_ot + heads[:, None] * stride_oh + v_cols[None, :]
    tl.store(o_rows, o.to(o_ptr.dtype.element_ty), mask=head_ok[:, None])
    # every value part computed the same lse; the first writes it (lane vector: see the KDA kernel)
    tl.store(lse_ptr + split * stride_ls + t * stride_lt + heads, lse, mask=head_ok & ((heads * 0 + v_part) == 0))


@bounded_partials
def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, *, block_h=64, block_n=32,
               split_size=None, num_warps=8, num_stages=1, exact_fp32=None, bf16_view=True, v_split=1):
    """Launch :func:`sparse_mla_kernel`.

    Args:
        q: ``[T, H, 576]`` bf16/fp16/fp32 (unit stride in the last dim).
        kv_pages: ``[num_blocks, block_tokens, token_bytes]`` uint8 latent pages in ``kv_fmt``.
        slots: ``[T, K]`` int32/int64 physical slots; -1 or out of range = skipped.
        kv_fmt: ``"bf16"``, ``"fp8"``, ``"fp8_ds_mla"`` or ``"nvfp4"``.
        kv_scale: ``[]`` fp32 tensor scale for ``"fp8"``, else None.
        softmax_scale: float.
        block_h, block_n: heads per program (power of two, ≥ 16) and slots per step.
        split_size: slots per split (multiple of ``block_n``); None = one split.
        exact_fp32: compute the dots in fp32 (default: unless q is bf16).
        bf16_view: read bf16 latents through a bf16-typed view of the pages (a plain load that feeds
            the MMA, which the software pipeliner can stage) rather than as raw 16-bit words.
        v_split: 1 or 2 programs per head block; with 2 each computes the logits and accumulates
            half of the 512 value columns (half the accumulator registers, twice the QK work).

    Returns:
        ``(o [T, H, 512] in q's dtype, lse [T, H] fp32)``.
    """
    tokens, heads, _ = q.shape
    k = slots.shape[1]
    fmt = LATENT_CODES[kv_fmt]
    as_bf16 = (q.dtype == torch.bfloat16) if exact_fp32 is None else not exact_fp32
    q = aligned_rows(q)
    if split_size is None or split_size >= k:
        split_size, splits = max(k, 1), 1
    else:
        splits = triton.cdiv(k, split_size)
    if splits == 1:
        o = torch.empty((1, tokens, heads, NOPE), dtype=q.dtype, device=q.device)
    else:
        o = torch.empty((splits, tokens, heads, NOPE), dtype=torch.float32, device=q.device)
    lse = torch.empty((splits, tokens, heads), dtype=torch.float32, device=q.device)
    if tokens == 0 or heads == 0:
        return o[0].to(q.dtype), lse[0]
    if v_split not in (1, 2, 4):
        raise ValueError(f"triton sparse_mla: v_split expected 1, 2 or 4, got {v_split!r}")
    head_programs = triton.cdiv(heads, block_h) * v_split
    views = typed_views(kv_pages)
    if bf16_view and as_bf16 and fmt == LATENT_BF16 and views[1][0].dtype == torch.uint16:
        # widen_bf16 is then a same-type bitcast (only the AS_BF16 path reads bf16 latents this way)
        views[1] = (views[1][0].view(torch.bfloat16), views[1][1], views[1][2])
    scale = kv_scale if fmt == LATENT_FP8 else lse
    pool = (kv_pages.shape[0] * kv_pages.shape[1], kv_pages.shape[1])
    meta = dict(FMT=fmt, AS_BF16=as_bf16, BLOCK_H=block_h, BLOCK_N=block_n, ALIGNED=views_usable(kv_pages),
                V_SPLIT=v_split, num_warps=num_warps, num_stages=num_stages)
    limit = launch_grid.MAX_GRID_YZ
    if tokens <= limit and splits <= limit:
        _launch(head_programs, q, views, slots, scale, o, lse, heads, k, pool, split_size, softmax_scale, meta)
    else:  # tokens on grid axis 1, splits on axis 2 (CUDA: <= 65535 programs each): one launch per block
        for t0, t1 in launch_grid.ranges(tokens):
            for s0, s1 in launch_grid.ranges(splits):
                # splits s0..s1-1 are slots [s0 * split_size, min(s1 * split_size, k)): the kernel reads
                # split s' of the block at slots s' * split_size of its view, the same slots as split s0 + s'
                c0, c1 = s0 * split_size, min(s1 * split_size, k)
                _launch(head_programs, q[t0:t1], views, slots[t0:t1, c0:c1], scale, o[s0:s1, t0:t1],
                        lse[s0:s1, t0:t1], heads, c1 - c0, pool, split_size, softmax_scale, meta)
    if splits == 1:
        return o[0], lse[0]
    out, lse_out = lse_combine(o, lse, out_dtype=q.dtype)
    return out, lse_out


def _launch(head_programs, q, views, slots, scale, o, lse, heads, k, pool, split_size, softmax_scale, meta):
    """One launch over the tokens of ``q [T', H, 576]``, ``slots [T', K']``, ``o [S', T', H, 512]`` and
    ``lse [S', T', H]`` (sliced alike along T, and ``o`` / ``lse`` along the splits as ``slots`` along K;
    the pages, indexed by slot, and ``scale`` whole). ``pool``: ``(num_slots, block_tokens)``."""
    sparse_mla_kernel[(head_programs, q.shape[0], o.shape[0])](
        q, q.stride(0), q.stride(1),
        views[0][0], views[1][0], views[2][0], *(s for _, sb, st in views for s in (sb, st)),
        slots, slots.stride(0),
        scale,
        o, o.stride(0), o.stride(1), o.stride(2),
        lse, lse.stride(0), lse.stride(1),
        heads, k, *pool, split_size,
        softmax_scale * LOG2E,
        **meta,
    )


def _check(device="cuda", dtype=torch.bfloat16, fmt="bf16"):
    """Compare with the reference on random inputs; returns the relative error of o."""
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    spec = latent_format(fmt)
    blocks, block_tokens, tokens, heads, k = 8, 16, 3, 16, 40
    latent = torch.randn(blocks * block_tokens, 576, device=device)
    scale = torch.tensor(0.05, device=device) if spec.needs_tensor_scale else None
    pages = spec.pack(latent, scale).view(blocks, block_tokens, -1)
    q = torch.randn(tokens, heads, 576, device=device).to(dtype)
    slots = torch.randint(-1, blocks * block_tokens, (tokens, k), device=device, dtype=torch.int32)
    o, lse = sparse_mla(q, pages, slots, fmt, scale, 576**-0.5, block_h=16, block_n=16)
    o_ref, lse_ref = reference(q, pages, slots, fmt, scale, 576**-0.5)
    o_err = float((o.float() - o_ref.float()).norm() / o_ref.float().norm())
    finite = torch.isfinite(lse_ref)
    lse_err = float((lse[finite] - lse_ref[finite]).abs().max()) if bool(finite.any()) else 0.0
    return o_err, lse_err


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
