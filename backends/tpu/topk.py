"""Top-k with the exact tie rule through XLA's TopK, on one device and merged over ranks.

XLA's TopK does not promise which of several equal scores it returns, so it is used only to
find each row's k-th largest score ``v``. The selection itself is then exact and static:
every score ``> v`` is kept, and of the scores ``== v`` the ones with the smallest index are
kept (ranked by a running count along the row) until the row holds k. A second TopK over the
distinct integer keys ``width - column`` of the kept entries lists them in ascending index order
(the contract lets a backend order the valid ones freely). ``-inf`` is never kept. Columns are
encoded as fp32 keys, exact below 2^24 = 16M columns.
"""
from __future__ import annotations

import torch

from .collectives import all_gather, group_rank_and_size

NEG_INF = float("-inf")
MAX_EXACT_COLUMNS = 1 << 24


def _select_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """``[T, W]`` fp32 (-inf = absent, W >= k) -> bool mask of each row's top-k under the tie
    rule "smaller column wins"."""
    kth = torch.topk(scores, k, dim=1).values[:, k - 1 : k]  # [T, 1]
    present = scores > NEG_INF
    above = scores > kth
    tied = (scores == kth) & present
    room = k - above.sum(dim=1, keepdim=True)
    tie_rank = torch.cumsum(tied.to(torch.int32), dim=1)  # 1-based rank among the row's ties
    return above | (tied & (tie_rank <= room))


def _columns_of(mask: torch.Tensor, k: int) -> torch.Tensor:
    """``[T, W]`` bool with at most k set per row -> ``[T, k]`` int64 columns ascending, -1 padded."""
    width = mask.shape[1]
    columns = torch.arange(width, device=mask.device)
    keys = torch.where(mask, (width - columns).to(torch.float32), torch.zeros((), device=mask.device))
    top = torch.topk(keys, k, dim=1).values
    picked = (width - top).to(torch.int64)
    return torch.where(top > 0, picked, torch.full_like(picked, -1))


def _pad_to_width(scores: torch.Tensor, width: int) -> torch.Tensor:
    if scores.shape[1] >= width:
        return scores
    pad = scores.new_full((scores.shape[0], width - scores.shape[1]), NEG_INF)
    return torch.cat([scores, pad], dim=1)


def topk(scores, lengths, k):
    """``[T, N]`` fp32 scores, ``[T]`` lengths -> ``[T, k]`` int32 (ascending index, -1 last)."""
    tokens, width = scores.shape
    if width >= MAX_EXACT_COLUMNS:
        raise ValueError(f"dsahal.topk: backend 'tpu' encodes columns exactly below {MAX_EXACT_COLUMNS}, "
                         f"got scores of width {width}")
    if tokens == 0:
        return scores.new_zeros((0, k), dtype=torch.int32)
    columns = torch.arange(width, device=scores.device)
    masked = torch.where(columns[None, :] < lengths[:, None].to(torch.int64), scores,
                         torch.full_like(scores, NEG_INF))
    masked = _pad_to_width(masked, k)  # short rows: pad with absent entries, static width max(N, k)
    return _columns_of(_select_mask(masked, k), k).to(torch.int32)


def topk_merge(local_scores, local_lengths, k, group):
    """Exact global top-k of a context interleaved over ranks (position p on rank p % W).

    Each rank keeps its local top-k (a global winner is always among its own rank's top-k),
    all-gathers them with their global positions, orders the W*k candidates by global position
    (a TopK over distinct keys) and applies the same exact selection as :func:`topk`, so ties
    go to the smaller *global* position. At world size 1 it is :func:`topk` itself."""
    rank, world = group_rank_and_size(group)
    if world == 1:
        return topk(local_scores, local_lengths, k)
    local = topk(local_scores, local_lengths, k).to(torch.int64)  # [T, k] local columns or -1
    valid = local >= 0
    candidate_scores = torch.where(valid, local_scores.gather(1, local.clamp_min(0)), NEG_INF)
    candidate_ids = torch.where(valid, local * world + rank, torch.full_like(local, -1))
    every_score = all_gather(candidate_scores, group)  # [W, T, k]
    every_id = all_gather(candidate_ids, group)
    tokens = local_scores.shape[0]
    merged_scores = every_score.permute(1, 0, 2).reshape(tokens, world * k)
    merged_ids = every_id.permute(1, 0, 2).reshape(tokens, world * k)
    # Order candidates by global id (absent ones, id -1, last) so column order is id order.
    id_keys = torch.where(merged_ids >= 0, (MAX_EXACT_COLUMNS - merged_ids).to(torch.float32),
                          torch.zeros((), device=merged_ids.device))
    order = torch.topk(id_keys, world * k, dim=1).indices
    merged_scores, merged_ids = merged_scores.gather(1, order), merged_ids.gather(1, order)
    chosen = _columns_of(_select_mask(merged_scores, k), k)
    ids = merged_ids.gather(1, chosen.clamp_min(0))
    return torch.where(chosen >= 0, ids, torch.full_like(ids, -1)).to(torch.int32)
