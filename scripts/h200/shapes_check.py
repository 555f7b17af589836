"""Unusual but valid shapes through the nvidia backend's routes, each against the reference backend on the same
inputs (no timing): the shapes the conformance suite's strategies do not draw.

* ``sparse_mla``: heads 1, 17, 33, 65, 100, 129, 256 (the routes' head groups, FlashMLA's padding, the general
  kernel past 128), top-k 1, 65, 700, 2049, 4096, int64 slots, duplicates, -1 slots, a row with none valid,
  q a strided view, every latent format, 1- and 128-token blocks, tiny and large softmax scales;
* ``indexer_score``: 3, 8, 48, 64 and 128 index heads, contexts of 1, 63, 65 and 4,097 keys, unmapped blocks in
  the middle of a request, bf16 and FP8 queries, every index format;
* ``topk``: k of 1, the width, past the width, 2048 of 2049; rows all -inf, all tied, ties at the k-th value, +0.0 /
  -0.0 mixed, lengths short of the row;
* ``lse_combine``: 1, 7 and 40 parts, 1 / 129 heads, parts far apart and all -inf;
* ``dsa_attention``: 64 index heads with 128 / 64 / 20 latent heads, top-k past the context, 1- and 16-token blocks,
  requests of different lengths.

Each case prints the routes that served it (an op observer: a reference fallback is named) and the error against
the reference; a case over its bound, an exception, or a non-finite value where the reference has none is a
failure (listed at the end; one ``error:`` line, status 1).

    python3 scripts/h200/shapes_check.py [--cpu-smoke]

``--cpu-smoke``: a few of the cases on the CPU through the reference backend against itself (checks the script).
"""
from __future__ import annotations

import sys
import time

import torch

from edge_check import Routes  # scripts/h200/edge_check.py
from script_cli import CheckError, finish, run  # scripts/h200/script_cli.py

SMOKE = "--cpu-smoke" in sys.argv[1:]
DEVICE = "cpu" if SMOKE else "cuda"
BACKEND = "reference" if SMOKE else "nvidia"


def both(set_backend, routes, call):
    """``call()`` on the backend under test, then on the reference backend (the same inputs): ``(got, want, the
    routes that served got)``."""
    set_backend(BACKEND)
    routes.take()
    got = call()
    served = routes.take()
    set_backend("reference")
    try:
        want = call()
    finally:
        set_backend(BACKEND)
        routes.take()
    return got, want, served


def rel_err(got, want) -> float:
    """max |got - want| / max |want| over the entries finite in ``want`` (inf if the finite patterns differ)."""
    got, want = got.double(), want.double()
    finite = torch.isfinite(want)
    if not torch.equal(finite, torch.isfinite(got)) or not torch.equal(got[~finite], want[~finite]):
        return float("inf")
    if not bool(finite.any()):
        return 0.0
    return float((got[finite] - want[finite]).abs().max() / want[finite].abs().max().clamp_min(1e-30))


class Checker:
    def __init__(self, ops, set_backend, routes):
        self.ops, self.set_backend, self.routes, self.failures = ops, set_backend, routes, []

    def check(self, label, call, compare, bound):
        """Run ``call`` on both backends and ``compare(got, want)`` -> error, against ``bound``."""
        try:
            got, want, routes = both(self.set_backend, self.routes, call)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            err = compare(got, want)
            ok = err <= bound
            print(f"{label}: {'ok' if ok else 'WRONG'} err {err:.2e} (bound {bound:.0e}) [{routes}]", flush=True)
            if not ok:
                self.failures.append(f"{label}: error {err:.3e} over {bound:.0e} [{routes}]")
        except Exception as exc:  # noqa: BLE001 - a failed case is listed, the rest still run
            self.routes.take()
            self.failures.append(f"{label}: {type(exc).__name__}: {str(exc)[:300]}")
            print(f"{label}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)


def attention_err(got, want) -> float:
    return max(rel_err(got[0], want[0]), rel_err(got[1], want[1]) if torch.isfinite(want[1]).any() else 0.0)


def latent_pages(fmt, blocks, block_tokens, gen):
    from dsahal.formats import latent_format

    spec = latent_format(fmt)
    scale = torch.tensor(4.0 / 448.0, device=DEVICE) if spec.needs_tensor_scale else None
    values = torch.randn(blocks * block_tokens, 576, device=DEVICE, generator=gen) + 1e-3
    return spec.pack(values, scale).view(blocks, block_tokens, spec.token_bytes), scale


def index_pages(fmt, blocks, block_tokens, gen):
    from dsahal.formats import index_format

    spec = index_format(fmt)
    values = torch.randn(blocks * block_tokens, 128, device=DEVICE, generator=gen) + 1e-3
    return spec.pack(values, None).view(blocks, block_tokens, spec.token_bytes)


def sparse_mla_cases(c: Checker):
    gen = torch.Generator(device=DEVICE).manual_seed(11)
    cases = [("fp8_ds_mla", h, 70, 700, 64) for h in (1, 17, 33, 65, 100, 129, 256)]
    cases += [("fp8_ds_mla", 16, 3, 4096, 64), ("fp8_ds_mla", 12, 200, 65, 64), ("fp8_ds_mla", 128, 5, 2049, 64),
              ("fp8_ds_mla", 16, 9, 1, 64), ("fp8_ds_mla", 16, 40, 300, 1), ("fp8_ds_mla", 64, 40, 300, 128),
              ("bf16", 17, 40, 700, 64), ("bf16", 129, 8, 700, 64), ("bf16", 64, 200, 65, 16),
              ("fp8", 17, 40, 700, 64), ("fp8", 129, 8, 700, 64), ("fp8", 48, 40, 2049, 64),
              ("nvfp4", 17, 40, 700, 64), ("nvfp4", 65, 8, 700, 64), ("nvfp4", 5, 320, 2048, 64)]
    if SMOKE:
        cases = [("fp8_ds_mla", 3, 4, 20, 16), ("nvfp4", 2, 3, 9, 1)]
    for n, (fmt, heads, tokens, topk, bt) in enumerate(cases):
        blocks = max(4, -(-2 * min(topk, 4096) // bt))
        pages, scale = latent_pages(fmt, blocks, bt, gen)
        num_slots = blocks * bt
        dtype = torch.int64 if n % 3 == 0 else torch.int32
        slots = torch.randint(0, num_slots, (tokens, topk), device=DEVICE, generator=gen).to(dtype)
        if topk > 4:
            slots[:, ::7] = -1
            slots[-1, : topk // 2] = slots[-1, 0].clamp_min(0)  # duplicates
        if tokens > 2:
            slots[1] = -1  # a row with no valid slot
        wide = torch.randn(tokens, heads + 3, 576, device=DEVICE, generator=gen).to(torch.bfloat16)
        q = wide[:, 1:heads + 1]  # a strided view (head stride 576, token stride (heads + 3) * 576)
        for softmax_scale in ((192 ** -0.5, 1e-4, 2.0) if n == 0 else (192 ** -0.5,)):
            c.check(f"sparse_mla {fmt} H={heads} {tokens} x {topk} (blocks of {bt}, {str(dtype)[6:]} slots, "
                    f"scale {softmax_scale:.3g})",
                    lambda: c.ops.sparse_mla(q, pages, slots, kv_fmt=fmt, kv_scale=scale,
                                             softmax_scale=softmax_scale),
                    attention_err, 2e-2)


def batch(requests, per, block_tokens, blocks_per_request, gen, holes=False):
    """A block table [B, blocks_per_request] of distinct blocks (a few -1 in the middle with ``holes``), and each
    request's ``per`` query tokens at its last positions (req_ids, positions int32)."""
    total = requests * blocks_per_request
    table = torch.randperm(total, device=DEVICE, generator=gen).to(torch.int32).view(requests, blocks_per_request)
    if holes and blocks_per_request > 2:
        table[:, blocks_per_request // 2] = -1
    context = blocks_per_request * block_tokens
    lengths = [max(per, context - 7 * r) for r in range(requests)]
    req = torch.arange(requests, device=DEVICE, dtype=torch.int32).repeat_interleave(per)
    pos = torch.cat([torch.arange(n - per, n, device=DEVICE, dtype=torch.int32) for n in lengths])
    return table, req, pos, total, context


def indexer_cases(c: Checker):
    gen = torch.Generator(device=DEVICE).manual_seed(12)
    cases = [(fmt, heads, q_dtype, 3, per, bt, blocks)
             for fmt in ("fp8", "mxfp4", "bf16") for heads in (3, 8, 48, 64, 128)
             for q_dtype, per in ((torch.bfloat16, 1), (torch.float8_e4m3fn, 5)) for bt, blocks in ((64, 5),)
             if not (fmt == "bf16" and q_dtype != torch.bfloat16)]
    cases += [("fp8", 64, torch.float8_e4m3fn, 2, 1, 1, 1), ("fp8", 64, torch.float8_e4m3fn, 2, 1, 63, 1),
              ("fp8", 64, torch.bfloat16, 2, 2, 65, 1), ("mxfp4", 32, torch.float8_e4m3fn, 4, 3, 64, 65)]
    if SMOKE:
        cases = [("fp8", 3, torch.bfloat16, 2, 1, 16, 3)]
    for fmt, heads, q_dtype, requests, per, bt, blocks in cases:
        table, req, pos, total, context = batch(requests, per, bt, blocks, gen, holes=True)
        pages = index_pages(fmt, total, bt, gen)
        tokens = req.shape[0]
        q = torch.randn(tokens, heads, 128, device=DEVICE, generator=gen).to(q_dtype)
        w = torch.randn(tokens, heads, device=DEVICE, generator=gen)
        w[:, ::4] = 0.0
        c.check(f"indexer_score {fmt} keys, {heads} heads, {str(q_dtype)[6:]} q, {requests} x {per}, context "
                f"{context} (blocks of {bt}, one unmapped)",
                lambda: c.ops.indexer_score(q, w, pages, table, req, pos, index_fmt=fmt, max_context=context + 3),
                rel_err, 1e-2)


def topk_cases(c: Checker):
    gen = torch.Generator(device=DEVICE).manual_seed(13)

    def same_sets(got, want):
        """Rows as sets (a backend may order its winners freely): 0 when every row's set is the reference's."""
        a, b = got.sort(dim=1).values, want.sort(dim=1).values
        return 0.0 if got.shape == want.shape and torch.equal(a, b) else 1.0

    shapes = [(4, 1, 1), (4, 2049, 2048), (3, 300, 300), (3, 300, 301), (3, 300, 1000), (2, 70000, 2048),
              (5, 4096, 64), (1, 131072, 2048)]
    if SMOKE:
        shapes = [(3, 40, 7)]
    for rows, width, k in shapes:
        for kind in ("random", "ties", "signed zeros", "all -inf row"):
            scores = torch.randn(rows, width, device=DEVICE, generator=gen)
            if kind == "ties":
                scores = torch.round(scores * 2) / 2  # few distinct values: ties at the k-th
                scores[0] = 1.5  # a row all equal
            elif kind == "signed zeros":
                scores = torch.where(torch.rand(rows, width, device=DEVICE, generator=gen) < 0.5, 0.0, -0.0)
                scores[:, ::3] = 1.0
            elif kind == "all -inf row":
                scores[0] = float("-inf")
            lengths = torch.full((rows,), width, dtype=torch.int32, device=DEVICE)
            if rows > 1:
                lengths[1] = width // 3
            c.check(f"topk [{rows}, {width}] k={k} {kind}", lambda: c.ops.topk(scores, lengths, k), same_sets, 0.0)


def lse_cases(c: Checker):
    gen = torch.Generator(device=DEVICE).manual_seed(14)
    for parts, heads, dtype in ((1, 1, torch.float32), (7, 129, torch.bfloat16), (40, 16, torch.float32)):
        o = torch.randn(parts, 5, heads, 512, device=DEVICE, generator=gen).to(dtype)
        lse = torch.randn(parts, 5, heads, device=DEVICE, generator=gen) * 30
        lse[0, 0] = float("-inf")  # one part absent
        if parts > 1:
            lse[:, 1] = float("-inf")  # every part absent: o 0, lse -inf
            lse[1, 2] = 80.0  # one part far above the others
        c.check(f"lse_combine {parts} parts, H={heads}, {str(dtype)[6:]}", lambda: c.ops.lse_combine(o, lse),
                attention_err, 1e-2)


def dsa_cases(c: Checker):
    gen = torch.Generator(device=DEVICE).manual_seed(15)
    cases = [("fp8_ds_mla", "fp8", 64, heads, 3, per, 64, 5, topk)
             for heads in (128, 64, 20) for per, topk in ((1, 2048), (5, 256))]
    cases += [("bf16", "mxfp4", 64, 16, 3, 2, 16, 20, 2048), ("nvfp4", "bf16", 32, 12, 2, 4, 1, 300, 64),
              ("fp8", "fp8", 64, 128, 4, 1, 64, 3, 64)]
    if SMOKE:
        cases = [("fp8_ds_mla", "fp8", 4, 3, 2, 2, 16, 3, 8)]
    for kv_fmt, index_fmt, index_heads, heads, requests, per, bt, blocks, topk in cases:
        table, req, pos, total, context = batch(requests, per, bt, blocks, gen)
        kv, scale = latent_pages(kv_fmt, total, bt, gen)
        keys = index_pages(index_fmt, total, bt, gen)
        tokens = req.shape[0]
        q_index = torch.randn(tokens, index_heads, 128, device=DEVICE, generator=gen).to(torch.float8_e4m3fn)
        w = torch.randn(tokens, index_heads, device=DEVICE, generator=gen)
        q = torch.randn(tokens, heads, 576, device=DEVICE, generator=gen).to(torch.bfloat16)
        c.check(f"dsa_attention {kv_fmt} / {index_fmt} keys, {index_heads} index heads, H={heads}, {requests} x "
                f"{per}, context {context} (blocks of {bt}), top-k {topk}",
                lambda: c.ops.dsa_attention(q_index, w, keys, q, kv, table, req, pos, index_fmt=index_fmt,
                                            kv_fmt=kv_fmt, kv_scale=scale, topk=topk, max_context=context,
                                            softmax_scale=192 ** -0.5),
                attention_err, 2e-2)


def main() -> int:
    if not SMOKE and not torch.cuda.is_available():
        raise CheckError("shapes_check: needs a CUDA device, none is visible (or pass --cpu-smoke)")
    from dsahal import ops, set_backend
    from dsahal.registry.observers import observe

    set_backend(BACKEND)
    started = time.time()
    print(f"device {torch.cuda.get_device_name() if not SMOKE else 'cpu'}  torch {torch.__version__}")
    with observe(Routes()) as routes:
        checker = Checker(ops, set_backend, routes)
        for family in (sparse_mla_cases, indexer_cases, topk_cases, lse_cases, dsa_cases):
            family(checker)
    return finish("shapes_check", checker.failures, started)


if __name__ == "__main__":
    run("shapes_check", main)
