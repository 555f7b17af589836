"""KDA's short convolution in plain torch: a causal depthwise conv1d (kernel ``W``, SiLU after) over each
request's tokens, with a per-request state of the last ``W - 1`` inputs of every channel.

As fla's ``ShortConvolution`` (``fla/modules/convolution.py``, no bias, ``activation="silu"``): channel
``c`` of token ``t`` is ``silu(sum_j weight[c, j] * x[t - (W - 1) + j])``, where inputs before the
request's first token of this step come from its conv state (zeros for a new request) — so prefill in
chunks, and prefill then decode, equal prefill of the whole sequence.

The ``P`` projections (q, k, v: ``P = 3``) are convolved together: ``x`` is ``[T, P, C]``, the weights
``[P, C, W]`` and a conv state ``[P, W - 1, C]`` (oldest input first). Every path accumulates the ``W``
taps oldest first in fp32 with the same code, so a token's output does not depend on how the sequence
was split into steps. Nothing here reads a tensor value on the host: the decode path is capturable in a
CUDA graph, and state id -1 (a padding request) reads zeros and writes nothing.
"""
from __future__ import annotations

import torch


def _accumulate(taps, weight: torch.Tensor) -> torch.Tensor:
    """``sum_j weight[..., j] * taps[j]`` in fp32, oldest tap first. taps: W tensors ``[N, P, C]``;
    weight ``[P, C, W]``. Returns ``[N, P, C]`` fp32."""
    weight = weight.float()
    out = torch.zeros_like(taps[0], dtype=torch.float32)
    for j, tap in enumerate(taps):
        out = out + weight[..., j] * tap.float()
    return out


def read_states(conv_pool: torch.Tensor, state_ids: torch.Tensor) -> torch.Tensor:
    """``conv_pool[state_ids]`` as fp32 ``[B, P, W - 1, C]``; zeros for id -1 (whatever its row holds)."""
    ids = state_ids.long()
    rows = conv_pool.index_select(0, ids.clamp(min=0)).float()
    return torch.where((ids >= 0).view(-1, 1, 1, 1), rows, torch.zeros_like(rows))


def write_states(conv_pool: torch.Tensor, state_ids: torch.Tensor, values: torch.Tensor) -> None:
    """``conv_pool[state_ids[b]] = values[b]`` for every ``b`` with ``state_ids[b] >= 0``; no host sync.

    Real ids are distinct; a padding row (-1) is pointed at the first real row and writes that row's
    value (duplicate targets of one ``index_put_`` then agree, so the write is deterministic). With no
    real row at all, every row writes row 0's own value back: nothing changes.

    A custom op (like the KDA ops that write the recurrent states): ``conv_pool`` is an ``as_strided``
    view of the cache pool, and ``torch.compile`` cannot functionalize a plain in-place write through one.
    """
    _write_states_op(conv_pool, state_ids, values.to(conv_pool.dtype))


@torch.library.custom_op("dsahal_legacy_decode::short_conv_write_states", mutates_args=("conv_pool",))
def _write_states_op(conv_pool: torch.Tensor, state_ids: torch.Tensor, values: torch.Tensor) -> None:
    ids = state_ids.long()
    if ids.numel() == 0:
        return
    valid = ids >= 0
    first = torch.argmax(valid.to(torch.int32))  # the first real row (0 when there is none)
    source = torch.where(valid, torch.arange(ids.numel(), device=ids.device), first)
    target = ids.clamp(min=0).index_select(0, source)
    new = values.index_select(0, source).to(conv_pool.dtype)
    old = conv_pool.index_select(0, target)
    conv_pool.index_put_((target,), torch.where(valid.index_select(0, source).view(-1, 1, 1, 1), new, old))


@_write_states_op.register_fake
def _(conv_pool: torch.Tensor, state_ids: torch.Tensor, values: torch.Tensor) -> None:
    return None


def conv_decode(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor,
                state_ids: torch.Tensor) -> torch.Tensor:
    """One token per request. x ``[B, P, C]``; weight ``[P, C, W]``; conv_pool ``[S, P, W - 1, C]`` (updated in
    place at ``state_ids`` ``[B]``, -1: padding). Returns ``silu(conv)`` ``[B, P, C]`` in x's dtype."""
    window = read_states(conv_pool, state_ids)  # [B, P, W - 1, C]
    taps = list(window.unbind(2)) + [x]
    out = torch.nn.functional.silu(_accumulate(taps, weight))
    write_states(conv_pool, state_ids, torch.cat([window, x.float().unsqueeze(2)], dim=2)[:, :, 1:])
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
    out = torch.nn.functional.silu(_accumulate(taps, weight)).to(x.dtype)
    # New state: inputs L_b .. L_b + W - 2 of (window, then the sequence's L_b tokens).
    lengths = (cu[1:] - cu[:-1]).unsqueeze(1)  # [B, 1]
    m = lengths + torch.arange(width, device=device)  # [B, W - 1]
    b = torch.arange(batch, device=device).unsqueeze(1)
    index = torch.where(m < width, b * width + m, batch * width + cu[:-1].unsqueeze(1) + m - width)
    new = table.index_select(0, index.reshape(-1)).view(batch, width, *x.shape[1:]).permute(0, 2, 1, 3)
    write_states(conv_pool, state_ids, new)
    return out
