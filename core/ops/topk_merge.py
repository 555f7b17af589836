"""Exact global top-k over a context sharded across ranks (decode context parallelism)."""
from __future__ import annotations

import torch

from ..registry.state import active_table
from ._layout import unit_last
from ._validate import INDEX_DTYPES, INT32_MAX, ShapeBinder, values_in_range
from .collectives import LocalChecks, checked_rank_and_size, same_on_every_rank

OP = "topk_merge"


def validate_topk_merge(local_scores, local_lengths, k, group) -> None:
    v = ShapeBinder(OP)
    rank, world = checked_rank_and_size(v, group)
    facts = None
    # A rank whose own checks fail still joins the agreement exchange below (LocalChecks), so that its peers raise
    # too instead of waiting in it.
    with LocalChecks() as checks:
        v.tensor("local_scores", local_scores, ["T", "N"], torch.float32)
        v.tensor("local_lengths", local_lengths, ["T"], INDEX_DTYPES)
        v.positive_int("k", k)
        # The output is [T, k] int32 (-1 padded past the row): a k past int32 is no row width, only an allocation
        # failure deep inside a route (dsa_attention bounds its topk the same way).
        v.at_most("k", k, INT32_MAX, "a count")
        v.same_device(local_scores=local_scores, local_lengths=local_lengths)
        v.has_data("local_scores", local_scores)  # (the merge reads scores and lengths)
        values_in_range(OP, "local_lengths", local_lengths, 0, local_scores.shape[1])
        facts = [*local_scores.shape, k]
    # Collective: ranks that disagree on T or N aborted gloo's process (and would hang NCCL); on k they each
    # returned a different width, where every rank must receive the same result.
    same_on_every_rank(v, "local_scores", "[T, N] and k", facts, local_scores, group, rank, world,
                       lambda row: f"[T, N] = [{row[0]}, {row[1]}], k = {row[2]}", checks, 3)


def topk_merge(
    local_scores: torch.Tensor,
    local_lengths: torch.Tensor,
    k: int,
    group=None,
    *,
    check: bool = True,
) -> torch.Tensor:
    """The global top-k of a context interleaved over the ``W`` ranks of ``group``.

    Global position ``p`` lives on rank ``p % W`` at local index ``p // W``. Every rank passes its
    local scores and receives the same result: exactly what :func:`dsahal.ops.topk` returns on the
    gathered ``[T, W * N]`` scores (same tie rule: smaller *global* position wins; -inf never
    selected; short rows padded with -1).

    Args:
        local_scores: ``[T, N]`` fp32 scores of this rank's tokens (same ``T`` and ``N`` on every rank).
        local_lengths: ``[T]`` int32 valid local entries per row (``ceil((L - rank) / W)`` for a
            context of length ``L``).
        k: number to keep.
        group: ``torch.distributed`` process group; ``None`` means the default group when
            ``torch.distributed`` is initialised, else a single rank.

    Returns:
        ``[T, k]`` int32 global positions, valid ones first, -1 padding last.

    Collective: every rank of ``group`` must call it with the same ``T``, ``N`` and ``k`` (checked with one
    small all-gather when ``check=True``: every rank raises the same error otherwise).
    """
    if check:
        validate_topk_merge(local_scores, local_lengths, k, group)
    local_lengths = unit_last(local_lengths)
    return active_table().dispatch[OP](local_scores, local_lengths, k, group)
