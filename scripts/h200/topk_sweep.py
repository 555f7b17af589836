"""Exact top-k (k = 2048) on one Hopper GPU: torch.topk, the NVIDIA backend's default and the max-bound
kernels (``dsahal.backends.triton_kernels.topk_bound`` / ``topk_groups``), on real lightning-indexer scores.

Usage (on a CUDA machine, from the repository with dsahal importable)::

    python scripts/h200/topk_sweep.py [--cpu-smoke]

Steps, in order, each printed:

1. device-to-device copy ceiling (1 GiB copy, read + write bytes / time) measured in this run;
2. scores: the NVIDIA indexer (``indexer_score``, FP8 queries on random FP8 keys, 32 heads, the backend's
   tuned config) for 64 requests x 5 decode tokens at 128K context (-inf past each token's position).
   Three cases are cut from them: ``decode 320x128K`` (as they are), ``decode 320x4K`` (the first 4096
   columns: early decode) and ``prefill 4096x32K`` (the first 32768 columns tiled to 4096 rows, causal
   lengths ``8 (t + 1)``: rows of 8 .. 32768 entries, a quarter of them shorter than k);
3. every variant checked before it is timed, on every row: the chosen set equals the set torch.topk implies
   under the tie rule (everything above the k-th value, then the first entries equal to it in index
   order; no -inf), no duplicates, -1 padding last, and on 8 rows per case the float64 reference's set
   exactly; the bound kernels' index order too; then one bound and one groups variant captured in a CUDA
   graph and replayed on other scores;
4. ``triton.testing.do_bench`` medians; one table: case, variant, ms, (scores + output bytes) / time,
   % of the copy ceiling, torch.topk ms / variant ms, and the bound kernels' survivors per row (mean / max).

A failed check is listed and the script exits with one ``error:`` line (after timing what did pass).
Runs in about a minute on an H200, most of it Triton compiles and the indexer.
"""
from __future__ import annotations

import argparse
import sys
import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
from script_cli import CheckError, finish, run  # scripts/h200/script_cli.py

K = 2048
HEADS = 32
BLOCK_TOKENS = 64
REQUESTS, PER_REQUEST, CONTEXT = 64, 5, 131072
SHORT, PREFILL_ROWS, PREFILL_WIDTH = 4096, 4096, 32768
REFERENCE_ROWS = 8
DEVICE = "cuda"  # --cpu-smoke: "cpu" under TRITON_INTERPRET=1
SMOKE_DIVISOR = 1  # --cpu-smoke: chunk sizes divided by this (tiny rows)

# (name, kwargs of dsahal.backends.triton_kernels.topk.topk); "default" is the NVIDIA config's
VARIANTS = (
    ("radix default", None),
    ("radix 1 prog/row", dict(chunk=2048, row_levels=2, num_warps=8, segments=1)),
    ("bound c1024 f512", dict(method="bound", chunk=1024, num_warps=4, finish_chunk=512, finish_warps=4)),
    ("bound c2048w8 f512", dict(method="bound", chunk=2048, num_warps=8, finish_chunk=512, finish_warps=4)),
    ("groups c1024 b64 f512", dict(method="groups", chunk=1024, batch=64, num_warps=4, finish_chunk=512,
                                   finish_warps=4)),
    ("groups c2048w8 b64", dict(method="groups", chunk=2048, batch=64, num_warps=8, finish_chunk=512, finish_warps=4)),
    ("groups c1024s32 f1024", dict(method="groups", chunk=1024, steps=32, batch=64, num_warps=4, finish_chunk=1024,
                                   finish_warps=8)),
    # thirteenth session: the groups default's neighbours (the top-k is ~15% of the DSA layer at 64x5 x 128K)
    ("groups c1024s32 b128 f1024", dict(method="groups", chunk=1024, steps=32, batch=128, num_warps=4,
                                        finish_chunk=1024, finish_warps=8)),
    ("groups G8 c1024s32 f1024", dict(method="groups", chunk=1024, steps=32, batch=64, num_warps=4, group_size=8,
                                      finish_chunk=1024, finish_warps=8)),
    ("groups c1024s32 f2048w16", dict(method="groups", chunk=1024, steps=32, batch=64, num_warps=4,
                                      finish_chunk=2048, finish_warps=16)),
    ("groups c2048s16w8 f1024", dict(method="groups", chunk=2048, steps=16, batch=64, num_warps=8,
                                     finish_chunk=1024, finish_warps=8)),
)



def _bench(fn):
    return timing.bench_ms(fn, DEVICE, warmup=10, rep=60)


def _kwargs(kw, width=1 << 17):
    from dsahal.backends.nvidia.config import topk_config

    kw = dict(topk_config(width)) if kw is None else dict(kw)
    for name in ("chunk", "finish_chunk"):
        if name in kw:
            kw[name] = max(16, kw[name] // SMOKE_DIVISOR)
    return kw


def indexer_scores(torch):
    """``[R x P, C]`` fp32 indexer output for R requests of P decode tokens at context C (FP8 keys)."""
    from dsahal.backends.nvidia.config import indexer_config
    from dsahal.backends.triton_kernels.indexer import indexer_score
    from dsahal.bench.inputs import decode_batch, random_pages

    block_table, req_ids, positions, num_blocks = decode_batch(REQUESTS, PER_REQUEST, CONTEXT, BLOCK_TOKENS, DEVICE)
    pages = random_pages("index", "fp8", num_blocks, BLOCK_TOKENS, DEVICE)
    tokens = req_ids.shape[0]
    q = torch.randn(tokens, HEADS, 128, device=DEVICE)
    q = q.to(torch.float8_e4m3fn) if DEVICE == "cuda" else q  # the interpreter's float -> e4m3 cast is wrong
    w = torch.rand(tokens, HEADS, device=DEVICE)
    cfg = indexer_config(HEADS, q.dtype, "fp8")
    scores = indexer_score(q, w, pages, block_table, req_ids, positions, "fp8", CONTEXT, **cfg)
    return scores, (positions + 1).to(torch.int32)


def build_cases(torch, scores, lengths):
    """(name, scores [T, N], lengths [T] int32) per case, cut from the indexer output."""
    short = scores[:, :SHORT].contiguous()
    tiled = scores[:, :PREFILL_WIDTH].repeat(-(-PREFILL_ROWS // scores.shape[0]), 1)[:PREFILL_ROWS].contiguous()
    causal = (torch.arange(PREFILL_ROWS, device=DEVICE, dtype=torch.int32) + 1) * (PREFILL_WIDTH // PREFILL_ROWS)
    tiled.masked_fill_(torch.arange(PREFILL_WIDTH, device=DEVICE)[None, :] >= causal[:, None], float("-inf"))
    return [
        (f"decode {scores.shape[0]}x{_width(scores.shape[1])}", scores, lengths),
        (f"decode {short.shape[0]}x{_width(SHORT)}", short, torch.clamp(lengths, max=SHORT)),
        (f"prefill {PREFILL_ROWS}x{_width(PREFILL_WIDTH)}", tiled, causal),
    ]


def _width(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def expected_mask(torch, scores, lengths, k):
    """``[T, N]`` bool: the tie rule's choice, from torch.topk's k-th value (nothing -inf)."""
    width = scores.shape[1]
    cols = torch.arange(width, device=scores.device)
    masked = torch.where(cols[None, :] < lengths[:, None].long(), scores, torch.full_like(scores, float("-inf")))
    tau = torch.topk(masked, min(k, width), dim=1).values[:, -1:]
    finite = masked != float("-inf")
    above = (masked > tau) & finite
    equal = (masked == tau) & finite
    need = min(k, width) - above.sum(dim=1, keepdim=True, dtype=torch.int32)
    return above | (equal & (torch.cumsum(equal.to(torch.int32), dim=1, dtype=torch.int32) <= need))


def check(torch, name, got, scores, lengths, k, want_mask, index_order):
    """Empty string when ``got [T, k]`` is the tie rule's set with -1 padding last, else what is wrong."""
    from dsahal.reference.topk import topk as reference

    tokens, width = scores.shape
    if tuple(got.shape) != (tokens, k) or got.dtype != torch.int32:
        return f"{name}: output {tuple(got.shape)} {got.dtype}, expected ({tokens}, {k}) int32"
    valid = got >= 0
    if bool((valid[:, 1:] & ~valid[:, :-1]).any()):
        return f"{name}: a valid index after -1 padding"
    if bool((valid & (got >= lengths[:, None])).any()) or bool((got < -1).any()):
        return f"{name}: an index outside [0, length) or below -1"
    hits = torch.zeros(tokens, width, dtype=torch.int32, device=got.device)
    hits.scatter_add_(1, got.clamp(0, width - 1).long(), valid.to(torch.int32))
    bad = (hits != want_mask.to(torch.int32)).any(dim=1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        return (f"{name}: {int(bad.sum())} of {tokens} rows differ from the tie rule's set, first row {row} "
                f"(length {int(lengths[row])}: {int(hits[row].sum())} chosen, {int(want_mask[row].sum())} expected, "
                f"{int((hits[row] > 1).sum())} duplicates)")
    if index_order:
        shifted = torch.where(valid, got, torch.iinfo(torch.int32).max)
        if bool((valid[:, 1:] & (shifted[:, 1:] <= shifted[:, :-1])).any()):
            return f"{name}: valid indices not in increasing index order"
    rows = torch.linspace(0, tokens - 1, REFERENCE_ROWS, device=got.device).long().unique()
    want = reference(scores[rows].double(), lengths[rows], k)
    if not torch.equal(got[rows].sort(dim=1).values, want.sort(dim=1).values):
        return f"{name}: differs from the float64 reference on rows {rows.tolist()}"
    return ""


def check_graph(torch, scores, lengths, kw, failures):
    """The bound kernel captured in a CUDA graph (no host sync may happen inside), replayed on new scores."""
    from dsahal.backends.triton_kernels.topk import topk

    static = scores.clone()
    eager = topk(static, lengths, K, **kw)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = topk(static, lengths, K, **kw)
    static.copy_(scores.flip(0))
    graph.replay()
    want = topk(static, lengths, K, **kw)
    ok = torch.equal(out, want) and not torch.equal(out, eager)
    print(f"  check CUDA graph replay of {kw}: {'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append(f"{kw['method']} kernel: a CUDA graph replay on new scores differs from an eager call")


def run_case(torch, case, rows, failures):
    from dsahal.backends.triton_kernels.topk import topk
    from dsahal.backends.triton_kernels.topk_bound import topk_bound
    from dsahal.backends.triton_kernels.topk_groups import topk_groups

    name, scores, lengths = case
    tokens, width = scores.shape
    nbytes = tokens * width * 4 + tokens * K * 4
    want_mask = expected_mask(torch, scores, lengths, K)
    peer_ms = _bench(lambda: torch.topk(scores, min(K, width), dim=1))
    rows.append((name, "torch.topk", peer_ms, nbytes / (peer_ms * 1e-3) / 1e9, 1.0, ""))
    for variant, raw in VARIANTS:
        kw = _kwargs(raw)
        try:
            got = topk(scores, lengths, K, **kw)
            problem = check(torch, variant, got, scores, lengths, K, want_mask, kw.get("method") in ("bound", "groups"))
        except Exception as exc:  # noqa: BLE001 - a variant that fails to compile or run is listed
            problem = f"{variant}: {type(exc).__name__}: {str(exc)[:200]}"
        print(f"  check {name:<18s} {variant:<18s} {problem or 'ok'}", flush=True)
        if problem:
            failures.append(f"{name}: {problem}")
            continue
        survivors = ""
        if kw.get("method") in ("bound", "groups"):
            stats = {}
            out = torch.empty(tokens, K, dtype=torch.int32, device=DEVICE)
            direct = topk_bound if kw["method"] == "bound" else topk_groups
            direct(scores, lengths, K, out, False, lengths, lengths.view(1, -1), 1, stats=stats,
                   **{key: value for key, value in kw.items() if key != "method"})
            count = stats["survivors"].float()
            survivors = f"{count.mean().item():.0f} / {count.max().item():.0f}"
        ms = _bench(lambda: topk(scores, lengths, K, **kw))
        rows.append((name, variant, ms, nbytes / (ms * 1e-3) / 1e9, peer_ms / ms, survivors))
    del want_mask


def _smoke_mode() -> None:
    import os

    global DEVICE, K, REQUESTS, PER_REQUEST, CONTEXT, SHORT, PREFILL_ROWS, PREFILL_WIDTH, SMOKE_DIVISOR, BLOCK_TOKENS
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    DEVICE, K, REQUESTS, PER_REQUEST, CONTEXT, BLOCK_TOKENS = "cpu", 16, 2, 2, 512, 16
    SHORT, PREFILL_ROWS, PREFILL_WIDTH, SMOKE_DIVISOR = 64, 16, 128, 64


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny shapes on the CPU under TRITON_INTERPRET=1 (fp32 queries): runs every step of "
                             "the script, times nothing meaningful")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        _smoke_mode()
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise CheckError("topk_sweep: needs a CUDA device, none is visible")
    started = time.time()
    import triton

    torch.manual_seed(0)
    ceiling = timing.announce(torch, triton, DEVICE)
    scores, lengths = indexer_scores(torch)
    finite = scores[torch.isfinite(scores)]
    print(f"indexer scores {tuple(scores.shape)}: finite min {finite.min().item():.3g} max {finite.max().item():.3g}, "
          f"{100 * (finite == 0).float().mean().item():.1f}% zeros ({time.time() - started:.0f} s)", flush=True)
    del finite
    rows, failures = [], []
    for case in build_cases(torch, scores, lengths):
        run_case(torch, case, rows, failures)
    if DEVICE == "cuda":
        for variant in (VARIANTS[2], VARIANTS[4]):
            check_graph(torch, scores, lengths, _kwargs(variant[1]), failures)
    print(f"\n| case | variant | ms | GB/s | % copy | torch.topk / variant | survivors mean / max |")
    print("|---|---|---:|---:|---:|---:|---|")
    for case, variant, ms, gbps, ratio, survivors in rows:
        print(f"| {case} | {variant} | {ms:.4f} | {gbps:.0f} | {100 * gbps / (ceiling * 1e3):.1f} | {ratio:.2f} | "
              f"{survivors} |")
    return finish("topk_sweep", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("topk_sweep", main)
