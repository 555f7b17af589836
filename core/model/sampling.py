"""Next-token sampling: greedy, or temperature / top-k sampling from a per-request seeded generator.

Each request draws from its own generator, so its tokens depend only on its seed and its logits,
never on which other requests share the batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` is greedy (argmax, ties to the smaller id). ``top_k == 0`` keeps the whole
    vocabulary. ``seed`` seeds the request's generator (required for temperature > 0)."""

    temperature: float = 0.0
    top_k: int = 0
    seed: Optional[int] = None

    def __post_init__(self):
        if not 0.0 <= self.temperature < float("inf"):  # inf divided every logit to 0: uniform, not sampling
            raise ValueError(f"SamplingParams: temperature expected a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams: top_k expected >= 0, got {self.top_k}")
        if self.temperature > 0.0 and self.seed is None:
            raise ValueError("SamplingParams: seed expected an int when temperature > 0 (seeded sampling), got None")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits ``[N, vocab]`` -> ``[N]`` int64 argmax (first maximum on ties)."""
    return torch.argmax(logits, dim=-1)


def sample_one(logits: torch.Tensor, params: SamplingParams, generator: Optional[torch.Generator]) -> int:
    """One token from logits ``[vocab]`` (fp32). ``generator`` is the request's CPU generator."""
    if params.greedy:
        return int(torch.argmax(logits))
    shifted = logits.float().cpu()
    shifted = shifted - shifted.max()
    # Shifted by the maximum before dividing, and the maxima kept at 0: a tiny temperature (1e-300, 0 in fp32)
    # made logits / T inf and 0 / T NaN, and softmax NaN; this way the rest are <= 0 (-inf at worst).
    scaled = torch.where(shifted == 0, shifted, shifted / params.temperature)
    if params.top_k:
        kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
        scaled = torch.where(scaled < kth, torch.full_like(scaled, float("-inf")), scaled)
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def request_generator(params: SamplingParams) -> Optional[torch.Generator]:
    """The CPU generator a request samples from (None for greedy)."""
    return None if params.greedy else torch.Generator().manual_seed(int(params.seed))
