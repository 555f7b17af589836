"""Speculative decoding: one step verifies up to 7 draft tokens per request (8 query tokens, the most
the DSA ops accept per request in decode), with greedy acceptance.

A step feeds each request its last token plus its drafts ``d_1..d_k``; the model returns a logits
row per token. Draft ``d_i`` is accepted while it equals the target chosen from the row before it
(greedy argmax, or the forced token in teacher-forcing replays); the first mismatch ends the run
and the target there is emitted instead (the "bonus" token), so each step emits 1..k+1 tokens and
the emitted tokens are exactly those plain greedy decoding would emit.

DSA needs no undo: entries written for rejected positions are never visible (a query at position
p sees keys ≤ p) and are overwritten when those positions are filled. KDA's recurrent state and its short-convolution state
(the last inputs of the q, k, v convolutions) have advanced over every fed token, so for a request with
a rejection both of its pooled states are restored from a snapshot taken before the step and the
accepted tokens are fed again.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from .batch import StepBatch, build_step, write_slots
from .request import Request

MAX_DRAFT_TOKENS = 7  # + the request's last token = 8 query tokens per request
Drafter = Callable[[Request], list[int]]


def _target(request: Request, row: torch.Tensor, emitted_so_far: int) -> int:
    if request.forced_tokens is not None:
        return int(request.forced_tokens[emitted_so_far])
    return int(torch.argmax(row))


def _drafts_for(engine, request: Request) -> list[int]:
    if not (request.sampling.greedy or request.forced_tokens is not None):
        raise ValueError(f"Engine: speculative decoding verifies greedily; request {request.request_id} samples "
                         f"with temperature {request.sampling.temperature}")
    room = request.max_new_tokens - len(request.output) - 1  # the bonus token is always emitted
    drafts = [int(t) for t in engine.drafter(request)][:max(0, min(engine.max_draft_tokens, room))]
    bad = [t for t in drafts if not 0 <= t < engine.config.vocab_size]
    if bad:
        raise ValueError(f"Engine: the drafter proposed token ids outside [0, {engine.config.vocab_size}) for "
                         f"request {request.request_id}: {bad}")
    return drafts


def _kda_pools(engine) -> list[torch.Tensor]:
    """Every per-request KDA state pool the step advances: each KDA layer's recurrent states
    ``[S, H, K, V]`` and its conv states ``[S, 3, kernel - 1, H * K]`` (both indexed by state id)."""
    pools = []
    for i in engine.config.kda_layers:
        states = engine.model.blocks[i].attn.states(engine.views.layer(i))
        pools += [states.recurrent, states.conv]
    return pools


def speculative_step(engine) -> StepBatch:
    """One verify step over every running request (all past prefill); updates outputs and stats."""
    requests = list(engine.running)
    drafts = {r.request_id: _drafts_for(engine, r) for r in requests}
    scheduled = [(r, 1 + len(drafts[r.request_id])) for r in requests]
    state_ids = torch.tensor([r.state_id for r in requests], dtype=torch.long, device=engine.device)
    snapshots = [pool[state_ids].clone() for pool in _kda_pools(engine)]
    slot_fn = getattr(engine.model.attention, "write_slots", write_slots)
    batch = build_step(scheduled, engine.block_table, engine.block_tokens, engine.max_context, False, engine.device,
                       slot_fn=slot_fn, drafts=drafts)
    start = time.perf_counter()
    rows = engine.model(batch.token_ids, batch.meta, engine.views, batch.logits_indices).float().cpu()

    offset, replay, emitted_total = 0, [], 0
    for request, count in scheduled:
        proposed, emitted = drafts[request.request_id], []
        for i in range(count):
            if request.record_logits:
                request.logits.append(rows[offset + i].clone())
            emitted.append(_target(request, rows[offset + i], len(request.output) + i))
            if i == len(proposed) or proposed[i] != emitted[-1]:
                break
        offset += count
        accepted = len(emitted) - 1
        engine.stats.draft_tokens += len(proposed)
        engine.stats.accepted_draft_tokens += accepted
        request.output.extend(emitted)  # accepted drafts, then the bonus token
        emitted_total += len(emitted)
        if accepted < len(proposed):
            replay.append((request, 1 + accepted))
        else:
            request.num_computed += count

    if replay:  # rewind KDA states of requests with a rejected draft, then feed their accepted tokens again
        index = {r.request_id: i for i, r in enumerate(requests)}
        for pool, snapshot in zip(_kda_pools(engine), snapshots):
            keep = torch.tensor([index[r.request_id] for r, _ in replay], dtype=torch.long)
            pool[state_ids[keep.to(state_ids.device)]] = snapshot[keep.to(snapshot.device)]
        again = build_step(replay, engine.block_table, engine.block_tokens, engine.max_context, False, engine.device,
                           slot_fn=slot_fn)
        engine.model(again.token_ids, again.meta, engine.views, again.logits_indices[:0])
        for request, count in replay:
            request.num_computed += count
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    engine.stats.decode_seconds += time.perf_counter() - start
    engine.stats.decode_tokens += emitted_total
    engine.stats.decode_steps += 1
    for request in requests:
        if request.finished:
            engine._release(request)
    return batch


def prompt_lookup_drafter(max_tokens: int, ngram: int = 2) -> Drafter:
    """Drafts by prompt lookup: find the latest earlier occurrence of the request's last ``ngram``
    tokens and propose the ``max_tokens`` tokens that followed it (none when there is no match)."""

    def drafter(request: Request) -> list[int]:
        tokens = request.tokens
        if len(tokens) <= ngram:
            return []
        tail = tokens[-ngram:]
        for start in range(len(tokens) - ngram - 1, -1, -1):
            if tokens[start:start + ngram] == tail:
                return tokens[start + ngram:start + ngram + max_tokens]
        return []
    return drafter
