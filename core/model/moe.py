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

from .layers import SwiGLU, swiglu_act
from ..ops._dispatch import tracing
from .packed import pack_rows

BATCHED_TOKENS = 128  # eager calls of at most this many tokens run the experts as batched matmuls (MoE.forward)
BATCH_ELEMENTS = 1 << 25  # the per-chunk intermediates [experts, T, max(2I, hidden)] stay below this many elements


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
        self._packed_memos = ({}, {})  # pack_rows' memos of the experts' gate/up and down weights

    def forward(self, x: torch.Tensor, dense: bool | None = None) -> torch.Tensor:
        """``dense``: run every expert on every token, weighted by zero where not chosen (no host sync:
        the form CUDA-graph capture and ``torch.compile`` need; the default while capturing or
        compiling, and for eager calls of at most :data:`BATCHED_TOKENS` tokens, a decode step's). Otherwise
        each expert runs on its own tokens only (reads the counts on the host; one matmul chain per expert).

        Dense, with grad off and not tracing, the experts run as batched matmuls over their packed weights
        (:meth:`stacked_experts`), a chunk of experts per launch: a few launches per layer instead of ~5 per
        expert. (A decode step's tokens choose most experts anyway, so this reads about the weights the
        per-expert loop reads; the extra FLOPs on unchosen experts are what keeps the step free of a sync.)"""
        stacked = None if torch.is_grad_enabled() else self.stacked_experts()
        if dense is None:
            dense = (torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing())
                     or (stacked is not None and x.shape[0] <= BATCHED_TOKENS))
        weights, chosen = self.router(x)
        out = torch.zeros(x.shape, dtype=weights.dtype, device=x.device)
        if dense:
            combine = torch.zeros(x.shape[0], len(self.experts), dtype=weights.dtype, device=x.device)
            combine.scatter_(1, chosen, weights)  # [T, E]: experts are distinct per token
            if stacked is not None:
                out = self._batched_experts(x, combine, *stacked, out)
            else:
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

    def stacked_experts(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(gate and up ``[E, 2I, hidden]``, down ``[E, hidden, I]``): every routed expert's weights as views of
        two packed buffers (:func:`dsahal.model.packed.pack_rows`: each expert's gate rows then its up rows, as
        its own SwiGLU packs them); None where they cannot be packed now (grad on, tracing, capturing)."""
        if tracing():
            return None
        experts = self.experts
        gate_up = pack_rows([w for e in experts for w in (e.gate.weight, e.up.weight)], self._packed_memos[0])
        down = pack_rows([e.down.weight for e in experts], self._packed_memos[1]) if gate_up is not None else None
        if down is None:
            return None
        first = experts[0]
        return (gate_up.view(len(experts), 2 * first.gate.out_features, first.gate.in_features),
                down.view(len(experts), *first.down.weight.shape))

    @staticmethod
    def _batched_experts(x: torch.Tensor, combine: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                         out: torch.Tensor) -> torch.Tensor:
        """``out + sum_e combine[:, e] * expert_e(x)`` ``[T, hidden]`` with the experts' matmuls batched, chunks of
        experts sized so the intermediates stay under :data:`BATCH_ELEMENTS`. x ``[T, hidden]``; combine ``[T, E]``
        (zero where not chosen); gate_up ``[E, 2I, hidden]``; down ``[E, hidden, I]``."""
        experts, width, hidden = gate_up.shape
        chunk = max(1, BATCH_ELEMENTS // max(1, x.shape[0] * max(width, hidden)))
        for start in range(0, experts, chunk):
            stop = min(start + chunk, experts)
            gate, up = torch.matmul(x, gate_up[start:stop].transpose(1, 2)).chunk(2, dim=-1)  # [e, T, I] each
            y = torch.bmm(swiglu_act(gate, up), down[start:stop].transpose(1, 2))  # [e, T, hidden]
            out = out + (combine[:, start:stop].t().unsqueeze(-1) * y.to(out.dtype)).sum(dim=0)
        return out
