"""Mutant: the DCP top-k merge sends only ceil(1.5 k / W) candidates per rank and never resends, so
it loses winners when one rank holds more of them than it sent."""
import math

import torch

from dsahal.ops.collectives import all_gather, group_rank_and_size
from dsahal.distributed.generic_merge import rank_with_tie_rule
from dsahal.reference.topk import topk
from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "topk_merge.equals_single_device"


def topk_merge(local_scores, local_lengths, k, group):
    rank, world = group_rank_and_size(group)
    sent = min(k, math.ceil(1.5 * k / world))
    local = topk(local_scores, local_lengths, sent).long()
    valid = local >= 0
    scores = torch.where(valid, local_scores.gather(1, local.clamp_min(0)), float("-inf"))
    ids = torch.where(valid, local * world + rank, torch.full_like(local, 2**31 - 1)).to(torch.int32)
    all_scores, all_ids = all_gather(scores, group, check=False), all_gather(ids, group, check=False)
    tokens = local_scores.shape[0]
    return rank_with_tie_rule(all_scores.permute(1, 0, 2).reshape(tokens, -1),
                              all_ids.permute(1, 0, 2).reshape(tokens, -1), k).to(torch.int32)


@hookimpl
def dsahal_backends():
    return [mutant_backend("mutant_merge_drops_winners", {"topk_merge": topk_merge},
                           description="merge without the resend step")]
