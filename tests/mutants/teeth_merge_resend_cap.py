"""Mutant: the exact DCP top-k merge with its resend buffer sized for 3/4·k words per row.

That is enough at W <= 4 (a rank sends c = ceil(1.5k/W) >= 3k/8 and resends at most k + 1 - c <=
3k/4), so the merge is exact on every case at W = 2 and 4; at W = 8 (c = 3k/16) a rank owning
more than c + 3k/4 winners loses the rest."""
import math
from dataclasses import replace

import torch

from dsahal.distributed import collective
from dsahal.distributed import merge as M
from dsahal.ops.collectives import group_rank_and_size
from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "topk_merge.equals_single_device_w8"


def capped_plan(k: int, width: int, world: int) -> M.MergePlan:
    plan = M.plan_merge(k, width, world)
    return replace(plan, ranked=min(plan.ranked, plan.candidates + math.ceil(0.75 * k)))


def topk_merge(local_scores, local_lengths, k, group):
    """:func:`dsahal.distributed.merge.exact_topk_merge` with :func:`capped_plan`."""
    rank, world = group_rank_and_size(group)
    tokens = local_scores.shape[0]
    plan = capped_plan(k, local_scores.shape[1], world)
    ranked = M.rank_locally(local_scores, local_lengths, plan)
    header = torch.tensor([plan.width, plan.k], dtype=torch.int32, device=local_scores.device)
    message = torch.cat([header, M.words_to_wire(ranked[:, :plan.candidates]).reshape(-1)])
    gathered = collective.all_gather(message, group, "topk_merge first round")
    first = M.wire_to_words(gathered[:, M.HEADER_INTS:]).reshape(world, tokens, plan.candidates)

    def exchange(payloads, counts, what):
        return collective.all_gather_varying(payloads[rank], list(counts), group, what)

    positions, _ = M._merge_after_first_round(first, {rank: (local_scores, local_lengths, ranked)}, plan, exchange)
    return positions


@hookimpl
def dsahal_backends():
    return [mutant_backend("teeth_merge_resend_cap", {"topk_merge": topk_merge},
                           description="resend buffer of 3/4 k words")]
