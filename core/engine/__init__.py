"""The engine loop over the model graph: requests, batch packing, chunked prefill, decode, sampling.

    cache = build_cache(config, max_batch=4, max_context=1024, latent_fmt="bf16", index_fmt="fp8")
    engine = Engine(model, cache, latent_fmt="bf16", index_fmt="fp8", max_batch=4, max_context=1024)
    finished = engine.run([Request(0, prompt, max_new_tokens=32)])
"""
from .batch import StepBatch, build_step, write_slots
from .engine import Engine, EngineStats
from .factory import build_cache, cache_rows_needed
from .profiling import OpTimer
from .request import Request
from .speculative import MAX_DRAFT_TOKENS, prompt_lookup_drafter

__all__ = [
    "Engine", "EngineStats", "build_cache", "cache_rows_needed", "Request", "StepBatch", "build_step", "write_slots",
    "OpTimer", "MAX_DRAFT_TOKENS", "prompt_lookup_drafter",
]
