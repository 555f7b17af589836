"""The engine's DSA attention when several ranks hold replicated caches (``dsahal run --tp W``): the seed's
TP case, with large prefill steps token-sharded (:func:`dsahal.distributed.token_sharded_dsa_prefill`).

Every rank runs the whole model on the whole batch and writes every token into its own cache (the
caches are replicated, as under tensor parallelism, whose KV cache every rank holds whole). What the
ranks share is the DSA attention of prefill steps; rank ``r`` owns attention heads
``r·H/W .. (r+1)·H/W - 1``, as a TP rank would:

- **token-sharded** (the seed's "shard attention by token, not head"): one all-to-all gives each rank
  ``1/W`` of the step's tokens with all H heads, each rank runs indexer, top-k and sparse MLA for its
  tokens only, a second all-to-all returns "all tokens, its H/W heads";
- **head-sharded** (the TP baseline): every rank scores every token in the indexer and attends with
  its own ``H/W`` heads.

Either way the heads are then all-gathered, because the rest of the model here is replicated (a real
TP model would feed its ``H/W`` heads to a row-parallel output projection instead), so every rank
holds the same output and emits the same tokens. Decode steps attend with every head on every rank
(no collective: the cache is whole everywhere, and a decode step stays capturable by CUDA graphs and
``torch.compile``).

Which prefill steps are token-sharded: ``--prefill-sharding tokens`` every one, ``none`` none,
``auto`` those of at least ``--prefill-shard-min-tokens`` tokens (below that the two all-to-alls cost
more than the indexer work they save). Every such step is recorded (its tokens, sharded or not) for
the run's report. "Prefill step" here is any step that is not a one-token-per-request decode step:
prefill chunks, and under ``--draft-tokens`` also the steps that verify drafts (the attention sees
only the batch, which does not say which of the two it is; both are sharded by the same rule).
"""
from __future__ import annotations

import torch

from .. import ops
from ..model.batch import BatchMeta, DsaLayerCache
from ..model.dsa_attention import LocalDsaAttention

MODES = ("none", "tokens", "auto")
DEFAULT_MIN_TOKENS = 1024


def check_sharding_args(mode: str, min_tokens: int, tp: int, dcp: int) -> None:
    """Raise ``ValueError`` naming the ``dsahal run`` flag when the combination cannot run."""
    if mode not in MODES:
        raise ValueError(f"dsahal run: argument '--prefill-sharding' expected one of {list(MODES)}, got {mode!r}")
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 1:
        raise ValueError(f"dsahal run: argument '--prefill-shard-min-tokens' expected an int >= 1, got {min_tokens!r}")
    if mode == "tokens" and tp == 1:  # (auto, the default, simply has nothing to shard on one rank)
        raise ValueError(f"dsahal run: argument '--prefill-sharding tokens' expected --tp > 1 (it splits a prefill "
                         f"step's tokens over the TP ranks), got --tp {tp}")
    if tp > 1 and dcp > 1:
        raise ValueError(f"dsahal run: arguments '--tp {tp}' and '--dcp {dcp}' expected one of them to be 1: DCP "
                         f"shards the cache by position, token-sharded prefill needs every rank to hold it whole")


def should_shard(mode: str, tokens: int, min_tokens: int) -> bool:
    """Whether a prefill step of ``tokens`` tokens is token-sharded under ``mode``."""
    return mode == "tokens" or (mode == "auto" and tokens >= min_tokens)


class ReplicatedTpAttention:
    """The :class:`~dsahal.model.DsaAttention` of one rank of a group holding replicated caches.

    Args:
        rank, world: this process's rank and the group's size W (W must divide the attention heads).
        mode: ``"none"``, ``"tokens"`` or ``"auto"`` (module docstring).
        min_tokens: ``auto``'s threshold, tokens per prefill step.
        group: the process group (None: the default group).
        fused, check: as :class:`~dsahal.model.LocalDsaAttention` (decode steps and argument checks).
    """

    context_shards = 1  # every rank stores every token

    def __init__(self, rank: int, world: int, mode: str = "auto", min_tokens: int = DEFAULT_MIN_TOKENS,
                 group=None, fused: bool = True, check: bool = True):
        check_sharding_args(mode, min_tokens, world, 1)
        if not 0 <= rank < world:
            raise ValueError(f"ReplicatedTpAttention: rank expected in [0, {world}), got {rank}")
        self.rank, self.world, self.mode, self.min_tokens, self.group = rank, world, mode, min_tokens, group
        self.local = LocalDsaAttention(fused=fused, check=check)
        self.steps: list[dict] = []  # one record per multi-token step: {"step", "tokens", "sharded", "layers"}
        self._last_meta = None  # a step's layers share one BatchMeta; kept alive so its id is not reused

    @property
    def check(self) -> bool:
        return self.local.check

    @check.setter
    def check(self, on: bool) -> None:  # the engine turns op checks off once a step has passed
        self.local.check = on

    write_slots = staticmethod(LocalDsaAttention.write_slots)

    def write(self, cache: DsaLayerCache, latent: torch.Tensor, index_key: torch.Tensor, meta: BatchMeta) -> None:
        """Every token into this rank's (replicated) cache."""
        self.local.write(cache, latent, index_key, meta)

    def attend(self, cache: DsaLayerCache, q_index: torch.Tensor, index_weights: torch.Tensor, q: torch.Tensor,
               meta: BatchMeta, topk: int, softmax_scale: float) -> torch.Tensor:
        """q ``[T, H, 576]`` (every head, identical on every rank) -> o ``[T, H, 512]``, identical on every rank."""
        if meta.decode:
            return self.local.attend(cache, q_index, index_weights, q, meta, topk, softmax_scale)
        tokens, heads = q.shape[0], q.shape[1]
        if heads % self.world:
            raise ValueError(f"dsahal run --tp {self.world}: expected a divisor of the attention heads ({heads}), "
                             f"got {self.world}")
        sharded = should_shard(self.mode, tokens, self.min_tokens)
        self._record(meta, tokens, sharded)
        from ..distributed import collective, head_sharded_dsa_prefill, token_sharded_dsa_prefill

        per_rank = heads // self.world
        mine = q[:, self.rank * per_rank:(self.rank + 1) * per_rank].contiguous()
        args = (q_index, index_weights, cache.index_pages, mine, cache.latent_pages, meta.block_table, meta.req_ids,
                meta.positions)
        common = dict(index_fmt=cache.index_fmt, kv_fmt=cache.latent_fmt, topk=topk, max_context=meta.max_context,
                      softmax_scale=softmax_scale, kv_scale=cache.latent_scale, check=self.check)
        if sharded:
            o = token_sharded_dsa_prefill(*args, group=self.group, **common)
        else:
            o, _ = head_sharded_dsa_prefill(*args, **common)
        gathered = collective.all_gather(o.contiguous(), self.group, "tp prefill: all-gather of the heads")
        return gathered.permute(1, 0, 2, 3).reshape(tokens, heads, o.shape[-1])  # [W, T, H/W, 512] -> [T, H, 512]

    def _record(self, meta: BatchMeta, tokens: int, sharded: bool) -> None:
        if meta is self._last_meta:
            self.steps[-1]["layers"] += 1
            return
        self._last_meta = meta
        self.steps.append({"step": len(self.steps), "tokens": tokens, "sharded": sharded, "layers": 1})

    def summary(self) -> dict:
        """The run report's ``prefill_sharding``: mode, ranks, threshold and every multi-token step (module
        docstring: prefill chunks, and draft verification under ``--draft-tokens``)."""
        sharded = [s["step"] for s in self.steps if s["sharded"]]
        return {"mode": self.mode, "ranks": self.world, "min_tokens": self.min_tokens if self.mode == "auto" else None,
                "multi_token_steps": len(self.steps), "sharded_steps": sharded,
                "sharded_tokens": sum(s["tokens"] for s in self.steps if s["sharded"]),
                "steps": [dict(s) for s in self.steps]}


def prefill_sharding_report(attention) -> dict:
    """``{"prefill_sharding": ...}`` for a replicated-cache run, else ``{}`` (merged into the run's report)."""
    summary = getattr(attention, "summary", None)
    return {"prefill_sharding": summary()} if isinstance(attention, ReplicatedTpAttention) else {}


def prefill_sharding_line(report: dict) -> str | None:
    """One line for the printed results, or None when the run had no replicated-cache group."""
    info = report.get("prefill_sharding")
    if not info:
        return None
    rule = {"tokens": "every step", "none": "no step",
            "auto": f"steps of >= {info['min_tokens']} tokens"}[info["mode"]]
    steps = ", ".join(str(s) for s in info["sharded_steps"]) or "none"
    return (f"prefill sharding: {info['mode']} ({rule}) over {info['ranks']} ranks with replicated caches: "
            f"{len(info['sharded_steps'])} of {info['multi_token_steps']} prefill (and draft-verify) steps "
            f"token-sharded ({info['sharded_tokens']} tokens; steps {steps}), the others head-sharded")


def start_tp(args, config, fingerprint: dict):
    """Join the torchrun process group for ``--tp W``; returns (attention, distributed context).

    ``fingerprint``: what every rank must agree on (``dsahal run`` builds it from its arguments)."""
    from ..distributed import StartupMismatch, init_distributed

    check_sharding_args(args.prefill_sharding, args.prefill_shard_min_tokens, args.tp, args.dcp)
    if config.num_heads % args.tp:
        raise ValueError(f"dsahal run: argument '--tp' expected a divisor of the attention heads of "
                         f"{config.name} ({config.num_heads}), got {args.tp}")
    fingerprint = dict(fingerprint, tp=args.tp, prefill_sharding=args.prefill_sharding,
                       prefill_shard_min_tokens=args.prefill_shard_min_tokens)
    try:
        context = init_distributed(fingerprint, timeout_s=args.dcp_timeout)
    except StartupMismatch as exc:
        raise ValueError(str(exc)) from None
    if context.world_size != args.tp:
        raise ValueError(f"dsahal run: argument '--tp {args.tp}' expected a group of {args.tp} processes, torchrun "
                         f"started {context.world_size}")
    rank, world = ops.group_rank_and_size(None)
    attention = ReplicatedTpAttention(rank, world, args.prefill_sharding, args.prefill_shard_min_tokens,
                                      fused=not args.split_dsa)
    return attention, context
