"""Position-to-slot translation on XLA: two gathers through the block table, no host reads."""
from __future__ import annotations

import torch


def positions_to_slots(positions, req_ids, block_table, block_tokens):
    """``[T, K]`` positions (-1 padding), ``[T]`` requests, ``[B, max_blocks]`` table -> ``[T, K]`` int32
    slots, -1 where the position is -1 or its block is unmapped (-1 in the table)."""
    pos = positions.to(torch.int64)
    valid = pos >= 0
    safe = torch.where(valid, pos, torch.zeros_like(pos))
    rows = block_table.to(torch.int64)[req_ids.to(torch.int64)]  # [T, max_blocks]
    block = rows.gather(1, torch.div(safe, block_tokens, rounding_mode="floor"))
    slots = block * block_tokens + torch.remainder(safe, block_tokens)
    return torch.where(valid & (block >= 0), slots, torch.full_like(slots, -1)).to(torch.int32)
