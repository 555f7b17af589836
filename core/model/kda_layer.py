"""The KDA (Kimi Delta Attention) layer: projections, short convolutions and gates in plain torch, the
recurrence through :func:`dsahal.ops.kda_prefill` / :func:`dsahal.ops.kda_decode` with the state in the
cache pool. Where the model's fused kernels are on (:mod:`dsahal.model.fused`: CUDA, the graph-replayed decode
path) the decode step's short convolution, the gates and the gated output norm run as one Triton kernel each.

Per head (H heads, K = V = ``kda_head_dim``), following flash-linear-attention's KDA layer:

    q, k, v = silu(conv(W_q x)), silu(conv(W_k x)), silu(conv(W_v x))   (L2-normalised q, k inside the op)
    g       = −exp(A_log[h]) · softplus(W_f↑ W_f↓ x + dt_bias)   channel-wise log-decay, ≤ 0
    β       = sigmoid(W_b x)
    o       = W_o · (RMSNorm(kda(q, k, v, g, β)) · sigmoid(W_g↑ W_g↓ x))

``conv`` is fla's ``ShortConvolution``: a causal depthwise conv1d of kernel ``kda_conv_size`` (4) over each
request's tokens (:mod:`dsahal.model.short_conv`). Each request carries, per KDA layer, its recurrent state
``[H, K, V]`` and its conv state (the last ``kernel - 1`` inputs of the q, k and v channels), both in the
packed cache pool: the layer's conv states are found from its recurrent-state view
(:func:`conv_state_view`, the layout of :func:`dsahal.cache.conv_state_offset`), or passed explicitly as
:class:`KdaStates`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch
from torch import nn

from .. import ops
from ..cache.layout import FP32_BYTES, KDA_CONV_PROJECTIONS, conv_state_offset, kda_conv_kernel
from ..ops._dispatch import tracing
from . import fused
from .batch import BatchMeta
from .layers import GatedRMSNorm
from .packed import adjacent_stack, pack_rows, project
from .short_conv import conv_decode, conv_prefill, state_rows


@dataclass
class KdaStates:
    """One KDA layer's per-request states when they do not live in a packed cache pool.

    Attributes:
        recurrent: ``[S, H, K, V]`` fp32 (the ops' ``state_pool``).
        conv: ``[S, 3, kernel - 1, H * K]`` fp32: the last inputs of the q, k, v convolutions, oldest first.
    """

    recurrent: torch.Tensor
    conv: torch.Tensor

    @classmethod
    def zeros(cls, slots: int, heads: int, head_dim: int, kernel: int, device=None) -> "KdaStates":
        return cls(torch.zeros((slots, heads, head_dim, head_dim), device=device),
                   torch.zeros((slots, KDA_CONV_PROJECTIONS, kernel - 1, heads * head_dim), device=device))


def conv_state_view(state_pool: torch.Tensor, kernel: int, check: bool = True) -> torch.Tensor:
    """The conv states ``[S, 3, kernel - 1, H * K]`` fp32 that sit beside a packed-cache recurrent-state view
    ``state_pool`` ``[S, H, K, V]`` (:meth:`dsahal.cache.PackedKVCache.kda_states`): in every state slot the
    layer's conv state starts at :func:`~dsahal.cache.conv_state_offset` of its recurrent state. Equal, as a
    view, to :meth:`~dsahal.cache.PackedKVCache.kda_conv_states`. Cut relative to ``state_pool`` (no storage
    offset is read), so it traces under ``torch.compile``.

    ``check``: verify that ``state_pool``'s storage holds the conv states (a standalone ``[S, H, K, V]``
    tensor does not: pass :class:`KdaStates` then); skipped while tracing.
    """
    slots, heads, key_dim, value_dim = state_pool.shape
    width, channels = kernel - 1, heads * key_dim
    gap = conv_state_offset(0, heads * key_dim * value_dim * FP32_BYTES) // FP32_BYTES  # recurrent + padding
    conv = KDA_CONV_PROJECTIONS * width * channels
    in_slot = gap + conv
    if check and not tracing():
        room = state_pool.untyped_storage().nbytes() // FP32_BYTES
        needs = state_pool.storage_offset() + (slots - 1) * state_pool.stride(0) + in_slot
        if (state_pool.dtype != torch.float32 or state_pool.stride()[1:] != (key_dim * value_dim, value_dim, 1)
                or (slots > 1 and state_pool.stride(0) < in_slot) or needs > room):
            raise ValueError(
                f"KdaLayer: argument 'state_pool' expected a KDA state view of a packed cache pool "
                f"(PackedKVCache.kda_states: fp32, slot stride >= {in_slot} elements, its storage holding the "
                f"conv states beside the recurrent ones) or KdaStates(recurrent, conv); got a {state_pool.dtype} "
                f"tensor of shape {list(state_pool.shape)}, strides {list(state_pool.stride())}, storage of "
                f"{room} fp32 elements (needs {needs})")
    # Each slot as one flat run from its recurrent state's first element (as_strided keeps the view's offset).
    flat = torch.as_strided(state_pool, (slots, in_slot), (state_pool.stride(0), 1))
    return flat[:, gap:].view(slots, KDA_CONV_PROJECTIONS, width, channels)


class ShortConv(nn.Module):
    """The depthwise weights of one causal conv: ``weight`` ``[channels, kernel]`` (fla's ``[channels, 1,
    kernel]`` without its singleton), no bias."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, kernel))
        nn.init.normal_(self.weight, std=kernel ** -0.5)


class KdaLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        heads, head_dim, rank, hidden = (config.kda_num_heads, config.kda_head_dim, config.kda_gate_rank,
                                         config.hidden_size)
        self.heads, self.head_dim = heads, head_dim
        self.conv_kernel = kda_conv_kernel(config)
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        # fla's names (q_conv1d, k_conv1d, v_conv1d): one short causal conv per projection.
        self.q_conv1d = ShortConv(heads * head_dim, self.conv_kernel)
        self.k_conv1d = ShortConv(heads * head_dim, self.conv_kernel)
        self.v_conv1d = ShortConv(heads * head_dim, self.conv_kernel)
        self.decay_down = nn.Linear(hidden, rank, bias=False)
        self.decay_up = nn.Linear(rank, heads * head_dim, bias=False)
        self.A_log = nn.Parameter(torch.zeros(heads))  # per-head decay rate, exp(A_log) > 0
        self.dt_bias = nn.Parameter(torch.zeros(heads * head_dim))
        self.beta_proj = nn.Linear(hidden, heads, bias=False)
        self.gate_down = nn.Linear(hidden, rank, bias=False)
        self.gate_up = nn.Linear(rank, heads * head_dim, bias=True)
        self.o_norm = GatedRMSNorm(head_dim, config.rms_norm_eps)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self._conv_memo: dict = {}  # pack_rows' memo of the three conv weights

    def log_decay(self, x: torch.Tensor, low: torch.Tensor | None = None,
                  up: torch.Tensor | None = None) -> torch.Tensor:
        """g ``[T, H, K]`` fp32, every entry ≤ 0 (a decay factor exp(g) in (0, 1]). ``low``: ``decay_down(x)``,
        ``up``: ``decay_up(low)``, when already computed."""
        tokens = x.shape[0]
        bias = self.dt_bias if self.dt_bias.dtype.itemsize <= 4 else self.dt_bias.float()  # widened exactly
        if up is None:
            up = self.decay_up(self.decay_down(x) if low is None else low)
        raw = up.float() + bias
        rate = torch.exp(self.A_log.float())[None, :, None]
        return -rate * nn.functional.softplus(raw).view(tokens, self.heads, self.head_dim)

    def gates(self, x: torch.Tensor, decay_low: torch.Tensor,
              beta_raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g ``[T, H, K]`` fp32 (:meth:`log_decay`), β ``[T, H]`` fp32 ``= sigmoid(beta_proj(x))``) from the
        projections ``decay_down(x)`` and ``beta_proj(x)``; the elementwise math in one kernel where the fused
        kernels are on."""
        raw = self.decay_up(decay_low)
        if fused.active(raw, beta_raw, self.dt_bias, self.A_log):
            return fused.kda_gates(raw, self.dt_bias, self.A_log, beta_raw, self.heads, self.head_dim)
        return self.log_decay(x, decay_low, raw), torch.sigmoid(beta_raw.float())

    def states(self, cache: Union[torch.Tensor, KdaStates], check: bool = True) -> KdaStates:
        """The layer's recurrent and conv state pools from its cache entry: a packed-cache recurrent-state view
        (the conv states found beside it, :func:`conv_state_view`) or :class:`KdaStates` as given."""
        if isinstance(cache, KdaStates):
            return cache
        return KdaStates(cache, conv_state_view(cache, self.conv_kernel, check=check))

    def short_conv(self, qkv: torch.Tensor, meta: BatchMeta, conv_pool: torch.Tensor) -> torch.Tensor:
        """silu(causal conv) of the stacked projections ``[T, 3, H * K]``, updating the requests' conv states.
        A decode step with the fused kernels on runs it as one kernel (:func:`dsahal.model.fused.conv_decode`) over
        the three weights packed into one buffer (:func:`~dsahal.model.packed.pack_rows`; stacked where they cannot be)."""
        parts = (self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight)
        if meta.decode and fused.active(qkv, *parts):
            packed = pack_rows(list(parts), self._conv_memo)
            weight = torch.stack(parts) if packed is None else packed.view(len(parts), *parts[0].shape)
            if fused.conv_weight_ok(weight, conv_pool):
                return fused.conv_decode(qkv, weight, conv_pool, meta.state_ids)
        weight = torch.stack(parts)  # [3, HK, W]
        if meta.decode:
            rows = meta.once("kda conv state rows", lambda: state_rows(meta.state_ids))  # alike in every layer
            return conv_decode(qkv, weight, conv_pool, meta.state_ids, rows)
        return conv_prefill(qkv, weight, meta.cu_seqlens, conv_pool, meta.state_ids)

    def forward(self, x: torch.Tensor, meta: BatchMeta, state_pool: Union[torch.Tensor, KdaStates],
                check: bool = True) -> torch.Tensor:
        """x ``[T, hidden]``; state_pool: the packed cache's ``[P, H, K, V]`` fp32 recurrent-state view (its conv
        states beside it) or :class:`KdaStates` (both updated in place). Returns ``[T, hidden]``."""
        tokens = x.shape[0]
        shape = (tokens, self.heads, self.head_dim)
        states = self.states(state_pool, check=check)
        # Every projection of x in one matmul where the weights are packed (dsahal.model.packed).
        q, k, v, decay_low, gate_low, beta_raw = project(x, (self.q_proj, self.k_proj, self.v_proj, self.decay_down,
                                                             self.gate_down, self.beta_proj))
        qkv = adjacent_stack((q, k, v))  # [T, 3, H * K]
        # Views of the conv's [T, 3, H * K] output: the decode op reads rows by stride; prefill gets copies (fla).
        q, k, v = (t.view(shape) if meta.decode else t.contiguous().view(shape)
                   for t in self.short_conv(qkv, meta, states.conv).unbind(1))
        g, beta = self.gates(x, decay_low, beta_raw)
        if meta.decode:
            o = ops.kda_decode(q, k, v, g, beta, states.recurrent, meta.state_ids, use_qk_l2norm=True, check=check)
        else:
            o = ops.kda_prefill(q, k, v, g, beta, meta.cu_seqlens, states.recurrent, meta.state_ids,
                                use_qk_l2norm=True, check=check)
        gate = self.gate_up(gate_low).view(shape)
        return self.o_proj(self.o_norm(o, gate).reshape(tokens, -1))
