"""The wgmma sparse MLA kernels at more than 16 heads (groups of 16 heads, one program each) on one H200: checked
against the float64 reference on edge cases first, then timed beside the routes that serve those head counts
otherwise (FlashMLA with its heads padded to 64, the few-heads Triton kernel, the general Triton kernel), same run.

Usage (on a CUDA machine, from the repository root)::

    python3 scripts/h200/head_groups_check.py [--pool-tokens 1048576] [--no-sweep]

1. Edge cases (one line each), fp8_ds_mla and NVFP4 latents: 16, 17, 24, 32 and 40 heads (a last group of 1, 8, 16
   and 8 heads), skipped (-1) and out-of-range slots, a row with no valid slot, one split and 256-slot splits, records
   over 12 binades; o relative error (Frobenius, rows with a valid slot), lse error (relative past 1), the empty row.
2. 64 requests x 5 tokens x top-k 2048 over a 1M-token pool at 16, 24, 32, 48 and 64 heads: each route's function
   checked on its first rows against the reference, then timed (``do_bench`` median): ms and the ratio to the wgmma
   kernel's groups.

Exits with one ``error:`` line when a check fails (after timing what passed).
"""
from __future__ import annotations

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from mla_check import edge_errors  # scripts/h200/mla_check.py
from script_cli import edge_then_sweep, run  # scripts/h200/script_cli.py
from wgmma_mla_check import TOPK, check, flash_mla, serving_inputs

BLOCK_TOKENS, SOFTMAX_SCALE = 64, 192**-0.5
TOL = {"fp8_ds_mla": (1e-2, 1e-3), "nvfp4": (4e-3, 1e-4)}  # (o, lse): the two kernels' own check scripts' bounds


def edge_cases(torch, failures):
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma
    from dsahal.backends.triton_kernels.sparse_mla_wgmma_fp4 import sparse_mla_wgmma_fp4
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    launchers = {"fp8_ds_mla": sparse_mla_wgmma, "nvfp4": sparse_mla_wgmma_fp4}
    gen = torch.Generator().manual_seed(0)
    for fmt, launcher in launchers.items():
        spec = latent_format(fmt)
        blocks = 40
        slots_n = blocks * BLOCK_TOKENS
        rows = torch.randn(slots_n, 576, generator=gen) * torch.exp2(torch.randint(-6, 7, (slots_n, 1), generator=gen))
        records = spec.pack(rows + 1e-3).view(blocks, BLOCK_TOKENS, spec.token_bytes)
        pages = records.cuda()
        for heads in (16, 17, 24, 32, 40):
            for split in (None, 256):
                tokens, width = 6, 700
                slots = torch.randint(-1, slots_n, (tokens, width), generator=gen, dtype=torch.int32)
                slots[1, :3] = slots_n + 5  # past the pool: skipped
                slots[-1] = -1  # a row with no valid slot
                q = (torch.randn(tokens, heads, 576, generator=gen) * 2.0).to(torch.bfloat16)
                safe = torch.where(slots >= slots_n, -1, slots)
                want_o, want_lse = reference(q.float(), records, safe, fmt, None, 0.07)
                o, lse = launcher(q.cuda(), pages, slots.cuda(), fmt, None, 0.07, split_size=split)
                torch.cuda.synchronize()
                err = edge_errors(torch, o, lse, want_o, want_lse)
                tol_o, tol_lse = TOL[fmt]
                # every head's own error too: a group offset wrong by a head would show in one group only
                ok = err.o < tol_o and err.head < 4 * tol_o and err.lse < tol_lse and err.empty and err.finite
                case = f"{fmt} H={heads} split {split}"
                print(f"  {case:<32s} o rel err {err.o:.2e} (worst head {err.head:.2e})  lse err "
                      f"{err.lse:.2e}  empty row ok {err.empty}  {'pass' if ok else 'FAIL'}", flush=True)
                if not ok:
                    failures.append(case)


def sweep(torch, pool_tokens, ceiling, failures):
    from dsahal.backends.nvidia import ops as nvidia_ops

    pools = cache_pools.latent_pools(torch, ("fp8_ds_mla", "nvfp4"), pool_tokens, "cuda")
    rows = []
    requests, per_request = 64, 5
    tokens = requests * per_request
    for fmt, ours in (("fp8_ds_mla", nvidia_ops.sparse_mla_wgmma), ("nvfp4", nvidia_ops.sparse_mla_wgmma_fp4)):
        pages = pools[fmt][0]
        for heads in (16, 24, 32, 48, 64):
            slots, q = serving_inputs(torch, pages.shape[0] * BLOCK_TOKENS, heads, tokens)
            case = f"{fmt} H={heads} {requests}x{per_request}"
            runs = [("wgmma, groups of 16", *(2 * (lambda: ours(q, pages, slots, fmt, None, SOFTMAX_SCALE),)))]
            if fmt == "fp8_ds_mla" and heads <= 64:
                peer = flash_mla(torch, q, pages, slots, requests, per_request)
                if peer is not None:
                    runs.append(("FlashMLA (h pad 64)", peer[0], peer[1]))
            if heads <= 32:
                runs.append(("triton few heads", *(2 * (lambda: nvidia_ops.sparse_mla_small_heads(
                    q, pages, slots, fmt, None, SOFTMAX_SCALE),))))
            runs.append(("triton general", *(2 * (lambda: nvidia_ops.sparse_mla(
                q, pages, slots, fmt, None, SOFTMAX_SCALE),))))
            ours_ms = None
            for name, timed, checked in runs:
                try:
                    ok, msg = check(torch, checked, q, pages, slots, fmt)
                except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
                    ok, msg = False, f"{type(exc).__name__}: {str(exc)[:300]}"
                print(f"  check {case:<24s} {name:<22s} {'pass' if ok else 'FAIL'}  {msg}", flush=True)
                if not ok:
                    failures.append(f"{case} {name}: {msg}")
                    continue
                ms = timing.bench_ms(timed, "cuda")
                ours_ms = ms if name.startswith("wgmma") else ours_ms
                pct = 100 * tokens * TOPK * pages.shape[2] / (ms * 1e-3) / 1e12 / ceiling  # each record once
                rows.append((case, name, ms, pct, None if ours_ms is None else ms / ours_ms))
    print("\n| case | route | ms | % copy (records once) | this / wgmma groups |")
    print("|---|---|---:|---:|---:|")
    for case, name, ms, pct, ratio in rows:
        print(f"| {case} | {name} | {ms:.4f} | {pct:.1f} | {'-' if ratio is None else f'{ratio:.2f}'} |")


def main(argv=None) -> int:
    return edge_then_sweep("head_groups_check", __doc__, edge_cases, sweep, argv)


if __name__ == "__main__":
    run("head_groups_check", main)
