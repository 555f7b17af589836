"""Few-heads sparse MLA on one H200: the chunked kernel's variants beside the first kernel, the general
kernel and FlashMLA (heads padded to 64), same run, same bytes.

Usage, from the repository root::

    python3 scripts/h200/small_heads_sweep.py [--pool-tokens 1048576] [--cpu-smoke]

Steps, each printed:

1. the device-to-device copy ceiling measured in this run;
2. random (never zero) latent pools of ``--pool-tokens`` tokens in 64-token blocks per format (bf16
   1152 B, fp8 576 B with a tensor scale, fp8_ds_mla 656 B, nvfp4 352 B), larger than the 60 MB L2;
3. per case, every variant is checked FIRST on the first rows against the float64 reference (and
   FlashMLA on the same fp8_ds_mla bytes against it too), then timed (``do_bench`` median);
4. one markdown table: case, variant, ms, TB/s of gathered bytes (tokens x top-k x record bytes),
   % of the copy ceiling, FlashMLA's fp8_ds_mla ms at the same shape / ours (the peer of every format); a variant that failed its check is listed and the
   script ends with one ``error:`` line and exit status 1 (after timing what passed).

Cases: 64 requests x 5 tokens (320 query tokens) x top-k 2048 at H = 16 and 12 for every format,
and 64 x 1 and 64 x 8 at H = 16 (fp8_ds_mla). The extra variants run at H = 16 on fp8_ds_mla and
nvfp4 only, the raw-e4m3 kernel's (``RAW``) on fp8_ds_mla 64 x 5 at H = 16 and 12, so the run stays
under 150 s including Triton compiles.
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
FORMATS = ("fp8_ds_mla", "nvfp4", "fp8", "bf16")
CHECK_ROWS = 8
O_TOL, LSE_TOL = 2e-2, 2e-2  # bf16 output and bf16 MMAs
DEVICE, Q_DTYPE = "cuda", "bfloat16"  # --cpu-smoke: "cpu", "float32" under TRITON_INTERPRET=1
# extra launch parameters of the chunked kernel tried at H = 16 (the default comes from hopper_config)
# (stages: does the cp.async staging pay; 16-slot steps; 256/1024-slot splits: waves vs fp32 partial traffic)
EXTRA = (dict(num_stages=1), dict(num_stages=3), dict(block_n=16), dict(split_size=256), dict(split_size=1024))
# the raw-e4m3 kernel (sparse_mla_small_heads_raw: fp16 MMAs on the codes, tile scales after the logit MMA and
# folded into P), fp8_ds_mla only, at H = 16 and 12 (64 x 5); sm_90 compile of the local Triton, per variant:
# registers, loop SASS instructions per step (old default: 208 regs, 2850 per 32-slot step)
RAW = (dict(block_n=64, gather_first=False),  # 220 regs, 2160 per 64 slots, wgmma for both MMAs
       dict(block_n=64, gather_first=False, split_size=1024),  # the same, half the programs and partials
       dict(block_n=32, gather_first=True),  # 230 regs, 1591 per 32 slots (mma.sync logits)
       dict(block_n=32, gather_first=True, reuse=True),  # 248 regs, 1547
       dict(block_n=32, gather_first=True, num_warps=8),  # 218 regs x 8 warps, 1283
       # fourteenth session: ptxas's register cap, 3 programs a SM instead of 2 (the KDA prepare pass gained 1.2x
       # from it); local sm_90 compile: 168 regs with 280 B of spills (92 / 88 local loads / stores a kernel)
       dict(block_n=64, gather_first=False, maxnreg=168),
       dict(block_n=32, gather_first=True, maxnreg=168))  # 224 B of spills
# sixteenth session: the Gluon kernel (sparse_mla_gluon: cp.async gather STAGES - 1 steps ahead, one warp per 128-dim
# tile, mma.sync); sm_90 compile of Triton 3.6, 32-slot steps, 3 stages: 240 registers, 104 KB shared, 816 loop
# instructions a step (the tl kernels: raw 2,160 a 64-slot step; the same split in tl 967 a 32-slot step)
# (R3 of the sixteenth session, every variant checked first: 0.57-0.64 ms at 32-slot steps, 0.497 at 16-slot steps and 4
# stages, against the raw kernel's 0.460: latency-bound at two programs a SM, 206-240 registers.) R4: the slot
# indices loaded one issue ahead, the accumulator rescaled only when a kept maximum moves (lazy), ptxas's cap of 168
# registers for three programs a SM (local compile: 72-264 B of spills)
# (local sm_90 compile, Triton 3.6: 16-slot steps 211 registers, the queries in shared memory 189; two warps per
# 128-dim tile (8 a program, each with half the accumulator) 137-160, 128 under the cap without spills at 3 stages:
# 16 warps a SM instead of 8)
GLUON = (dict(block_n=16, stages=4), dict(block_n=16, stages=4, lazy=False),
         dict(block_n=16, stages=3, q_smem=True, maxnreg=168), dict(block_n=16, stages=3, warps_per_tile=2, maxnreg=128),
         dict(block_n=16, stages=4, warps_per_tile=2, maxnreg=128), dict(block_n=32, stages=2, warps_per_tile=2,
                                                                         maxnreg=128),
         dict(block_n=16, stages=3, warps_per_tile=2), dict(block_n=32, stages=2))



def build_pools(torch, pool_tokens):
    return cache_pools.latent_pools(torch, FORMATS, pool_tokens, DEVICE, BLOCK_TOKENS)


def check(torch, run, q, pages, slots, fmt, scale, need_lse=True):
    """``run() -> (o, lse)`` at the full shape; its first rows vs the float64 reference: (ok, message)."""
    from dsahal.reference.sparse_mla import sparse_mla as reference

    o, lse = run()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    rows = min(CHECK_ROWS, q.shape[0])
    want_o, want_lse = reference(q[:rows], pages, slots[:rows], fmt, scale, SOFTMAX_SCALE)
    o_err = float((o[:rows].double() - want_o.double()).norm() / want_o.double().norm())
    finite = torch.isfinite(want_lse)
    lse_err = float((lse[:rows].float()[finite] - want_lse.float()[finite]).abs().max())
    ok = o_err < O_TOL and (lse_err < LSE_TOL or not need_lse)
    return ok, f"o rel err {o_err:.2e}, lse max err {lse_err:.2e}"


def flash_mla_run(torch, q, pages, slots, requests, per_request):
    """FlashMLA's SM90 sparse decode on our fp8_ds_mla bytes, heads zero-padded to 64 outside the timed
    call: (timed run, run returning (o, lse) unpadded), or None when flash_mla does not import."""
    try:
        import flash_mla
    except Exception as exc:  # noqa: BLE001 - no peer column, said once
        print(f"FlashMLA not available: {type(exc).__name__}: {exc}")
        return None
    tokens, heads, _ = q.shape
    qp = torch.zeros(tokens, 64, 576, dtype=q.dtype, device=DEVICE)
    qp[:, :heads] = q
    q4 = qp.view(requests, per_request, 64, 576)
    cache = pages.view(pages.shape[0], BLOCK_TOKENS, 1, pages.shape[2])
    idx = slots.view(requests, per_request, slots.shape[1]).to(torch.int32)
    meta, _ = flash_mla.get_mla_metadata()

    def timed():
        return flash_mla.flash_mla_with_kvcache(q4, cache, None, None, 512, meta, softmax_scale=SOFTMAX_SCALE,
                                                is_fp8_kvcache=True, indices=idx, use_legacy=True, kv_format="V32")

    def unpadded():
        out, lse = timed()  # out [b, s_q, 64, 512], lse [b, 64, s_q]
        return out.reshape(tokens, 64, 512)[:, :heads], lse.transpose(1, 2).reshape(tokens, 64)[:, :heads]

    return timed, unpadded


def variants(fmt, heads, tokens, extra, raw=False):
    """[(name, launcher, kwargs)] for one case: the general kernel, the chunked few-heads kernel's default
    and (``extra``) its alternatives (the first few-heads kernel it replaced is gone: 1.85 ms vs 0.90 ms,
    BENCHMARKS.md, fifth session)."""
    import torch

    from dsahal.backends.nvidia.config import sparse_mla_config
    from dsahal.backends.triton_kernels import sparse_mla, sparse_mla_small_heads as chunked

    q_dtype = getattr(torch, Q_DTYPE)
    default = chunked.hopper_config(heads, fmt, q_dtype)
    out = [("general", sparse_mla.sparse_mla, dict(sparse_mla_config(tokens, heads, TOPK, fmt, q_dtype))),
           ("chunked default", chunked.sparse_mla_small_heads, default)]
    if extra:
        for i, cfg in enumerate(EXTRA):
            out.append((f"chunked x{i + 1}", chunked.sparse_mla_small_heads, dict(default, **cfg)))
    if raw:
        for i, cfg in enumerate(RAW):
            out.append((f"raw e4m3 r{i + 1}", chunked.sparse_mla_small_heads,
                        dict(dict(split_size=512, num_warps=4, num_stages=1, reuse=False), raw_fp8=True, **cfg)))
        if DEVICE == "cuda":  # (Gluon has no interpreter)
            from dsahal.backends.triton_kernels.sparse_mla_gluon import sparse_mla_gluon

            for i, cfg in enumerate(GLUON):
                out.append((f"gluon g{i + 1}", sparse_mla_gluon, dict(dict(split_size=512), **cfg)))
    return out


def run_case(torch, pools, fmt, heads, requests, per_request, extra, ceiling, rows, failures, peers):
    """Check then time every variant on one case. ``peers`` maps (heads, requests, per_request) to
    FlashMLA's fp8_ds_mla time, the peer of every format's row of that shape (fp8_ds_mla runs first)."""
    tokens = requests * per_request
    pages, scale = pools[fmt]
    gen = torch.Generator(device=DEVICE).manual_seed(heads * 1000 + tokens)
    num_slots = pages.shape[0] * BLOCK_TOKENS
    slots = torch.randint(0, num_slots, (tokens, TOPK), device=DEVICE, dtype=torch.int32, generator=gen)
    slots[:, -7:] = -1  # a few skipped slots, like a short context
    q = torch.randn(tokens, heads, 576, device=DEVICE, generator=gen).to(getattr(torch, Q_DTYPE))
    gathered = tokens * TOPK * pages.shape[2]
    case = f"H={heads} {requests}x{per_request} {fmt}"
    runs = []
    if fmt == "fp8_ds_mla" and DEVICE == "cuda":
        peer = flash_mla_run(torch, q, pages, slots, requests, per_request)
        if peer is not None:
            runs.append(("FlashMLA (h pad 64)", peer[0], peer[1], False, ""))
    for name, launcher, cfg in variants(fmt, heads, tokens, extra, raw=fmt == "fp8_ds_mla" and per_request == 5):
        def run(launcher=launcher, cfg=cfg):
            return launcher(q, pages, slots, fmt, scale, SOFTMAX_SCALE, **cfg)

        runs.append((name, run, run, True, ", ".join(f"{k}={v}" for k, v in cfg.items())))
    for name, timed, checked, need_lse, cfg in runs:
        try:
            ok, msg = check(torch, checked, q, pages, slots, fmt, scale, need_lse)
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile or run is recorded
            ok, msg = False, f"{type(exc).__name__}: {str(exc)[:200]}"
        print(f"  check {case:<26s} {name:<20s} {'pass' if ok else 'FAIL'}  {msg}", flush=True)
        if not ok:
            failures.append(f"{case} {name}: {msg}")
            continue
        ms = timing.bench_ms(timed, DEVICE)
        if name.startswith("FlashMLA"):
            peers[(heads, requests, per_request)] = ms
        peer_ms = peers.get((heads, requests, per_request))
        tbps = gathered / (ms * 1e-3) / 1e12
        rows.append((case, name, ms, tbps, 100 * tbps / ceiling, None if peer_ms is None else peer_ms / ms, cfg))


def _smoke_mode(args):
    import os

    global DEVICE, Q_DTYPE, TOPK, BLOCK_TOKENS, EXTRA, RAW
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    DEVICE, Q_DTYPE, TOPK, BLOCK_TOKENS = "cpu", "float32", 32, 16
    EXTRA = EXTRA[:2]
    RAW = tuple(dict(cfg, block_n=16) for cfg in (*RAW[2:4], RAW[-1]))  # 16-slot steps: the interpreter is slow
    args.pool_tokens = min(args.pool_tokens, 256)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-tokens", type=int, default=1 << 20)
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny shapes on the CPU under TRITON_INTERPRET=1 with fp32 queries: runs every step, "
                             "times nothing meaningful")
    parser.add_argument("--raw-only", action="store_true",
                        help="fp8_ds_mla at 64 x 5, H = 16 and 12 only (FlashMLA, the defaults and the raw variants)")
    parser.add_argument("--gluon", action="store_true",
                        help="with --raw-only: of the raw kernel's variants only its default, beside the Gluon ones")
    args = parser.parse_args(argv)
    if args.gluon:
        global RAW
        RAW = RAW[:1]
    if args.cpu_smoke:
        _smoke_mode(args)
    if args.pool_tokens < BLOCK_TOKENS:
        raise CheckError(f"small_heads_sweep: --pool-tokens expected >= {BLOCK_TOKENS}, got {args.pool_tokens}")
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise CheckError("small_heads_sweep: needs a CUDA device, none is visible (or pass --cpu-smoke)")
    started = time.time()
    import triton

    ceiling = timing.announce(torch, triton, DEVICE)
    pools = build_pools(torch, args.pool_tokens)
    print(f"pools: {args.pool_tokens} tokens per format ({time.time() - started:.0f} s)", flush=True)
    cases = [(fmt, heads, 64, 5, heads == 16 and fmt in ("fp8_ds_mla", "nvfp4"))
             for fmt in FORMATS for heads in (16, 12)]
    cases += [("fp8_ds_mla", 16, 64, 1, False), ("fp8_ds_mla", 16, 64, 8, False)]
    if args.raw_only:
        cases = [(fmt, heads, requests, per, False) for fmt, heads, requests, per, _ in cases
                 if fmt == "fp8_ds_mla" and per == 5]
    if DEVICE == "cpu":  # 2 requests instead of 64: the interpreter is slow
        cases = [(fmt, heads, 2, per, extra) for fmt, heads, _, per, extra in cases if per == 5 or fmt == "fp8_ds_mla"]
    rows, failures, peers = [], [], {}
    for fmt, heads, requests, per_request, extra in cases:
        run_case(torch, pools, fmt, heads, requests, per_request, extra, ceiling, rows, failures, peers)
    print(f"\n| case | variant | ms | TB/s gathered | % copy | FlashMLA fp8_ds_mla / ours | config |")
    print("|---|---|---:|---:|---:|---:|---|")
    for case, name, ms, tbps, pct, ratio, cfg in rows:
        ratio_s = f"{ratio:.2f}" if ratio is not None else "-"
        print(f"| {case} | {name} | {ms:.4f} | {tbps:.2f} | {pct:.1f} | {ratio_s} | {cfg} |")
    return finish("small_heads_sweep", failures, started, "variant(s) failed the reference check")


if __name__ == "__main__":
    run("small_heads_sweep", main)
