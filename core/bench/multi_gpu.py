"""Multi-GPU measurements of decode context parallelism (DCP) and token-sharded prefill.

Launch one process per GPU (NCCL; gloo on CPU with ``--quick``)::

    torchrun --nproc-per-node 2 -m dsahal.bench.multi_gpu [--section capacity|merge|prefill ...] [--json F]

Sections (each prints a table on rank 0; ``--json`` writes every number):

- ``capacity``: tokens of a model's KV cache that a per-GPU memory budget holds under TP=W (every rank
  stores every token) and under DCP=W (each rank stores every W-th token), *measured by allocating*
  the packed pool on the GPU and then whole contexts until the allocator refuses, beside what
  ``dsahal plan`` predicts for the same layout.
- ``merge``: one DSA decode attention step (64 requests x 5 query tokens at 128K context, H heads)
  over the DCP group with the exact packed top-k merge and with the generic merge (full local top-k,
  8 bytes a candidate): bytes each rank sends and time of the merge alone and of the step; the same
  step on one GPU over the whole cache; and the DCP output against that single-GPU output.
- ``prefill``: token-sharded against head-sharded prefill of one long prompt (time per layer), and
  whether token-sharded output is bitwise the single-device (non-DCP) output with
  ``DSAHAL_BATCH_INVARIANT=1``.

Timing: a barrier, then CUDA events around one call, repeated; the median per rank and the maximum
over ranks (the group waits for its slowest rank). Correctness is checked before anything is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from .. import ops
from ..cache import CacheFullError, PackedKVCache, plan_layout
from ..cli.capacity import capacity
from ..config import load_config
from ..distributed import (
    dcp_dsa_attention,
    exact_topk_merge,
    generic_payload_bytes,
    generic_topk_merge,
    head_sharded_dsa_prefill,
    init_distributed,
    local_width,
    shard_paged_cache,
    shard_query_positions,
    shutdown_distributed,
    token_sharded_dsa_prefill,
)
from ..distributed.traffic import merge_traffic
from .cases import batch_invariant_mode, relative_error
from .inputs import decode_batch, random_pages

MLA_SCALE = 192 ** -0.5
INDEX_HEADS = 32
SECTIONS = ("capacity", "merge", "prefill")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_collective_ms(fn: Callable[[], object], device: torch.device, *, warmup: int = 2, reps: int = 5) -> float:
    """Median ms of ``fn()`` per rank, maximum over ranks. Every rank runs the same number of calls
    (``fn`` may be collective), each after a barrier so rank skew is not timed."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        _sync(device)
        dist.barrier()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return _max_over_ranks(statistics.median(times), device)


def _max_over_ranks(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _same_on_every_rank(x: torch.Tensor) -> bool:
    gathered = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, x.contiguous())
    return all(torch.equal(g, gathered[0]) for g in gathered)


# -- capacity ---------------------------------------------------------------------------------------
def measure_capacity(config_name: str, budget_gib: float, context: int, latent_fmt: str, index_fmt: str,
                     block_tokens: int, world: int, device: torch.device) -> list[dict]:
    """TP=W and DCP=W layouts of ``config_name``: predicted and allocated capacity per device."""
    config = load_config(config_name)
    budget = int(budget_gib * 2**30)
    rows = []
    for name, dcp in ((f"TP{world}", 1), (f"TP{world} DCP{world}", world)):
        layout = plan_layout(config, latent_fmt=latent_fmt, index_fmt=index_fmt, block_tokens=block_tokens,
                             tp=world, dcp=dcp)
        predicted = capacity(layout, budget, context)
        _sync(device)
        before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        cache = PackedKVCache.from_budget(layout, budget, device=device)
        _sync(device)
        pool_bytes = (torch.cuda.memory_allocated(device) - before) if device.type == "cuda" \
            else cache.pool.numel() * cache.pool.element_size()
        # Tokens: blocks until the allocator refuses (each block holds block_tokens of this rank's tokens;
        # under DCP a block on each of the W ranks holds W x block_tokens distinct tokens of the group).
        blocks = _allocate_until_full(lambda: cache.allocate_blocks(1))
        for ids in blocks:
            cache.free_blocks(ids)
        # Whole contexts: this rank's share of a context's blocks plus one KDA state slot each.
        blocks_per_context = -(-(-(-context // dcp)) // block_tokens)

        def one_context():
            state = cache.allocate_state() if layout.states else None
            try:
                return cache.allocate_blocks(blocks_per_context)
            except CacheFullError:
                if state is not None:
                    cache.free_state(state)
                raise

        contexts = len(_allocate_until_full(one_context))
        rows.append(dict(
            layout=name, latent_fmt=layout.latent_fmt, index_fmt=layout.index_fmt, budget_gib=budget_gib,
            context=context, row_bytes=layout.row_bytes, rows=cache.num_rows, pool_bytes_allocated=pool_bytes,
            predicted_tokens=predicted.tokens, measured_tokens=len(blocks) * block_tokens * dcp,
            predicted_contexts=predicted.full_contexts, measured_contexts=contexts,
        ))
        cache = None  # the pool goes before the next layout is allocated
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for row in rows:  # None where TP=W holds nothing to compare with
        row["tokens_vs_tp"] = row["measured_tokens"] / rows[0]["measured_tokens"] if rows[0]["measured_tokens"] \
            else None
        row["contexts_vs_tp"] = row["measured_contexts"] / rows[0]["measured_contexts"] \
            if rows[0]["measured_contexts"] else None
        row["same_on_every_rank"] = _same_on_every_rank(
            torch.tensor([row["measured_tokens"], row["measured_contexts"]], device=device))
    return rows


def _allocate_until_full(allocate: Callable[[], list]) -> list:
    """Call ``allocate`` until it raises :class:`CacheFullError`; what each successful call returned."""
    got = []
    while True:
        try:
            got.append(allocate())
        except CacheFullError:
            return got


# -- DCP decode: merge and step ---------------------------------------------------------------------
class DecodeProblem:
    """A decode batch over a global paged cache built identically on every rank (same seed), and this
    rank's DCP shard of it (token ``p`` on rank ``p % W``)."""

    def __init__(self, requests: int, per_request: int, context: int, heads: int, kv_fmt: str, index_fmt: str,
                 block_tokens: int, rank: int, world: int, device: torch.device):
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(1234)
        if device.type == "cuda":
            torch.cuda.manual_seed(1234)
        self.block_table, self.req_ids, self.positions, num_blocks = decode_batch(
            requests, per_request, context, block_tokens, device)
        self.index_pages = random_pages("index", index_fmt, num_blocks, block_tokens, device)
        self.kv_pages = random_pages("latent", kv_fmt, num_blocks, block_tokens, device)
        tokens = self.req_ids.shape[0]
        self.q_index = torch.randn(tokens, INDEX_HEADS, 128, device=device).to(torch.float8_e4m3fn)
        self.weights = torch.rand(tokens, INDEX_HEADS, device=device)
        self.q = torch.randn(tokens, heads, 576, device=device, dtype=torch.bfloat16)
        torch.random.set_rng_state(gen_state)
        self.kv_scale = torch.tensor(0.5, device=device) if kv_fmt == "fp8" else None
        self.kw = dict(index_fmt=index_fmt, kv_fmt=kv_fmt, kv_scale=self.kv_scale, max_context=context,
                       softmax_scale=MLA_SCALE)
        lens = torch.full((requests,), context, dtype=torch.int64, device=device)
        self.local_index, self.local_table = shard_paged_cache(self.index_pages, self.block_table, lens, rank, world)
        self.local_kv, _ = shard_paged_cache(self.kv_pages, self.block_table, lens, rank, world)
        self.local_table = self.local_table.to(device)
        self.world, self.rank = world, rank

    def single_gpu(self, topk: int):
        return ops.dsa_attention(self.q_index, self.weights, self.index_pages, self.q, self.kv_pages,
                                 self.block_table, self.req_ids, self.positions, topk=topk, check=False, **self.kw)

    def dcp(self, topk: int, merge=None):
        return dcp_dsa_attention(self.q_index, self.weights, self.local_index, self.q, self.local_kv,
                                 self.local_table, self.req_ids, self.positions, topk=topk, check=False,
                                 merge=merge, **self.kw)

    def local_scores(self):
        """This rank's indexer scores ``[T, local_width]`` and valid lengths, as the DCP step computes them."""
        width = local_width(self.kw["max_context"], self.world)
        shard = shard_query_positions(self.positions, self.rank, self.world)
        scores = ops.indexer_score(self.q_index, self.weights, self.local_index, self.local_table, self.req_ids,
                                   shard.local_positions, index_fmt=self.kw["index_fmt"], max_context=width,
                                   check=False)
        return scores, torch.clamp(shard.local_lengths, max=width)


def measure_merge(requests: int, per_request: int, context: int, heads: int, topk: int, kv_fmt: str,
                  index_fmt: str, block_tokens: int, rank: int, world: int, device: torch.device,
                  reps: int) -> dict:
    problem = DecodeProblem(requests, per_request, context, heads, kv_fmt, index_fmt, block_tokens, rank, world,
                            device)
    # Correctness first: both merges pick the same winners; DCP output against one GPU's output.
    scores, lengths = problem.local_scores()
    exact = exact_topk_merge(scores, lengths, topk)
    generic = generic_topk_merge(scores, lengths, topk)
    same_set = bool((torch.sort(exact, dim=1).values == torch.sort(generic, dim=1).values).all())
    merge_traffic.reset()
    exact_topk_merge(scores, lengths, topk)
    stats = merge_traffic.last
    o_single, lse_single = problem.single_gpu(topk)
    o_dcp, lse_dcp = problem.dcp(topk)
    o_generic, _ = problem.dcp(topk, merge=generic_topk_merge)
    result = dict(
        requests=requests, per_request=per_request, context=context, heads=heads, topk=topk, kv_fmt=kv_fmt,
        index_fmt=index_fmt, world=world,
        merges_pick_same_set=same_set and _same_on_every_rank(exact),
        exact_payload_bytes_per_rank=stats.payload_bytes, exact_first_round_bytes=stats.first_round_bytes,
        exact_resend_bytes=stats.resend_bytes, exact_band_bytes=stats.band_bytes, band_rows=stats.band_rows,
        generic_payload_bytes_per_rank=generic_payload_bytes(scores.shape[0], topk),
        dcp_vs_single_gpu_o_rel_err=relative_error(o_dcp, o_single),
        dcp_vs_single_gpu_lse_max_err=float((lse_dcp - lse_single).abs().max()),
        generic_vs_exact_dcp_o_bitwise=bool(torch.equal(o_generic, o_dcp)),
    )
    result["bytes_ratio"] = result["generic_payload_bytes_per_rank"] / max(result["exact_payload_bytes_per_rank"], 1)
    result["exact_merge_ms"] = time_collective_ms(lambda: exact_topk_merge(scores, lengths, topk), device, reps=reps)
    result["generic_merge_ms"] = time_collective_ms(lambda: generic_topk_merge(scores, lengths, topk), device,
                                                    reps=reps)
    result["dcp_step_exact_ms"] = time_collective_ms(lambda: problem.dcp(topk), device, reps=reps)
    result["dcp_step_generic_ms"] = time_collective_ms(lambda: problem.dcp(topk, merge=generic_topk_merge), device,
                                                       reps=reps)
    result["single_gpu_step_ms"] = _max_over_ranks(_time_local_ms(lambda: problem.single_gpu(topk), device, reps),
                                                   device)
    result["merge_speedup"] = result["generic_merge_ms"] / result["exact_merge_ms"]
    result["step_speedup"] = result["dcp_step_generic_ms"] / result["dcp_step_exact_ms"]
    return result


def _time_local_ms(fn, device: torch.device, reps: int) -> float:
    """Median ms of a non-collective ``fn`` on this rank."""
    fn()
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# -- prefill ----------------------------------------------------------------------------------------
def measure_prefill(length: int, heads: int, topk: int, kv_fmt: str, index_fmt: str, block_tokens: int, rank: int,
                    world: int, device: torch.device, reps: int, check_bitwise: bool) -> dict:
    """One request prefilling ``length`` tokens (positions ``0..length-1``) over a cache that holds them."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(4321)
    if device.type == "cuda":
        torch.cuda.manual_seed(4321)
    block_table, req_ids, positions, num_blocks = decode_batch(1, length, length, block_tokens, device)
    index_pages = random_pages("index", index_fmt, num_blocks, block_tokens, device)
    kv_pages = random_pages("latent", kv_fmt, num_blocks, block_tokens, device)
    q_index = torch.randn(length, INDEX_HEADS, 128, device=device).to(torch.float8_e4m3fn)
    weights = torch.rand(length, INDEX_HEADS, device=device)
    q_all = torch.randn(length, heads, 576, device=device, dtype=torch.bfloat16)
    torch.random.set_rng_state(gen_state)
    per_rank = heads // world
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    q_mine = q_all[:, mine].contiguous()
    kv_scale = torch.tensor(0.5, device=device) if kv_fmt == "fp8" else None
    kw = dict(index_fmt=index_fmt, kv_fmt=kv_fmt, kv_scale=kv_scale, topk=topk, max_context=length,
              softmax_scale=MLA_SCALE, check=False)
    args = (q_index, weights, index_pages)
    cache = (kv_pages, block_table, req_ids, positions)

    def token_sharded():
        return token_sharded_dsa_prefill(*args, q_mine, *cache, **kw)

    def head_sharded():
        return head_sharded_dsa_prefill(*args, q_mine, *cache, **kw)

    result = dict(length=length, heads=heads, topk=topk, kv_fmt=kv_fmt, index_fmt=index_fmt, world=world)
    o_token = token_sharded()
    o_head, _ = head_sharded()
    result["token_vs_head_sharded_o_rel_err"] = relative_error(o_token, o_head)
    result["token_vs_head_sharded_bitwise"] = _all_ranks(bool(torch.equal(o_token, o_head)), device)
    if check_bitwise:
        with batch_invariant_mode():
            o_token_inv = token_sharded()
            o_single, _ = ops.dsa_attention(*args, q_all, *cache, **kw)  # one device, every head, every token
            same = bool(torch.equal(o_token_inv, o_single[:, mine]))
        result["batch_invariant_token_sharded_equals_single_device_bitwise"] = _all_ranks(same, device)
        result["batch_invariant_max_abs_diff"] = _max_over_ranks(
            float((o_token_inv.float() - o_single[:, mine].float()).abs().max()), device)
        del o_single, o_token_inv
    result["token_sharded_ms"] = time_collective_ms(token_sharded, device, warmup=1, reps=reps)
    result["head_sharded_ms"] = time_collective_ms(head_sharded, device, warmup=1, reps=reps)
    result["speedup"] = result["head_sharded_ms"] / result["token_sharded_ms"]
    return result


def _all_ranks(flag: bool, device: torch.device) -> bool:
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


# -- driver -----------------------------------------------------------------------------------------
def _print_table(title: str, rows: list[dict], columns: list[str]) -> None:
    print(f"\n{title}\n")
    print("| " + " | ".join(columns) + " |")
    print("| " + " | ".join("---" for _ in columns) + " |")
    for row in rows:
        cells = []
        for c in columns:
            v = row.get(c)
            v = "-" if v is None else v
            cells.append(f"{v:.3g}" if isinstance(v, float) else str(v))
        print("| " + " | ".join(cells) + " |")
    print(flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsahal.bench.multi_gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", action="append", choices=SECTIONS, help="sections to run (default all)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a CPU/gloo smoke run)")
    parser.add_argument("--config", default="k31-pro", help="model preset for the capacity section")
    parser.add_argument("--budget-gib", type=float, default=None, help="cache memory per device (capacity)")
    parser.add_argument("--layout-world", type=int, default=None,
                        help="W of the TP=W / DCP=W layouts in the capacity section (default: the number of "
                             "ranks); each device's pool does not depend on the others, so one GPU measures "
                             "what each of W would hold")
    parser.add_argument("--heads", type=int, default=128, help="attention heads of the DSA layer")
    parser.add_argument("--prefill-lengths", default=None, help="comma-separated prompt lengths")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default=None, help="write every number here (rank 0)")
    args = parser.parse_args(argv)
    sections = args.section or list(SECTIONS)

    ctx = init_distributed({"tool": "bench.multi_gpu", "sections": sections, "quick": args.quick})
    rank, world, device = ctx.rank, ctx.world_size, ctx.device
    collective_sections = [s for s in sections if s in ("merge", "prefill")]
    if world < 2 and collective_sections:
        shutdown_distributed()
        parser.error(f"sections {collective_sections} need at least 2 ranks (torchrun --nproc-per-node W), "
                     f"got {world}; only 'capacity' runs on one")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    quick = args.quick
    report: dict = {"world": world, "backend": ctx.backend, "dsahal_backend": os.environ.get("DSAHAL_BACKEND"),
                    "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    try:
        if "capacity" in sections:
            budget = args.budget_gib or (0.25 if quick else 32.0)
            layout_world = args.layout_world or world
            report["capacity"] = measure_capacity("tiny" if quick else args.config, budget,
                                                  4096 if quick else 131072, "fp8", "fp8", 64, layout_world, device)
            if rank == 0:
                _print_table(f"KV capacity per {budget:g} GiB per device, layouts for W={layout_world} "
                             f"({world} rank(s) allocating)", report["capacity"],
                             ["layout", "row_bytes", "rows", "pool_bytes_allocated", "predicted_tokens",
                              "measured_tokens", "tokens_vs_tp", "predicted_contexts", "measured_contexts",
                              "contexts_vs_tp", "same_on_every_rank"])
        if "merge" in sections:
            shape = dict(requests=4, per_request=2, context=512, heads=4, topk=16) if quick else \
                dict(requests=64, per_request=5, context=131072, heads=args.heads, topk=2048)
            report["merge"] = measure_merge(**shape, kv_fmt="fp8", index_fmt="fp8", block_tokens=64, rank=rank,
                                            world=world, device=device, reps=args.reps)
            if rank == 0:
                _print_table("DCP decode step: exact packed merge vs generic merge", [report["merge"]],
                             ["requests", "per_request", "context", "heads", "merges_pick_same_set",
                              "exact_payload_bytes_per_rank", "generic_payload_bytes_per_rank", "bytes_ratio",
                              "exact_merge_ms", "generic_merge_ms", "merge_speedup", "dcp_step_exact_ms",
                              "dcp_step_generic_ms", "step_speedup", "single_gpu_step_ms",
                              "dcp_vs_single_gpu_o_rel_err", "dcp_vs_single_gpu_lse_max_err"])
        if "prefill" in sections:
            lengths = [int(x) for x in (args.prefill_lengths or ("96,160" if quick else "8192,32768,65536"))
                       .split(",")]
            rows = []
            for i, length in enumerate(lengths):
                rows.append(measure_prefill(length, 4 if quick else args.heads, 16 if quick else 2048, "fp8",
                                            "fp8", 64, rank, world, device, args.reps, check_bitwise=(i == 0)))
                if rank == 0:
                    print(f"prefill {length}: {rows[-1]}", flush=True)
            report["prefill"] = rows
            if rank == 0:
                _print_table("Token-sharded vs head-sharded prefill (one request)", rows,
                             ["length", "heads", "token_sharded_ms", "head_sharded_ms", "speedup",
                              "token_vs_head_sharded_o_rel_err", "token_vs_head_sharded_bitwise",
                              "batch_invariant_token_sharded_equals_single_device_bitwise",
                              "batch_invariant_max_abs_diff"])
        if rank == 0 and args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=2)
        # Leave together: a rank tearing its process group down while a peer is still in a collective's
        # tail aborted that peer at exit on gloo ("terminate called without an active exception").
        dist.barrier()
    finally:
        shutdown_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
