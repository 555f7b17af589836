"""Sparse MLA on one Hopper GPU: our Triton kernels (general, few-heads, NVFP4) beside FlashMLA, same run.

Usage (on a CUDA machine, from the repository with dsahal importable)::

    python scripts/h200/sparse_mla_bench.py [--pool-tokens 1048576] [--heads 128,64,16,12] [--no-sweep]

Steps, in order, each printed:

1. device-to-device copy ceiling (1 GiB copy, read + write bytes / time) measured in this run;
2. random (never zero) latent caches of ``--pool-tokens`` tokens in 64-token blocks, one per format
   (bf16 1152 B, fp8 576 B, fp8_ds_mla 656 B, nvfp4 352 B), larger than the 60 MB L2;
3. per shape (H x tokens, top-k 2048, random slots over the whole pool, a few -1): every kernel is
   checked against the float64 reference op on the first rows before it is timed (relative error
   printed; a miss raises and the script exits with one ``error:`` line);
4. ``triton.testing.do_bench`` medians; FlashMLA (``import flash_mla``, SM90 ``use_legacy=True``)
   sparse decode on the very same fp8_ds_mla bytes ("V32", heads zero-padded to 64 outside the timed
   region) and sparse prefill on the bf16 latents, when it imports;
5. one table: shape, format, kernel, ours ms, FlashMLA ms, FlashMLA/ours, GB/s of gathered bytes
   (tokens x top-k x record bytes) and % of the copy ceiling; then registers / spills / shared memory
   of every compiled Triton kernel variant;
6. unless ``--no-sweep``: a small sweep of the few-heads kernel's launch parameters at H=16, 320
   tokens, fp8_ds_mla and nvfp4 (what ``hopper_config`` should become).

Runs in well under 3 minutes on an H200 (most of it Triton compiles).
"""
from __future__ import annotations

import argparse
import sys
import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from script_cli import CheckError, finish, run  # scripts/h200/script_cli.py

TOPK = 2048
BLOCK_TOKENS = 64
SOFTMAX_SCALE = 192**-0.5
FORMATS = ("bf16", "fp8", "fp8_ds_mla", "nvfp4")
SHAPES = ((64, 5), (8, 1))  # (requests, query tokens per request)
CHECK_ROWS = 8  # rows compared with the float64 reference (it loops over tokens)
O_TOL, LSE_TOL = 2e-2, 2e-2  # bf16 output; FlashMLA and ours agreed to 3.6e-3 on these bytes
DEVICE, Q_DTYPE = "cuda", "bfloat16"  # --cpu-smoke: "cpu", "float32" under TRITON_INTERPRET=1



def _bench(fn):
    return timing.bench_ms(fn, DEVICE, warmup=10, rep=60)


def build_pools(torch, pool_tokens):
    return cache_pools.latent_pools(torch, FORMATS, pool_tokens, DEVICE, BLOCK_TOKENS)


def relative_errors(torch, o, lse, want_o, want_lse):
    o_err = float((o.double() - want_o.double()).norm() / want_o.double().norm())
    finite = torch.isfinite(want_lse)
    lse_err = float((lse.float()[finite] - want_lse.float()[finite]).abs().max())
    return o_err, lse_err


def check(torch, name, run, q, pages, slots, fmt, scale, need_lse=True):
    """Run ``run()`` -> (o, lse) at the full shape; compare its first rows with the reference.
    ``need_lse=False`` (a peer whose lse convention may differ) fails on ``o`` only."""
    from dsahal.reference.sparse_mla import sparse_mla as reference

    o, lse = run()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    rows = min(CHECK_ROWS, q.shape[0])
    want_o, want_lse = reference(q[:rows], pages, slots[:rows], fmt, scale, SOFTMAX_SCALE)
    o_err, lse_err = relative_errors(torch, o[:rows], lse[:rows], want_o, want_lse)
    status = "ok" if o_err < O_TOL and lse_err < LSE_TOL else ("lse differs" if o_err < O_TOL else "FAIL")
    print(f"  check {name:<40s} o rel err {o_err:.2e}  lse max err {lse_err:.2e}  {status}", flush=True)
    if status == "FAIL" or (need_lse and status != "ok"):
        raise CheckError(f"{name}: output differs from the reference (o rel err {o_err:.3e}, lse err {lse_err:.3e})")


def compiled_variants():
    """{(kernel name, key): (n_regs, n_spills, shared bytes, num_warps, num_stages)} of the Triton kernels."""
    from dsahal.backends.triton_kernels import lse_combine, sparse_mla, sparse_mla_small_heads

    found = {}
    for fn in (sparse_mla.sparse_mla_kernel, sparse_mla_small_heads.sparse_mla_small_heads_kernel,
               lse_combine.lse_combine_kernel):
        try:
            for cache in fn.device_caches.values():
                kernels = cache[0] if isinstance(cache, tuple) else cache
                for key, kernel in kernels.items():
                    meta = kernel.metadata
                    found[(fn.__name__, str(key))] = (getattr(kernel, "n_regs", None), getattr(kernel, "n_spills", None),
                                                      getattr(meta, "shared", None), getattr(meta, "num_warps", None),
                                                      getattr(meta, "num_stages", None))
        except Exception as exc:  # noqa: BLE001 - Triton's cache layout is internal; report, don't fail
            found[(fn.__name__, "unavailable")] = (f"{type(exc).__name__}: {exc}",)
    return found


def load_flash_mla():
    try:
        import flash_mla

        return flash_mla, getattr(flash_mla, "__version__", "?")
    except Exception as exc:  # noqa: BLE001 - any failure means "no peer column"
        return None, f"{type(exc).__name__}: {exc}"


def flash_mla_runs(torch, flash_mla, q, pools, slots, requests, per_request):
    """FlashMLA closures on our bytes: {fmt: run() -> (o [T, H, 512], lse [T, H])}, heads padded to 64."""
    tokens, heads, _ = q.shape
    padded = 64 if heads <= 64 else 128
    qp = torch.zeros(tokens, padded, 576, dtype=q.dtype, device=DEVICE)
    qp[:, :heads] = q
    runs = {}
    pages, _ = pools["fp8_ds_mla"]
    k_cache = pages.view(pages.shape[0], BLOCK_TOKENS, 1, pages.shape[2])
    q4 = qp.view(requests, per_request, padded, 576)
    idx = slots.view(requests, per_request, TOPK).to(torch.int32)
    meta, _ = flash_mla.get_mla_metadata()

    def decode():
        out, lse = flash_mla.flash_mla_with_kvcache(q4, k_cache, None, None, 512, meta, softmax_scale=SOFTMAX_SCALE,
                                                    is_fp8_kvcache=True, indices=idx, use_legacy=True,
                                                    kv_format="V32")
        return out, lse

    def decode_unpadded():
        out, lse = decode()  # out [b, s_q, h, 512], lse [b, h, s_q]
        return out.reshape(tokens, padded, 512)[:, :heads], lse.transpose(1, 2).reshape(tokens, padded)[:, :heads]

    runs["fp8_ds_mla"] = (decode, decode_unpadded)
    bf16_pages, _ = pools["bf16"]
    kv = bf16_pages.view(-1, 1152).view(torch.bfloat16).view(-1, 1, 576)
    idx3 = slots.to(torch.int32).view(tokens, 1, TOPK)

    def prefill():
        return flash_mla.flash_mla_sparse_fwd(qp, kv, idx3, SOFTMAX_SCALE, 512, use_legacy=True)

    def prefill_unpadded():
        out, _, lse = prefill()  # out [s_q, h, 512], lse [s_q, h]
        return out[:, :heads], lse.reshape(tokens, padded)[:, :heads]

    runs["bf16"] = (prefill, prefill_unpadded)
    return runs


def our_kernels(fmt, heads):
    """[(name, launcher kwargs maker)] of our kernels that take this shape."""
    from dsahal.backends.nvidia.config import sparse_mla_config
    from dsahal.backends.triton_kernels.sparse_mla import sparse_mla
    from dsahal.backends.triton_kernels.sparse_mla_small_heads import MAX_HEADS, hopper_config, sparse_mla_small_heads

    import torch

    q_dtype = getattr(torch, Q_DTYPE)
    kernels = [("general", lambda tokens: (sparse_mla, dict(sparse_mla_config(tokens, heads, TOPK, fmt, q_dtype))))]
    if heads <= MAX_HEADS:
        kernels.append(("small_heads", lambda tokens: (sparse_mla_small_heads, hopper_config(heads, fmt, q_dtype))))
    return kernels


def run_shape(torch, pools, heads, requests, per_request, flash_mla, rows_out, ceiling, failures):
    """Check then time every kernel on one shape; a failure is recorded in ``failures`` and the rest go on."""
    tokens = requests * per_request
    gen = torch.Generator(device=DEVICE).manual_seed(heads * 1000 + tokens)
    num_slots = next(iter(pools.values()))[0].shape[0] * BLOCK_TOKENS
    slots = torch.randint(0, num_slots, (tokens, TOPK), device=DEVICE, dtype=torch.int32, generator=gen)
    slots[:, -7:] = -1  # a few skipped slots, like a short context
    q = torch.randn(tokens, heads, 576, device=DEVICE, generator=gen).to(getattr(torch, Q_DTYPE))
    peers = {}
    if flash_mla is not None:
        try:
            peers = flash_mla_runs(torch, flash_mla, q, pools, slots, requests, per_request)
        except Exception as exc:  # noqa: BLE001 - the peer's refusal is reported, not fatal
            print(f"  FlashMLA H={heads} T={tokens}: not set up ({type(exc).__name__}: {exc})", flush=True)
    for fmt in FORMATS:
        pages, scale = pools[fmt]
        gathered = tokens * TOPK * pages.shape[2]
        peer_ms = None
        if fmt in peers:
            timed, unpadded = peers[fmt]
            try:  # the peer is checked like ours; a peer that disagrees gets no time column
                check(torch, f"FlashMLA {fmt} H={heads} T={tokens}", unpadded, q, pages, slots, fmt, scale,
                      need_lse=False)
                peer_ms = _bench(timed)
            except Exception as exc:  # noqa: BLE001
                print(f"  FlashMLA {fmt} H={heads} T={tokens}: not timed ({type(exc).__name__}: {exc})", flush=True)
        for name, make in our_kernels(fmt, heads):
            launcher, cfg = make(tokens)

            def run(launcher=launcher, cfg=cfg, pages=pages, scale=scale):
                return launcher(q, pages, slots, fmt, scale, SOFTMAX_SCALE, **cfg)

            label = f"{name} {fmt} H={heads} T={tokens}"
            try:
                check(torch, label, run, q, pages, slots, fmt, scale)
                ms = _bench(run)
            except Exception as exc:  # noqa: BLE001 - recorded; the script fails at the end
                failures.append(f"{label}: {type(exc).__name__}: {exc}")
                print(f"  {label}: FAILED ({type(exc).__name__}: {str(exc)[:300]})", flush=True)
                continue
            gbps = gathered / (ms * 1e-3) / 1e9
            rows_out.append((f"H={heads} {requests}x{per_request}", fmt, name, ms, peer_ms,
                             None if peer_ms is None else peer_ms / ms, gbps, 100 * gbps / (ceiling * 1e3),
                             ", ".join(f"{k}={v}" for k, v in cfg.items())))


def sweep(torch, pools, ceiling):
    """The few-heads kernel's launch parameters at H=16, 64 x 5 tokens: time each, print the table."""
    from dsahal.backends.triton_kernels.sparse_mla_small_heads import sparse_mla_small_heads

    tokens, heads = (320 if DEVICE == "cuda" else 2), 16
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    num_slots = pools["bf16"][0].shape[0] * BLOCK_TOKENS
    slots = torch.randint(0, num_slots, (tokens, TOPK), device=DEVICE, dtype=torch.int32, generator=gen)
    q = torch.randn(tokens, heads, 576, device=DEVICE, generator=gen).to(getattr(torch, Q_DTYPE))
    # the default (64 rows, 4 warps, 2 stages, 512-slot splits) is in the main table
    variants = [dict(block_n=64, num_warps=4, num_stages=s, prefetch=p, split_size=sp)
                for s, p, sp in ((1, False, 512), (3, False, 512), (1, True, 512), (2, False, 1024))]
    variants.append(dict(block_n=128, num_warps=8, num_stages=2, prefetch=False, split_size=512))
    variants.append(dict(block_n=32, num_warps=4, num_stages=1, prefetch=True, split_size=512))
    print("\nsweep: few-heads kernel, H=16, 64x5 tokens, top-k 2048")
    for fmt in ("fp8_ds_mla", "nvfp4"):
        pages, scale = pools[fmt]
        gathered = tokens * TOPK * pages.shape[2]
        for cfg in variants:
            try:
                ms = _bench(lambda: sparse_mla_small_heads(q, pages, slots, fmt, scale, SOFTMAX_SCALE, **cfg))
                gbps = gathered / (ms * 1e-3) / 1e9
                print(f"  {fmt:<11s} {str(cfg):<85s} {ms:8.4f} ms {gbps:7.0f} GB/s {100 * gbps / (ceiling * 1e3):5.1f}%",
                      flush=True)
            except Exception as exc:  # noqa: BLE001 - a variant that does not compile is a data point
                print(f"  {fmt:<11s} {str(cfg):<85s} failed: {type(exc).__name__}: {str(exc)[:120]}", flush=True)


def _smoke_mode(args) -> None:
    import os

    global DEVICE, Q_DTYPE, TOPK, SHAPES, BLOCK_TOKENS
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    DEVICE, Q_DTYPE, TOPK, SHAPES, BLOCK_TOKENS = "cpu", "float32", 32, ((2, 1),), 16
    args.pool_tokens = min(args.pool_tokens, 256)
    args.heads = "16,12" if args.heads == "128,64,16,12" else args.heads


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-tokens", type=int, default=1 << 20)
    parser.add_argument("--heads", default="128,64,16,12")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny shapes on the CPU under TRITON_INTERPRET=1 with fp32 queries: runs every step "
                             "of the script, times nothing meaningful")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        _smoke_mode(args)
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise CheckError("sparse_mla_bench: needs a CUDA device, none is visible")
    try:
        heads_list = [int(h) for h in args.heads.split(",")]
    except ValueError:
        raise CheckError(f"sparse_mla_bench: --heads expected comma-separated integers, got {args.heads!r}") from None
    started = time.time()
    import triton

    ceiling = timing.announce(torch, triton, DEVICE)
    flash_mla, version = load_flash_mla()
    print(f"FlashMLA: {'version ' + version if flash_mla else 'not available: ' + version}")
    pools = build_pools(torch, args.pool_tokens)
    print(f"pools: {args.pool_tokens} tokens per format ({time.time() - started:.0f} s)", flush=True)
    rows, failures = [], []
    for heads in heads_list:
        for requests, per_request in SHAPES:
            run_shape(torch, pools, heads, requests, per_request, flash_mla, rows, ceiling, failures)
    print(f"\n{'shape':<14s} {'format':<11s} {'kernel':<12s} {'ours ms':>9s} {'FlashMLA':>9s} {'FM/ours':>8s} "
          f"{'GB/s':>7s} {'%copy':>6s}  config")
    for shape, fmt, name, ms, peer, ratio, gbps, pct, cfg in rows:
        peer_s = f"{peer:9.4f}" if peer is not None else f"{'-':>9s}"
        ratio_s = f"{ratio:8.2f}" if ratio is not None else f"{'-':>8s}"
        print(f"{shape:<14s} {fmt:<11s} {name:<12s} {ms:9.4f} {peer_s} {ratio_s} {gbps:7.0f} {pct:6.1f}  {cfg}")
    print("\ncompiled Triton variants: n_regs, n_spills, shared bytes, num_warps, num_stages")
    for (name, key), info in sorted(compiled_variants().items()):
        print(f"  {name:<32s} {info}  {key[:160]}")
    if not args.no_sweep:
        sweep(torch, pools, ceiling)
    return finish("sparse_mla_bench", failures, started, "kernel case(s) failed the reference check or did not run")


if __name__ == "__main__":
    run("sparse_mla_bench", main)
