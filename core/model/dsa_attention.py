"""How a DSA layer writes its cache and attends: an object chosen when the engine is built.

The MLA layer computes its queries and keys in plain torch and hands them to this object; the
single-device version below writes through :func:`dsahal.ops.cache_write` and attends through
:func:`dsahal.ops.dsa_attention` (or the separate ops). Decode context parallelism swaps in an
object with the same two methods that writes only the tokens its rank owns and merges the ranks'
top-k and partial outputs (``dsahal.distributed``); the model does not change.
"""
from __future__ import annotations

from typing import Protocol

import torch

from .. import ops
from ..ops.composite import separate_slots
from .batch import BatchMeta, DsaLayerCache


class DsaAttention(Protocol):
    """The extension point. ``write`` stores one layer's new tokens; ``attend`` returns
    ``o`` ``[T, H, 512]`` (q's dtype), the attention output in latent space.

    ``context_shards`` (W) is how many processes share each request's context (this one stores
    ``1/W`` of its tokens, so the engine's block table maps ``ceil(tokens / W)`` local tokens);
    ``write_slots`` gives the slot each new token is written to in *this* process's cache (-1 for
    tokens stored elsewhere). The engine reads both when it is built and when it packs a step.
    """

    context_shards: int

    def write_slots(self, block_table: torch.Tensor, req_rows: torch.Tensor, positions: torch.Tensor,
                    block_tokens: int) -> torch.Tensor:
        ...

    def write(self, cache: DsaLayerCache, latent: torch.Tensor, index_key: torch.Tensor, meta: BatchMeta) -> None:
        ...

    def attend(self, cache: DsaLayerCache, q_index: torch.Tensor, index_weights: torch.Tensor, q: torch.Tensor,
               meta: BatchMeta, topk: int, softmax_scale: float) -> torch.Tensor:
        ...


def write_layer_cache(cache: DsaLayerCache, latent: torch.Tensor, index_key: torch.Tensor, slots: torch.Tensor,
                      check: bool = True) -> None:
    """latent ``[T, 576]``, index_key ``[T, 128]``: quantised into the layer's pages at ``slots`` ``[T]``
    (-1: not stored in this process's cache)."""
    ops.cache_write(latent, slots, cache.latent_pages, kind="latent", fmt=cache.latent_fmt,
                    scale=cache.latent_scale, check=check)
    ops.cache_write(index_key, slots, cache.index_pages, kind="index", fmt=cache.index_fmt, check=check)


class LocalDsaAttention:
    """Single-device DSA: every token of every request lives in this process's cache.

    Args:
        fused: call :func:`dsahal.ops.dsa_attention` (a backend may fuse indexer, top-k and sparse
            MLA); False calls ``indexer_score`` → ``topk`` → ``positions_to_slots`` → ``sparse_mla``
            one by one (the same result; useful to time the stages separately), the first three over the
            token ranges the composite layer uses (:mod:`dsahal.ops.score_ranges`: the scores bounded).
        check: validate op arguments (reads slot values on the host; the engine turns it off in
            the timed loop once a step has passed).
    """

    context_shards = 1

    def __init__(self, fused: bool = True, check: bool = True):
        self.fused = fused
        self.check = check

    @staticmethod
    def write_slots(block_table: torch.Tensor, req_rows: torch.Tensor, positions: torch.Tensor,
                    block_tokens: int) -> torch.Tensor:
        """``block_table[row, pos // block_tokens] · block_tokens + pos % block_tokens`` ``[T]`` int64."""
        blocks = block_table[req_rows.long(), torch.div(positions.long(), block_tokens, rounding_mode="floor")]
        return blocks.long() * block_tokens + positions.long() % block_tokens

    def write(self, cache: DsaLayerCache, latent: torch.Tensor, index_key: torch.Tensor, meta: BatchMeta) -> None:
        """latent ``[T, 576]``, index_key ``[T, 128]``: quantised into the layer's pages at ``meta.slots``."""
        write_layer_cache(cache, latent, index_key, meta.slots, self.check)

    def attend(self, cache: DsaLayerCache, q_index: torch.Tensor, index_weights: torch.Tensor, q: torch.Tensor,
               meta: BatchMeta, topk: int, softmax_scale: float) -> torch.Tensor:
        """q_index ``[T, Hi, 128]`` (float8_e4m3fn from the model, its per-(token, head) scale folded into
        index_weights; any indexer query dtype works), index_weights ``[T, Hi]`` fp32, q ``[T, H, 576]``
        -> o ``[T, H, 512]``."""
        if self.fused:
            o, _ = ops.dsa_attention(
                q_index, index_weights, cache.index_pages, q, cache.latent_pages, meta.block_table, meta.req_ids,
                meta.positions, index_fmt=cache.index_fmt, kv_fmt=cache.latent_fmt, topk=topk,
                max_context=meta.max_context, softmax_scale=softmax_scale, kv_scale=cache.latent_scale,
                check=self.check)
            return o
        slots = separate_slots(q_index, index_weights, cache.index_pages, meta.block_table, meta.req_ids,
                               meta.positions, cache.index_fmt, topk, meta.max_context, check=self.check)
        o, _ = ops.sparse_mla(q, cache.latent_pages, slots, kv_fmt=cache.latent_fmt, softmax_scale=softmax_scale,
                              kv_scale=cache.latent_scale, check=self.check)
        return o
