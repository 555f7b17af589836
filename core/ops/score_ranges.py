"""Token ranges of a DSA layer whose ``[T, context]`` fp32 index scores stay within a budget.

The layer (``dsahal.ops.dsa_attention``) scores every query token against its request's context and keeps each
row's top-k. Its score matrix is ``T x max_context`` fp32: 320 MiB for a 640-token decode batch at 128K, but 8 GiB
for a 16K-token prefill at 128K and 64 GiB at 1M. A layer whose scores would pass :data:`SCORES_BUDGET_BYTES`
scores and selects over consecutive ranges of tokens instead, reusing one range's buffer (serving engines chunk
their DSA indexer's prefill logits the same way); the slots of every range then feed one sparse-MLA call. A range is
a smaller batch of the same tokens: where a row's scores do not depend on its batch (batch-invariant mode, the
reference, the kernels tested bitwise on the CPU) the ranges change the memory a layer takes, not its result; in
default mode on a GPU a row is as batch-dependent as it already was (an indexer may group a request's tokens).

The budget is ``DSAHAL_SCRATCH_MIB`` (default 512 MiB), the one scratch bound of long calls; read at call time from
this module (``score_ranges.SCORES_BUDGET_BYTES``), so a test can lower it.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..registry.settings import scratch_bytes

# DSAHAL_SCRATCH_MIB (default 512 MiB: 1024 tokens at 128K, 128 at 1M), read when this module is imported
SCORES_BUDGET_BYTES = scratch_bytes()


def tokens_per_range(row_floats: int) -> int:
    """Most tokens whose fp32 score rows of ``row_floats`` entries fit :data:`SCORES_BUDGET_BYTES` (at least 1)."""
    return max(1, SCORES_BUDGET_BYTES // max(1, 4 * row_floats))


def score_ranges(tokens: int, row_floats: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``[0, tokens)``, each range's ``[stop - start, row_floats]`` fp32 scores
    within :data:`SCORES_BUDGET_BYTES`; one range when the whole matrix fits (``[(0, 0)]`` for no tokens: the layer's
    stages then run once on their empty inputs, as without ranges)."""
    step = tokens_per_range(row_floats)
    return [(start, min(start + step, tokens)) for start in range(0, max(tokens, 1), step)]


def requests_in_range(requests: int, range_tokens: int, tokens: int) -> int:
    """The requests a range of ``range_tokens`` of a call's ``tokens`` (from ``requests`` block-table rows) is
    planned for: its share, ``ceil(requests * range_tokens / tokens)`` (all of them for the one range), so an
    indexer that plans its launch by tokens a request (``ceil(tokens / requests)``) plans a range as the whole call.
    Without it a range of 160 of a 64 x 5 decode batch's 320 tokens reads as 3 tokens a request and gets a
    launch plan with other last bits (H200, thirty-third session: ``scripts/h200/score_range_sweep.py``)."""
    return max(1, -(-requests * range_tokens // max(1, tokens)))


def slots_over_score_ranges(tokens: int, row_floats: int, slots_of: Callable[[slice], torch.Tensor]) -> torch.Tensor:
    """The layer's slots ``[tokens, k]``: ``slots_of(rows)`` (the indexer and top-k of the tokens at ``rows``, a
    slice) for each of :func:`score_ranges`, in token order; the one range's own tensor when there is one."""
    parts = [slots_of(slice(start, stop)) for start, stop in score_ranges(tokens, row_floats)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)
