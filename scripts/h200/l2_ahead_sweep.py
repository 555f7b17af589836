"""The wgmma few-heads sparse MLA kernel's L2 hint (``l2_ahead``) swept, same run: each launch checked bit for bit
against the same launch without the hint (the certified kernel), the hint-free launch checked against the float64
reference on the first rows, then all timed from CUDA-graph replays beside FlashMLA's padded decode on the same
bytes.

The hint (``sparse_mla_wgmma(l2_ahead=d)``): each 64-slot step also asks the L2 for the records of the step ``d``
past the one whose gathers it starts (two ``cp.async.bulk.prefetch.L2`` a record), so the gathers of later steps
find their bytes in the L2 and more bytes are in flight a SM than its two stages hold.

    python3 scripts/h200/l2_ahead_sweep.py [--ahead 0,1,2,3] [--cpu-smoke]

Cases: fp8_ds_mla (and per-tensor FP8) at H = 16 / 12, 64 x 5, 64 x 8, 192 and 128 tokens, 2048 slots a token over a
1M-token pool (7 skipped a row), and an edge case (5 heads, 2,000 slots: skipped and out-of-range slots, a row with
none valid); launches: the fixed splits the backend takes without a device and the balanced schedule at two programs
a SM. ``--cpu-smoke`` only checks the script's arguments (Gluon has no interpreter).
"""
from __future__ import annotations

import sys

import timing  # scripts/h200/timing.py
import pools as cache_pools  # scripts/h200/pools.py
from module_ab import same_bits  # scripts/h200/module_ab.py
from script_cli import CheckError, finish, run, start  # scripts/h200/script_cli.py

SOFTMAX_SCALE = 192 ** -0.5
CASES = ((16, 320, 2048, "H=16 64 x 5"), (12, 320, 2048, "H=12 64 x 5"), (16, 512, 2048, "H=16 64 x 8"),
         (16, 192, 2048, "H=16 192 tokens"), (16, 128, 2048, "H=16 128 tokens"), (5, 70, 2000, "H=5 edges"))


def aheads(argv) -> list[int]:
    if "--ahead" not in argv:
        return [0, 1, 2, 3]
    try:
        values = [int(v) for v in argv[argv.index("--ahead") + 1].split(",")]
    except (IndexError, ValueError):
        raise CheckError("l2_ahead_sweep: --ahead expected comma-separated ints, e.g. 0,1,2") from None
    if 0 not in values:
        values = [0] + values  # (the certified launch every other is checked against)
    return values


def flash_mla_padded(torch, q, pages, slots):
    """FlashMLA's sparse decode on the same bytes with the heads zero-padded to 64 outside the call, or None."""
    try:
        import flash_mla as fm
    except Exception as exc:  # noqa: BLE001 - no peer column, said once
        print(f"FlashMLA not available: {type(exc).__name__}: {exc}")
        return None
    tokens, heads, _ = q.shape
    qp = torch.zeros(tokens, 1, 64, 576, dtype=q.dtype, device="cuda")
    qp[:, 0, :heads] = q
    cache = pages.view(pages.shape[0], pages.shape[1], 1, 656)
    meta, _ = fm.get_mla_metadata()
    idx = slots.view(tokens, 1, slots.shape[1])
    return lambda: fm.flash_mla_with_kvcache(qp, cache, None, None, 512, meta, softmax_scale=SOFTMAX_SCALE,
                                             is_fp8_kvcache=True, indices=idx, use_legacy=True, kv_format="V32")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    values = aheads(argv)
    if "--cpu-smoke" in argv:
        print(f"l2_ahead_sweep: arguments fine ({values}); the kernel needs an sm_90 GPU")
        return 0
    torch, _, started, ceiling = start("l2_ahead_sweep", "cuda")
    from dsahal.backends.nvidia import ops
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma
    from dsahal.reference.sparse_mla import sparse_mla as reference

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    failures, rows = [], []
    pools = cache_pools.latent_pools(torch, ("fp8_ds_mla", "fp8"), 1 << 20, "cuda")
    for fmt in ("fp8_ds_mla", "fp8"):
        pages, scale = pools[fmt]
        pool_slots = pages.shape[0] * pages.shape[1]
        for heads, tokens, width, label in CASES:
            if fmt == "fp8" and tokens != 320:
                continue
            gen = torch.Generator(device="cuda").manual_seed(heads * 1000 + tokens)
            slots = torch.randint(0, pool_slots, (tokens, width), device="cuda", dtype=torch.int32, generator=gen)
            slots[:, -7:] = -1
            edges = width != 2048
            if edges:  # skipped and out-of-range slots, a row with none valid
                slots[:, ::13] = -1
                slots[1, :300] = pool_slots + 3
                slots[-1] = -1
            q = torch.randn(tokens, heads, 576, device="cuda", generator=gen).to(torch.bfloat16)
            launches = {"fixed": ops.wgmma_launch(tokens), "balanced": dict(ops.wgmma_launch(tokens), programs=2 * sms)}
            peer = None if edges or fmt != "fp8_ds_mla" else flash_mla_padded(torch, q, pages, slots)
            peer_ms = timing.bench_ms(timing.captured(torch, peer).replay, "cuda") if peer else None
            for kind, launch in launches.items():
                calls = {d: (lambda d=d: sparse_mla_wgmma(q, pages, slots, fmt, scale, SOFTMAX_SCALE, l2_ahead=d,
                                                         **launch)) for d in values}
                base = calls[0]()
                # the certified launch against the float64 reference on its first rows (the rest by the bits)
                n = 8
                safe = torch.where((slots[:n] >= 0) & (slots[:n] < pool_slots), slots[:n], -1)
                want_o, want_lse = reference(q[:n].double(), pages, safe, fmt, scale, SOFTMAX_SCALE)
                err = ((base[0][:n].double() - want_o).abs().max() / want_o.abs().max().clamp_min(1e-30)).item()
                finite = torch.isfinite(want_lse)
                lse_ok = torch.equal(finite, torch.isfinite(base[1][:n])) and (
                    (base[1][:n].double() - want_lse.double())[finite].abs().max().item() < 1e-4
                    if finite.any() else True)
                if not (err < 2e-2 and lse_ok):
                    failures.append(f"{fmt} {label} {kind} l2_ahead=0: o rel err {err:.2e}, lse ok {lse_ok}")
                    continue
                ok = True
                for d in values[1:]:
                    if not same_bits(torch, calls[d](), base):
                        failures.append(f"{fmt} {label} {kind} l2_ahead={d}: outputs differ from l2_ahead=0's")
                        ok = False
                torch.cuda.synchronize()
                print(f"{fmt} {label} {kind}: reference o {err:.1e}; hints {'the same bits' if ok else 'DIFFER'}",
                      flush=True)
                if edges or not ok:
                    continue
                graphs = {d: timing.captured(torch, call) for d, call in calls.items()}
                times = {d: [] for d in values}
                for order in (values, values[::-1]):
                    for d in order:
                        times[d].append(timing.bench_ms(graphs[d].replay, "cuda"))
                ms = {d: sum(t) / len(t) for d, t in times.items()}
                gathered = tokens * (width - 7) * pages.shape[2]
                cells = " | ".join(f"{ms[d]:.4f}" for d in values)
                best = min(values, key=ms.get)
                rows.append(f"| {fmt} {label} | {kind} | {cells} | {ms[0] / ms[best]:.3f} (l2_ahead={best}) | "
                            f"{100 * gathered / (ms[best] * 1e-3) / 1e12 / ceiling:.1f} | "
                            + (f"{peer_ms:.4f} / {peer_ms / ms[best]:.2f}x |" if peer_ms else "- |"))
                del graphs
    head = " | ".join(f"l2_ahead={d} ms" for d in values)
    print(f"\ncopy ceiling {ceiling:.2f} TB/s\n\n| case | launch | {head} | best: l2_ahead=0 / best | best % copy | "
          f"FlashMLA (pad 64) ms / ratio |\n| --- | --- | " + " | ".join("---:" for _ in values) + " | ---: | ---: | ---: |")
    print("\n".join(rows))
    return finish("l2_ahead_sweep", failures, started)


if __name__ == "__main__":
    run("l2_ahead_sweep", main)
