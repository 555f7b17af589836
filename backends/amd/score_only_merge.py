"""Score-only exact top-k merge for decode context parallelism (the seed's AMD method).

The context is interleaved over the ``W`` ranks of a group: global position ``p`` lives on rank
``p % W`` at local index ``p // W``. Ranks exchange candidate *scores only*; token ids stay
local. Every rank derives the same threshold and the same tie decision from the exchanged
scores, so each one knows which of its own candidates win without seeing anyone's ids.

Algorithm, per query row ``t`` (every step after an exchange runs identically on every rank):

1. *Scores.* Each rank sends its ``k`` best local scores, sorted, ``-inf`` padded
   (``4k`` bytes per row: 8 KiB at k = 2048, half of a score + id exchange).
2. *Threshold.* ``tau`` = the k-th largest of the ``W·k`` gathered scores. It is the true
   global k-th largest: every global winner is in its own rank's local top-k (anything that
   beats it on its rank beats it globally too), so the union holds the whole global top-k.
   ``above_q`` = rank q's candidates ``> tau``; ``tied_q`` = its candidates ``== tau``;
   ``need = k - Σ above_q`` threshold-equal slots remain. If ``tau = -inf`` the row has fewer
   than k finite scores: every finite score wins and nothing else does.
3. *Ties.* The tie rule is "smaller global position wins", and positions interleave across
   ranks, so counts alone cannot split ``need`` slots among the tied candidates of several
   ranks (rank 0 tied at local {0, 100} and rank 1 at {1}: positions 0, 200, 3). A row is
   *ambiguous* when ``Σ tied_q > need``. Ambiguity is decided from the gathered scores, so
   every rank agrees on it and on the set of ambiguous rows without talking. Only for those
   rows, each rank sends the global positions of its first ``min(tied_q, need)`` tied
   candidates (by local index: a rank's tie winners are always its smallest tied indices, and
   its local top-k kept exactly those). The ``need`` smallest gathered positions are the tie
   winners; ``wins_q`` = how many of them rank q sent. Unambiguous rows: ``wins_q = tied_q``.
   With continuous scores no row is ambiguous and this exchange does not happen.
4. *Local winners.* Rank r's winners: its valid entries ``> tau`` and its first ``wins_r``
   entries ``== tau`` by local index — exactly its share of the single-device top-k.

That is all a DCP decode step needs (each rank attends to the winners it owns, then LSE
combine). The op :func:`dsahal.ops.topk_merge` additionally returns every winner's global
position on every rank, so :func:`score_only_topk_merge` adds one exchange of the winners'
positions only: rank q sends exactly its ``Σ_t (above_q + wins_q)`` positions (every rank knows
those counts), padded to the largest rank's total; with winners spread evenly that is about
``4k/W`` bytes per row per rank. The receiver pairs them with the scores it already has and
orders the row by (score descending, position ascending), as :func:`dsahal.ops.topk` does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dsahal.distributed.generic_merge import rank_with_tie_rule
from dsahal.ops.collectives import all_gather, group_rank_and_size

NEG_INF = float("-inf")
NO_POSITION = torch.iinfo(torch.int32).max  # sorts after every real position


@dataclass
class MergeTraffic:
    """Bytes this rank sent per phase (what the algorithm costs on the wire)."""

    scores: int = 0
    tie_positions: int = 0
    winner_positions: int = 0


@dataclass
class LocalWinners:
    """This rank's share of the global top-k, and what every rank knows about everyone's share.

    Attributes:
        local_index: ``[T, k]`` int64 local indices of this rank's winners, ascending, -1 padded.
        candidate_scores: ``[W, T, k]`` fp32 every rank's sorted candidate scores (phase 1).
        winner_counts: ``[W, T]`` int64 winners each rank owns per row (sums to at most k).
        traffic: bytes sent by this rank.
    """

    local_index: torch.Tensor
    candidate_scores: torch.Tensor
    winner_counts: torch.Tensor
    traffic: MergeTraffic


def _masked(local_scores: torch.Tensor, local_lengths: torch.Tensor) -> torch.Tensor:
    columns = torch.arange(local_scores.shape[1], device=local_scores.device)
    valid = columns[None, :] < local_lengths[:, None].long()
    return torch.where(valid, local_scores, torch.full_like(local_scores, NEG_INF))


def _sorted_candidates(masked: torch.Tensor, k: int) -> torch.Tensor:
    """``[T, k]`` the k largest values per row, descending, -inf padded (values only: the
    multiset is all the exchange needs, so any top-k kernel's tie handling is fine here)."""
    tokens, width = masked.shape
    values = torch.topk(masked, min(k, width), dim=1, largest=True, sorted=True).values
    if values.shape[1] < k:
        values = torch.cat([values, values.new_full((tokens, k - values.shape[1]), NEG_INF)], dim=1)
    return values.contiguous()


def _tie_rank(masked: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """``[T, N]`` 1-based rank of each threshold-equal entry among its row's threshold-equal
    entries by local index; 0 elsewhere (and everywhere on rows whose threshold is -inf)."""
    tied = (masked == tau[:, None]) & (tau[:, None] > NEG_INF)
    return torch.where(tied, torch.cumsum(tied.long(), dim=1), torch.zeros_like(masked, dtype=torch.long))


def _first_tied_positions(tie_rank, limit, width_out, rank, world):
    """``[R, width_out]`` int32 global positions of each row's first ``limit[row]`` tied entries,
    ascending, padded with :data:`NO_POSITION`."""
    rows, width = tie_rank.shape
    columns = torch.arange(width, device=tie_rank.device)
    chosen = (tie_rank > 0) & (tie_rank <= limit[:, None])
    keys = torch.where(chosen, columns[None, :] * world + rank, torch.full_like(tie_rank, NO_POSITION))
    keys = torch.sort(keys, dim=1).values[:, :width_out]
    if keys.shape[1] < width_out:
        keys = torch.cat([keys, keys.new_full((rows, width_out - keys.shape[1]), NO_POSITION)], dim=1)
    return keys.to(torch.int32).contiguous()


def _tie_wins(masked, tau, tied, need, ambiguous, rank, world, group, traffic):
    """``[W, T]`` threshold-equal winners per rank. Exchanges tie positions for ambiguous rows only."""
    wins = tied.clone()
    if not bool(ambiguous.any()):
        return wins
    rows = torch.nonzero(ambiguous).flatten()
    sent = torch.minimum(tied[:, rows], need[rows][None, :])  # [W, R] what each rank sends
    width = int(sent.max())
    mine = _first_tied_positions(_tie_rank(masked[rows], tau[rows]), sent[rank], width, rank, world)
    traffic.tie_positions += mine.numel() * mine.element_size()
    everyone = all_gather(mine, group, check=False).long()  # [W, R, width]
    union = everyone.permute(1, 0, 2).reshape(rows.numel(), -1)
    cut = torch.sort(union, dim=1).values.gather(1, (need[rows] - 1)[:, None])  # need-th smallest
    wins[:, rows] = (everyone <= cut[None, :, :]).sum(dim=2)
    return wins


def score_only_local_winners(
    local_scores: torch.Tensor, local_lengths: torch.Tensor, k: int, group=None
) -> LocalWinners:
    """Which of this rank's tokens are in the exact global top-k, exchanging scores only.

    Args:
        local_scores: ``[T, N]`` fp32 scores of this rank's tokens (N may differ between ranks).
        local_lengths: ``[T]`` int valid local entries per row.
        k: number of winners per row.
        group: ``torch.distributed`` process group (None: default group, or a single rank).

    Returns:
        :class:`LocalWinners`. Collective: every rank calls it with the same ``T`` and ``k``.
    """
    rank, world = group_rank_and_size(group)
    traffic = MergeTraffic()
    masked = _masked(local_scores, local_lengths)
    candidates = _sorted_candidates(masked, k)
    traffic.scores = candidates.numel() * candidates.element_size()
    gathered = all_gather(candidates, group, check=False)  # [W, T, k]

    tokens = masked.shape[0]
    union = gathered.permute(1, 0, 2).reshape(tokens, -1)
    tau = torch.topk(union, k, dim=1, sorted=True).values[:, k - 1]
    finite = tau > NEG_INF
    above = (gathered > tau[None, :, None]).sum(dim=2)  # [W, T]
    tied = ((gathered == tau[None, :, None]) & finite[None, :, None]).sum(dim=2)
    need = torch.where(finite, k - above.sum(dim=0), torch.zeros_like(tau, dtype=torch.long))
    ambiguous = tied.sum(dim=0) > need
    wins = _tie_wins(masked, tau, tied, need, ambiguous, rank, world, group, traffic)

    tie_rank = _tie_rank(masked, tau)
    winning = (masked > tau[:, None]) | ((tie_rank > 0) & (tie_rank <= wins[rank][:, None]))
    winning &= masked > NEG_INF
    columns = torch.arange(masked.shape[1], device=masked.device)
    local_index = torch.where(winning, columns[None, :], torch.full_like(tie_rank, NO_POSITION))
    local_index = torch.sort(local_index, dim=1).values[:, :k]
    if local_index.shape[1] < k:
        local_index = torch.cat([local_index, local_index.new_full((tokens, k - local_index.shape[1]),
                                                                   NO_POSITION)], dim=1)
    local_index = torch.where(local_index == NO_POSITION, torch.full_like(local_index, -1), local_index)
    return LocalWinners(local_index, gathered, above + wins, traffic)


def _winner_positions_by_score(local_scores, winners: LocalWinners, rank, world):
    """``[T, k]`` this rank's winners' global positions ordered by (score desc, position asc)."""
    index = winners.local_index  # ascending local index = ascending global position, -1 last
    valid = index >= 0
    scores = torch.where(valid, local_scores.gather(1, index.clamp_min(0)), NEG_INF)
    positions = torch.where(valid, index * world + rank, NO_POSITION)
    by_score = torch.sort(scores, dim=1, descending=True, stable=True).indices
    return positions.gather(1, by_score)


def score_only_topk_merge(
    local_scores: torch.Tensor, local_lengths: torch.Tensor, k: int, group=None
) -> torch.Tensor:
    """The :func:`dsahal.ops.topk_merge` contract computed by the score-only method.

    Args and collective behaviour as :func:`score_only_local_winners`.

    Returns:
        ``[T, k]`` int32 global positions, the same on every rank and equal to
        :func:`dsahal.ops.topk` on the gathered ``[T, W·N]`` scores: ordered by score
        descending then position ascending, -1 padded.
    """
    rank, world = group_rank_and_size(group)
    tokens = local_scores.shape[0]
    if tokens == 0:
        return torch.empty((0, k), dtype=torch.int32, device=local_scores.device)
    winners = score_only_local_winners(local_scores, local_lengths, k, group)
    counts = winners.winner_counts  # [W, T]
    totals = counts.sum(dim=1)  # [W]
    longest = max(int(totals.max()), 1)

    mine = _winner_positions_by_score(local_scores, winners, rank, world)
    slots = torch.arange(k, device=mine.device)
    packed = mine[slots[None, :] < counts[rank][:, None]].to(torch.int32)  # row-major, this rank's winners
    packed = torch.cat([packed, packed.new_full((longest - packed.numel(),), NO_POSITION)])
    winners.traffic.winner_positions = packed.numel() * packed.element_size()
    everyone = all_gather(packed, group, check=False).long()  # [W, longest]

    # Rank q's winners of row t sit at offsets starts[q, t] + j, j < counts[q, t].
    starts = torch.cumsum(counts, dim=1) - counts
    within = slots[None, None, :] < counts[:, :, None]  # [W, T, k]
    offsets = (starts[:, :, None] + slots[None, None, :]).clamp_max(longest - 1)
    positions = torch.where(within, everyone.gather(1, offsets.reshape(world, -1)).reshape(world, tokens, k),
                            torch.full_like(offsets, NO_POSITION))
    # A rank's winners are its first counts[q, t] candidates: the scores gathered in phase 1.
    scores = torch.where(within, winners.candidate_scores, torch.full_like(winners.candidate_scores, NEG_INF))
    scores = scores.permute(1, 0, 2).reshape(tokens, -1)
    positions = positions.permute(1, 0, 2).reshape(tokens, -1)
    return rank_with_tie_rule(scores, positions, k).to(torch.int32)
