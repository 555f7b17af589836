"""Host time of one eager op call on the `nvidia` backend's default routes, beside its GPU time.

Usage (on the H200, from the repository with dsahal importable)::

    python3 scripts/h200/route_host.py

Why: at 64 requests x 1 token the eager ``sparse_mla`` (FlashMLA route) measured 0.24 ms at H = 128 and 0.42 ms
at H = 16 against FlashMLA's bare call at 0.08-0.10 ms (eighth session), and the note said "host-bound": this
script says by how much and where. Cases: ``sparse_mla`` on fp8_ds_mla latents (1M-token pool, top-k 2048) at
64 x 1 and 64 x 5 tokens, H = 128 and 16, and ``dsa_attention`` (fp8_ds_mla latents, FP8 index keys, 64 x 1 at
4K context) at H = 16. For each, after checking the op against the float64 reference on the first rows:

- GPU time: the call captured in a CUDA graph and replayed (medians of batches of replays);
- eager time: back-to-back calls, the device synchronised after each batch of 200 (what ``dsahal bench`` times);
- host time: the same calls with ``torch.cuda.synchronize`` replaced by nothing, batches short enough that the
  launch queue never fills (the Python and launch cost alone);
- FlashMLA's bare call on the same bytes (sparse_mla cases), eager, for the gap a user sees;

then a cProfile of 300 eager calls of the H = 64 and H = 16, 64 x 1 sparse_mla cases and the dsa_attention case (its
host time was 2.4x its GPU time in the twenty-fifth session): the top functions by own and by cumulative time. (Also 64 x 1 at H = 64 and 32: the bench's H = 64 row read 0.173 ms against FlashMLA's bare
0.080 in the twenty-fourth session.)
"""
from __future__ import annotations

import cProfile
import io
import pstats

import timing  # scripts/h200/timing.py
from script_cli import CheckError, run  # scripts/h200/script_cli.py

SCALE = 192 ** -0.5


def per_call_us(fn, sync, calls: int = 200, rounds: int = 9) -> float:
    """:func:`timing.per_call_us` of one function (20 warm-up calls)."""
    return timing.per_call_us({"fn": fn}, sync, calls=calls, rounds=rounds, warmup=20)["fn"]


def graph_us(torch, fn, replays: int = 50, rounds: int = 9) -> float:
    """GPU time per call: ``fn`` captured once in a CUDA graph (:func:`timing.captured`), replayed."""
    return per_call_us(timing.captured(torch, fn).replay, torch.cuda.synchronize, calls=replays, rounds=rounds)


def sparse_mla_case(torch, tokens, heads, pool_tokens=1 << 20, block_tokens=64):
    from dsahal import ops
    from dsahal.bench import peers
    from dsahal.bench.inputs import random_pages, random_slots

    pages = random_pages("latent", "fp8_ds_mla", pool_tokens // block_tokens, block_tokens, "cuda")
    q = torch.randn(tokens, heads, 576, device="cuda", dtype=torch.bfloat16)
    slots = random_slots(tokens, 2048, pool_tokens, "cuda")
    call = lambda: ops.sparse_mla(q, pages, slots, kv_fmt="fp8_ds_mla", softmax_scale=SCALE, check=False)  # noqa
    with_ref = lambda: ops.sparse_mla(q[:4], pages, slots[:4], kv_fmt="fp8_ds_mla", softmax_scale=SCALE)  # noqa
    from dsahal import use_backend

    got = with_ref()
    with use_backend("reference"):
        want = ops.sparse_mla(q[:4].cpu(), pages.cpu(), slots[:4].cpu(), kv_fmt="fp8_ds_mla", softmax_scale=SCALE)
    err = (got[0].float().cpu() - want[0].float()).norm() / want[0].float().norm()
    if not err < 2e-2:
        raise CheckError(f"route_host: sparse_mla {tokens} x H={heads} o rel err {err:.2e} against the reference")
    bare = peers.flashmla_sparse_mla(q, pages, slots, "fp8_ds_mla", SCALE)
    return call, (next(iter(bare.values())) if bare else None), f"o rel err {err:.1e}"


def dsa_case(torch, requests, heads, context=4096, block_tokens=64):
    from dsahal import ops
    from dsahal.bench.inputs import decode_batch, random_pages

    table, req_ids, positions, blocks = decode_batch(requests, 1, context, block_tokens, "cuda")
    index_pages = random_pages("index", "fp8", blocks, block_tokens, "cuda")
    kv_pages = random_pages("latent", "fp8_ds_mla", blocks, block_tokens, "cuda")
    tokens = req_ids.shape[0]
    q_index = torch.randn(tokens, 32, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.rand(tokens, 32, device="cuda")
    q = torch.randn(tokens, heads, 576, device="cuda", dtype=torch.bfloat16)
    kw = dict(index_fmt="fp8", kv_fmt="fp8_ds_mla", topk=2048, max_context=context, softmax_scale=SCALE, check=False)
    call = lambda: ops.dsa_attention(q_index, w, index_pages, q, kv_pages, table, req_ids, positions, **kw)  # noqa
    out = call()
    if not torch.isfinite(out[0].float()).all():
        raise CheckError("route_host: dsa_attention gave non-finite outputs")
    return call, None, "finite"


def main() -> int:
    import torch

    import dsahal

    if not torch.cuda.is_available():
        raise CheckError("route_host: needs a CUDA device")
    dsahal.set_backend("nvidia")
    sync = torch.cuda.synchronize
    nothing = lambda: None  # noqa: E731
    cases = [("sparse_mla 64x1 H=128", lambda: sparse_mla_case(torch, 64, 128)),
             ("sparse_mla 64x1 H=64", lambda: sparse_mla_case(torch, 64, 64)),
             ("sparse_mla 64x1 H=32", lambda: sparse_mla_case(torch, 64, 32)),
             ("sparse_mla 64x1 H=16", lambda: sparse_mla_case(torch, 64, 16)),
             ("sparse_mla 64x5 H=16", lambda: sparse_mla_case(torch, 320, 16)),
             ("dsa_attention 64x1 @4K H=16", lambda: dsa_case(torch, 64, 16))]
    print("| case | check | GPU (graph) us | eager us | host us | FlashMLA bare eager us |")
    print("|---|---|---:|---:|---:|---:|")
    profiled = {}
    for name, build in cases:
        call, bare, check = build()
        gpu = graph_us(torch, call)
        eager = per_call_us(call, sync)
        host = per_call_us(call, nothing, calls=20)  # 20 calls stay far below the launch queue's depth
        sync()
        bare_us = f"{per_call_us(bare, sync):.1f}" if bare is not None else "-"
        print(f"| {name} | {check} | {gpu:.1f} | {eager:.1f} | {host:.1f} | {bare_us} |", flush=True)
        if name in ("sparse_mla 64x1 H=64", "sparse_mla 64x1 H=16", "dsa_attention 64x1 @4K H=16"):
            profiled[name] = call
    for name, fn in profiled.items():
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(300):
            fn()
        sync()
        profile.disable()
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats(order).print_stats(30)
            print(f"\ncProfile, 300 eager calls of {name} (top 30 by {order}):")
            print(text.getvalue()[:7000])
    return 0


if __name__ == "__main__":
    run("route_host", main)
