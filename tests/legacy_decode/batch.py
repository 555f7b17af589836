"""What one forward pass needs besides the token ids: the batch metadata and the cache views.

Both are plain containers of tensors (plus a few static Python values), so a step is a function
of tensors and traces under ``torch.compile(fullgraph=True)``. The engine builds them
(:mod:`dsahal.engine.batch`); the model only reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class BatchMeta:
    """Metadata of a packed batch of ``T`` tokens from ``B`` sequences (requests) in this step.

    Tokens are packed request by request: sequence ``b`` is tokens ``cu_seqlens[b]:cu_seqlens[b+1]``.

    Attributes:
        positions: ``[T]`` int32 position of each token in its request.
        req_ids: ``[T]`` int32 row of ``block_table`` of each token's request.
        block_table: ``[R, max_blocks]`` int32 physical block of each logical block; -1 unmapped.
        slots: ``[T]`` int64 physical cache slot each token's latent / index key is written to (-1: skip).
        cu_seqlens: ``[B + 1]`` int32 sequence offsets (KDA prefill).
        state_ids: ``[B]`` int32 KDA state slot of each sequence (-1: padding sequence).
        max_context: static width of the indexer scores (≥ every position + 1).
        decode: static; True when every sequence has exactly one token (``T == B``), so KDA uses
            its recurrent decode step.
    """

    positions: torch.Tensor
    req_ids: torch.Tensor
    block_table: torch.Tensor
    slots: torch.Tensor
    cu_seqlens: torch.Tensor
    state_ids: torch.Tensor
    max_context: int
    decode: bool

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    def to(self, device: torch.device | str) -> "BatchMeta":
        moved = {name: getattr(self, name).to(device) for name in
                 ("positions", "req_ids", "block_table", "slots", "cu_seqlens", "state_ids")}
        return BatchMeta(**moved, max_context=self.max_context, decode=self.decode)


@dataclass
class DsaLayerCache:
    """One DSA layer's views into the packed cache (inside a :class:`ModelCache` the two page
    fields may be :class:`PoolView` recipes; :meth:`ModelCache.layer` cuts them into tensors).

    Attributes:
        latent_pages: ``[num_blocks, block_tokens, latent_bytes]`` uint8 view.
        index_pages: ``[num_blocks, block_tokens, index_bytes]`` uint8 view (same blocks).
        latent_fmt, index_fmt: format names (:mod:`dsahal.formats`).
        latent_scale: ``[]`` fp32 per-tensor scale for formats that need one, else None.
    """

    latent_pages: torch.Tensor
    index_pages: torch.Tensor
    latent_fmt: str
    index_fmt: str
    latent_scale: Optional[torch.Tensor]

    @property
    def block_tokens(self) -> int:
        return self.latent_pages.shape[1]


@dataclass(frozen=True)
class PoolView:
    """How to cut one view out of the cache's byte pool: dtype, shape, strides and storage offset
    (in elements of ``dtype``). Rebuilt from the pool at every step, so a compiled step takes the
    pool as its only cache input: views with another dtype that alias each other as separate graph
    inputs are not supported by ``torch.compile`` when an op writes through them."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @classmethod
    def of_view(cls, view: torch.Tensor) -> "PoolView":
        return cls(view.dtype, tuple(view.shape), tuple(view.stride()), view.storage_offset())

    def cut(self, pool: torch.Tensor) -> torch.Tensor:
        flat = pool.view(-1)
        base = flat if self.dtype == pool.dtype else flat.view(self.dtype)
        return base.as_strided(self.shape, self.stride, self.offset)


@dataclass
class ModelCache:
    """The cache views of every layer, indexed by model layer: a :class:`DsaLayerCache` for a DSA
    layer, the KDA state pool ``[num_state_slots, H, K, V]`` fp32 for a KDA layer.

    Entries may be tensors, or :class:`PoolView` recipes cut from ``pool`` (``[rows, row_bytes]``
    uint8) when :meth:`layer` is called; :meth:`from_packed` builds the latter.
    """

    layers: list
    pool: Optional[torch.Tensor] = None

    def _resolve(self, item):
        return item.cut(self.pool) if isinstance(item, PoolView) else item

    def layer(self, index: int):
        """Layer ``index``'s views (cut from the pool now if they are recipes)."""
        entry = self.layers[index]
        if isinstance(entry, DsaLayerCache):
            return DsaLayerCache(self._resolve(entry.latent_pages), self._resolve(entry.index_pages), entry.latent_fmt,
                                 entry.index_fmt, entry.latent_scale)
        return self._resolve(entry)

    @classmethod
    def from_packed(cls, cache, config, latent_fmt: str, index_fmt: str) -> "ModelCache":
        """Views of a :class:`dsahal.cache.PackedKVCache`: recipes over its ``pool`` for the views
        that live in it, the tensors themselves otherwise."""
        pool = getattr(cache, "pool", None)

        def recipe(view: torch.Tensor):
            in_pool = (pool is not None and pool.is_contiguous() and pool.storage_offset() == 0
                       and view.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr())
            return PoolView.of_view(view) if in_pool else view

        layers: list = []
        for layer, kind in enumerate(config.layer_kinds):
            if kind == "dsa":
                layers.append(DsaLayerCache(recipe(cache.latent_pages(layer)), recipe(cache.index_pages(layer)),
                                            latent_fmt, index_fmt, cache.latent_scale(layer)))
            else:
                layers.append(recipe(cache.kda_states(layer)))
        return cls(layers, pool)
