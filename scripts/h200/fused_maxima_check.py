"""The fused indexer -> top-k (issue 18, item 4): the Gluon indexer also stores the top-k's group maxima, and the
top-k's groups method skips its first pass (a read of every score). Checked first, then timed against the two stages
apart, same run.

Usage (on the H200, from the repository with dsahal importable)::

    python3 scripts/h200/fused_maxima_check.py [--cpu-smoke]

Cases as the DSA layer calls them (``dsahal.bench.inputs``' decode batches: 64 requests x 1 / 2 / 5 tokens at 128K,
8 x 3 at an odd width of 100,037 whose last tile and group are partial, with some unmapped blocks and one request
of a shorter context), 32 index heads, FP8 keys with FP8 and bf16 queries, MXFP4 keys with FP8 queries, each with the
backend's indexer launch (``config.indexer_config``) and top-k configuration (``config.topk_config``: the groups
method from 64K). Checks, per case: the call took the Gluon kernel and filled the maxima (their buffer starts as
garbage but for the tail columns the layer zeroes); the scores are the unfused launch's, bit for bit; the maxima are the
group maxima of those scores below each row's length, bit for bit (built in torch: ``topk_groups.maxima_of``, the
contract of ``topk_groups.topk_groups``' ``maxima``); the top-k with them is the top-k without them, bit for bit. Then ms (median
of CUDA events) of the indexer with and without the maxima and of the top-k with and without them, and of the nvidia
DSA layer (64 x 1 / 2 / 5 at 128K, fp8_ds_mla latents, H = 128 and 16) with ``config.FUSED_GROUP_MAXIMA`` forced on
and off (its output bitwise the same; GPU time from CUDA-graph replays, timed off, on, on, off, two timings averaged
a side). ``--cpu-smoke``: tiny shapes, the interpreter; Gluon does not run there, so it checks that the calls say
they did not fill the maxima and that the top-k takes the torch-built ones (nothing timed).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402 (scripts/h200/timing.py)
from script_cli import finish, run, smoke_args, start  # noqa: E402

GARBAGE = 0x5A5A5A5A  # what the maxima buffer holds before the indexer writes it (a key no score has here)


def cases(torch, smoke: bool):
    """(label, requests, tokens a request, context, index format, query dtype, edges)."""
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    if smoke:  # (fp32 queries: the interpreter's bf16 dots are wrong; the tl kernel takes them)
        return [("2 x 3 at 300, fp8 keys", 2, 3, 300, "fp8", torch.float32, True)]
    ctx = 128 * 1024
    return [("64 x 5 at 128K, fp8 keys, fp8 q", 64, 5, ctx, "fp8", fp8, False),
            ("64 x 5 at 128K, fp8 keys, bf16 q", 64, 5, ctx, "fp8", bf16, False),
            ("64 x 5 at 128K, mxfp4 keys, fp8 q", 64, 5, ctx, "mxfp4", fp8, False),
            ("64 x 1 at 128K, fp8 keys, fp8 q", 64, 1, ctx, "fp8", fp8, False),
            ("64 x 2 at 128K, fp8 keys, fp8 q", 64, 2, ctx, "fp8", fp8, False),
            ("8 x 3 at 100,037 (edges), fp8 keys, fp8 q", 8, 3, 100037, "fp8", fp8, True),
            ("8 x 3 at 100,037 (edges), fp8 keys, bf16 q", 8, 3, 100037, "fp8", bf16, True)]


def build(torch, requests, per_request, context, index_fmt, q_dtype, edges, device):
    from dsahal.bench.cases import INDEX_HEADS
    from dsahal.bench.inputs import decode_batch, random_pages

    block_table, req_ids, positions, blocks = decode_batch(requests, per_request, context, 64, device)
    if edges:  # unmapped blocks, and one request's tokens well inside the context (tiles past its reach)
        block_table[0, 1] = -1
        block_table[-1, -2:] = -1
        positions[:per_request] -= context // 3
    pages = random_pages("index", index_fmt, blocks, 64, device)
    tokens = req_ids.shape[0]
    q = torch.randn(tokens, INDEX_HEADS, 128, device=device).to(q_dtype)
    weights = torch.rand(tokens, INDEX_HEADS, device=device)
    return q, weights, pages, block_table, req_ids, positions


def main(argv=None) -> int:
    args = smoke_args(__doc__.splitlines()[0], argv)
    smoke = args.cpu_smoke
    device = "cpu" if smoke else "cuda"
    torch, _, started, _ = start("fused_maxima_check", device)
    from dsahal.backends.nvidia import config
    from dsahal.backends.triton_kernels import indexer, topk as topk_module
    from dsahal.backends.triton_kernels.topk_groups import maxima_layout, maxima_of

    k = 16 if smoke else 2048
    failures = []
    rows = ["| case | indexer ms | + maxima | top-k ms | with maxima | both apart | fused | fused / apart |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, requests, per_request, context, index_fmt, q_dtype, edges in cases(torch, smoke):
        q, weights, pages, block_table, req_ids, positions = build(torch, requests, per_request, context, index_fmt,
                                                                   q_dtype, edges, device)
        options = config.indexer_config(q.shape[1], q_dtype, index_fmt)
        topk_options = dict(config.topk_config(context))
        if smoke:  # the groups method at the smoke's width (the backend's starts at 64K)
            topk_options = dict(method="groups", chunk=16, steps=2, batch=4, group_size=8, num_warps=1,
                                finish_chunk=16, finish_warps=1, segment_histograms=True)
        size, columns = maxima_layout(context, k, **topk_options)
        lengths = torch.clamp(positions + 1, max=context).to(torch.int32)
        maxima = torch.full((q.shape[0], columns), GARBAGE, dtype=torch.int32, device=device)
        maxima[:, -(-context // size):] = 0  # (the layer's zeroed tail)
        args_ = (q, weights, pages, block_table, req_ids, positions, index_fmt, context)
        scores, filled = indexer.indexer_score(*args_, group_maxima=maxima, maxima_group=size, **options)
        plain = indexer.indexer_score(*args_, **options)
        want = maxima_of(plain, lengths, size, columns)
        problems = []
        if filled == smoke:
            problems.append(f"filled={filled} ({'no Gluon kernel here' if smoke else 'the Gluon kernel expected'})")
        if not torch.equal(scores.view(torch.int32), plain.view(torch.int32)):
            problems.append("the scores differ from the unfused launch's")
        if filled and not torch.equal(maxima, want):
            bad = (maxima != want).any(dim=1).nonzero().flatten().tolist()
            problems.append(f"maxima differ in {len(bad)} rows (first {bad[:5]}; "
                            f"{int((maxima == GARBAGE).sum())} entries never written)")
        given = maxima if filled else want
        out = topk_module.topk(plain, lengths, k, **topk_options)
        fused = topk_module.topk(plain, lengths, k, group_maxima=given, **topk_options)
        if not torch.equal(out, fused):
            problems.append("the top-k with the maxima differs from the top-k without")
        verdict = "ok" if not problems else "FAIL: " + "; ".join(problems)
        print(f"{label}: {verdict}", flush=True)
        failures += [f"{label}: {p}" for p in problems]
        if smoke or problems:
            continue
        ms = [timing.bench_ms(lambda: indexer.indexer_score(*args_, **options), device),
              timing.bench_ms(lambda: indexer.indexer_score(*args_, group_maxima=maxima, maxima_group=size,
                                                            **options), device),
              timing.bench_ms(lambda: topk_module.topk(plain, lengths, k, **topk_options), device),
              timing.bench_ms(lambda: topk_module.topk(plain, lengths, k, group_maxima=maxima, **topk_options),
                              device)]
        apart, together = ms[0] + ms[2], ms[1] + ms[3]
        rows.append(f"| {label} | {ms[0]:.3f} | {ms[1]:.3f} | {ms[2]:.3f} | {ms[3]:.3f} | {apart:.3f} | "
                    f"{together:.3f} | {together / apart:.3f} |")
    print("\n".join(rows))
    if not smoke:
        failures += layer_on_and_off(torch, config, device)
    return finish("fused_maxima_check", failures, started)


def layer_on_and_off(torch, config, device) -> list:
    """The nvidia DSA layer (64 x 1 / 2 / 5 at 128K, fp8_ds_mla latents, FP8 index keys and queries) with the fused
    maxima on (at every call length) and off: the same output bit for bit, and ms of GPU time each (CUDA-graph
    replays)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from score_range_sweep import layer

    from dsahal.registry import use_backend

    failures = []
    rows = ["| DSA layer at 128K | apart ms | fused ms | fused / apart |", "| --- | ---: | ---: | ---: |"]
    shipped = config.FUSED_GROUP_MAXIMA, config.FUSED_MAXIMA_TOKENS
    with use_backend("nvidia"):
        for per_request, heads in ((1, 128), (1, 16), (2, 16), (5, 128), (5, 16)):
            call = layer(torch, 64, per_request, 128 * 1024, heads, device, 2048)
            outputs, times = {}, {False: [], True: []}
            # off, on, on, off: the mean of two timings each, so neither side gains from going first (the 35th
            # session's pair and layer disagreed by a few per cent)
            for on in (False, True, True, False):
                config.FUSED_GROUP_MAXIMA = frozenset({("fp8", torch.float8_e4m3fn)}) if on else frozenset()
                config.FUSED_MAXIMA_TOKENS = 8
                try:
                    if on not in outputs:
                        outputs[on] = call()[0]
                    # GPU time: a CUDA graph's replay (the eager layer is host-bound at 64 x 1 and 64 x 2: R1 of the
                    # 36th session read 0.75-0.91 ms for the same apart layer at 64 x 1, H = 128)
                    graph = timing.captured(torch, call) if device == "cuda" else None
                    times[on].append(timing.bench_ms(graph.replay if graph else call, device))
                    del graph
                finally:
                    config.FUSED_GROUP_MAXIMA, config.FUSED_MAXIMA_TOKENS = shipped
            if not torch.equal(outputs[True], outputs[False]):
                failures.append(f"DSA layer 64 x {per_request}, H={heads}: the fused layer's output differs")
            apart, fused = (sum(times[on]) / 2 for on in (False, True))
            rows.append(f"| 64 x {per_request}, H = {heads} | {apart:.3f} | {fused:.3f} | {fused / apart:.3f} |")
            del call
    print("\n".join(rows))
    return failures


if __name__ == "__main__":
    run("fused_maxima_check", main)
