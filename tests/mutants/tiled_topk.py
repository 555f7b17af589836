"""A top-k that works a row in tiles of 1024 entries, as the Triton kernels do, with switchable
tile-boundary bugs (used by the ``teeth_topk_*`` mutants). Without a bug it is exact: the k best,
ties to the smaller index, -inf and entries past the length never chosen, -1 padding."""
from __future__ import annotations

import torch

TILE = 1024


def tiled_topk(scores, lengths, k, *, ties_last_tile_first=False, drop_last_partial_tile=False):
    tokens, width = scores.shape
    out = torch.full((tokens, k), -1, dtype=torch.int32)
    for t in range(tokens):
        length = max(0, min(int(lengths[t]), width))
        if drop_last_partial_tile and length > TILE and length % TILE:
            length -= length % TILE  # bug: the row's last, partial tile is never read
        row = scores[t, :length].float().cpu()
        ids = torch.nonzero(row != float("-inf")).flatten()
        count = min(k, ids.numel())
        if count == 0:
            continue
        tau = torch.sort(row[ids], descending=True).values[count - 1]
        above = ids[row[ids] > tau]
        ties = ids[row[ids] == tau]
        if ties_last_tile_first:  # bug: the tie candidates are collected tile by tile, last tile first
            ties = ties[torch.argsort(-(ties // TILE) * (width + 1) + ties)]
        chosen = torch.cat([above, ties[: count - above.numel()]])
        out[t, :count] = chosen.to(torch.int32)
    return out.to(scores.device)
