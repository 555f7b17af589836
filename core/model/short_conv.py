"""KDA's short convolution in plain torch: a causal depthwise conv1d (kernel ``W``, SiLU after) over each
request's tokens, with a per-request state of the last ``W - 1`` inputs of every channel.

As fla's ``ShortConvolution`` (``fla/modules/convolution.py``, no bias, ``activation="silu"``): channel
``c`` of token ``t`` is ``silu(sum_j weight[c, j] * x[t - (W - 1) + j])``, where inputs before the
request's first token of this step come from its conv state (zeros for a new request) — so prefill in
chunks, and prefill then decode, equal prefill of the whole sequence.

The ``P`` projections (q, k, v: ``P = 3``) are convolved together: ``x`` is ``[T, P, C]``, the weights
``[P, C, W]`` and a conv state ``[P, W - 1, C]`` (oldest input first). Every path sums the ``W`` taps in
fp32 with the same code over the same ``[N, P, W, C]`` layout, so a token's output does not depend on how
the sequence was split into steps. Nothing here reads a tensor value on the host: the decode path is capturable in a
CUDA graph, and state id -1 (a padding request) reads zeros and writes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops._dispatch import tracing


def _accumulate(taps: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``sum_j weight[..., j] * taps[:, :, j]`` in fp32: one product and one sum over the taps (two launches for
    the W taps). taps ``[N, P, W, C]`` fp32, oldest first; weight ``[P, C, W]``. Returns ``[N, P, C]`` fp32.

    A 16-bit or fp32 weight meets the fp32 taps by type promotion, which widens it exactly (no cast of its own);
    a float64 one is rounded to fp32 first. On the CPU the sum adds the taps oldest first, bitwise the chain
    ``w0 t0 + w1 t1 + ...``; on every device each path calls this with the same ``[N, P, W, C]`` layout.
    """
    weight = weight if weight.dtype.itemsize <= 4 else weight.float()
    return (taps * weight.transpose(1, 2)).sum(dim=2)


@dataclass(frozen=True)
class StateRows:
    """Where a step reads and writes its requests' states (``B`` requests; the same for every KDA layer, so
    computed once per step: :meth:`dsahal.model.BatchMeta.once`).

    Real ids are distinct; a padding request (-1) reads zeros and, so that one ``index_put_`` writes every
    request without a host sync, is pointed at the first real request and writes that request's value
    (duplicate targets then agree: the write is deterministic). With no real request at all, every row writes
    row 0's own value back: nothing changes.

    Attributes:
        read: ``[B]`` int64 the row each request reads (padding: row 0, masked).
        padding: ``[B, 1, 1, 1]`` bool, the padding requests.
        source: ``[B]`` int64 the request whose value each write carries.
        target: ``[B]`` int64 the row each write lands on.
        keep: ``[B, 1, 1, 1]`` bool, the write carries a value (False: the row's own value is written back).
    """

    read: torch.Tensor
    padding: torch.Tensor
    source: torch.Tensor
    target: torch.Tensor
    keep: torch.Tensor


def state_rows(state_ids: torch.Tensor) -> StateRows:
    """:class:`StateRows` of ``state_ids`` ``[B]`` (any int dtype; -1: padding). No host sync."""
    ids = state_ids.long()
    valid = ids >= 0
    read = ids.clamp(min=0)
    first = torch.argmax(valid.to(torch.int32))  # the first real row (0 when there is none)
    source = torch.where(valid, torch.arange(ids.numel(), device=ids.device), first)
    return StateRows(read, (~valid).view(-1, 1, 1, 1), source, read.index_select(0, source),
                     valid.index_select(0, source).view(-1, 1, 1, 1))


def read_states(conv_pool: torch.Tensor, state_ids: torch.Tensor, rows: StateRows | None = None) -> torch.Tensor:
    """``conv_pool[state_ids]`` as fp32 ``[B, P, W - 1, C]``; zeros for id -1 (whatever its row holds).
    ``rows``: the step's :func:`state_rows` of ``state_ids``, when already computed."""
    rows = rows or state_rows(state_ids)
    return conv_pool.index_select(0, rows.read).float().masked_fill_(rows.padding, 0.0)


def write_states(conv_pool: torch.Tensor, state_ids: torch.Tensor, values: torch.Tensor,
                 rows: StateRows | None = None) -> None:
    """``conv_pool[state_ids[b]] = values[b]`` for every ``b`` with ``state_ids[b] >= 0``; no host sync (see
    :class:`StateRows`). ``rows``: the step's :func:`state_rows` of ``state_ids``, when already computed.

    Through a custom op while tracing (like the KDA ops that write the recurrent states): ``conv_pool`` is an
    ``as_strided`` view of the cache pool, and ``torch.compile`` cannot functionalize a plain in-place write
    through one. In eager code the op's function is called directly (its dispatcher costs host time for
    nothing there), as :mod:`dsahal.ops` does.
    """
    rows = rows or state_rows(state_ids)
    write = _write_rows_op if tracing() else _write_rows
    write(conv_pool, rows.source, rows.target, rows.keep, values.to(conv_pool.dtype))


def _write_rows(conv_pool: torch.Tensor, source: torch.Tensor, target: torch.Tensor, keep: torch.Tensor,
                values: torch.Tensor) -> None:
    if source.numel() == 0:
        return
    new = values.index_select(0, source).to(conv_pool.dtype)
    conv_pool.index_put_((target,), torch.where(keep, new, conv_pool.index_select(0, target)))


_write_rows_op = torch.library.custom_op("dsahal_model::short_conv_write_rows", mutates_args=("conv_pool",))(_write_rows)


@_write_rows_op.register_fake
def _(conv_pool: torch.Tensor, source: torch.Tensor, target: torch.Tensor, keep: torch.Tensor,
      values: torch.Tensor) -> None:
    return None


def conv_decode(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor, state_ids: torch.Tensor,
                rows: StateRows | None = None) -> torch.Tensor:
    """One token per request. x ``[B, P, C]``; weight ``[P, C, W]``; conv_pool ``[S, P, W - 1, C]`` (updated in
    place at ``state_ids`` ``[B]``, -1: padding; ``rows``: their :func:`state_rows`, when already computed).
    Returns ``silu(conv)`` ``[B, P, C]`` in x's dtype."""
    rows = rows or state_rows(state_ids)
    window = read_states(conv_pool, state_ids, rows)  # [B, P, W - 1, C]
    taps = torch.cat([window, x.float().unsqueeze(2)], dim=2)  # [B, P, W, C]: the conv's inputs and new state
    out = torch.nn.functional.silu(_accumulate(taps, weight))
    write_states(conv_pool, state_ids, taps[:, :, 1:], rows)
    return out.to(x.dtype)


def conv_prefill(x: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor, conv_pool: torch.Tensor,
                 state_ids: torch.Tensor) -> torch.Tensor:
    """Packed sequences: sequence ``b`` is tokens ``cu_seqlens[b]:cu_seqlens[b+1]`` of x ``[T, P, C]`` and
    continues from ``conv_pool[state_ids[b]]`` (``[S, P, W - 1, C]``; -1: from zeros, written nowhere), whose
    new value is the last ``W - 1`` inputs of (state, then the sequence's tokens). weight ``[P, C, W]``;
    cu_seqlens ``[B + 1]`` int32. Returns ``silu(conv)`` ``[T, P, C]`` in x's dtype."""
    tokens, batch, width = x.shape[0], state_ids.shape[0], weight.shape[-1] - 1
    device = x.device
    window = read_states(conv_pool, state_ids)  # [B, P, W - 1, C]
    # One table of every input a tap may read: the B windows (row b * (W - 1) + i), then the T tokens.
    table = torch.cat([window.permute(0, 2, 1, 3).reshape(batch * width, *x.shape[1:]), x.float()])
    cu = cu_seqlens.long()
    t = torch.arange(tokens, device=device)
    seq = torch.searchsorted(cu[1:], t, right=True)  # the sequence of each token
    pos = t - cu.index_select(0, seq)  # its index within the sequence's tokens of this step
    taps = []
    for j in range(width + 1):  # tap j reads the input lag = W - 1 - j tokens back (j = W - 1: the token itself)
        lag = width - j
        from_window = seq * width + width - lag + pos  # window row W - 1 - (lag - pos), used when pos < lag
        taps.append(table.index_select(0, torch.where(pos >= lag, batch * width + t - lag, from_window)))
    out = torch.nn.functional.silu(_accumulate(torch.stack(taps, dim=2), weight)).to(x.dtype)
    # New state: inputs L_b .. L_b + W - 2 of (window, then the sequence's L_b tokens).
    lengths = (cu[1:] - cu[:-1]).unsqueeze(1)  # [B, 1]
    m = lengths + torch.arange(width, device=device)  # [B, W - 1]
    b = torch.arange(batch, device=device).unsqueeze(1)
    index = torch.where(m < width, b * width + m, batch * width + cu[:-1].unsqueeze(1) + m - width)
    new = table.index_select(0, index.reshape(-1)).view(batch, width, *x.shape[1:]).permute(0, 2, 1, 3)
    write_states(conv_pool, state_ids, new)
    return out
