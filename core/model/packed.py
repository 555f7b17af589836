"""Several bias-free projections of one input as one matmul: fewer launches in the eager decode step.

The step is bound by host time per launch (each ``nn.Linear`` is a transpose view and a matmul), and the
layers project the same input many times (a KDA layer six times: q, k, v, the decay and gate down-projections,
beta). :func:`project` runs them as one matmul over their weights stacked by rows: when the weights already
lie back to back in one storage that is a view; otherwise, in inference (grad off, not tracing, not capturing
a CUDA graph), the weights are packed once, as FSDP packs its flat parameters: one buffer is filled with them
and each parameter's ``.data`` becomes its rows of it. The parameters keep their names, shapes and values
(``state_dict``, in-place loads and ``init_weights`` write through to the buffer); anything that gives a
parameter new storage (``.to()``, ``to_empty``, assigning ``.data``) only makes the next call pack again.
No memory is added: the old storages are released once nothing else holds them.

Results equal the separate projections' up to the matmul's summation order (the same on the CPU's blocked
kernels for more than one row; cuBLAS may pick another algorithm for the wider matrix).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from ..ops._dispatch import recording, tracing


def project(x: torch.Tensor, linears: Sequence[nn.Linear]) -> list[torch.Tensor]:
    """``[linear(x) for linear in linears]`` (bias-free, one input dim), as one matmul where
    :func:`packed_weight` gives the stacked weights; the outputs are then column slices of one ``[T, sum N]``
    result. x ``[T, K]``. With grad enabled (the stacked view is detached) or while tracing (a graph reads the
    parameters themselves), each linear runs alone. (The weights' storage is read with
    ``data_ptr``, which ``torch.compile`` cannot trace either.)
    """
    if torch.is_grad_enabled() or tracing():
        return [linear(x) for linear in linears]
    packed = packed_weight(linears)
    if packed is None:
        return [linear(x) for linear in linears]
    return list(nn.functional.linear(x, packed).split([linear.out_features for linear in linears], dim=-1))


def adjacent_stack(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(parts, dim=1)`` ``[T, P, N]`` of P ``[T, N]`` tensors, as a view (no copy) when they are
    consecutive column slices of one ``[T, >= P·N]`` matrix, as :func:`project`'s outputs are (a copy while
    tracing: ``data_ptr`` is not traceable, and a traced :func:`project` runs the linears alone anyway)."""
    if tracing():
        return torch.stack(list(parts), dim=1)
    first = parts[0]
    width, step = first.shape[-1], first.element_size()
    if first.dim() == 2 and first.stride(1) == 1 and all(
            p.shape == first.shape and p.stride() == first.stride() and p.dtype == first.dtype
            and p.data_ptr() == first.data_ptr() + i * width * step for i, p in enumerate(parts)):
        return first.as_strided((first.shape[0], len(parts), width), (first.stride(0), width, 1))
    return torch.stack(list(parts), dim=1)


def packed_weight(linears: Sequence[nn.Linear]) -> Optional[torch.Tensor]:
    """The ``[sum N, K]`` weights of ``linears`` stacked by rows, as a view of the parameters' storage (packing
    them first if they are not back to back and packing is safe now); None where they cannot be."""
    if any(linear.bias is not None for linear in linears):
        return None
    return pack_rows([linear.weight for linear in linears])


def pack_rows(weights: list[torch.Tensor], memo: Optional[dict] = None) -> Optional[torch.Tensor]:
    """2-D parameters of one width stacked by rows ``[sum N, K]``: a view of their storage, packing them into
    one buffer first (each parameter's ``.data`` its rows) where they are not back to back; None where that is
    not possible or not safe now (:func:`_may_pack`).

    ``memo``: a dict the caller keeps for these weights (hundreds of experts: checking each one's layout costs
    ~0.7 us): when every weight's address is the one last verified, the view is rebuilt without the checks
    (it holds no tensor, so no storage is kept alive by it).
    """
    if not weights:
        return None
    if memo is not None:
        addresses = [w.data_ptr() for w in weights]
        if memo.get("addresses") == addresses:
            first = weights[0]
            return first.detach().as_strided((memo["rows"], first.shape[1]), (first.shape[1], 1))
    view = _stacked_view(weights)
    if view is None and _may_pack(weights):
        view = _pack(weights)
    if view is not None and memo is not None:
        memo.update(addresses=[w.data_ptr() for w in weights], rows=view.shape[0])
    return view


def _pack(weights: list[torch.Tensor]) -> Optional[torch.Tensor]:
    buffer = torch.cat([w.detach() for w in weights])
    start = 0
    for w in weights:
        w.data = buffer[start:start + w.shape[0]]
        start += w.shape[0]
    return _stacked_view(weights)


def _stacked_view(weights: list[torch.Tensor]) -> Optional[torch.Tensor]:
    first = weights[0]
    if first.dim() != 2 or not first.is_contiguous():
        return None
    cols, step = first.shape[1], first.element_size()
    pointer = first.data_ptr()
    for w in weights:
        if (w.dim() != 2 or w.shape[1] != cols or w.dtype != first.dtype or w.device != first.device
                or not w.is_contiguous() or w.data_ptr() != pointer):
            return None
        pointer += w.numel() * step
    rows = sum(w.shape[0] for w in weights)
    storage = first.untyped_storage()
    if pointer > storage.data_ptr() + storage.nbytes():
        return None
    return first.detach().as_strided((rows, cols), (cols, 1))


def _may_pack(weights: list[torch.Tensor]) -> bool:
    """Grad off, never while tracing (the graph must not move parameters) or capturing a CUDA graph (the copy
    would be captured), nor under ``inference_mode`` (the buffer would be an inference tensor, which autograd
    later refuses to record as a parameter); same shape rules as :func:`_stacked_view`."""
    first = weights[0]
    if (torch.is_grad_enabled() or torch.is_inference_mode_enabled() or first.device.type == "meta"
            or recording(first.device)):
        return False
    return all(w.dim() == 2 and w.shape[1] == first.shape[1] and w.dtype == first.dtype and w.device == first.device
               for w in weights)
