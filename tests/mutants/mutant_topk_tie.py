"""Mutant: top-k breaks ties toward the larger index (the contract: the smaller index wins)."""
import torch

from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "topk.exact_tie_rule"


def topk(scores, lengths, k):
    width = scores.shape[1]
    columns = torch.arange(width)
    masked = torch.where(columns[None, :] < lengths[:, None].long(), scores, float("-inf"))
    reversed_ids = columns.flip(0)  # a stable sort over reversed columns prefers the larger index
    order = torch.sort(masked[:, reversed_ids], dim=1, descending=True, stable=True).indices
    ids = reversed_ids[order][:, :k]
    chosen = masked.gather(1, ids)
    ids = torch.where(chosen == float("-inf"), -1, ids)
    if ids.shape[1] < k:
        ids = torch.cat([ids, ids.new_full((ids.shape[0], k - ids.shape[1]), -1)], dim=1)
    return ids.to(torch.int32)


@hookimpl
def dsahal_backends():
    return [mutant_backend("mutant_topk_tie", {"topk": topk}, description="ties go to the larger index")]
