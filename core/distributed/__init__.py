"""Distributed attention on ``torch.distributed`` (gloo on CPU, NCCL on GPUs), launched by ``torchrun``.

- :mod:`.sharding`: interleaved decode context parallelism (token ``p`` on rank ``p % W``).
- :mod:`.merge`: the exact top-k merge with 32-bit packed candidates and targeted resends
  (the reference backend's ``topk_merge``), its traffic statistics, an in-process simulation.
- :mod:`.generic_merge`: the generic exact merge (full local top-k, 8 bytes a candidate), the baseline.
- :mod:`.dcp_attention`: a DSA layer's decode attention over a DCP group.
- :mod:`.prefill`: token-sharded prefill (two all-to-alls) and the head-sharded baseline.
- :mod:`.launch`: process-group start-up with a timeout and a same-configuration check.
- :mod:`.testing`: run a function on W spawned gloo ranks.
"""
from .collective import DistributedFault
from .dcp_attention import dcp_dsa_attention
from .generic_merge import generic_topk_merge
from .launch import DistributedContext, StartupMismatch, init_distributed, shutdown_distributed
from .merge import MergePlan, exact_topk_merge, merge_in_process, plan_merge
from .traffic import MergeStats, generic_payload_bytes, merge_traffic
from .packing import round_scores_for_merge
from .prefill import balanced_token_split, head_sharded_dsa_prefill, token_sharded_dsa_prefill
from .sharding import (
    DcpQueryShard,
    build_local_block_table,
    dcp_write_slots,
    local_context_lengths,
    local_width,
    owner_rank,
    shard_paged_cache,
    shard_query_positions,
    to_global_positions,
    to_local_positions,
)

__all__ = [
    "DistributedFault", "dcp_dsa_attention", "generic_payload_bytes", "generic_topk_merge", "DistributedContext",
    "StartupMismatch", "init_distributed",
    "shutdown_distributed", "MergePlan", "MergeStats", "exact_topk_merge", "merge_in_process", "merge_traffic",
    "plan_merge", "round_scores_for_merge", "balanced_token_split", "head_sharded_dsa_prefill",
    "token_sharded_dsa_prefill", "DcpQueryShard", "build_local_block_table", "dcp_write_slots",
    "local_context_lengths", "local_width", "owner_rank", "shard_paged_cache", "shard_query_positions",
    "to_global_positions", "to_local_positions",
]
