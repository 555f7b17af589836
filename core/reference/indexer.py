"""Reference indexer score, one query token at a time, in float64."""
from __future__ import annotations

import torch

from .cache import read_tokens


def token_slots(block_table: torch.Tensor, req: int, length: int, block_tokens: int) -> torch.Tensor:
    """Physical slots of positions ``0..length-1`` of request ``req``; -1 where the block is unmapped."""
    pos = torch.arange(length, device=block_table.device)
    block = block_table[req].long()[pos // block_tokens]
    return torch.where(block >= 0, block * block_tokens + pos % block_tokens, torch.full_like(block, -1))


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    """``score[t, s] = Σ_h w[t, h] · relu(q[t, h] · k[s])`` (k dequantised, so its scale is included)."""
    tokens = q.shape[0]
    block_tokens = index_pages.shape[1]
    scores = torch.full((tokens, max_context), float("-inf"), dtype=torch.float32, device=q.device)
    for t in range(tokens):
        visible = min(int(positions[t]) + 1, max_context)
        slots = token_slots(block_table, int(req_ids[t]), visible, block_tokens)
        mapped = slots >= 0
        keys = read_tokens(index_pages, slots[mapped], "index", index_fmt).double()  # [S, 128]
        per_head = torch.relu(q[t].double() @ keys.T)  # [H, S]
        row = torch.full((visible,), float("-inf"), dtype=torch.float64, device=q.device)
        row[mapped] = weights[t].double() @ per_head
        scores[t, :visible] = row.float()
    return scores
