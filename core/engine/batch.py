"""Packing scheduled requests into one step's tensors: token ids, batch metadata, logits rows."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..model.batch import BatchMeta
from ..model.dsa_attention import LocalDsaAttention
from .request import Request

# The single-device rule; a DSA attention object may bring its own (decode context parallelism).
write_slots = LocalDsaAttention.write_slots


@dataclass
class StepBatch:
    """One step's inputs.

    Attributes:
        token_ids: ``[T]`` int64.
        meta: :class:`~dsahal.model.BatchMeta` on the model's device.
        logits_indices: ``[N]`` int64 tokens whose logits are sampled (each the last token of a
            request that reaches the end of its known tokens in this step).
        sampled: the N requests those rows belong to, in order (a request with drafts once per token).
        requests: every scheduled request with its token count, in packing order.
        prompt_rows: ``(request, n)`` for requests that record prompt logits: after the ``N`` sampled
            rows, ``logits_indices`` holds ``n`` more rows of that request's prompt positions (all its
            prompt tokens of this step but a last one, whose row is sampled), request after request.
    """

    token_ids: torch.Tensor
    meta: BatchMeta
    logits_indices: torch.Tensor
    sampled: list[Request]
    requests: list[tuple[Request, int]]
    prompt_rows: list[tuple[Request, int]] = field(default_factory=list)


def build_step(scheduled: list[tuple[Request, int]], block_table: torch.Tensor, block_tokens: int,
               max_context: int, decode: bool, device: torch.device,
               slot_fn: Callable[..., torch.Tensor] = write_slots,
               drafts: Optional[dict[int, list[int]]] = None) -> StepBatch:
    """Pack ``(request, n)`` pairs: the next ``n`` uncomputed tokens of each request, in order.

    ``block_table`` ``[R, max_blocks]`` int32 (host) must already map every position written here.
    ``decode`` asks for the KDA recurrent step and requires ``n == 1`` for every request.
    ``slot_fn(block_table, rows, positions, block_tokens)`` gives the write slots (the DSA
    attention's own rule: under decode context parallelism only this rank's tokens get one).
    ``drafts[request_id]`` (speculative decoding): draft tokens that follow the request's last
    known token in this step (``n`` counts them); every one of its tokens then gets a logits row.
    """
    drafts = drafts or {}
    token_ids, positions, rows, cu_seqlens, state_ids, logits_indices, sampled = [], [], [], [0], [], [], []
    prompt_indices, prompt_rows = [], []
    for request, count in scheduled:
        if decode and count != 1:
            raise ValueError(f"build_step: a decode step takes one token per request, request "
                             f"{request.request_id} has {count}")
        start = request.num_computed
        known = request.tokens + drafts.get(request.request_id, [])
        token_ids.extend(known[start:start + count])
        positions.extend(range(start, start + count))
        rows.extend([request.row] * count)
        cu_seqlens.append(cu_seqlens[-1] + count)
        state_ids.append(request.state_id)
        if request.request_id in drafts:  # verify: a row per token (each predicts the next)
            logits_indices.extend(range(cu_seqlens[-2], cu_seqlens[-1]))
            sampled.extend([request] * count)
        elif start + count == len(known):  # its last known token: the next one is sampled from here
            logits_indices.append(cu_seqlens[-1] - 1)
            sampled.append(request)
        if request.record_prompt_logits and request.request_id not in drafts:
            # prompt positions of this step whose row is not the sampled one (position len(prompt) - 1)
            last = min(start + count, len(request.prompt) - 1)
            if last > start:
                prompt_indices.extend(range(cu_seqlens[-2], cu_seqlens[-2] + last - start))
                prompt_rows.append((request, last - start))
    positions_t = torch.tensor(positions, dtype=torch.int32)
    rows_t = torch.tensor(rows, dtype=torch.int32)
    meta = BatchMeta(
        positions=positions_t, req_ids=rows_t, block_table=block_table,
        slots=slot_fn(block_table, rows_t, positions_t, block_tokens).long(),
        cu_seqlens=torch.tensor(cu_seqlens, dtype=torch.int32), state_ids=torch.tensor(state_ids, dtype=torch.int32),
        max_context=max_context, decode=decode,
    ).to(device)
    return StepBatch(torch.tensor(token_ids, dtype=torch.int64, device=device), meta,
                     torch.tensor(logits_indices + prompt_indices, dtype=torch.int64, device=device), sampled,
                     scheduled, prompt_rows)
