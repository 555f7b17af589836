"""LSE combine: merge partial attention results over disjoint key sets.

``lse = log Σ_w exp(lse_w)``, ``o = Σ_w exp(lse_w − lse) · o_w``; -inf partials contribute
nothing; all -inf gives ``o = 0``, ``lse = -inf``. One program per (token, head) row; the parts
are visited in index order, so the result does not depend on other rows.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


# Counts and sizes that vary from call to call are not specialised on (Triton would compile a
# variant per value pattern: ==1, multiple of 16); strides stay specialised for wide loads.
SIZE_ARGS = ("W", "H")


@triton.jit(do_not_specialize=SIZE_ARGS)
def lse_combine_kernel(
    o_ptr, stride_ow, stride_ot, stride_oh,  # o_parts [W, T, H, D]
    lse_ptr, stride_lw, stride_lt, stride_lh,  # lse_parts [W, T, H] fp32
    out_ptr, stride_xt, stride_xh,  # out [T, H, D]
    out_lse_ptr,  # [T * H] fp32, contiguous
    W, H, D,
    BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)
    t = (row // H).to(tl.int64)
    h = row % H
    parts = tl.arange(0, BLOCK_W)
    lse_w = tl.load(lse_ptr + parts * stride_lw + t * stride_lt + h * stride_lh, mask=parts < W,
                    other=float("-inf"))
    m = tl.max(lse_w, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    weight = tl.exp(lse_w - m_safe)  # -inf parts -> 0
    total = tl.sum(weight, axis=0)
    lse = tl.where(total > 0.0, m_safe + tl.log(tl.where(total > 0.0, total, 1.0)), float("-inf"))
    weight = weight / tl.where(total > 0.0, total, 1.0)
    tl.store(out_lse_ptr + row, lse)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for w in range(0, W):
            w_weight = tl.sum(tl.where(parts == w, weight, 0.0), axis=0)
            o_w = tl.load(o_ptr + w * stride_ow + t * stride_ot + h * stride_oh + cols, mask=cols < D, other=0.0)
            acc += tl.where(w_weight > 0.0, w_weight * o_w.to(tl.float32), 0.0)
        tl.store(out_ptr + t * stride_xt + h * stride_xh + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < D)


def _launch_args(o_parts, lse_parts, out, lse, block_d):
    parts, tokens, heads, dim = o_parts.shape
    return ((tokens * heads,), (
        o_parts, o_parts.stride(0), o_parts.stride(1), o_parts.stride(2),
        lse_parts, lse_parts.stride(0), lse_parts.stride(1), lse_parts.stride(2),
        out, out.stride(0), out.stride(1), lse,
        parts, heads, dim,
    ), dict(BLOCK_W=max(triton.next_power_of_2(parts), 2), BLOCK_D=min(block_d, max(triton.next_power_of_2(dim), 16))))


def prepare_bare_launch(o_parts, lse_parts, *, block_d=512, num_warps=4):
    """``launch()``: exactly the kernel launch :func:`lse_combine` makes, outputs preallocated (the
    dispatch bench's floor for this op)."""
    parts, tokens, heads, dim = o_parts.shape
    out = torch.empty((tokens, heads, dim), dtype=o_parts.dtype, device=o_parts.device)
    lse = torch.empty((tokens, heads), dtype=torch.float32, device=o_parts.device)
    grid, args, meta = _launch_args(o_parts, lse_parts, out, lse, block_d)

    def launch():
        lse_combine_kernel[grid](*args, **meta, num_warps=num_warps)
        return out, lse

    return launch


def lse_combine(o_parts, lse_parts, *, out_dtype=None, block_d=512, num_warps=4):
    """Launch :func:`lse_combine_kernel`.

    Args:
        o_parts: ``[W, T, H, D]`` fp32/bf16/fp16 (unit stride in D).
        lse_parts: ``[W, T, H]`` fp32.
        out_dtype: dtype of ``o`` (default o_parts' dtype).

    Returns:
        ``(o [T, H, D], lse [T, H] fp32)``.
    """
    parts, tokens, heads, dim = o_parts.shape
    o_parts = o_parts if o_parts.stride(-1) == 1 else o_parts.contiguous()
    out = torch.empty((tokens, heads, dim), dtype=out_dtype or o_parts.dtype, device=o_parts.device)
    lse = torch.empty((tokens, heads), dtype=torch.float32, device=o_parts.device)
    if tokens * heads == 0:
        return out, lse
    if parts == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    grid, args, meta = _launch_args(o_parts, lse_parts, out, lse, block_d)
    lse_combine_kernel[grid](*args, **meta, num_warps=num_warps)
    return out, lse
