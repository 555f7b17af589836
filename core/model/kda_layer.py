"""The KDA (Kimi Delta Attention) layer: projections and gates in plain torch, the recurrence through
:func:`dsahal.ops.kda_prefill` / :func:`dsahal.ops.kda_decode` with the state in the cache pool.

Per head (H heads, K = V = ``kda_head_dim``), following flash-linear-attention's KDA layer:

    q, k, v = W_q x, W_k x, W_v x                      (L2-normalised q, k inside the op)
    g       = −exp(A_log[h]) · softplus(W_f↑ W_f↓ x + dt_bias)   channel-wise log-decay, ≤ 0
    β       = sigmoid(W_b x)
    o       = W_o · (RMSNorm(kda(q, k, v, g, β)) · sigmoid(W_g↑ W_g↓ x))

The short causal convolution of the published layer is left out: it would need a per-request
convolution state beside the recurrent state, which the packed cache does not hold.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import ops
from .batch import BatchMeta
from .layers import GatedRMSNorm


class KdaLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        heads, head_dim, rank, hidden = (config.kda_num_heads, config.kda_head_dim, config.kda_gate_rank,
                                         config.hidden_size)
        self.heads, self.head_dim = heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.decay_down = nn.Linear(hidden, rank, bias=False)
        self.decay_up = nn.Linear(rank, heads * head_dim, bias=False)
        self.A_log = nn.Parameter(torch.zeros(heads))  # per-head decay rate, exp(A_log) > 0
        self.dt_bias = nn.Parameter(torch.zeros(heads * head_dim))
        self.beta_proj = nn.Linear(hidden, heads, bias=False)
        self.gate_down = nn.Linear(hidden, rank, bias=False)
        self.gate_up = nn.Linear(rank, heads * head_dim, bias=True)
        self.o_norm = GatedRMSNorm(head_dim, config.rms_norm_eps)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """g ``[T, H, K]`` fp32, every entry ≤ 0 (a decay factor exp(g) in (0, 1])."""
        tokens = x.shape[0]
        raw = self.decay_up(self.decay_down(x)).float() + self.dt_bias.float()
        rate = torch.exp(self.A_log.float())[None, :, None]
        return -rate * nn.functional.softplus(raw).view(tokens, self.heads, self.head_dim)

    def forward(self, x: torch.Tensor, meta: BatchMeta, state_pool: torch.Tensor, check: bool = True) -> torch.Tensor:
        """x ``[T, hidden]``; state_pool ``[P, H, K, V]`` fp32 (updated in place). Returns ``[T, hidden]``."""
        tokens = x.shape[0]
        shape = (tokens, self.heads, self.head_dim)
        q, k, v = self.q_proj(x).view(shape), self.k_proj(x).view(shape), self.v_proj(x).view(shape)
        g = self.log_decay(x)
        beta = torch.sigmoid(self.beta_proj(x).float())
        if meta.decode:
            o = ops.kda_decode(q, k, v, g, beta, state_pool, meta.state_ids, use_qk_l2norm=True, check=check)
        else:
            o = ops.kda_prefill(q, k, v, g, beta, meta.cu_seqlens, state_pool, meta.state_ids, use_qk_l2norm=True,
                                check=check)
        gate = self.gate_up(self.gate_down(x)).view(shape)
        return self.o_proj(self.o_norm(o, gate).reshape(tokens, -1))
