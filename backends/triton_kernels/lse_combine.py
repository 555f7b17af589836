"""LSE combine: merge partial attention results over disjoint key sets.

``lse = log Σ_w exp(lse_w)``, ``o = Σ_w exp(lse_w − lse) · o_w``; -inf partials contribute
nothing; all -inf gives ``o = 0``, ``lse = -inf``. One program per (token, head) row; the parts
are visited in index order, so the result does not depend on other rows.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .alignment import aligned_rows
from dsahal.kernel_launch import triton_launch, wrap_launched


# Counts and sizes that vary from call to call are not specialised on (Triton would compile a
# variant per value pattern: ==1, multiple of 16); strides stay specialised for wide loads.
SIZE_ARGS = ("W", "H")
# The value dim (the same whichever rows a batch holds) and the tensors :func:`lse_combine` aligns on every call (the
# partials and their lse, :func:`~.alignment.aligned_rows`; the outputs it allocates): compile_budget's
# batch-invariant mode keeps their facts. Without them the sm_90 loop read the partials 4 bytes a load (32 LDG.32
# against 8 LDG.128 a row of 4 parts; thirty-first session, ``python -m dsahal.backends.nvidia.aot --invariant``);
# with them the default's SASS.
# (the partial lse's head stride is its unit last-dim stride once aligned: 1 on every call, kept with D)
CACHE_ARGS = {"lse_combine_kernel": ("D", "stride_lh")}
LAUNCHER_ALIGNED_ARGS = {"lse_combine_kernel": ("o_ptr", "stride_ow", "stride_ot", "stride_oh", "lse_ptr", "stride_lw",
                                                "stride_lt", "out_ptr", "out_lse_ptr")}


@triton.jit(do_not_specialize=SIZE_ARGS)
def lse_combine_kernel(
    o_ptr, stride_ow, stride_ot, stride_oh,  # o_parts [W, T, H, D]
    lse_ptr, stride_lw, stride_lt, stride_lh,  # lse_parts [W, T, H] fp32
    out_ptr,  # out [T, H, D], contiguous (allocated by lse_combine): row (t, h) starts at row * D
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
        # Part w's row is reached by stepping the pointer one part stride at a time, never as w * stride_ow:
        # both are int32, and sparse MLA's partials [S, T, H, 512] put part 2 at 2^31 elements already at 16K
        # tokens x 128 heads (stride 2^30), where the product wraps negative.
        o_w_ptr = o_ptr + t * stride_ot + h * stride_oh + cols
        for w in range(0, W):
            w_weight = tl.sum(tl.where(parts == w, weight, 0.0), axis=0)
            o_w = tl.load(o_w_ptr, mask=cols < D, other=0.0)
            acc += tl.where(w_weight > 0.0, w_weight * o_w.to(tl.float32), 0.0)
            o_w_ptr += stride_ow
        tl.store(out_ptr + row.to(tl.int64) * D + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < D)


def _block_w(parts: int) -> int:
    """The next power of two >= ``parts``, at least 2 (``parts`` >= 1). Plain int arithmetic: Triton's
    ``next_power_of_2`` is a constexpr function whose host-side call costs microseconds."""
    return max(1 << (parts - 1).bit_length(), 2)


def _block_d(dim: int, block_d: int) -> int:
    """``min(block_d, max(next_power_of_2(dim), 16))``."""
    return min(block_d, max(1 << (dim - 1).bit_length() if dim > 0 else 0, 16))


def _launch_args(o_parts, lse_parts, out, lse):
    """``(grid, positional kernel args)`` of one launch: 13 runtime arguments (the launcher binds and
    specialises each one in Python per call: the output strides are not among them, out is contiguous)."""
    parts, tokens, heads, dim = o_parts.shape
    so, sl = o_parts.stride(), lse_parts.stride()
    return (tokens * heads,), (o_parts, so[0], so[1], so[2], lse_parts, sl[0], sl[1], sl[2], out, lse,
                               parts, heads, dim)


def prepare_bare_launch(o_parts, lse_parts, *, allocate=False, cached=False, block_d=512, num_warps=4):
    """``launch()``: the kernel launch :func:`lse_combine` makes, outputs preallocated, through Triton's own
    ``kernel[grid](...)`` (the dispatch bench's floor for this op, as issue 16 defines it; the route itself
    launches through :mod:`.launcher`'s cache); ``allocate=True``: each launch first allocates its two
    outputs as :func:`lse_combine` does, so the bench can tell allocation from the wrapper's own work;
    ``cached=True``: the launch the route makes (the cache's, where installed)."""
    kernel = lse_combine_kernel if cached else triton_launch(lse_combine_kernel)
    parts, tokens, heads, dim = o_parts.shape
    out = torch.empty((tokens, heads, dim), dtype=o_parts.dtype, device=o_parts.device)
    lse = torch.empty((tokens, heads), dtype=torch.float32, device=o_parts.device)
    grid, args = _launch_args(o_parts, lse_parts, out, lse)
    block_w, block = _block_w(parts), _block_d(dim, block_d)
    head, tail = args[:8], args[10:]
    out_shape, lse_shape, fp32 = (tokens, heads, dim), (tokens, heads), torch.float32

    def launch():
        kernel[grid](*args, BLOCK_W=block_w, BLOCK_D=block, num_warps=num_warps)
        return out, lse

    def allocate_and_launch():
        new_out, new_lse = o_parts.new_empty(out_shape), o_parts.new_empty(lse_shape, dtype=fp32)
        kernel[grid](*head, new_out, new_lse, *tail, BLOCK_W=block_w, BLOCK_D=block,
                                 num_warps=num_warps)
        return new_out, new_lse

    return allocate_and_launch if allocate else launch


def lse_combine(o_parts, lse_parts, *, out_dtype=None, block_d=512, num_warps=4):
    """Launch :func:`lse_combine_kernel`.

    Args:
        o_parts: ``[W, T, H, D]`` fp32/bf16/fp16 (any strides: copied when not 16-byte aligned with unit stride in D
            and the others multiples of 16).
        lse_parts: ``[W, T, H]`` fp32 (any strides: copied as ``o_parts``).
        out_dtype: dtype of ``o`` (default o_parts' dtype).

    Returns:
        ``(o [T, H, D], lse [T, H] fp32)``.
    """
    parts, tokens, heads, dim = o_parts.shape
    o_parts, lse_parts = aligned_rows(o_parts), aligned_rows(lse_parts)  # (LAUNCHER_ALIGNED_ARGS)
    so = o_parts.stride()
    out = o_parts.new_empty((tokens, heads, dim), dtype=out_dtype) if out_dtype is not None else \
        o_parts.new_empty((tokens, heads, dim))
    lse = o_parts.new_empty((tokens, heads), dtype=torch.float32)
    rows = tokens * heads
    if rows == 0:
        return out, lse
    if parts == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    sl = lse_parts.stride()
    lse_combine_kernel[(rows,)](o_parts, so[0], so[1], so[2], lse_parts, sl[0], sl[1], sl[2], out, lse,
                                parts, heads, dim, BLOCK_W=_block_w(parts), BLOCK_D=_block_d(dim, block_d),
                                num_warps=num_warps)
    return out, lse


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
