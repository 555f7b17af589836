"""The engine's DSA attention under decode context parallelism (``dsahal run --dcp W`` under torchrun).

Every rank runs the whole model on the whole batch (KDA layers, projections and MLP are
replicated); only the DSA cache is sharded: global position ``p`` of a request lives on rank
``p % W`` at local position ``p // W`` (:mod:`dsahal.distributed.sharding`). Each rank writes the
tokens it owns and attends through :func:`dsahal.distributed.dcp_dsa_attention` (local indexer,
exact top-k merge, sparse MLA over the winners it owns, LSE combine), whose output is identical
on every rank, so every rank emits the same tokens.
"""
from __future__ import annotations

import torch

from .. import ops
from ..model.batch import BatchMeta, DsaLayerCache
from ..model.dsa_attention import write_layer_cache


class DcpDsaAttention:
    """The :class:`~dsahal.model.DsaAttention` of one rank of a DCP group.

    Args:
        rank, world: this process's rank in the group and the group's size W.
        group: the process group (None: the default group).
        check: validate op arguments.
    """

    def __init__(self, rank: int, world: int, group=None, check: bool = True):
        from .. import distributed  # imported here: single-device runs never need torch.distributed

        if not 0 <= rank < world:
            raise ValueError(f"DcpDsaAttention: rank expected in [0, {world}), got {rank}")
        self._distributed = distributed
        self.rank, self.context_shards, self.group, self.check = rank, world, group, check

    @classmethod
    def from_process_group(cls, group=None, check: bool = True) -> "DcpDsaAttention":
        rank, world = ops.group_rank_and_size(group)
        return cls(rank, world, group, check)

    def write_slots(self, block_table: torch.Tensor, req_rows: torch.Tensor, positions: torch.Tensor,
                    block_tokens: int) -> torch.Tensor:
        """This rank's slot for each new token at global ``positions`` (-1 where another rank owns it)."""
        return self._distributed.dcp_write_slots(positions, req_rows, block_table, block_tokens, self.rank,
                                                 self.context_shards).long()

    def write(self, cache: DsaLayerCache, latent: torch.Tensor, index_key: torch.Tensor, meta: BatchMeta) -> None:
        write_layer_cache(cache, latent, index_key, meta.slots, self.check)

    def attend(self, cache: DsaLayerCache, q_index: torch.Tensor, index_weights: torch.Tensor, q: torch.Tensor,
               meta: BatchMeta, topk: int, softmax_scale: float) -> torch.Tensor:
        o, _ = self._distributed.dcp_dsa_attention(
            q_index, index_weights, cache.index_pages, q, cache.latent_pages, meta.block_table, meta.req_ids,
            meta.positions, index_fmt=cache.index_fmt, kv_fmt=cache.latent_fmt, topk=topk,
            max_context=meta.max_context, softmax_scale=softmax_scale, kv_scale=cache.latent_scale,
            group=self.group, check=self.check)
        return o
