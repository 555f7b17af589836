"""Shared set-up for the model, engine and `dsahal run` tests (no tests here).

Small configs keep every test to a fraction of a second on two CPU cores; the real dimensions that
the ops and formats fix (576-dim latent, 128-dim index keys, 128-dim KDA heads) are kept.
"""
from __future__ import annotations

import dataclasses

import torch

from dsahal.config import load_config
from dsahal.engine import Engine, Request, build_cache, write_slots
from dsahal.model import BatchMeta, HybridModel, init_weights


def small_config(**overrides):
    """The tiny preset, narrower: 4 layers (k k k d), hidden 128, 2 heads, top-k 32."""
    base = dataclasses.replace(load_config("tiny"), hidden_size=128, intermediate_size=256, vocab_size=256,
                               num_heads=2, kda_heads=2, index_heads=2, q_lora_rank=32, index_topk=32,
                               kda_gate_rank=8)
    return dataclasses.replace(base, **overrides)


def small_model(config=None, seed=0):
    return init_weights(HybridModel(config or small_config()), seed=seed).eval()


def small_engine(model, *, max_batch=4, max_context=256, chunk=48, latent_fmt="bf16", index_fmt="fp8",
                 block_tokens=16, **kwargs):
    cache = build_cache(model.config, max_batch=max_batch, max_context=max_context, latent_fmt=latent_fmt,
                        index_fmt=index_fmt, block_tokens=block_tokens, device=torch.device("cpu"))
    return Engine(model, cache, latent_fmt=latent_fmt, index_fmt=index_fmt, max_batch=max_batch,
                  max_context=max_context, prefill_chunk_tokens=chunk, **kwargs)


def random_prompts(lengths, vocab, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


def greedy_requests(prompts, new_tokens, **kwargs):
    return [Request(i, p, new_tokens, record_logits=True, **kwargs) for i, p in enumerate(prompts)]


@torch.no_grad()
def full_sequence_logits(model, tokens, *, latent_fmt="bf16", index_fmt="fp8", block_tokens=16):
    """Logits ``[len(tokens), vocab]`` of one sequence prefilled in a single step into a fresh cache."""
    engine = small_engine(model, max_batch=1, max_context=len(tokens) + block_tokens, latent_fmt=latent_fmt,
                          index_fmt=index_fmt, block_tokens=block_tokens)
    request = Request(0, tokens, 1)
    engine.add(request)
    engine._admit()
    positions = torch.arange(len(tokens), dtype=torch.int32)
    rows = torch.zeros(len(tokens), dtype=torch.int32)
    meta = BatchMeta(positions, rows, engine.block_table, write_slots(engine.block_table, rows, positions,
                                                                      engine.block_tokens),
                     torch.tensor([0, len(tokens)], dtype=torch.int32),
                     torch.tensor([request.state_id], dtype=torch.int32), engine.max_context, False)
    return model(torch.tensor(tokens), meta, engine.views)


__all__ = ["small_config", "small_model", "small_engine", "random_prompts", "greedy_requests",
           "full_sequence_logits"]
