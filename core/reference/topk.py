"""Reference top-k (one device) and the generic distributed merge it is checked against."""
from __future__ import annotations

import torch

from ..distributed.merge import exact_topk_merge
from ..ops.collectives import all_gather, group_rank_and_size

NEG_INF = float("-inf")


def _ranked(scores: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """Order each row by (score descending, id ascending) and keep ``k`` ids; -inf entries become -1."""
    by_id = torch.sort(ids, dim=1, stable=True).indices
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    by_score = torch.sort(scores, dim=1, descending=True, stable=True).indices
    scores, ids = scores.gather(1, by_score)[:, :k], ids.gather(1, by_score)[:, :k]
    ids = torch.where(scores == NEG_INF, torch.full_like(ids, -1), ids)
    if ids.shape[1] < k:
        ids = torch.cat([ids, ids.new_full((ids.shape[0], k - ids.shape[1]), -1)], dim=1)
    return ids


def topk(scores, lengths, k):
    """Mask entries at or past ``lengths[t]`` to -inf, then rank with the tie rule."""
    width = scores.shape[1]
    columns = torch.arange(width, device=scores.device)
    masked = torch.where(columns[None, :] < lengths[:, None].long(), scores, torch.full_like(scores, NEG_INF))
    ids = columns[None, :].expand_as(masked).to(torch.int32)
    return _ranked(masked, ids, k).to(torch.int32)


def topk_merge(local_scores, local_lengths, k, group):
    """The packed exact merge (:mod:`dsahal.distributed.merge`): each rank sends ~1.5·k/W candidates
    as 32-bit words, resends only where it may own more winners, and resolves the rounding band
    with raw fp32 scores. Equals the set ``topk`` selects on the gathered raw scores."""
    return exact_topk_merge(local_scores, local_lengths, k, group)


def topk_merge_generic(local_scores, local_lengths, k, group):
    """Generic exact merge: each rank sends its full local top-k (fp32 score + int32 global id),
    every rank ranks the union. Exact on unrounded scores because a global winner is among its own
    rank's top-k. 8·k bytes per row per rank: the baseline the packed merge is measured against."""
    rank, world = group_rank_and_size(group)
    local = topk(local_scores, local_lengths, k).long()  # [T, k] local indices or -1
    valid = local >= 0
    cand_scores = torch.where(valid, local_scores.gather(1, local.clamp_min(0)), NEG_INF)
    cand_ids = torch.where(valid, local * world + rank, torch.full_like(local, -1)).to(torch.int32)
    all_scores = all_gather(cand_scores, group, check=False)  # [W, T, k]
    all_ids = all_gather(cand_ids, group, check=False)
    tokens = local_scores.shape[0]
    merged_scores = all_scores.permute(1, 0, 2).reshape(tokens, -1)
    merged_ids = all_ids.permute(1, 0, 2).reshape(tokens, -1)
    # -1 ids carry -inf scores; give them a huge id so they never outrank a real candidate.
    merged_ids = torch.where(merged_ids < 0, torch.full_like(merged_ids, torch.iinfo(torch.int32).max), merged_ids)
    return _ranked(merged_scores, merged_ids, k).to(torch.int32)
