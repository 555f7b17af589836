"""Cache write: quantise new tokens into a cache format and scatter them into their slots."""
from __future__ import annotations

from typing import Optional

import torch

from ..formats import INDEX_FORMATS, LATENT_FORMATS, cache_format
from ..registry.state import active_table
from ._dispatch import tracing
from ._layout import unit_last
from ._validate import (FLOAT_DTYPES, INDEX_DTYPES, INT32_MAX, ShapeBinder, can_read_values, positive_scale,
                        values_in_range)

OP = "cache_write"


@torch.library.custom_op("dsahal::cache_write", mutates_args=("pages",))
def _cache_write_op(
    values: torch.Tensor, slots: torch.Tensor, pages: torch.Tensor, kind: str, fmt: str, scale: Optional[torch.Tensor]
) -> None:
    active_table().dispatch[OP](values, slots, pages, kind, fmt, scale)


def validate_cache_write(values, slots, pages, kind, fmt, scale) -> None:
    v = ShapeBinder(OP)
    v.choice("kind", kind, ("latent", "index"))
    formats = LATENT_FORMATS if kind == "latent" else INDEX_FORMATS
    if not isinstance(fmt, str) or fmt not in formats:
        v.fail(f"argument 'fmt' expected a {kind} format, one of {sorted(formats)}, got {fmt!r}")
    spec = cache_format(kind, fmt)
    v.tensor("values", values, ["N", spec.dim], FLOAT_DTYPES)
    v.tensor("slots", slots, ["N"], INDEX_DTYPES)
    v.tensor("pages", pages, [None, None, spec.token_bytes], torch.uint8, last_dim_contiguous=True)
    # Written in place: records that share bytes would make one token's write land in another's record.
    v.disjoint("pages", pages, "[block, token] records")
    v.writable("pages", pages)
    num_slots = pages.shape[0] * pages.shape[1]
    v.at_most("pages", num_slots, INT32_MAX + 1, "num_blocks * block_tokens (slots are int32)")
    if spec.needs_tensor_scale:
        v.tensor("scale", scale, [], torch.float32)
    elif scale is not None:
        v.fail(f"argument 'scale' expected None for format {kind}:{fmt} (it has no tensor scale), got a tensor")
    v.same_device(values=values, slots=slots, pages=pages, scale=scale)
    v.has_data("slots", slots)
    if spec.needs_tensor_scale:
        positive_scale(OP, "scale", scale, spec)
    values_in_range(OP, "slots", slots, -1, num_slots - 1, what=" (-1 skips a token)")
    if can_read_values(slots):
        written = slots[slots >= 0]
        if written.numel() != torch.unique(written).numel():
            v.fail("argument 'slots' expected distinct slots (except -1), got a slot written twice")


def cache_write(
    values: torch.Tensor,
    slots: torch.Tensor,
    pages: torch.Tensor,
    *,
    kind: str,
    fmt: str,
    scale: Optional[torch.Tensor] = None,
    check: bool = True,
) -> None:
    """Quantise ``values`` into format ``kind:fmt`` and write token ``i`` to slot ``slots[i]``.

    Args:
        values: ``[N, D]`` float (fp32/bf16/fp16); D = 576 for ``kind="latent"``, 128 for ``"index"``.
        slots: ``[N]`` int32/int64 physical slots ``block * block_tokens + offset``; ``-1`` skips
            the token. Slots must be distinct.
        pages: ``[num_blocks, block_tokens, token_bytes]`` uint8, written in place; may be a strided
            view into the packed pool (unit stride in the last dim).
        kind: ``"latent"`` or ``"index"``.
        fmt: format name (:mod:`dsahal.formats`), e.g. ``"fp8_ds_mla"``.
        scale: ``[]`` fp32 per-tensor scale, required by formats with a tensor scale, else None.
        check: validate arguments (metadata, and slot values where they can be read).

    Raises ``TypeError``/``ValueError`` naming the argument on bad input. Slots outside
    ``[-1, num_slots)`` are rejected; an implementation must never write outside the target slots.
    """
    if check:
        validate_cache_write(values, slots, pages, kind, fmt, scale)
    slots = unit_last(slots)  # a strided view would have the kernel write other rows (_layout)
    if tracing():
        torch.ops.dsahal.cache_write(values, slots, pages, kind, fmt, scale)
        return
    active_table().dispatch[OP](values, slots, pages, kind, fmt, scale)
