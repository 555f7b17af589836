"""The AMD backend's Triton path: the shared kernels of :mod:`dsahal.backends.triton_kernels` (the
same source the NVIDIA backend runs) launched with the block sizes of :mod:`.config`.

Signatures are the backend-facing argument lists of :mod:`dsahal.ops`. These are the paths that
take every op no vendor kernel takes, and the only ones that run when ``DSAHAL_AMD_PATHS=triton``.
"""
from __future__ import annotations


import torch

from dsahal.backends.triton_kernels import cache_write as _cache_write
from dsahal.backends.triton_kernels import indexer as _indexer
from dsahal.backends.triton_kernels import kda as _kda
from dsahal.backends.triton_kernels import lse_combine as _lse
from dsahal.backends.triton_kernels import slots as _slots
from dsahal.backends.triton_kernels import sparse_mla as _mla
from dsahal.backends.triton_kernels import topk as _topk

from . import config
from .arch import gfx_of


TILES_ENV = config.TILES_ENV


def tile_target(tensor: torch.Tensor) -> str | None:
    """The gfx target whose block sizes to use: the device's on ROCm; elsewhere (the verification run
    on an NVIDIA GPU) ``DSAHAL_AMD_TILES`` (``gfx942`` or ``gfx950``), default the gfx942 sizes."""
    return gfx_of(tensor) or config.tiles_override()


def cache_write(values, slots, pages, kind, fmt, scale):
    _cache_write.cache_write(values, slots, pages, kind, fmt, scale, num_warps=config.small_kernel_warps())


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    return _indexer.indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context,
                                  **config.indexer_config(q.shape[1]))


def topk(scores, lengths, k):
    return _topk.topk(scores, lengths, k, **config.topk_config())


def positions_to_slots(positions, req_ids, block_table, block_tokens):
    return _slots.positions_to_slots(positions, req_ids, block_table, block_tokens,
                                     num_warps=config.small_kernel_warps())


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    cfg = config.sparse_mla_config(tile_target(q), q.shape[0], q.shape[1], slots.shape[1])
    return _mla.sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, **cfg)


def lse_combine(o_parts, lse_parts):
    return _lse.lse_combine(o_parts, lse_parts, **config.lse_combine_config())


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    return _kda.kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm,
                           **config.kda_decode_config(v.shape[-1]))


def kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    return _kda.kda_prefill_recurrent(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm,
                                      **config.kda_decode_config(v.shape[-1]))
