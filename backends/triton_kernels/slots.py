"""Position-to-slot translation: ``slot = block_table[req, pos // bt] * bt + pos % bt``.

-1 where the position is -1 (padding), out of the block table, or its block is unmapped.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import grid as launch_grid
from dsahal.kernel_launch import wrap_launched


# Counts and sizes that vary from call to call are not specialised on (Triton would compile a
# variant per value pattern: ==1, multiple of 16); strides stay specialised for wide loads.
SIZE_ARGS = ("K", "num_requests", "max_blocks", "block_tokens")


@triton.jit(do_not_specialize=SIZE_ARGS)
def positions_to_slots_kernel(
    pos_ptr, stride_pt,  # positions [T, K]
    req_ptr,  # [T]
    block_table_ptr, stride_bt,  # [B, max_blocks]
    out_ptr, stride_ot,  # [T, K] int32
    K, num_requests, max_blocks, block_tokens,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < K
    pos = tl.load(pos_ptr + t * stride_pt + cols, mask=in_row, other=-1).to(tl.int64)
    req = tl.load(req_ptr + t + 0 * cols).to(tl.int64)  # broadcast: masks stay tensor-only
    logical = pos // block_tokens
    lookup = in_row & (pos >= 0) & (logical < max_blocks) & (req >= 0) & (req < num_requests)
    block = tl.load(block_table_ptr + req * stride_bt + logical, mask=lookup, other=-1).to(tl.int64)
    slot = tl.where(lookup & (block >= 0), block * block_tokens + pos % block_tokens, -1)
    tl.store(out_ptr + t * stride_ot + cols, slot.to(tl.int32), mask=in_row)


def positions_to_slots(positions, req_ids, block_table, block_tokens, *, block=1024, num_warps=4):
    """Launch :func:`positions_to_slots_kernel`. positions ``[T, K]``, req_ids ``[T]``,
    block_table ``[B, max_blocks]`` -> ``[T, K]`` int32 slots."""
    tokens, width = positions.shape
    positions = positions if positions.stride(-1) == 1 else positions.contiguous()
    out = torch.empty((tokens, width), dtype=torch.int32, device=positions.device)
    if tokens * width == 0:
        return out
    block = min(block, max(triton.next_power_of_2(width), 16))
    if tokens <= launch_grid.MAX_GRID_YZ:
        _launch(positions, req_ids, block_table, block_tokens, out, block, num_warps)
    else:  # tokens on grid axis 1 (CUDA: <= 65535 programs): one launch per range of rows, same programs
        for start, stop in launch_grid.ranges(tokens):
            _launch(positions[start:stop], req_ids[start:stop], block_table, block_tokens, out[start:stop], block,
                    num_warps)
    return out


def _launch(positions, req_ids, block_table, block_tokens, out, block, num_warps):
    """One launch over rows ``[T', K]`` of ``positions`` / ``req_ids`` / ``out`` (all sliced alike; the
    block table, indexed by request id, whole)."""
    tokens, width = positions.shape
    grid = (triton.cdiv(width, block), tokens)
    positions_to_slots_kernel[grid](
        positions, positions.stride(0), req_ids, block_table, block_table.stride(0), out, out.stride(0),
        width, block_table.shape[0], block_table.shape[1], block_tokens, BLOCK=block, num_warps=num_warps,
    )


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
