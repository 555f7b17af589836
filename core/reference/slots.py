"""Reference position-to-slot translation."""
from __future__ import annotations

import torch


def positions_to_slots(positions, req_ids, block_table, block_tokens):
    pos = positions.long()
    valid = pos >= 0
    safe = pos.clamp_min(0)
    rows = block_table.long()[req_ids.long()]  # [T, max_blocks]
    block = rows.gather(1, safe // block_tokens)
    slots = block * block_tokens + safe % block_tokens
    return torch.where(valid & (block >= 0), slots, torch.full_like(slots, -1)).to(torch.int32)
