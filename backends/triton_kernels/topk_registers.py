"""Exact top-k of short rows held whole in registers: one program a row, one read of the row.

The other methods stream a row through several passes (histograms, a candidate list in a scratch row), which is
what long rows need; a row of at most :data:`MAX_WIDTH` scores fits a program's registers (8K scores over 8 warps:
32 a thread), so this kernel reads it once and never touches memory again until it writes the answer:

1. each valid score (before ``lengths[t]``, not ``-inf``) becomes its order-preserving 32-bit key
   (:func:`.topk_common._sort_key`; invalid lanes are left out of every count);
2. the k-th largest key ``τ`` is found bit by bit from the top: 32 steps, each one count of the keys at or above a
   candidate (a sum over the registers), keeping the candidate bit when at least k keys reach it;
3. the entries above ``τ`` and the first ones equal to it, in index order (the tie rule: equal scores go to the
   smaller index), are written in index order at the places a prefix sum gives them; then -1 padding (a row with
   fewer than k valid entries keeps them all).

Output: the same set, in the same (index) order, as the bound and groups methods (:mod:`.topk_bound`), bit for
bit, so it may serve either mode. Nothing waits on the host (CUDA-graph safe); no scratch memory.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .alignment import aligned_rows
from .topk_common import _emit, _pad, _sort_key
from dsahal.kernel_launch import wrap_launched

MAX_WIDTH = 16384  # widest row a program holds (32 keys a thread at the default 16 warps: default_warps)
SIZE_ARGS = ("max_blocks", "block_tokens", "N", "k")
# The arguments whose alignment facts compile_budget's batch-invariant mode keeps (as topk_bound's, whose bits this
# kernel writes): the scores (aligned by :func:`topk_registers`: .alignment.aligned_rows) and the output (allocated by
# .topk.topk), the output's row stride (k: the same whichever rows a batch holds). Both modes take this method for
# rows of <= 8K since the thirty-sixth session; without these facts batch-invariant mode would run its generic compile.
CACHE_ARGS = {"topk_registers_kernel": ("stride_ot",)}
LAUNCHER_ALIGNED_ARGS = {"topk_registers_kernel": ("scores_ptr", "stride_st", "out_ptr")}


@triton.jit(do_not_specialize=SIZE_ARGS)
def topk_registers_kernel(
    scores_ptr, stride_st,  # [T, N] fp32
    lengths_ptr,  # [T]
    out_ptr, stride_ot,  # [T, k] int32
    req_ptr, block_table_ptr, stride_bt, max_blocks, block_tokens,  # used when EMIT_SLOTS
    N, k,
    EMIT_SLOTS: tl.constexpr, BLOCK: tl.constexpr, PAD_CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    out_row = out_ptr + row * stride_ot
    length = tl.maximum(tl.minimum(tl.load(lengths_ptr + row).to(tl.int32), N), 0)
    req = 0
    if EMIT_SLOTS:
        req = tl.load(req_ptr + row).to(tl.int32)
    cols = tl.arange(0, BLOCK)
    inside = cols < length
    score = tl.load(scores_ptr + row * stride_st + cols, mask=inside, other=float("-inf"))
    valid = inside & (score != float("-inf"))
    key = tl.where(valid, _sort_key(score), 0)
    num_valid = tl.sum(valid.to(tl.int32), axis=0)

    # 2. τ: the largest key with at least k valid keys at or above it (any key when every valid entry wins)
    tau = tl.full([], 0, tl.uint32)
    if num_valid > k:
        for bit in tl.static_range(31, -1, -1):
            candidate = tau | (tl.full([], 1, tl.uint32) << bit)
            reach = tl.sum((valid & (key >= candidate)).to(tl.int32), axis=0)
            tau = tl.where(reach >= k, candidate, tau)
        above = valid & (key > tau)
        tie = valid & (key == tau)
        need = k - tl.sum(above.to(tl.int32), axis=0)
        win = above | (tie & (tl.cumsum(tie.to(tl.int32), axis=0) <= need))
    else:
        win = valid
    win_i = win.to(tl.int32)
    _emit(out_row, tl.cumsum(win_i, axis=0) - 1, cols, win, req, block_table_ptr, stride_bt, max_blocks,
          block_tokens, EMIT_SLOTS)
    _pad(out_row, tl.sum(win_i, axis=0), k, tl.arange(0, PAD_CHUNK))


def serves(width: int) -> bool:
    """Whether rows of ``width`` scores fit one program's registers."""
    return 0 <= width <= MAX_WIDTH


def default_warps(width: int) -> int:
    """32 scores a thread, 4 to 16 warps."""
    return min(16, max(4, max(16, triton.next_power_of_2(width)) // (32 * 32)))


def topk_registers(scores, lengths, k, out, emit, req_ids, block_table, block_tokens, *, num_warps=None):
    """Launch :func:`topk_registers_kernel`: ``scores [T, N]`` fp32 with unit stride in N and ``N <=``
    :data:`MAX_WIDTH`, ``lengths [T]`` int32, ``out [T, k]`` int32 (written whole); ``emit``: write physical slots
    through ``block_table [B, max_blocks]`` at ``req_ids [T]`` with ``block_tokens`` a block. ``num_warps``: None
    picks 32 scores a thread (4 to 16 warps)."""
    tokens, width = scores.shape
    if not serves(width):
        raise ValueError(f"dsahal.topk (triton registers): rows of at most {MAX_WIDTH} scores, got {width}")
    scores = aligned_rows(scores)  # (LAUNCHER_ALIGNED_ARGS)
    block = max(16, triton.next_power_of_2(width))
    warps = default_warps(width) if num_warps is None else num_warps
    if warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"dsahal.topk (triton registers): num_warps expected 1, 2, 4, 8 or 16, got {warps!r}")
    topk_registers_kernel[(tokens,)](
        scores, scores.stride(0), lengths, out, out.stride(0),
        req_ids, block_table, block_table.stride(0), block_table.shape[1], block_tokens,
        width, k,
        EMIT_SLOTS=emit, BLOCK=block, PAD_CHUNK=min(1024, triton.next_power_of_2(max(k, 1))), num_warps=warps,
    )
    return out


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
