"""The backend-neutral hybrid model graph: KDA and MLA+DSA layers over the packed cache.

    model = init_weights(HybridModel(load_config("tiny")), seed=0)
    logits = model(token_ids, meta, ModelCache.from_packed(cache, config, "bf16", "fp8"))

Attention goes through :mod:`dsahal.ops` only; the model never imports a backend.
"""
from .batch import BatchMeta, DsaLayerCache, ModelCache, PoolView
from .dsa_attention import DsaAttention, LocalDsaAttention
from .model import HybridModel
from .sampling import SamplingParams, greedy, request_generator, sample_one
from .weights import CheckpointError, checkpoint_config, init_weights, load_weights, save_weights

__all__ = [
    "BatchMeta", "DsaLayerCache", "ModelCache", "PoolView", "DsaAttention", "LocalDsaAttention", "HybridModel",
    "SamplingParams", "greedy", "request_generator", "sample_one", "CheckpointError", "checkpoint_config",
    "init_weights", "load_weights", "save_weights",
]
