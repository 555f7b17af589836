"""Paged-cache addressing on XLA: gather records by slot, scatter rows while skipping some.

Both keep shapes static and never read tensor contents on the host: a ``-1`` slot is clamped to
a real address for the gather and masked afterwards; a skipped row of a scatter is redirected
(see :func:`scatter_rows_skipping`) instead of being filtered out with a boolean mask, which
would give a data-dependent shape.
"""
from __future__ import annotations

from typing import Callable

import torch


def split_slots(slots: torch.Tensor, block_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Physical slots (non-negative) -> (block, offset in block), int64."""
    slots = slots.to(torch.int64)
    return torch.div(slots, block_tokens, rounding_mode="floor"), torch.remainder(slots, block_tokens)


def gather_records(pages: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Records at ``slots`` of ``pages``.

    Args:
        pages: ``[num_blocks, block_tokens, token_bytes]`` uint8 (may be a strided view).
        slots: ``[*S]`` int32/int64, -1 for none.

    Returns:
        ``records`` ``[*S, token_bytes]`` uint8 (slot 0's record where the slot is -1) and
        ``valid`` ``[*S]`` bool.
    """
    valid = slots >= 0
    block, offset = split_slots(torch.where(valid, slots, torch.zeros_like(slots)), pages.shape[1])
    return pages[block, offset], valid


def scatter_rows_skipping(dest: torch.Tensor, index: tuple[torch.Tensor, ...], values: torch.Tensor,
                          keep: torch.Tensor, encode: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
    """``dest[index[0][i], index[1][i], ...] = encode(values)[i]`` for every ``i`` with ``keep[i]``; in place.

    A skipped row must not write anything, yet an XLA scatter has one static size. Skipped rows
    are therefore redirected to the address of the first kept row *with that row's value*, so
    every duplicate write carries identical bytes and the result does not depend on the order
    in which the scatter applies them. With no kept row at all, every row rewrites address 0
    with the value it already holds. Kept addresses must be distinct (the ops validate it).

    The redirection picks rows of the *input* before ``encode`` (a row-wise function, e.g. a
    quantiser), so the encoded tensor has a single consumer: XLA:CPU takes seconds to compile a
    row gather out of an FP8 quantisation by a runtime scale, and the result is the same.

    Args:
        dest: the tensor written in place (may be a view; the write goes through it).
        index: one int tensor ``[N]`` per leading dim of ``dest`` addressed.
        values: ``[N, *rest]``; ``encode(values)`` must be in dest's dtype with dest's row shape.
        keep: ``[N]`` bool.
        encode: row-wise map applied before writing (None: identity).
    """
    rows = keep.shape[0]
    if rows == 0:
        return
    order = torch.arange(rows, device=keep.device)
    first = torch.where(keep, order, torch.full_like(order, rows)).min().reshape(1)
    any_kept = first < rows  # [1]
    # Index with a 1-element tensor, never a 0-d one: torch turns a 0-d integer index into a
    # Python int (``.item()``), which on XLA is a device round trip and a graph cut.
    first = first.clamp(max=rows - 1)
    redirected = []
    for component in index:
        component = component.to(torch.int64)
        fallback = torch.where(any_kept, component.index_select(0, first), torch.zeros_like(first))
        redirected.append(torch.where(keep, component, fallback))
    shape = (rows,) + (1,) * (values.dim() - 1)
    chosen = torch.where(keep.reshape(shape), values, values.index_select(0, first))
    encoded = chosen if encode is None else encode(chosen)
    current = dest[tuple(torch.zeros_like(c[:1]) for c in redirected)]  # [1, *rest]: address 0 today
    final = torch.where(any_kept.reshape((1,) * encoded.dim()), encoded, current)
    dest.index_put_(tuple(redirected), final)
