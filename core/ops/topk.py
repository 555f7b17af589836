"""Top-k selection with a fixed tie rule, on one device."""
from __future__ import annotations

import torch

from ..registry.state import active_table
from ._dispatch import tracing
from ._layout import unit_last
from ._validate import INDEX_DTYPES, INT32_MAX, ShapeBinder, values_in_range

OP = "topk"


@torch.library.custom_op("dsahal::topk", mutates_args=())
def _topk_op(scores: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    return active_table().dispatch[OP](scores, lengths, k)


@_topk_op.register_fake
def _(scores, lengths, k):
    return scores.new_empty((scores.shape[0], k), dtype=torch.int32)


def validate_topk(scores, lengths, k) -> None:
    v = ShapeBinder(OP)
    v.tensor("scores", scores, ["T", "N"], torch.float32)
    v.tensor("lengths", lengths, ["T"], INDEX_DTYPES)
    v.positive_int("k", k)
    # The output is [T, k] int32 (-1 padded past the row): a k past int32 is no row width, only an allocation
    # failure deep inside a route (dsa_attention bounds its topk the same way).
    v.at_most("k", k, INT32_MAX, "a count")
    v.same_device(scores=scores, lengths=lengths)
    values_in_range(OP, "lengths", lengths, 0, scores.shape[1], what=" (at most the scores' width)")


def topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, *, check: bool = True) -> torch.Tensor:
    """The ``k`` largest of ``scores[t, :lengths[t]]`` per row.

    Tie rule: among equal scores the smaller index wins. ``-inf`` entries are never selected
    (a masked entry is absent, not a candidate); rows with fewer than ``k`` candidates are
    padded with -1. NaN scores are not allowed (undefined result).

    Args:
        scores: ``[T, N]`` fp32.
        lengths: ``[T]`` int32, each in ``[0, N]``.
        k: number to keep (may exceed N).

    Returns:
        ``[T, k]`` int32 indices, valid ones first and -1 padding last. The reference orders the
        valid ones by score descending, then index ascending; a backend may order them freely.
        Every backend returns a set with the reference's score multiset; one that claims
        determinism returns exactly the reference's set (the tie rule honoured).
    """
    if check:
        validate_topk(scores, lengths, k)
    lengths = unit_last(lengths)
    if tracing():
        return torch.ops.dsahal.topk(scores, lengths, k)
    return active_table().dispatch[OP](scores, lengths, k)
