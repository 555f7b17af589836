"""Every sparse-MLA route of the ``nvidia`` backend through ``dsahal.ops``, on an H200, in one table.

For each shape and each route that accepts it (forced with ``dsahal.use_routes``): correctness first
against the float64 reference on the same cache bytes (random, never zero; a row of -1 slots, a slot
out of range, int64 slots), then the median time (``triton.testing.do_bench``) of the public op
(``check=False``) beside FlashMLA's own kernel on the same bytes (the peer, heads padded as it needs),
and the route the default order picks. Usage: ``python scripts/h200/routes_check.py [--quick]``.
"""
from __future__ import annotations

import argparse
import sys

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import torch

import dsahal
from dsahal import ops
from dsahal.formats import latent_format

TOPK = 2048
SCALE = 192 ** -0.5
BLOCK = 64


def copy_ceiling_tbps() -> float:
    return timing.copy_ceiling_tbps(torch, "cuda")


def build(pool_tokens: int, fmt: str, gen: torch.Generator):
    spec = latent_format(fmt)
    blocks = pool_tokens // BLOCK
    pages = torch.empty((blocks, BLOCK, spec.token_bytes), dtype=torch.uint8, device="cuda")
    chunk = 1 << 16
    slots_all = torch.arange(pool_tokens, device="cuda")
    scale = torch.tensor(0.05, device="cuda") if spec.needs_tensor_scale else None
    for start in range(0, pool_tokens, chunk):
        values = torch.randn((min(chunk, pool_tokens - start), 576), generator=gen, device="cuda")
        with dsahal.use_backend("reference"):
            ops.cache_write(values, slots_all[start:start + chunk], pages, kind="latent", fmt=fmt, scale=scale,
                            check=False)
    return pages, scale


def slots_for(tokens: int, pool_tokens: int, gen: torch.Generator, *, edge_cases: bool):
    slots = torch.randint(0, pool_tokens, (tokens, TOPK), generator=gen, device="cuda", dtype=torch.int32)
    if edge_cases:
        slots[0] = -1  # a row with no valid slot: o = 0, lse = -inf
        slots[1, ::7] = -1
        slots[-1, 3] = slots[-1, 5]  # a duplicate
    return slots


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def check(route: str | None, q, pages, slots, fmt, scale) -> tuple[bool, str]:
    with dsahal.use_backend("reference"):
        o_ref, lse_ref = ops.sparse_mla(q[:8].float(), pages, slots[:8], kv_fmt=fmt, kv_scale=scale,
                                        softmax_scale=SCALE)
    context = dsahal.use_routes(sparse_mla=route) if route else dsahal.use_backend("nvidia")
    with context:
        o, lse = ops.sparse_mla(q[:8], pages, slots[:8], kv_fmt=fmt, kv_scale=scale, softmax_scale=SCALE)
        o64, lse64 = ops.sparse_mla(q[:8], pages, slots[:8].long(), kv_fmt=fmt, kv_scale=scale, softmax_scale=SCALE)
    finite = torch.isfinite(lse_ref)
    problems = []
    err = rel(o[finite], o_ref[finite])
    if not (err < 2e-2):
        problems.append(f"o rel err {err:.2e}")
    if not torch.equal(torch.isinf(lse), ~finite):
        problems.append("lse -inf pattern differs (empty rows)")
    if finite.any() and float((lse[finite] - lse_ref[finite]).abs().max()) > 2e-2:
        problems.append(f"lse max diff {float((lse[finite] - lse_ref[finite]).abs().max()):.2e}")
    if not (o[~finite] == 0).all():
        problems.append("empty rows not zero")
    if not torch.equal(o, o64):
        problems.append("int64 slots differ from int32")
    return (not problems), (", ".join(problems) or f"o rel err {err:.1e}")


def flashmla_peer(q, pages, slots, fmt):
    """FlashMLA's own kernel on the same bytes (heads padded to 64), or None when it does not serve fmt."""
    try:
        import flash_mla
    except ImportError:
        return None
    heads = q.shape[1]
    tile = 64 if heads <= 64 else 128
    qp = torch.zeros((q.shape[0], tile, 576), dtype=q.dtype, device=q.device)
    qp[:, :heads] = q
    if fmt == "fp8_ds_mla":
        meta = flash_mla.get_mla_metadata()[0]
        cache, idx = pages.unsqueeze(2), slots.unsqueeze(1)
        return lambda: flash_mla.flash_mla_with_kvcache(qp.unsqueeze(1), cache, None, None, 512, meta, softmax_scale=SCALE,
                                                        is_fp8_kvcache=True, indices=idx, use_legacy=True,
                                                        kv_format="V32")
    if fmt == "bf16":
        kv, idx = pages.view(torch.bfloat16).reshape(-1, 1, 576), slots.unsqueeze(1)
        return lambda: flash_mla.flash_mla_sparse_fwd(qp, kv, idx, SCALE, 512, use_legacy=True)
    return None


def main(argv=None) -> int:
    import triton

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profile", action="store_true", help="also break down an 8-token call (host and kernels)")
    parser.add_argument("--pool-tokens", type=int, default=1 << 20)
    args = parser.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ceiling = copy_ceiling_tbps()
    print(f"copy ceiling {ceiling:.2f} TB/s; torch {torch.__version__}, triton {triton.__version__}")
    table = dsahal.set_backend("nvidia")
    print("sparse_mla routes:", [(r.name, r.available, r.reason) for r in table.entries["sparse_mla"].routes])
    shapes = [(320, 128), (320, 64), (320, 16), (320, 12), (8, 128), (8, 16)]
    formats = ["fp8_ds_mla", "bf16", "fp8", "nvfp4"]
    if args.quick:
        shapes, formats = [(320, 128), (320, 16)], ["fp8_ds_mla", "bf16"]
    rows, failures = [], []
    for fmt in formats:
        pages, scale = build(args.pool_tokens, fmt, gen)
        for tokens, heads in shapes:
            q = (torch.randn((tokens, heads, 576), generator=gen, device="cuda") * 0.5).to(torch.bfloat16)
            slots = slots_for(tokens, args.pool_tokens, gen, edge_cases=False)
            edge = slots_for(tokens, args.pool_tokens, gen, edge_cases=True)
            default, _ = table.choose("sparse_mla", q, pages, slots, fmt, scale, SCALE)
            peer = flashmla_peer(q, pages, slots, fmt)
            peer_ms = triton.testing.do_bench(peer, rep=100) if peer else None
            gathered = tokens * TOPK * latent_format(fmt).token_bytes
            for entry in table.entries["sparse_mla"].active:
                ok_args, why = (entry.verifier(q, pages, slots, fmt, scale, SCALE) if entry.verifier else (True, ""))
                if not ok_args:
                    continue
                good, detail = check(entry.name, q, pages, edge, fmt, scale)
                if not good:
                    failures.append(f"{fmt} T={tokens} H={heads} {entry.name}: {detail}")
                with dsahal.use_routes(sparse_mla=entry.name):
                    ms = triton.testing.do_bench(lambda: ops.sparse_mla(q, pages, slots, kv_fmt=fmt, kv_scale=scale,
                                                                      softmax_scale=SCALE, check=False), rep=100)
                rows.append((fmt, tokens, heads, entry.name, "*" if entry.name == default else "", good, ms, peer_ms,
                             gathered / (ms * 1e-3) / 1e12))
        del pages
        torch.cuda.empty_cache()
    print("\n| format | T | H | route | default | check | ms | FlashMLA ms | FlashMLA/ours | TB/s gathered | % copy |")
    print("| --- | ---: | ---: | --- | :-: | --- | ---: | ---: | ---: | ---: | ---: |")
    for fmt, tokens, heads, route, star, good, ms, peer_ms, tbps in rows:
        ratio = f"{peer_ms / ms:.2f}x" if peer_ms else "-"
        peer = f"{peer_ms:.3f}" if peer_ms else "-"
        print(f"| {fmt} | {tokens} | {heads} | {route} | {star} | {'pass' if good else 'FAIL'} | {ms:.3f} | {peer} | "
              f"{ratio} | {tbps:.2f} | {100 * tbps / ceiling:.0f}% |")
    for failure in failures:
        print("FAIL:", failure)
    if args.profile:
        profile_small_batch(gen, args.pool_tokens)
    return 1 if failures else 0


def host_us(fn, calls=200) -> float:
    import time

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def profile_small_batch(gen, pool_tokens: int) -> None:
    """Where the time of an 8-token FlashMLA route call goes: host µs per call of FlashMLA itself, of the
    route function and of the public op; then the profiler's per-kernel table for the public op."""
    pages, scale = build(pool_tokens, "fp8_ds_mla", gen)
    q = (torch.randn((8, 128, 576), generator=gen, device="cuda") * 0.5).to(torch.bfloat16)
    slots = slots_for(8, pool_tokens, gen, edge_cases=False)
    peer = flashmla_peer(q, pages, slots, "fp8_ds_mla")
    from dsahal.backends.nvidia import flashmla

    route = lambda: flashmla.sparse_mla_decode(q, pages, slots, "fp8_ds_mla", None, SCALE)  # noqa: E731
    with dsahal.use_routes(sparse_mla="flashmla_decode"):
        public = lambda: ops.sparse_mla(q, pages, slots, kv_fmt="fp8_ds_mla", softmax_scale=SCALE, check=False)  # noqa
        print(f"\nhost us/call at T=8 H=128: FlashMLA {host_us(peer):.1f}, route fn {host_us(route):.1f}, "
              f"dsahal.ops {host_us(public):.1f}")
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                public()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            peer()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))


if __name__ == "__main__":
    sys.exit(main())
