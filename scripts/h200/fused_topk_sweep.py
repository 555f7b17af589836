"""The fused indexer -> top-k (issue 18 item 4) against the unfused pair and ``torch.topk``, checked and timed
in the same run on one Hopper GPU.

Usage (on a CUDA machine, from the repository root with dsahal importable)::

    python3 scripts/h200/fused_topk_sweep.py [--cpu-smoke]

What is fused: the block-tile indexer writes the groups top-k's group maxima from its registers as it scores
(``indexer_score(..., group_maxima=...)``) and the top-k skips the pass that reads every score to find them
(``topk(..., group_maxima=...)``); the nvidia backend's ``dsa_attention`` does this whenever the top-k is the
groups method (rows of >= 64K keys outside batch-invariant mode).

Steps, in order, each printed:

1. the copy ceiling measured in this run;
2. per shape (FP8 keys, FP8 queries, 32 heads, 64-token blocks: 64 x 1, 64 x 2, 64 x 5 at 128K, 8 x 1 at 1M),
   checks first: the fused maxima equal the group maxima recomputed by torch from the scores the same launch
   stored; the fused top-k is bit for bit the unfused one; the unfused one is the tie rule's set on those scores
   (the mask torch.topk's k-th value gives);
3. timing (``do_bench`` median): the indexer alone, the indexer writing the maxima, the top-k alone and from the
   given maxima, both pairs end to end, and ``torch.topk`` on the same scores; the key-read floor (key bytes /
   copy ceiling) and each pair's ratio to it (issue 18's goal: <= 1.2x);
4. the DSA layer (64 x 5 at 128K, fp8_ds_mla latents, H = 128 and 16): ``dsahal.ops.dsa_attention`` on the
   nvidia backend (fused) against the same stages unfused (the previous layer: indexer, top-k with the slots,
   ``ops.sparse_mla``), outputs compared bit for bit first.

A failed check is listed and the script exits with one ``error:`` line (after timing what passed).
"""
from __future__ import annotations

import os
import time

os.environ.setdefault("DSAHAL_BACKEND", "nvidia")

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from script_cli import finish, run, smoke_args, start  # scripts/h200/script_cli.py
from topk_sweep import expected_mask  # scripts/h200/topk_sweep.py

HEADS = 32
TOPK = 2048
BLOCK_TOKENS = 64
DEVICE = "cuda"  # --cpu-smoke: "cpu" under TRITON_INTERPRET=1


def shapes():
    """[(label, requests, tokens per request, keys per request)]."""
    if DEVICE == "cpu":
        return [("2x2 @512", 2, 2, 512)]
    k = 1024
    return [("64x1 @128K", 64, 1, 128 * k), ("64x2 @128K", 64, 2, 128 * k), ("64x5 @128K", 64, 5, 128 * k),
            ("8x1 @1M", 8, 1, 1024 * k)]


def topk_cfg(width: int) -> dict:
    from dsahal.backends.nvidia.config import topk_config

    if DEVICE == "cpu":  # short rows in the smoke run: the groups method by hand
        return dict(method="groups", chunk=64, steps=2, batch=8, finish_chunk=64)
    cfg = dict(topk_config(width))
    if cfg.get("method") != "groups":
        raise RuntimeError(f"fused_topk_sweep: the backend's top-k at width {width} is {cfg.get('method')}, not groups")
    return cfg


def sort_keys(torch, scores):
    """Order-preserving keys (``topk_common._sort_key``) of fp32 ``scores`` as int64."""
    x = torch.where(scores == 0, torch.zeros_like(scores), scores)
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return torch.where(bits >= 0x80000000, bits ^ 0xFFFFFFFF, bits | 0x80000000)


def expected_maxima(torch, scores, positions, size: int, columns: int):
    """``[T, columns]`` int64 keys: each group's max over entries ``<= position``, 0 for none."""
    tokens, width = scores.shape
    padded = torch.full((tokens, columns * size), float("-inf"), device=scores.device)
    padded[:, :width] = scores
    cols = torch.arange(columns * size, device=scores.device)
    padded.masked_fill_(cols[None, :] > positions.to(torch.int64)[:, None], float("-inf"))
    best = padded.view(tokens, columns, size).amax(dim=2)
    return torch.where(torch.isneginf(best), torch.zeros_like(best, dtype=torch.int64), sort_keys(torch, best))


class Pair:
    """The indexer and top-k of one shape, fused and not, on fixed inputs."""

    def __init__(self, torch, pages, table, req, pos, context, gen):
        from dsahal.backends.nvidia.config import indexer_config
        from dsahal.backends.triton_kernels.topk_groups import group_layout

        tokens = req.shape[0]
        # (every check below is against this run's own scores, so the interpreter's e4m3 cast may round as it does)
        self.q = torch.randn(tokens, HEADS, 128, device=DEVICE, generator=gen).to(torch.float8_e4m3fn)
        self.w = torch.rand(tokens, HEADS, device=DEVICE, generator=gen) + 0.01
        self.pages, self.table, self.req, self.pos, self.context = pages, table, req, pos, context
        self.index_cfg = dict(indexer_config(HEADS, self.q.dtype, "fp8"))
        if DEVICE == "cpu":
            self.index_cfg["block_tiles"] = dict(self.index_cfg["block_tiles"], block_n=16, tiles=2)
        self.topk_cfg = topk_cfg(context)
        layout_args = {n: self.topk_cfg[n] for n in ("chunk", "steps", "group_size", "batch") if n in self.topk_cfg}
        self.layout = group_layout(context, TOPK, **layout_args)
        self.scores = torch.empty(tokens, context, device=DEVICE)
        self.maxima = torch.zeros(tokens, self.layout.columns, dtype=torch.int32, device=DEVICE)
        self.lengths = torch.clamp(pos + 1, max=context).to(torch.int32)

    def index(self):
        from dsahal.backends.triton_kernels.indexer import indexer_score

        return indexer_score(self.q, self.w, self.pages, self.table, self.req, self.pos, "fp8", self.context,
                             out=self.scores, **self.index_cfg)

    def index_fused(self):
        from dsahal.backends.triton_kernels.indexer import indexer_score

        return indexer_score(self.q, self.w, self.pages, self.table, self.req, self.pos, "fp8", self.context,
                             out=self.scores, group_maxima=(self.maxima, self.layout.size), **self.index_cfg)

    def topk(self):
        from dsahal.backends.triton_kernels.topk import topk

        return topk(self.scores, self.lengths, TOPK, **self.topk_cfg)

    def topk_given(self):
        from dsahal.backends.triton_kernels.topk import topk

        return topk(self.scores, self.lengths, TOPK, group_maxima=self.maxima, **self.topk_cfg)

    def torch_topk(self):
        import torch

        return torch.topk(self.scores, min(TOPK, self.context), dim=1)

    def plain(self):
        self.index()
        return self.topk()

    def fused(self):
        self.index_fused()
        return self.topk_given()


def check_pair(torch, pair, failures, label) -> bool:
    pair.index_fused()
    fused_scores = pair.scores.clone()
    want = expected_maxima(torch, fused_scores, pair.pos, pair.layout.size, pair.layout.columns)
    maxima_ok = torch.equal(pair.maxima.to(torch.int64) & 0xFFFFFFFF, want)
    live = float((want > 0).float().mean())
    got_fused = pair.topk_given()
    pair.index()
    scores_same = torch.equal(pair.scores, fused_scores)  # the maxima change no score
    got_plain = pair.topk()
    same = torch.equal(got_fused, got_plain)
    mask = expected_mask(torch, pair.scores, pair.lengths, TOPK)
    width = mask.shape[1]
    valid = got_plain >= 0
    chosen = torch.zeros(mask.shape[0], width + 1, dtype=torch.bool, device=mask.device)  # (-1 -> spare column)
    chosen.scatter_(1, torch.where(valid, got_plain, width).long(), True)
    padded_last = bool((valid[:, 1:] <= valid[:, :-1]).all())  # -1 padding only after the chosen entries
    rule_ok = torch.equal(chosen[:, :width], mask) and padded_last and int(valid.sum()) == int(mask.sum())
    ok = maxima_ok and scores_same and same and rule_ok
    print(f"  check {label:<12s} maxima {'ok' if maxima_ok else 'FAIL'} (non-empty groups {100 * live:.0f}%), "
          f"scores unchanged {scores_same}, fused == unfused {same}, tie-rule set {rule_ok}", flush=True)
    if not ok:
        failures.append(f"{label}: maxima {maxima_ok}, scores {scores_same}, fused==unfused {same}, rule {rule_ok}")
    return ok


def time_pairs(torch, failures, ceiling):
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    blocks = max(r * -(-c // BLOCK_TOKENS) for _, r, _, c in shapes())
    pages = cache_pools.index_pool(torch, "fp8", blocks, gen, DEVICE, BLOCK_TOKENS)
    rows = []
    for label, requests, per_request, context in shapes():
        table, req, pos = cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, DEVICE,
                                                   BLOCK_TOKENS)
        pair = Pair(torch, pages, table, req, pos, context, gen)
        if not check_pair(torch, pair, failures, label):
            continue
        floor_ms = requests * context * pages.shape[2] / (ceiling * 1e12) * 1e3
        ms = {name: timing.bench_ms(getattr(pair, name), DEVICE, warmup=5, rep=40)
              for name in ("index", "index_fused", "topk", "topk_given", "torch_topk", "plain", "fused")}
        rows.append((label, floor_ms, ms))
        print(f"  {label} timed", flush=True)
    print("\n| shape | key floor | indexer | indexer + maxima | top-k | top-k, given maxima | torch.topk | "
          "indexer + top-k | fused | fused / floor | fused vs unfused |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for label, floor_ms, ms in rows:
        print(f"| {label} | {floor_ms:.3f} | {ms['index']:.3f} | {ms['index_fused']:.3f} | {ms['topk']:.3f} | "
              f"{ms['topk_given']:.3f} | {ms['torch_topk']:.3f} | {ms['plain']:.3f} | {ms['fused']:.3f} | "
              f"{ms['fused'] / floor_ms:.2f}x | {ms['plain'] / ms['fused']:.2f}x |")


def time_layer(torch, failures):
    """The DSA layer at 64 x 5, 128K, fp8_ds_mla: the backend's (fused) against the stages unfused."""
    from dsahal import ops
    from dsahal.backends.nvidia import config
    from dsahal.backends.nvidia.ops import indexer_score
    from dsahal.backends.triton_kernels import topk as topk_kernels

    if DEVICE == "cpu":
        return
    requests, per_request, context = 64, 5, 128 * 1024
    blocks = requests * context // BLOCK_TOKENS
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    index_pages = cache_pools.index_pool(torch, "fp8", blocks, gen, DEVICE, BLOCK_TOKENS)
    kv_pages, _ = cache_pools.latent_pools(torch, ["fp8_ds_mla"], blocks * BLOCK_TOKENS, DEVICE)["fp8_ds_mla"]
    table, req, pos = cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, DEVICE,
                                               BLOCK_TOKENS)
    tokens = req.shape[0]
    q_index = torch.randn(tokens, HEADS, 128, device=DEVICE, generator=gen).to(torch.float8_e4m3fn)
    w = torch.rand(tokens, HEADS, device=DEVICE, generator=gen) + 0.01
    scale = 192 ** -0.5
    print("\n| DSA layer 64x5 @128K, fp8_ds_mla | dsa_attention (fused) | stages unfused | ratio |\n|---|---|---|---|")
    for heads in (128, 16):
        q = torch.randn(tokens, heads, 576, device=DEVICE, generator=gen).to(torch.bfloat16)
        kw = dict(index_fmt="fp8", kv_fmt="fp8_ds_mla", kv_scale=None, topk=TOPK, max_context=context,
                  softmax_scale=scale, check=False)

        def fused():
            return ops.dsa_attention(q_index, w, index_pages, q, kv_pages, table, req, pos, **kw)

        def unfused():
            scores = indexer_score(q_index, w, index_pages, table, req, pos, "fp8", context)
            lengths = torch.clamp(pos.to(torch.int32) + 1, max=context)
            slots = topk_kernels.topk(scores, lengths, TOPK, emit_slots=(req, table, BLOCK_TOKENS),
                                      **config.topk_config(context))
            return ops.sparse_mla(q, kv_pages, slots, kv_fmt="fp8_ds_mla", kv_scale=None, softmax_scale=scale,
                                  check=False)

        (o1, l1), (o2, l2) = fused(), unfused()
        if not (torch.equal(o1, o2) and torch.equal(l1, l2)):
            failures.append(f"DSA layer H={heads}: fused and unfused outputs differ")
            print(f"| H={heads} | outputs differ: not timed | | |")
            continue
        a = timing.bench_ms(fused, DEVICE, warmup=5, rep=40)
        b = timing.bench_ms(unfused, DEVICE, warmup=5, rep=40)
        print(f"| H={heads} | {a:.3f} ms | {b:.3f} ms | {b / a:.2f}x |", flush=True)


def main(argv=None) -> int:
    global DEVICE, BLOCK_TOKENS
    if smoke_args(__doc__.splitlines()[0], argv).cpu_smoke:
        DEVICE, BLOCK_TOKENS = "cpu", 16
    torch, triton, started, ceiling = start("fused_topk_sweep", DEVICE)
    failures: list[str] = []
    print("\nindexer -> top-k, checks then timing")
    time_pairs(torch, failures, ceiling)
    print(f"\nDSA layer ({time.time() - started:.0f} s)", flush=True)
    time_layer(torch, failures)
    return finish("fused_topk_sweep", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("fused_topk_sweep", main)
