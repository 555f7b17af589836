"""Split sparse-MLA launches' fp32 partials, bounded: a long call runs as several launches over its tokens.

A sparse-MLA launcher that splits each token's slot list writes one fp32 partial output per split, ``o [splits, T,
H, 512]`` and ``lse [splits, T, H]``, and merges them (:func:`~.lse_combine.lse_combine`). Where the split is fixed
(batch-invariant mode at every head count; few heads in both modes: 512 or 1024 slots a split) those partials grow
with the call's tokens: 2 KiB a token and head a split, 17 GiB for a 16K-token prefill at 128 heads and top-k 2048 in
batch-invariant mode, where the output itself is 2 GiB. :func:`bounded_partials` makes a launcher run over
consecutive ranges of at most :func:`tokens_per_launch` tokens when its partials would pass
:data:`PARTIALS_BUDGET_BYTES`, each range's output copied into the call's. Every token's result is bitwise the same
(a program's work depends on its token alone, and every range takes the launch options of the whole call), so the
bound changes memory, never numbers; calls under it (up to 511 tokens at 128 heads and 4 splits: the seed's 320-token
decode batch) launch once, as before.

The budget is ``DSAHAL_SCRATCH_MIB`` (default 512 MiB), the one scratch bound of long calls. Launchers read
:data:`PARTIALS_BUDGET_BYTES` from this module at call time, so a test can lower it to exercise the ranges on tiny
inputs.
"""
from __future__ import annotations

import functools
import inspect

import torch

from dsahal.registry.settings import scratch_bytes

# fp32 partials one launch may allocate: DSAHAL_SCRATCH_MIB (default 512 MiB: 511 tokens at H = 128, 4 splits), read
# when this module is imported
PARTIALS_BUDGET_BYTES = scratch_bytes()
VALUE_DIM = 512  # the value (nope) columns of a partial output row


def splits_of(k: int, split_size: int | None) -> int:
    """How many splits a launcher makes of ``k`` slots a token with ``split_size`` slots a split (None: one). A
    ``split_size`` that is not a whole number >= 1 counts as one split: the launcher itself rejects it, naming it."""
    if split_size is None or type(split_size) is not int or split_size < 1 or split_size >= k:
        return 1
    return -(-k // split_size)


def partial_bytes_per_token(heads: int, k: int, split_size: int | None) -> int:
    """Bytes of fp32 partials (outputs and lse) a token of ``heads`` heads over ``k`` slots takes; 0 with one split
    (its output is written final, in the queries' dtype)."""
    splits = splits_of(k, split_size)
    return 0 if splits == 1 else splits * heads * (VALUE_DIM + 1) * 4


def tokens_per_launch(heads: int, k: int, split_size: int | None) -> int | None:
    """The most tokens one launch takes within :data:`PARTIALS_BUDGET_BYTES` (at least 1); None: no bound."""
    per_token = partial_bytes_per_token(heads, k, split_size)
    return None if per_token == 0 else max(1, PARTIALS_BUDGET_BYTES // per_token)


def bounded_partials(launcher):
    """``launcher(q [T, H, 576], kv_pages, slots [T, K], kv_fmt, kv_scale, softmax_scale, *, split_size=..., ...)``
    returning ``(o [T, H, 512], lse [T, H] fp32)``, made to run over token ranges whose partials stay within
    :data:`PARTIALS_BUDGET_BYTES` (its own ``split_size`` default where the call names none)."""
    default_split = inspect.signature(launcher).parameters["split_size"].default

    @functools.wraps(launcher)
    def launch(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, **options):
        if not (isinstance(q, torch.Tensor) and isinstance(slots, torch.Tensor) and q.dim() == 3 and slots.dim() == 2
                and q.shape[0] == slots.shape[0]):  # other shapes: the launcher's own checks name what is wrong
            return launcher(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, **options)
        tokens = q.shape[0]
        most = tokens_per_launch(q.shape[1], slots.shape[1], options.get("split_size", default_split))
        if most is None or tokens <= most:
            return launcher(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, **options)
        out = lse = None
        for start in range(0, tokens, most):
            stop = min(start + most, tokens)
            o_part, lse_part = launcher(q[start:stop], kv_pages, slots[start:stop], kv_fmt, kv_scale, softmax_scale,
                                        **options)
            if out is None:  # (the launcher's output dtype: q's, whatever the launcher's rule)
                out = o_part.new_empty((tokens, *o_part.shape[1:]))
                lse = lse_part.new_empty((tokens, *lse_part.shape[1:]))
            out[start:stop].copy_(o_part)
            lse[start:stop].copy_(lse_part)
        return out, lse

    launch.bounded_partials = True  # (a test checks that every split launcher has it)
    return launch
