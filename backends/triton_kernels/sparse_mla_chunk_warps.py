"""Few-heads sparse MLA on fp8_ds_mla latents, one warp per 128-dim tile: batched MMAs, no transposes in registers.

Same op as :mod:`.sparse_mla_small_heads_raw` (``o[t, h] = softmax_s(scale · q[t, h] · kv[s]) · kv[s, :512]``,
``lse`` natural log, -1 and out-of-range slots skipped, a row with no valid slot gives ``o = 0``,
``lse = -inf``), for the ``fp8_ds_mla`` record (512 e4m3 | 4 fp32 tile scales | 64 bf16 RoPE = 656 B), with the
raw kernel's arithmetic: e4m3 codes widened to fp16 exactly, each 128-dim tile's scale ``σ[s, c]`` applied after
the logit MMA and folded into ``P`` for the value MMA (``P_c = p · σ_c / M_c``, ``M_c`` the running largest tile-c
scale), the queries scaled per head by a power of two into fp16's range.

Why a second layout. The raw kernel multiplies ``kv_c [BLOCK_N, 128] · q_c^T`` (slots on the MMA's M side) and
``kv_c^T · p^T`` for the values: the second wants the tile transposed, and in its sm_90 SASS that transpose is 128
16-bit shared-memory loads a step, 38 barriers and ~2,160 instructions a warp per 64-slot step, at 2 programs a SM
(latency-bound: ~10 cycles between a warp's instructions on the H200). Here the four 128-dim tiles are the batch
dimension of 3-D MMAs, ``S_c [H, BLOCK_N] = q_c [H, 128] · kv_c^T`` and ``R_c [H, 128] = P_c [H, BLOCK_N] · kv_c``,
which Triton runs as ``mma.sync`` with its warps on the batch: warp ``c`` owns tile ``c`` (its queries stay in
registers, its fp16 tile feeds both MMAs through shared memory by ``ldmatrix`` and ``ldmatrix.trans``), and the only
cross-warp exchange a step is the sum of the four partial logits. The RoPE dims are split the same way (16 a warp).

One program = (one split of the slot list, one token), heads padded to ``BLOCK_H`` (16); ``splits > 1`` writes
fp32 partials that :func:`.lse_combine.lse_combine` merges in split order (a fixed slot count per split: a row's
result does not depend on the batch).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import grid as launch_grid
from .bytes import row_alignment
from .lse_combine import lse_combine
from .sparse_mla import LOG2E
from .sparse_mla_small_heads_raw import _pow2_scales, _record_bytes, block_heads, check_launch, split_outputs
from dsahal.kernel_launch import wrap_launched

SIZE_ARGS = ("H", "K", "num_slots", "block_tokens", "split_size")
TILES = 4  # 128-dim tiles of the 512 nope dims: the batch of every MMA, one warp each
MAX_HEADS = 16  # the accumulator is [4, BLOCK_H, 128] fp32 over 4 warps: 64 registers a thread at 16 heads


@triton.jit
def _tile_index():
    """``[TILES, 1, 1]`` tile indices and ``[1, 1, 128]`` dims within a tile."""
    return tl.arange(0, 4)[:, None, None], tl.arange(0, 128)[None, None, :]


@triton.jit
def _as_f16(codes, PTX: tl.constexpr):
    """e4m3 bytes -> fp16, exact. With ``PTX`` by an opaque ``cvt.rn.f16x2.e4m3x2`` per two values: Triton would
    otherwise move the layout conversion each MMA operand needs above a plain cast, onto the one-byte codes,
    and load them from shared memory byte by byte (256 ``LDS.8`` a warp per 64-slot step in the sm_90 SASS)
    instead of as fp16 rows by ``ldmatrix``."""
    if PTX:
        return tl.inline_asm_elementwise(
            "{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, $2;\n\tcvt.rn.f16x2.e4m3x2 $0, lo;"
            "\n\tcvt.rn.f16x2.e4m3x2 $1, hi;\n\t}", "=r,=r,r", [codes], dtype=tl.float16, is_pure=False, pack=4)
    return codes.to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit(do_not_specialize=SIZE_ARGS)
def sparse_mla_chunk_warps_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 576]
    pages_u8, s8_b, s8_t,  # latent pages [num_blocks, block_tokens, 656] uint8, strides in bytes
    slots_ptr, stride_st,  # slots [T, K] int32/int64
    o_ptr, stride_os, stride_ot, stride_oh,  # o [splits, T, H, 512] (fp32 partials or q's dtype)
    lse_ptr, stride_ls, stride_lt,  # lse [splits, T, H] fp32
    H, K, num_slots, block_tokens, split_size,
    logit_scale,  # softmax_scale · log2(e)
    ROPE_BF16: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    ROW_ALIGN: tl.constexpr,  # largest power of two (<= 16) dividing every record's address (>= 4)
    BT_LOG2: tl.constexpr,  # log2(block_tokens) when a power of two, else -1
    FLAT: tl.constexpr,  # record s at byte s * s8_t (blocks back to back): no block / offset split per slot
    PTX: tl.constexpr,  # widen the codes by inline PTX (GPU launches; the interpreter runs no PTX)
):
    split = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    tile, dim = _tile_index()  # [4, 1, 1], [1, 1, 128]
    heads = tl.arange(0, BLOCK_H)
    head_ok = heads < H
    heads3 = heads[None, :, None]
    head_ok3 = head_ok[None, :, None]
    q_row = q_ptr + t * stride_qt + heads3 * stride_qh
    # queries of tile c: [4, BLOCK_H, 128], scaled per head by 2^e into fp16's range (exact for bf16 queries)
    qf = tl.load(q_row + tile * 128 + dim, mask=head_ok3, other=0.0).to(tl.float32)
    q_up, q_down = _pow2_scales(tl.max(tl.max(tl.abs(qf), axis=2), axis=0))
    q16 = (qf * q_up[None, :, None]).to(tl.float16)
    rope_dim = tl.arange(0, 16)[None, None, :]
    qr = tl.load(q_row + 512 + tile * 16 + rope_dim, mask=head_ok3, other=0.0)  # [4, BLOCK_H, 16]
    if ROPE_BF16:
        qr = qr.to(tl.bfloat16)
    else:
        qr = qr.to(tl.float32)
    nope_scale = (logit_scale * q_down)[None, :, None]  # [1, BLOCK_H, 1]: undoes 2^e_h
    slot_row = slots_ptr + t * stride_st

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([4, BLOCK_H, 128], tl.float32)  # o_c / M_c per tile c
    big = tl.zeros([4], tl.float32)  # M_c: running largest tile-c scale over valid slots (0 until one is seen)
    tile2 = tl.arange(0, 4)[:, None]

    start = split * split_size
    end = tl.minimum(start + split_size, K)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        slot = tl.load(slot_row + n, mask=n < end, other=-1)
        valid = (slot >= 0) & (slot < num_slots)
        safe = tl.where(valid, slot, 0)
        if FLAT:  # one multiply: the blocks are back to back (s8_b == block_tokens * s8_t)
            row8 = tl.multiple_of(safe.to(tl.int64) * s8_t, ROW_ALIGN)
        else:
            row8 = _record_bytes(safe.to(tl.int32), block_tokens, s8_b, s8_t, ROW_ALIGN, BT_LOG2)
        rows3 = pages_u8 + row8[None, :, None]
        valid3 = valid[None, :, None]
        codes = tl.load(rows3 + tile * 128 + dim, mask=valid3, other=0)  # [4, BLOCK_N, 128] e4m3 bytes
        # [4, BLOCK_N] tile scales (the launcher takes only 4-byte aligned records)
        sigma = tl.load((pages_u8 + row8 + 512).to(tl.pointer_type(tl.float32))[None, :] + tile2,
                        mask=valid[None, :], other=0.0)
        rope = tl.load((rows3 + 528).to(tl.pointer_type(tl.uint16)) + tile * 16 + rope_dim, mask=valid3, other=0)
        if ROPE_BF16:
            kr = rope.to(tl.bfloat16, bitcast=True)
            s_rope = tl.dot(qr, tl.permute(kr, (0, 2, 1)))
        else:
            kr = (rope.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
            s_rope = tl.dot(qr, tl.permute(kr, (0, 2, 1)), input_precision="ieee")
        k16 = _as_f16(codes, PTX)  # exact
        s_nope = tl.dot(q16, tl.permute(k16, (0, 2, 1)))  # [4, BLOCK_H, BLOCK_N]
        s3 = s_nope * sigma[:, None, :] * nope_scale + s_rope * logit_scale
        s = tl.where(valid[None, :], tl.sum(s3, axis=0), float("-inf"))  # [BLOCK_H, BLOCK_N]

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all-skipped head stays at p = 0
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        big_new = tl.maximum(big, tl.max(sigma, axis=1))
        big_div = tl.where(big_new > 0.0, big_new, 1.0)  # no valid slot with a nonzero scale yet: p · 0 = 0
        p16 = (p[None, :, :] * (sigma / big_div[:, None])[:, None, :]).to(tl.float16)  # P_c in [0, 1]
        acc = tl.dot(p16, k16, acc * (alpha[None, :, None] * (big / big_div)[:, None, None]))
        big = big_new
        m_i = m_new

    has_any = l_i > 0.0
    norm = 1.0 / tl.where(has_any, l_i, 1.0)
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    lse = tl.where(has_any, (m_safe + tl.log2(tl.where(has_any, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
    out = acc * (norm[None, :, None] * big[:, None, None])
    o_rows = o_ptr + split.to(tl.int64) * stride_os + t * stride_ot + heads3 * stride_oh
    tl.store(o_rows + tile * 128 + dim, out.to(o_ptr.dtype.element_ty), mask=head_ok3)
    tl.store(lse_ptr + split * stride_ls + t * stride_lt + heads, lse, mask=head_ok)


def serves(q: torch.Tensor, kv_pages: torch.Tensor, kv_fmt: str) -> bool:
    """Whether this kernel takes the call: fp8_ds_mla pages of 4-byte aligned records, at most 16 heads."""
    return (kv_fmt == "fp8_ds_mla" and kv_pages.dtype == torch.uint8 and kv_pages.dim() == 3
            and kv_pages.shape[2] == 656 and q.shape[1] <= MAX_HEADS and row_alignment(kv_pages) >= 4)


def sparse_mla_chunk_warps(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, *, block_n=32, split_size=512,
                           num_warps=4, num_stages=1):
    """Launch :func:`sparse_mla_chunk_warps_kernel`.

    Args:
        q: ``[T, H, 576]`` bf16/fp16/fp32, ``H <= MAX_HEADS``.
        kv_pages: ``[num_blocks, block_tokens, 656]`` uint8 fp8_ds_mla pages, records 4-byte aligned (any
            strides: a view into a packed cache is read in place).
        slots: ``[T, K]`` int32/int64 physical slots; -1 or out of range = skipped.
        kv_fmt: must be ``"fp8_ds_mla"``.
        kv_scale: unused by the format (None).
        softmax_scale: float.
        block_n: slots per step (a power of two >= 16).
        split_size: slots per split, a fixed count (batch invariance); None = one split.
        num_warps: 4 (one per 128-dim tile); num_stages: as Triton's.

    Returns:
        ``(o [T, H, 512] in q's dtype, lse [T, H] fp32)``.
    """
    name = "triton sparse_mla_chunk_warps"
    if kv_fmt != "fp8_ds_mla":
        raise ValueError(f"{name}: kv_fmt expected 'fp8_ds_mla' (raw e4m3 tiles with fp32 scales), got {kv_fmt!r}")
    if kv_pages.dtype != torch.uint8 or kv_pages.dim() != 3 or kv_pages.shape[2] != 656:
        raise ValueError(f"{name}: kv_pages expected uint8 [num_blocks, block_tokens, 656], got {kv_pages.dtype} "
                         f"{list(kv_pages.shape)}")
    align = row_alignment(kv_pages)
    if align < 4:
        raise ValueError(f"{name}: kv_pages records expected at 4-byte aligned addresses (the tile scales are "
                         f"loaded as fp32), got records aligned to {align} byte(s)")
    tokens, heads, _ = q.shape
    if heads > MAX_HEADS:
        raise ValueError(f"{name}: q expected at most {MAX_HEADS} heads, got {heads}")
    check_launch(name, heads, block_n, split_size)
    if num_warps != 4:
        raise ValueError(f"{name}: num_warps expected 4 (one warp per 128-dim tile), got {num_warps}")
    k = slots.shape[1]
    q = q if q.stride(-1) == 1 else q.contiguous()
    slots = slots if slots.stride(-1) == 1 else slots.contiguous()
    split_size, splits, o, lse = split_outputs(q, k, split_size)
    if tokens == 0 or heads == 0:
        return o[0].to(q.dtype), lse[0]
    block_tokens = kv_pages.shape[1]
    flat = kv_pages.stride(0) == block_tokens * kv_pages.stride(1)
    meta = dict(ROPE_BF16=q.dtype == torch.bfloat16, BLOCK_H=block_heads(heads), BLOCK_N=block_n, ROW_ALIGN=align,
                BT_LOG2=block_tokens.bit_length() - 1 if block_tokens & (block_tokens - 1) == 0 else -1,
                FLAT=flat, PTX=q.device.type == "cuda" and torch.version.hip is None,
                num_warps=num_warps, num_stages=num_stages)
    sizes = (heads, k, kv_pages.shape[0] * block_tokens, block_tokens, split_size, softmax_scale * LOG2E)
    for first, stop in launch_grid.ranges(tokens):  # tokens on grid axis 1 (CUDA: <= 65535 programs a launch)
        sparse_mla_chunk_warps_kernel[(splits, stop - first)](
            q[first:stop], q.stride(0), q.stride(1),
            kv_pages, kv_pages.stride(0), kv_pages.stride(1),
            slots[first:stop], slots.stride(0),
            o[:, first:stop], o.stride(0), o.stride(1), o.stride(2),
            lse[:, first:stop], lse.stride(0), lse.stride(1),
            *sizes, **meta)
    if splits == 1:
        return o[0], lse[0]
    return lse_combine(o, lse, out_dtype=q.dtype)


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
