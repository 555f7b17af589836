"""Block-size sweep of the shared Triton kernels at the decode shapes of docs/performance.md
(``python -m dsahal.backends.nvidia.tune``).

Prints, per kernel, the median time of each configuration and whether its output matches the
first configuration's (a configuration that changes the result is a bug, not a speed-up). The
winners are what :mod:`.config` hard-codes.
"""
from __future__ import annotations

import itertools
import sys

import torch

from dsahal.bench.cases import INDEX_HEADS, MLA_SCALE
from dsahal.bench.inputs import decode_batch, random_pages, random_slots
from dsahal.bench.timing import time_ms


def _compiled(jit_fns) -> dict:
    """``{id: kernel}`` of every compiled variant of these ``@triton.jit`` functions (Triton 3.x caches)."""
    found = {}
    for fn in jit_fns:
        try:
            for cache in getattr(fn, "device_caches", {}).values():
                for kernel in cache[0].values():
                    found[id(kernel)] = kernel
        except Exception:  # noqa: BLE001 - cache layout differs between Triton versions: no resource column
            pass
    return found


def _resources(kernels) -> str:
    """Registers per thread, spilled bytes and shared memory of newly compiled kernels (why a config is slow)."""
    parts = []
    for kernel in kernels:
        shared = getattr(getattr(kernel, "metadata", None), "shared", "?")
        parts.append(f"regs={getattr(kernel, 'n_regs', '?')} spills={getattr(kernel, 'n_spills', '?')} smem={shared}")
    return " [" + "; ".join(parts) + "]" if parts else ""


def _sweep(label, configs, launch, compare, jit_fns=()):
    print(f"\n== {label}")
    first = None
    best = None
    for cfg in configs:
        try:
            before = _compiled(jit_fns)
            out = launch(**cfg)
            torch.cuda.synchronize()
            same = True if first is None else compare(out, first)
            first = out if first is None else first
            ms = time_ms(lambda: launch(**cfg))
        except Exception as exc:  # noqa: BLE001 - a config that fails to compile is reported and skipped
            print(f"  {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        after = _compiled(jit_fns)
        print(f"  {cfg}: {ms:.4f} ms  same={same}" + _resources(after[i] for i in after.keys() - before.keys()))
        if same and (best is None or ms < best[0]):
            best = (ms, cfg)
    print(f"  best: {best}")
    sys.stdout.flush()


def _close(a, b, tol=1e-2):
    a = a[0] if isinstance(a, tuple) else a
    b = b[0] if isinstance(b, tuple) else b
    return bool(((a.float() - b.float()).norm() / b.float().norm()) < tol)


def main(sections=("sparse_mla", "indexer", "topk", "kda")):
    """Run the sweeps named in ``sections``.

    Command line: ``python -m dsahal.backends.nvidia.tune [SECTION...]``.
    """
    from ..triton_kernels import indexer, kda, sparse_mla, topk, topk_bound, topk_groups, topk_split
    from . import config

    unknown = set(sections) - {"sparse_mla", "indexer", "topk", "kda"}
    if unknown:
        raise SystemExit(f"tune: unknown section(s) {sorted(unknown)}; expected sparse_mla, indexer, topk, kda")
    dev = torch.device("cuda")
    for heads, tokens in ((128, 320), (16, 320), (128, 8)) if "sparse_mla" in sections else ():
        for fmt in ("bf16", "fp8", "fp8_ds_mla"):  # (fp8_ds_mla: the general kernel where FlashMLA is not installed)
            pages = random_pages("latent", fmt, (1 << 20) // 64, 64, dev)
            scale = torch.tensor(0.5, device=dev) if fmt == "fp8" else None
            q = torch.randn(tokens, heads, 576, device=dev, dtype=torch.bfloat16)
            slots = random_slots(tokens, 2048, 1 << 20, dev)
            if heads >= 64 and tokens > 64:
                shapes = [(64, 32, 8, 1, None), (64, 32, 8, 2, None), (64, 32, 8, 3, None), (64, 64, 8, 1, None),
                          (64, 64, 8, 2, None), (64, 64, 4, 2, None), (32, 64, 4, 2, None), (64, 16, 4, 2, None),
                          (64, 64, 8, 2, 1024),
                          # 16 warps: half the accumulator registers a thread (sm_90 compiles, 32nd session: 128
                          # registers; bf16 latents at 32 slots a step and 2 stages spill 8 B, fp8_ds_mla ~900 B)
                          (64, 32, 16, 2, None), (64, 64, 16, 1, None)]
            elif heads >= 64:
                shapes = [(64, 32, 8, 1, None), (64, 32, 8, 1, 512), (64, 32, 8, 1, 256), (64, 64, 8, 2, 256),
                          (64, 32, 8, 2, 256), (32, 64, 4, 2, 256)]
            else:
                shapes = [(16, 64, 4, 2, 512), (16, 32, 4, 1, None), (16, 64, 4, 2, None), (16, 64, 4, 3, 512),
                          (16, 128, 4, 2, 512), (16, 128, 8, 2, 512), (16, 64, 4, 2, 256), (16, 64, 8, 2, 256),
                          (16, 128, 4, 3, 256), (16, 32, 4, 3, 256)]
            configs = [dict(block_h=h, block_n=n, num_warps=w, num_stages=s, split_size=sp)
                       for h, n, w, s, sp in shapes]
            if heads >= 64:  # two programs per head block, each with half of the value columns
                configs += [dict(c, v_split=2) for c in configs if c["block_h"] == 64 and c["num_warps"] == 8]
                configs += [dict(block_h=64, block_n=64, num_warps=4, num_stages=2, split_size=configs[0]["split_size"],
                                 v_split=2)]
            _sweep(f"sparse_mla {fmt} T={tokens} H={heads}", configs,
                   lambda **c: sparse_mla.sparse_mla(q, pages, slots, fmt, scale, MLA_SCALE, **c), _close,
                   (sparse_mla.sparse_mla_kernel,))
            pages = None  # free the pool before the next shape
    block_table, req_ids, positions, nb = decode_batch(64, 5, 131072, 64, dev)
    ipages = random_pages("index", "fp8", nb, 64, dev)
    for qd in (torch.float8_e4m3fn, torch.bfloat16) if "indexer" in sections else ():
        qi = torch.randn(320, INDEX_HEADS, 128, device=dev).to(qd)
        w = torch.rand(320, INDEX_HEADS, device=dev)
        configs = [dict(block_n=64, group=8, tiles=4, num_warps=4, num_stages=1)]  # today's choice first
        # the rolled loop (fewer registers, the query operand amortised over more tiles), keys as either
        # MMA operand, read through a typed view
        configs += [dict(block_n=64, group=8, tiles=tl_, num_warps=wp, num_stages=st, pipeline=True, typed_keys=True,
                         keys_as_b=kb)
                    for kb, tl_, wp, st in itertools.product([False, True], [8, 16], [4, 8], [2])]
        _sweep(f"indexer fp8 keys q={qd}", configs,
               lambda **c: indexer.indexer_score(qi, w, ipages, block_table, req_ids, positions, "fp8", 131072, **c),
               lambda a, b: torch.equal(torch.isfinite(a), torch.isfinite(b)) and _close(
                   torch.nan_to_num(a, neginf=0), torch.nan_to_num(b, neginf=0), 1e-3),
               (indexer.indexer_score_kernel,))
    # Top-k on two score distributions: Gaussian, and the indexer's own output (non-negative sums of
    # relu terms, crowded into few exponents), which is what the DSA layer feeds it.
    qi = torch.randn(320, INDEX_HEADS, 128, device=dev).to(torch.float8_e4m3fn)
    w = torch.rand(320, INDEX_HEADS, device=dev)
    indexer_scores = indexer.indexer_score(qi, w, ipages, block_table, req_ids, positions, "fp8", 131072)
    ipages = None
    lengths = torch.full((320,), 131072, device=dev, dtype=torch.int32)
    distributions = (("indexer output", indexer_scores), ("gaussian", torch.randn(320, 131072, device=dev)))
    for label, scores in distributions if "topk" in sections else ():
        today = config.topk_config(131072)  # today's choice first (the groups method): the reference
        bound = dict(method="bound", chunk=1024, num_warps=4, finish_chunk=512, finish_warps=4)  # 8K-64K's
        configs = [today, dict(today, segment_histograms=True), bound, dict(bound, segment_histograms=True)]
        configs += [dict(chunk=c, num_warps=w, row_levels=2, segments=sg)  # radix, rows split over programs
                    for sg, c, w in itertools.product([1, 8], [1024, 2048], [4, 8])]
        _sweep(f"topk [320, 128K] k=2048 {label}", configs, lambda **c: topk.topk(scores, lengths, 2048, **c),
               lambda a, b: torch.equal(a.sort(1).values, b.sort(1).values),
               (topk.topk_kernel, topk_split.split_histogram_kernel, topk_split.split_write_kernel,
                topk_groups.group_max_kernel, topk_groups.group_compact_kernel, topk_bound.bound_max_kernel,
                topk_bound.bound_threshold_kernel, topk_bound.bound_compact_kernel, topk_bound.bound_finish_kernel))
        print(f"  torch.topk: {time_ms(lambda: torch.topk(scores, 2048, dim=1)):.4f} ms")
    for batch in (64, 256) if "kda" in sections else ():
        pool = torch.randn(batch * 2, 32, 128, 128, device=dev) * 0.05
        ids = torch.randperm(batch * 2, device=dev)[:batch].to(torch.int32)
        q, k, v = (torch.randn(batch, 32, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
        g = -torch.rand(batch, 32, 128, device=dev) * 0.1
        beta = torch.rand(batch, 32, device=dev, dtype=torch.bfloat16)
        configs = [dict(block_v=b, num_warps=w) for b, w in itertools.product([16, 32, 64, 128], [4, 8])]
        _sweep(f"kda decode B={batch}", configs,
               lambda **c: kda.kda_decode(q, k, v, g, beta, pool, ids, 128**-0.5, True, **c),
               lambda a, b: True, (kda.kda_recurrent_kernel,))


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or ("sparse_mla", "indexer", "topk", "kda"))
