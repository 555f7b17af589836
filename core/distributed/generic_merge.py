"""The generic exact top-k merge: the baseline the packed merge (:mod:`.merge`) is measured against.

Each rank takes its full local top-k (``k`` candidates per row), sends them as fp32 score + int32
global id (8 bytes a candidate: ``8·T·k`` bytes per rank), and every rank ranks the ``W·k``
candidates with the tie rule. Exact on the raw scores: a global winner is among its own rank's
top-k. Used by the reference backend (with its sort-based top-k) and by the multi-GPU bench (with the
backend's top-k kernel, so the comparison times the merges, not two different local top-k's).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import ops
from . import collective

NEG_INF = float("-inf")
LocalTopk = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def rank_with_tie_rule(scores: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """Order each row of ``scores`` ``[T, n]`` by (score descending, id ascending), keep ``k`` of the
    matching ``ids`` ``[T, n]``; -inf entries become -1, rows shorter than ``k`` are padded with -1."""
    by_id = torch.sort(ids, dim=1, stable=True).indices
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    by_score = torch.sort(scores, dim=1, descending=True, stable=True).indices
    scores, ids = scores.gather(1, by_score)[:, :k], ids.gather(1, by_score)[:, :k]
    ids = torch.where(scores == NEG_INF, torch.full_like(ids, -1), ids)
    if ids.shape[1] < k:
        ids = torch.cat([ids, ids.new_full((ids.shape[0], k - ids.shape[1]), -1)], dim=1)
    return ids


def _backend_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    return ops.topk(scores, lengths, k, check=False)


def generic_topk_merge(local_scores: torch.Tensor, local_lengths: torch.Tensor, k: int, group=None, *,
                       local_topk: Optional[LocalTopk] = None) -> torch.Tensor:
    """``dsahal.ops.topk_merge`` by exchanging every rank's full local top-k.

    Args:
        local_scores: ``[T, N]`` fp32 scores of this rank's tokens (global position ``local·W + rank``).
        local_lengths: ``[T]`` int valid local entries per row.
        k: number to keep.
        group: the process group (None: the default group, or one rank).
        local_topk: ``(scores, lengths, k) -> [T, k]`` local indices with the tie rule, -1 padded;
            default the current backend's ``dsahal.ops.topk``.

    Returns:
        ``[T, k]`` int32 global positions, -1 padding; identical on every rank. Collective: two
        all-gathers of ``[T, k]`` (scores, ids).
    """
    rank, world = ops.group_rank_and_size(group)
    local = (local_topk or _backend_topk)(local_scores, local_lengths, k).long()  # [T, k] local ids or -1
    valid = local >= 0
    cand_scores = torch.where(valid, local_scores.gather(1, local.clamp_min(0)), NEG_INF)
    cand_ids = torch.where(valid, local * world + rank, torch.full_like(local, -1)).to(torch.int32)
    all_scores = collective.all_gather(cand_scores, group, "generic topk_merge scores")  # [W, T, k]
    all_ids = collective.all_gather(cand_ids, group, "generic topk_merge ids")
    tokens = local_scores.shape[0]
    # Explicit widths, not -1: with zero rows there are zero elements and -1 would be ambiguous.
    merged_scores = all_scores.permute(1, 0, 2).reshape(tokens, world * local.shape[1])
    merged_ids = all_ids.permute(1, 0, 2).reshape(tokens, world * local.shape[1])
    # -1 ids carry -inf scores; give them a huge id so they never outrank a real candidate.
    merged_ids = torch.where(merged_ids < 0, torch.full_like(merged_ids, torch.iinfo(torch.int32).max), merged_ids)
    return rank_with_tie_rule(merged_scores, merged_ids, k).to(torch.int32)
