"""Reference top-k (one device) and the generic distributed merge it is checked against."""
from __future__ import annotations

import torch

from ..distributed.generic_merge import generic_topk_merge, rank_with_tie_rule
from ..distributed.merge import exact_topk_merge

NEG_INF = float("-inf")


def topk(scores, lengths, k):
    """Mask entries at or past ``lengths[t]`` to -inf, then rank with the tie rule."""
    width = scores.shape[1]
    columns = torch.arange(width, device=scores.device)
    masked = torch.where(columns[None, :] < lengths[:, None].long(), scores, torch.full_like(scores, NEG_INF))
    ids = columns[None, :].expand_as(masked).to(torch.int32)
    return rank_with_tie_rule(masked, ids, k).to(torch.int32)


def topk_merge(local_scores, local_lengths, k, group):
    """The packed exact merge (:mod:`dsahal.distributed.merge`): each rank sends ~1.5·k/W candidates
    as 32-bit words, resends only where it may own more winners, and resolves the rounding band
    with raw fp32 scores. Equals the set ``topk`` selects on the gathered raw scores."""
    return exact_topk_merge(local_scores, local_lengths, k, group)


def topk_merge_generic(local_scores, local_lengths, k, group):
    """Generic exact merge (:mod:`dsahal.distributed.generic_merge`): each rank sends its full local
    top-k (fp32 score + int32 global id), every rank ranks the union. 8·k bytes per row per rank:
    the baseline the packed merge is measured against. The local top-k is this module's."""
    return generic_topk_merge(local_scores, local_lengths, k, group, local_topk=topk)
