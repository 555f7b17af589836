"""A generation request and its progress through the engine."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ..model.sampling import SamplingParams, request_generator


@dataclass
class Request:
    """One prompt to continue.

    Args:
        request_id: caller's id (unique within an engine).
        prompt: token ids (at least one).
        max_new_tokens: tokens to generate (≥ 1).
        sampling: greedy by default; seeded sampling with ``SamplingParams(temperature, seed=...)``.
        forced_tokens: if given, these tokens are emitted instead of sampled ones (teacher forcing:
            ``dsahal run --check`` replays one backend's tokens on the reference so every step's
            logits are comparable). Must hold ``max_new_tokens`` ids.
        record_logits: keep the fp32 logits of every sampled position (``[vocab]`` each, on the CPU).
        record_prompt_logits: also keep the logits of every prompt position but the last (whose row is
            the first sampled one): ``prompt_logits`` gets one ``[n, vocab]`` fp32 CPU tensor per prefill
            chunk, ``len(prompt) - 1`` rows in all (``dsahal run --check`` compares them too).
    """

    request_id: int
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    forced_tokens: Optional[list[int]] = None
    record_logits: bool = False
    record_prompt_logits: bool = False
    # progress, owned by the engine
    output: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    prompt_logits: list[torch.Tensor] = field(default_factory=list)
    num_computed: int = 0  # tokens whose cache entries (latent, index key, KDA state) are written
    row: Optional[int] = None  # row of the engine's block table
    blocks: list[int] = field(default_factory=list)
    state_id: Optional[int] = None
    generator: Optional[torch.Generator] = field(default=None, repr=False)

    def __post_init__(self):
        self.prompt = [int(t) for t in self.prompt]
        if not self.prompt:
            raise ValueError(f"Request {self.request_id}: prompt expected at least one token, got none")
        if self.max_new_tokens < 1:
            raise ValueError(f"Request {self.request_id}: max_new_tokens expected >= 1, got {self.max_new_tokens}")
        if self.forced_tokens is not None and len(self.forced_tokens) < self.max_new_tokens:
            raise ValueError(f"Request {self.request_id}: forced_tokens expected {self.max_new_tokens} ids, "
                             f"got {len(self.forced_tokens)}")
        self.generator = request_generator(self.sampling)

    @property
    def tokens(self) -> list[int]:
        """Prompt plus generated tokens."""
        return self.prompt + self.output

    @property
    def total_tokens(self) -> int:
        """The most tokens this request will ever hold in the cache (the last sampled one is never fed)."""
        return len(self.prompt) + self.max_new_tokens - 1

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt)

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_new_tokens
