"""DeepSeek-V3's mixture of experts, in plain torch (the experts are outside the HAL).

Per token x ``[hidden]``, with E routed experts in G groups, k experts per token:

    s      = sigmoid(W_gate x)                              [E]   the affinities
    b      = s + e_score_correction_bias                    [E]   used only to choose
    groups : each group's score = the sum of its top-2 b; keep the topk_group best groups
    chosen = top-k of b over the kept groups' experts       [k]
    w      = s[chosen] / sum(s[chosen]) · routed_scaling_factor      (unbiased, normalised)
    y      = Σ_j w_j · expert_{chosen_j}(x) + shared(x)

Every expert and the shared expert are SwiGLU MLPs (the shared one ``n_shared_experts`` times as
wide). Routing runs in fp32 (float64 for float64 inputs): the bias shifts the choice by small
amounts, which bf16 scores would round away.
"""
from __future__ import annotations

import torch
from torch import nn

from .layers import SwiGLU


class Router(nn.Module):
    """The gate: ``weight`` ``[E, hidden]`` and ``e_score_correction_bias`` ``[E]`` (DeepSeek-V3's names)."""

    def __init__(self, config):
        super().__init__()
        self.top_k, self.groups, self.top_groups = (config.num_experts_per_tok, config.n_group, config.topk_group)
        self.scaling = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(config.n_routed_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[T, hidden]`` -> (weights ``[T, k]`` fp32 (float64 for float64 x), experts ``[T, k]`` int64)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        scores = torch.sigmoid(nn.functional.linear(x.to(dtype), self.weight.to(dtype)))  # [T, E]
        biased = scores + self.e_score_correction_bias.to(dtype)
        if self.groups > 1:
            tokens, experts = biased.shape
            per_group = biased.view(tokens, self.groups, experts // self.groups)
            group_scores = per_group.topk(min(2, per_group.shape[-1]), dim=-1).values.sum(dim=-1)  # [T, G]
            kept = group_scores.topk(self.top_groups, dim=-1).indices
            keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
            biased = per_group.masked_fill(~keep[..., None], float("-inf")).view(tokens, experts)
        chosen = biased.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, chosen)
        return weights / weights.sum(dim=-1, keepdim=True) * self.scaling, chosen


class MoE(nn.Module):
    """Routed experts plus shared experts. x ``[T, hidden]`` -> ``[T, hidden]`` (x's dtype).

    Parameters: ``router.{weight, e_score_correction_bias}``, ``experts.E.{gate,up,down}.weight``,
    ``shared.{gate,up,down}.weight`` (absent without shared experts).
    """

    def __init__(self, config):
        super().__init__()
        self.router = Router(config)
        self.experts = nn.ModuleList(SwiGLU(config.hidden_size, config.moe_intermediate_size)
                                     for _ in range(config.n_routed_experts))
        self.shared = (SwiGLU(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)
                       if config.n_shared_experts else None)

    def forward(self, x: torch.Tensor, dense: bool | None = None) -> torch.Tensor:
        """``dense``: run every expert on every token, weighted by zero where not chosen (no host sync:
        the form CUDA-graph capture and ``torch.compile`` need; the default while capturing or
        compiling). Otherwise each expert runs on its own tokens only (reads the counts on the host)."""
        if dense is None:
            dense = torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing())
        weights, chosen = self.router(x)
        out = torch.zeros(x.shape, dtype=weights.dtype, device=x.device)
        if dense:
            combine = torch.zeros(x.shape[0], len(self.experts), dtype=weights.dtype, device=x.device)
            combine.scatter_(1, chosen, weights)  # [T, E]: experts are distinct per token
            for index, expert in enumerate(self.experts):
                out += combine[:, index:index + 1] * expert(x).to(weights.dtype)
        else:
            flat = chosen.flatten()
            order = flat.argsort(stable=True)
            tokens = order // chosen.shape[1]  # the token of each (token, slot) pair, grouped by expert
            counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
            start = 0
            for index, count in enumerate(counts):
                if count:
                    rows = tokens[start:start + count]
                    y = self.experts[index](x.index_select(0, rows)).to(weights.dtype)
                    out.index_add_(0, rows, y * weights.flatten()[order[start:start + count], None])
                start += count
        if self.shared is not None:
            out += self.shared(x).to(weights.dtype)
        return out.to(x.dtype)
