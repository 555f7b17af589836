"""The wgmma few-heads sparse MLA kernel on per-tensor FP8 latents (576 e4m3 codes x one fp32 tensor scale) on one
H200: checked against the float64 reference on edge cases first, then timed beside the general Triton kernel (the
route that served the format before), same run, same bytes.

Usage (on a CUDA machine, from the repository root)::

    python3 scripts/h200/wgmma_fp8_check.py [--no-sweep]

1. Edge cases (one line each): 1, 5, 12, 16, 24 and 40 heads, skipped (-1) and out-of-range slots, a row with no valid
   slot, one split and 64 / 256 / 1024-slot splits, records over 12 binades, tensor scales 2^-12 and 2^4, 16-slot
   blocks, a strided pool, queries x1e-20 and x1e20, 2 and 3 stages; o relative error (Frobenius, rows with a valid
   slot), each head's own, lse error (relative past 1), the empty row (o = 0, lse = -inf).
2. 64 requests x 5 (and x 1) tokens x top-k 2048 over a 1M-token pool, H = 16, 12 and 32: each function checked on its
   first rows against the reference, then timed (``do_bench`` median), ms and the general kernel's time / ours.

Exits with one ``error:`` line when a check fails (after timing what passed).
"""
from __future__ import annotations

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from mla_check import edge_errors  # scripts/h200/mla_check.py
from script_cli import edge_then_sweep, run  # scripts/h200/script_cli.py
from wgmma_mla_check import TOPK, serving_inputs

BLOCK_TOKENS, SOFTMAX_SCALE = 64, 192**-0.5
# fp16 logits since the thirty-seventh session (H100 R4: o <= 1.7e-3, lse <= 1.8e-7 on these cases; 1e-2 / 1e-3 before)
TOL_O, TOL_LSE = 4e-3, 1e-5


def edge_cases(torch, failures):
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    spec = latent_format("fp8")
    gen = torch.Generator().manual_seed(0)
    for heads, block_tokens, width, split, stages, strided, q_mag, scale in (
            (16, 64, 2048, 1024, 2, False, 2.0, 2.0**-6), (12, 64, 300, 256, 2, False, 2.0, 2.0**-12),
            (1, 16, 77, None, 3, True, 2.0, 2.0**4), (16, 16, 1000, 256, 2, True, 2.0, 2.0**-6),
            (5, 64, 130, 64, 3, False, 2.0, 0.01), (24, 64, 700, 256, 2, False, 2.0, 0.05),
            (40, 64, 500, None, 2, False, 2.0, 0.05), (16, 64, 2048, None, 3, False, 1e-20, 0.05),
            (12, 64, 700, 256, 2, True, 1e20, 0.05)):
        blocks = 40
        slots_n = blocks * block_tokens
        kv_scale = torch.tensor(scale, dtype=torch.float32)
        rows = torch.randn(slots_n, 576, generator=gen) * torch.exp2(torch.randint(-6, 7, (slots_n, 1), generator=gen))
        rows = rows * (scale * 448 / 64 / float(rows.abs().max()))  # (largest |x| 1/64 of 448 scales: no saturation)
        records = spec.pack(rows + 1e-3 * scale, kv_scale).view(blocks, block_tokens, 576)
        if strided:  # blocks 16 bytes further apart than their records (a view into a larger buffer)
            buf = torch.zeros(blocks, block_tokens * 576 + 16, dtype=torch.uint8, device="cuda")
            pages = buf[:, : block_tokens * 576].unflatten(1, (block_tokens, 576))
            pages.copy_(records.cuda())
        else:
            pages = records.cuda()
        tokens = 6
        slots = torch.randint(-1, slots_n, (tokens, width), generator=gen, dtype=torch.int32)
        slots[1, :3] = slots_n + 5  # past the pool: skipped
        slots[-1] = -1  # a row with no valid slot
        q = (torch.randn(tokens, heads, 576, generator=gen) * q_mag).to(torch.bfloat16)
        safe = torch.where(slots >= slots_n, -1, slots)
        want_o, want_lse = reference(q.float(), records, safe, "fp8", kv_scale, 0.07)
        o, lse = sparse_mla_wgmma(q.cuda(), pages, slots.cuda(), "fp8", kv_scale.cuda(), 0.07, stages=stages,
                                  split_size=split)
        torch.cuda.synchronize()
        err = edge_errors(torch, o, lse, want_o, want_lse)
        ok = err.o < TOL_O and err.head < 4 * TOL_O and err.lse < TOL_LSE and err.empty and err.finite
        case = (f"H={heads} blocks of {block_tokens} width {width} split {split} stages {stages} |q|~{q_mag:g} "
                f"scale {scale:g}" + (" strided" if strided else ""))
        print(f"  {case:<72s} o rel err {err.o:.2e} (worst head {err.head:.2e})  lse err {err.lse:.2e}  "
              f"empty row ok {err.empty}  {'pass' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(case)


def sweep(torch, pool_tokens, ceiling, failures):
    from dsahal.backends.nvidia import ops as nvidia_ops
    from dsahal.reference.sparse_mla import sparse_mla as reference

    pages, kv_scale = cache_pools.latent_pools(torch, ("fp8",), pool_tokens, "cuda")["fp8"]
    rows = []
    for heads, requests, per_request in ((16, 64, 5), (12, 64, 5), (32, 64, 5), (16, 64, 1)):
        tokens = requests * per_request
        slots, q = serving_inputs(torch, pages.shape[0] * BLOCK_TOKENS, heads, tokens)
        case = f"H={heads} {requests}x{per_request}"
        runs = (("wgmma (the route now)", nvidia_ops.sparse_mla_wgmma), ("triton general", nvidia_ops.sparse_mla))
        times = {}
        for name, fn in runs:
            call = (lambda fn=fn: fn(q, pages, slots, "fp8", kv_scale, SOFTMAX_SCALE))
            o, lse = call()
            torch.cuda.synchronize()
            want_o, want_lse = reference(q[:8], pages, slots[:8], "fp8", kv_scale, SOFTMAX_SCALE)
            o_err = float((o[:8].double() - want_o.double()).norm() / want_o.double().norm())
            lse_err = float((lse[:8].float() - want_lse.float()).abs().max())
            ok = o_err < 2e-2 and lse_err < 2e-2
            print(f"  check {case:<10s} {name:<24s} {'pass' if ok else 'FAIL'}  o rel err {o_err:.2e}, lse max err "
                  f"{lse_err:.2e}", flush=True)
            if not ok:
                failures.append(f"{case} {name}")
                continue
            times[name] = timing.bench_ms(call, "cuda")
        rows.append((case, tokens, times))
    print("\n| case | wgmma ms | % copy | general ms | general / wgmma |\n|---|---:|---:|---:|---:|")
    for case, tokens, times in rows:
        ours, general = times.get("wgmma (the route now)"), times.get("triton general")
        ratio = f"{general / ours:.2f}x" if ours and general else "-"
        pct = f"{100 * tokens * TOPK * 576 / (ours * 1e-3) / 1e12 / ceiling:.1f}" if ours else "-"
        print(f"| {case} | {ours or float('nan'):.4f} | {pct} | {general or float('nan'):.4f} | {ratio} |")


def main(argv=None) -> int:
    return edge_then_sweep("wgmma_fp8_check", __doc__, edge_cases, sweep, argv)


if __name__ == "__main__":
    run("wgmma_fp8_check", main)
