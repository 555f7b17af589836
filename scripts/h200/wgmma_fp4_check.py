"""The wgmma NVFP4 sparse MLA kernel (``sparse_mla_wgmma_fp4``) on one H200: checked against the float64 reference on
edge cases first, then timed beside the route it replaces (the few-heads Triton kernel on the same NVFP4 bytes) and
FlashMLA (heads padded to 64) on an fp8_ds_mla pool of the same tokens, same run.

Usage (on a CUDA machine, from the repository root)::

    python3 scripts/h200/wgmma_fp4_check.py [--pool-tokens 1048576] [--no-sweep]

1. Edge cases (one line each): 1, 5, 12 and 16 heads, skipped (-1) and out-of-range slots, a row with no valid slot,
   splits with a partial last one (1024 / 512 / 128 / 16 slots), records over 12 binades, records whose scales are
   e4m3 subnormals (written byte by byte: no encoder makes them), saturated records (every code 6, every scale 448),
   a strided pool, 16-slot blocks, queries x1e-20 / x1e20, a head of zeros, 2, 3 and 4 stages, rows whose first 200 /
   600 slots are skipped. o relative error (Frobenius, rows with a valid slot) and lse error (relative past 1). Each
   case with fixed splits and on the balanced schedule (``programs`` 7 and 264: pieces across rows, one step each).
2. The serving shapes: 64 requests x 5 tokens (and x 1, x 8; 8 x 1; 66 x 3, one full wave of three programs a SM)
   x top-k 2048 over a 1M-token pool, H = 16 and 12; each variant checked on its first rows against the reference
   (the balanced schedule's, three and two programs a SM, also every row against the fixed splits), then timed
   (``do_bench`` median); a table of ms, TB/s of gathered bytes (352 a slot), % of the copy ceiling, the ratio to the
   Triton route and to FlashMLA.

Exits with one ``error:`` line when a check fails (after timing what passed).
"""
from __future__ import annotations

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from mla_check import edge_errors  # scripts/h200/mla_check.py
from script_cli import edge_then_sweep, run  # scripts/h200/script_cli.py
# FlashMLA's decode on fp8_ds_mla bytes (heads padded to 64), the reference check, the serving shapes' inputs
from wgmma_mla_check import EDGE_LAUNCHES, check, flash_mla, rows_agree, serving_inputs

TOPK, BLOCK_TOKENS, SOFTMAX_SCALE = 2048, 64, 192**-0.5
TOL_O, TOL_LSE = 4e-3, 1e-4  # fp16 MMAs on exactly decoded values: the fp8_ds_mla kernel's bounds are 1e-2, 1e-3
RECORD = 352
# (2 stages under a 168-register cap: three programs a SM, 64 KB each; in_flight 2: two logit MMAs in flight)
# (thirty-eighth session: 768 / 512-slot splits of the three-programs launch, and 198 tokens: 396 programs, one full
# wave of three a SM on 132 SMs, to probe the wave tail)
VARIANTS = {"full": (dict(stages=3, split_size=1024), dict(stages=2, split_size=1024, maxnreg=168),
                     dict(stages=2, split_size=768, maxnreg=168), dict(stages=2, split_size=512, maxnreg=168),
                     dict(stages=3, split_size=1024, in_flight=2)),
            "small": (dict(stages=3, split_size=1024), dict(stages=3, split_size=1024, in_flight=2))}


def _records(torch, spec, rows, kind, gen):
    """NVFP4 records of ``rows`` (fp32 ``[N, 576]``), with ``kind`` "subnormal" (scale bytes rewritten to e4m3
    subnormals 0x01..0x07 on every other record) or "saturated" (every code 6 -> 0x77 bytes, every scale 448)."""
    records = spec.pack(rows)
    if kind == "subnormal":
        sub = torch.randint(1, 8, (records.shape[0] // 2, 32), generator=gen, dtype=torch.uint8)
        records[::2][: sub.shape[0], 320:352] = sub
    elif kind == "saturated":
        records[:, :256] = 0x77
        records[:, 320:352] = 0x7E  # e4m3 448
    return records


def edge_cases(torch, failures):
    from dsahal.backends.triton_kernels.sparse_mla_wgmma_fp4 import sparse_mla_wgmma_fp4
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    gen = torch.Generator().manual_seed(0)
    spec = latent_format("nvfp4")
    cases = (  # heads, block tokens, width, split, stages, strided, |q|, leading skipped, records
        (16, 64, 2048, 1024, 3, False, 1.0, 0, "spread"), (12, 64, 300, 128, 2, False, 1.0, 0, "spread"),
        (1, 16, 77, None, 4, True, 1.0, 0, "spread"), (16, 16, 1000, 512, 3, True, 1.0, 0, "spread"),
        (16, 64, 37, 16, 2, False, 1.0, 0, "spread"), (16, 64, 2048, None, 3, False, 1e-20, 0, "spread"),
        (12, 64, 700, 256, 3, True, 1e20, 0, "spread"), (5, 64, 130, 64, 4, False, 1.0, 0, "spread"),
        (16, 64, 512, None, 3, False, 1.0, 0, "saturated"), (16, 64, 600, 512, 3, False, 1.0, 0, "subnormal"),
        (16, 64, 1000, 512, 3, False, 1.0, 200, "spread"), (16, 64, 1000, None, 2, False, 1.0, 600, "spread"),
        (16, 64, 2048, 1024, 3, False, 0.0, 0, "spread"))
    for heads, block_tokens, width, split, stages, strided, q_mag, lead_skip, kind in cases:
        blocks = 40
        slots_n = blocks * block_tokens
        rows = torch.randn(slots_n, 576, generator=gen) * torch.exp2(torch.randint(-6, 7, (slots_n, 1), generator=gen))
        records = _records(torch, spec, rows + 1e-3, kind, gen).view(blocks, block_tokens, RECORD)
        if strided:  # blocks 16 bytes further apart than their records (a view into a larger buffer)
            buf = torch.zeros(blocks, block_tokens * RECORD + 16, dtype=torch.uint8, device="cuda")
            pages_gpu = buf[:, : block_tokens * RECORD].unflatten(1, (block_tokens, RECORD))
            pages_gpu.copy_(records.cuda())
        else:
            pages_gpu = records.cuda()
        tokens = 6
        slots = torch.randint(-1, slots_n, (tokens, width), generator=gen, dtype=torch.int32)
        slots[1, :3] = slots_n + 5  # past the pool: skipped
        slots[:, :lead_skip] = -1
        slots[-1] = -1  # a row with no valid slot
        q = torch.randn(tokens, heads, 576, generator=gen) * (q_mag if q_mag else 1.0)
        if not q_mag:  # a head of zeros (its logits all 0: a uniform softmax)
            q[:, 0] = 0.0
        q = q.to(torch.bfloat16)
        safe = torch.where(slots >= slots_n, -1, slots)
        want_o, want_lse = reference(q.float(), records, safe, "nvfp4", None, 0.07)
        for launch in EDGE_LAUNCHES:  # fixed splits, then the balanced schedule's
            try:
                o, lse = sparse_mla_wgmma_fp4(q.cuda(), pages_gpu, slots.cuda(), "nvfp4", None, 0.07, stages=stages,
                                              split_size=split, **launch)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
                failures.append(f"edge case H={heads} {kind}: {type(exc).__name__}: {str(exc)[:300]}")
                print(f"  H={heads} {kind}: {type(exc).__name__}: {str(exc)[:300]}  FAIL", flush=True)
                continue
            err = edge_errors(torch, o, lse, want_o, want_lse)
            o_err, lse_err, empty = err.o, err.lse, err.empty
            ok = o_err < TOL_O and lse_err < TOL_LSE and empty and err.finite
            case = (f"H={heads} blocks of {block_tokens} width {width} split {split} stages {stages} |q|~{q_mag:g} "
                    f"{kind}" + (" strided" if strided else "") + (f" first {lead_skip} skipped" if lead_skip else "")
                    + "".join(f" {k} {v}" for k, v in launch.items()))
            print(f"  {case:<88s} o rel err {o_err:.2e}  lse err {lse_err:.2e}  empty row ok {empty}  "
                  f"{'pass' if ok else 'FAIL'}", flush=True)
            if not ok:
                failures.append(case)


def sweep(torch, pool_tokens, ceiling, failures):
    from dsahal.backends.nvidia import ops as nvidia_ops
    from dsahal.backends.triton_kernels.sparse_mla_wgmma_fp4 import sparse_mla_wgmma_fp4

    pools = cache_pools.latent_pools(torch, ("nvfp4", "fp8_ds_mla"), pool_tokens, "cuda")
    pages, fp8_pages = pools["nvfp4"][0], pools["fp8_ds_mla"][0]
    rows = []
    for heads, requests, per_request, kind in ((16, 64, 5, "full"), (12, 64, 5, "full"), (16, 64, 8, "full"),
                                               (16, 64, 1, "small"), (16, 8, 1, "small"), (16, 66, 3, "full")):
        tokens = requests * per_request
        slots, q = serving_inputs(torch, pages.shape[0] * BLOCK_TOKENS, heads, tokens)
        case = f"H={heads} {requests}x{per_request}"
        runs = []
        peer = flash_mla(torch, q, fp8_pages, slots, requests, per_request)
        if peer is not None:
            runs.append(("FlashMLA fp8_ds_mla (h pad 64)", peer[0], peer[1], "fp8_ds_mla"))
        runs.append(("triton few heads (the route before)", *(2 * (lambda: nvidia_ops.sparse_mla_small_heads(
            q, pages, slots, "nvfp4", None, SOFTMAX_SCALE),)), "nvfp4"))
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        balanced = (dict(stages=2, maxnreg=168, programs=3 * sms), dict(stages=3, in_flight=2, programs=2 * sms))
        for cfg in VARIANTS[kind] + balanced:  # (the balanced schedule: three programs a SM, two)
            fn = (lambda cfg=cfg: sparse_mla_wgmma_fp4(q, pages, slots, "nvfp4", None, SOFTMAX_SCALE, **cfg))
            runs.append((f"wgmma nvfp4 {cfg}", fn, fn, "nvfp4"))
            if "programs" in cfg:  # every row against the fixed splits' (the reference checks the first rows only)
                rows_agree(torch, f"{case} {cfg}", fn, lambda: sparse_mla_wgmma_fp4(
                    q, pages, slots, "nvfp4", None, SOFTMAX_SCALE, **VARIANTS[kind][0]), failures)
        peer_ms = route_ms = None
        for name, timed, checked, fmt in runs:
            bytes_in = fp8_pages if fmt == "fp8_ds_mla" else pages
            try:
                ok, msg = check(torch, checked, q, bytes_in, slots, fmt)
            except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
                ok, msg = False, f"{type(exc).__name__}: {str(exc)[:300]}"
            print(f"  check {case:<12s} {name:<52s} {'pass' if ok else 'FAIL'}  {msg}", flush=True)
            if not ok:
                failures.append(f"{case} {name}: {msg}")
                continue
            ms = timing.bench_ms(timed, "cuda")
            peer_ms = ms if name.startswith("FlashMLA") else peer_ms
            route_ms = ms if name.startswith("triton") else route_ms
            tbps = tokens * TOPK * (656 if fmt == "fp8_ds_mla" else RECORD) / (ms * 1e-3) / 1e12
            rows.append((case, name, ms, tbps, 100 * tbps / ceiling, None if route_ms is None else route_ms / ms,
                         None if peer_ms is None else peer_ms / ms))
    print("\n| case | variant | ms | TB/s gathered | % copy | route before / this | FlashMLA / this |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for case, name, ms, tbps, pct, vs_route, vs_peer in rows:
        print(f"| {case} | {name} | {ms:.4f} | {tbps:.2f} | {pct:.1f} | "
              f"{'-' if vs_route is None else f'{vs_route:.2f}'} | {'-' if vs_peer is None else f'{vs_peer:.2f}'} |")


def main(argv=None) -> int:
    return edge_then_sweep("wgmma_fp4_check", __doc__, edge_cases, sweep, argv)


if __name__ == "__main__":
    run("wgmma_fp4_check", main)
