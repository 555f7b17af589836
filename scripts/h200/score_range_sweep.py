"""The DSA layer over token ranges of its index scores: the bound's cost, and whether ranges small enough to stay in
L2 make the layer faster (issue 18, item 4: the score matrix round trip).

Usage (on the H200, from the repository with dsahal importable)::

    python3 scripts/h200/score_range_sweep.py [--cpu-smoke]

Since the thirty-second session the layer (`dsahal.ops.dsa_attention` on `nvidia`) scores and selects over token
ranges whose `[T, context]` fp32 scores fit ``dsahal.ops.score_ranges.SCORES_BUDGET_BYTES`` (512 MiB): one range for
the seed's 64 x 5 decode batch at 128K (168 MiB of scores). Ranges of a few tens of MiB would leave a range's scores
in the H200's 50 MiB L2 between the indexer writing them and the top-k reading them (if the key stream does not evict
them first), at the price of more, smaller launches. Cases as ``dsahal bench`` builds them
(``dsahal.bench.cases.build_dsa``'s inputs, the nvidia layer called directly: 64 x 5 tokens at 128K, fp8_ds_mla latents, FP8 index keys, top-k 2048) at H = 128
and 16. First, in batch-invariant mode, the smallest budget's output must be the one-range output bit for bit (a range
is a smaller batch); then, in default mode, each budget's output against the one-range output (bitwise, or how many
rows differ, stage by stage: the index scores (beyond 1e-5 of their row's largest is a failure), the rows that select
other slots, the output rows that differ; an output that differs on the same slots is a failure), and one table of ms
(median of CUDA events), budget by budget, same run. The layer's ranges are planned as the whole call (the indexer's
``requests``: :func:`dsahal.ops.score_ranges.requests_in_range`); before that (thirty-third session, first run) a
range of 160 tokens read as 3 tokens a request and 36-40 of 320 rows selected other slots. ``--cpu-smoke``: tiny shapes under the Triton interpreter, nothing timed.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402 (scripts/h200/timing.py)
from invariant_mla_check import set_mode  # noqa: E402 (the process's mode, as a backend built in it reads it)
from script_cli import finish, run, smoke_args, start  # noqa: E402

MIB = 2**20
# None: the shipped budget; 48 MiB: ranges of 96 tokens, which split requests of 5 tokens
BUDGETS = (None, 128 * MIB, 64 * MIB, 48 * MIB, 32 * MIB, 16 * MIB, 8 * MIB)


def layer(torch, requests: int, per_request: int, context: int, heads: int, device: str, topk: int):
    """The bench's DSA case (``dsahal.bench.cases.build_dsa``'s inputs) as a call of the nvidia backend's layer."""
    from dsahal.backends.nvidia import ops as nvidia_ops
    from dsahal.bench.cases import INDEX_HEADS, MLA_SCALE
    from dsahal.bench.inputs import decode_batch, random_pages

    block_table, req_ids, positions, blocks = decode_batch(requests, per_request, context, 64, device)
    index_pages = random_pages("index", "fp8", blocks, 64, device)
    kv_pages = random_pages("latent", "fp8_ds_mla", blocks, 64, device)
    tokens = req_ids.shape[0]
    q_index = torch.randn(tokens, INDEX_HEADS, 128, device=device).to(torch.float8_e4m3fn)
    weights = torch.rand(tokens, INDEX_HEADS, device=device)
    # (bf16 queries on the GPU; fp32 under the interpreter, whose bf16 dots are wrong)
    q = torch.randn(tokens, heads, 576, device=device).to(torch.bfloat16 if device == "cuda" else torch.float32)
    args = (q_index, weights, index_pages, q, kv_pages, block_table, req_ids, positions, "fp8", "fp8_ds_mla", None,
            topk, context, MLA_SCALE)
    return lambda: nvidia_ops.dsa_attention(*args)


def stages(call):
    """``call()``'s output with the index scores (each range's rows, concatenated) and the slots it selected: the
    nvidia layer's indexer and slot helper observed through their module attributes for this one call."""
    import torch

    from dsahal.backends.nvidia import ops as nvidia_ops

    indexer, over_ranges, seen = nvidia_ops._indexer.indexer_score, nvidia_ops.slots_over_score_ranges, {}

    def scoring(*args, **kwargs):
        result = indexer(*args, **kwargs)
        scores = result[0] if isinstance(result, tuple) else result  # (with the fused group maxima: (scores, filled))
        seen.setdefault("scores", []).append(scores.clone())  # (the layer reuses its buffer range by range)
        return result

    def selecting(*args, **kwargs):
        seen["slots"] = over_ranges(*args, **kwargs)
        return seen["slots"]

    nvidia_ops._indexer.indexer_score, nvidia_ops.slots_over_score_ranges = scoring, selecting
    try:
        o, _ = call()
    finally:
        nvidia_ops._indexer.indexer_score, nvidia_ops.slots_over_score_ranges = indexer, over_ranges
    return o, torch.cat(seen["scores"]), seen["slots"]


def explain(torch, o, scores, slots, want_o, want_scores, want_slots):
    """(verdict, failure or None) of a ranged layer against the one-range one, stage by stage. Scores differing
    beyond 1e-5 of the row's largest are a failure (a range scored other keys or tokens, not other last bits), as is
    an output that differs on the same slots (the sparse-MLA call is one launch on all the slots either way); rows
    whose selection changed are reported (a last-bit change of a score at the k-th place swaps a slot, which moves a
    row by ~1e-2 on random inputs)."""
    finite = torch.isfinite(want_scores)
    if not torch.equal(finite, torch.isfinite(scores)):
        return "", "the ranges' scores are -inf at other places than the one range's"
    diff = (scores - want_scores).abs().where(finite, torch.zeros_like(scores)).amax(1)
    scale = want_scores.abs().where(finite, torch.zeros_like(scores)).amax(1).clamp_min(1e-30)
    score_err = float((diff / scale).max()) if diff.numel() else 0.0
    if score_err > 1e-5:
        return "", f"index scores differ by {score_err:.1e} of their row's largest"
    score_rows = int((diff > 0).sum())
    selected = int((slots.sort(1).values != want_slots.sort(1).values).any(1).sum())
    if selected == 0 and not torch.equal(o, want_o):
        return "", "the output differs on the same slots"
    if torch.equal(o, want_o):
        return "bitwise", None
    out_rows = int((o != want_o).flatten(1).any(1).sum())
    return (f"{score_rows} rows' scores differ (<= {score_err:.0e} rel), {selected} rows select other slots, "
            f"{out_rows} output rows differ", None)


def main(argv=None) -> int:
    args = smoke_args(__doc__.splitlines()[0], argv)
    device = "cpu" if args.cpu_smoke else "cuda"
    torch, _, started, _ = start("score_range_sweep", device)
    import contextlib

    from dsahal.ops import score_ranges
    from dsahal.registry import use_backend

    shipped = score_ranges.SCORES_BUDGET_BYTES
    requests, per_request, context, topk = (2, 3, 256, 16) if args.cpu_smoke else (64, 5, 128 * 1024, 2048)
    budgets = (None, 4 * 1024, 2 * 1024) if args.cpu_smoke else BUDGETS
    tokens, padded = requests * per_request, -(-context // 16) * 16
    failures, lines = [], []
    rows = ["| case | budget | ranges | output vs one range | ms | vs one range |",
            "| --- | --- | ---: | --- | ---: | ---: |"]

    def ranged(call, budget):
        score_ranges.SCORES_BUDGET_BYTES = shipped if budget is None else budget
        try:
            return call(), len(score_ranges.score_ranges(tokens, padded))
        finally:
            score_ranges.SCORES_BUDGET_BYTES = shipped

    # (the layer's sparse-MLA stage goes through the public op: on the GPU the nvidia backend's routes)
    with contextlib.nullcontext() if args.cpu_smoke else use_backend("nvidia"):
        for heads in ((16,) if args.cpu_smoke else (128, 16)):
            # batch-invariant mode first: a range is a smaller batch, so the output must be the one range's, bit for bit
            set_mode(True)
            call = layer(torch, requests, per_request, context, heads, device, topk)
            (want, _), ((got, _), count) = call(), ranged(call, budgets[-1])
            same = torch.equal(got, want)
            lines.append(f"{'pass' if same else 'FAIL'} batch-invariant H={heads}: {count} ranges vs one, "
                         f"{'bitwise equal' if same else 'differ'}")
            failures += [] if same else [lines[-1]]
            set_mode(False)
            # default mode, timed: a range's rows may differ in the last bits (an indexer may group a request's tokens)
            want_o, want_scores, want_slots = stages(call)
            base = None
            for budget in budgets:
                ((o, scores, slots), count) = ranged(lambda: stages(call), budget)
                verdict, failure = explain(torch, o, scores, slots, want_o, want_scores, want_slots)
                if failure:
                    failures.append(f"H={heads} budget {budget}: {failure}")
                    continue
                score_ranges.SCORES_BUDGET_BYTES = shipped if budget is None else budget
                try:
                    ms = timing.bench_ms(call, device)
                finally:
                    score_ranges.SCORES_BUDGET_BYTES = shipped
                base = ms if budget is None else base
                label = "shipped (512 MiB)" if budget is None else f"{budget / MIB:g} MiB"
                rows.append(f"| {requests} x {per_request} at {context}, H={heads} | {label} | {count} | {verdict} | "
                            f"{ms:.3f} | {ms / base:.2f}x |")
            del call
    print("\n".join(lines))
    print("\n".join(rows))
    return finish("score_range_sweep", failures, started)


if __name__ == "__main__":
    run("score_range_sweep", main)
