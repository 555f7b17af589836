"""The wgmma few-heads kernel with a producer warpgroup (``ws=True``) against the launch it would replace, same run.

Usage (on a CUDA machine, from the repository root)::

    python3 scripts/h200/ws_sweep.py [--heads 16,12] [--tokens 320,512,128,64] [--regs 24,32,40] [--edges-only]

``--edges-only``: the edge cases alone, no timing (run it under ``compute-sanitizer --tool memcheck``).

Why: a step of the shipped kernel is 1,478 instructions a warp, about 340 of them the gathers' own (the slot indices'
loads, the record offsets, the copies' addresses and the copies; sm_90 SASS, forty-third session), at two programs of
four warps a SM. With ``ws`` a second warpgroup (the producer, 24-40 registers a thread) gathers, handing each stage
over by mbarriers, and the computing warpgroup's step is 1,171 instructions; both programs still fit a SM (a launch
cap of 128 registers, ``setmaxnreg`` moving them to the computing warpgroup).

Cases: fp8_ds_mla latents (1M-token pool, 2048 slots a row, the last 7 skipped) at each head count and token count,
and per-tensor FP8 at 16 heads x 320 tokens; for each, the launch today (the balanced schedule at two programs a SM,
and the fixed splits) and the same launch with ``ws`` at each producer register count; FlashMLA's decode on the same
bytes (heads padded to 64) as the peer. Each launch is checked first: today's first rows against the float64
reference, every ``ws`` launch against its twin bit for bit (the same arithmetic in the same order), then timed from
CUDA-graph replays. Edge cases after, each checked against the reference and bit for bit the same way: 5 heads, rows
of 2,000 slots with skipped and out-of-range ones and a row with none valid, on a balanced launch of 7 programs (each
meeting many rows), 512-slot splits and one split; int64 slots; a strided q; blocks 16 bytes further apart than
their records (not flat); per-tensor FP8 records at 20 heads (two head groups).

Exits with one ``error:`` line when a check fails (after timing what passed).
"""
from __future__ import annotations

import argparse

import pools as cache_pools  # scripts/h200/pools.py
from gluon_launch import graph_us  # scripts/h200/gluon_launch.py
from module_ab import same_bits  # scripts/h200/module_ab.py
from script_cli import CheckError, run, start  # scripts/h200/script_cli.py
from wgmma_mla_check import SOFTMAX_SCALE, TOPK, check, flash_mla


def bitwise(torch, case, fn, twin_fn, failures) -> bool:
    """Whether ``fn()`` gives ``twin_fn()``'s outputs bit for bit (:func:`module_ab.same_bits`; one line and a failure
    when not)."""
    (o, lse), (want_o, want_lse) = fn(), twin_fn()
    torch.cuda.synchronize()
    same = same_bits(torch, (o, lse), (want_o, want_lse))
    if not same:
        err = ((o.float() - want_o.float()).abs().max().item(), (lse - want_lse).abs().nan_to_num().max().item())
        failures.append(f"{case}: not bit for bit its twin (o max diff {err[0]:.3e}, lse {err[1]:.3e})")
        print(f"  {case}: DIFFERS from its twin {err}", flush=True)
    return same


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default="16,12")
    parser.add_argument("--tokens", default="320,512,128,64")
    parser.add_argument("--regs", default="24,32,40")
    parser.add_argument("--edges-only", action="store_true", help="the edge cases alone, no timing")
    args = parser.parse_args(argv)
    torch, _, _, _ = start("ws_sweep", "cuda")
    from dsahal.backends.nvidia import config, ops
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    regs = [int(r) for r in args.regs.split(",")]
    pools = cache_pools.latent_pools(torch, ("fp8_ds_mla", "fp8"), 1 << 20, "cuda")
    cases = [("fp8_ds_mla", h, n) for h in map(int, args.heads.split(",")) for n in map(int, args.tokens.split(","))]
    cases.append(("fp8", 16, 320))
    failures, table = [], []
    if args.edges_only:
        cases = []
    for fmt, heads, tokens in cases:
        pages, kv_scale = pools[fmt]
        gen = torch.Generator(device="cuda").manual_seed(heads * 1000 + tokens)
        slots = torch.randint(0, pages.shape[0] * pages.shape[1], (tokens, TOPK), device="cuda", dtype=torch.int32,
                              generator=gen)
        slots[:, -7:] = -1
        q = torch.randn(tokens, heads, 576, device="cuda", generator=gen).to(torch.bfloat16)
        times = {}
        if fmt == "fp8_ds_mla":
            peer = flash_mla(torch, q, pages, slots, tokens, 1)
            if peer is not None:
                times["FlashMLA (h pad 64)"] = graph_us(torch, peer[0])
        bases = {"balanced": dict(config.WGMMA_FEW_HEADS, programs=2 * sms, ws=False),
                 "fixed": dict(ops.wgmma_launch(tokens), ws=False)}
        for base, cfg in bases.items():
            fn = (lambda cfg=cfg: sparse_mla_wgmma(q, pages, slots, fmt, kv_scale, SOFTMAX_SCALE, **cfg))
            case = f"{fmt} H={heads} {tokens} tokens {base} {cfg}"
            ok, msg = check(torch, fn, q, pages, slots, fmt, kv_scale)
            print(f"  check {case}: {'ok' if ok else 'FAIL'} {msg}", flush=True)
            if not ok:
                failures.append(f"{case}: {msg}")
                continue
            times[base] = graph_us(torch, fn)
            for r in (regs if base == "balanced" else regs[1:2]):
                ws_cfg = dict(cfg, ws=True, producer_regs=r)
                ws_fn = (lambda ws_cfg=ws_cfg: sparse_mla_wgmma(q, pages, slots, fmt, kv_scale, SOFTMAX_SCALE, **ws_cfg))
                if bitwise(torch, f"{case} ws {r}", ws_fn, fn, failures):
                    times[f"{base} ws {r}"] = graph_us(torch, ws_fn)
        table.append((fmt, heads, tokens, times))
        print(f"{fmt} H={heads} {tokens}: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()), flush=True)

    # edge cases: few heads, partial last steps, skipped / out-of-range slots, a row with none valid, many pieces
    pages, kv_scale = pools["fp8_ds_mla"]
    gen = torch.Generator(device="cuda").manual_seed(7)
    pool = pages.shape[0] * pages.shape[1]
    slots = torch.randint(0, pool, (9, 2000), device="cuda", dtype=torch.int32, generator=gen)
    slots[:, 5::11] = -1
    slots[:, 7::13] = pool + 3  # past the pool: the kernel skips them (the reference is given -1 there)
    slots[4] = -1
    q = torch.randn(9, 5, 576, device="cuda", generator=gen).to(torch.bfloat16)
    # blocks 16 bytes further apart than their records: a view into a larger buffer (not flat)
    spaced = torch.zeros(pages.shape[0], pages.shape[1] * 656 + 16, dtype=torch.uint8, device="cuda")
    spaced_pages = spaced[:, : pages.shape[1] * 656].unflatten(1, (pages.shape[1], 656))
    spaced_pages.copy_(pages)
    wide_q = torch.randn(9, 2, 5, 576, device="cuda", generator=gen).to(torch.bfloat16)[:, 1]  # a strided q
    fp8_pages, fp8_scale = pools["fp8"]
    q20 = torch.randn(9, 20, 576, device="cuda", generator=gen).to(torch.bfloat16)
    edges = [("balanced 7 programs", "fp8_ds_mla", q, pages, slots, None, dict(programs=7)),
             ("fixed 512-slot splits", "fp8_ds_mla", q, pages, slots, None, dict(split_size=512)),
             ("fixed one split", "fp8_ds_mla", q, pages, slots, None, dict(split_size=None)),
             ("int64 slots, balanced", "fp8_ds_mla", q, pages, slots.long(), None, dict(programs=11)),
             ("strided q, spaced blocks", "fp8_ds_mla", wide_q, spaced_pages, slots, None, dict()),
             ("spaced blocks, balanced", "fp8_ds_mla", q, spaced_pages, slots, None, dict(programs=5)),
             ("fp8 20 heads (two groups)", "fp8", q20, fp8_pages, slots, fp8_scale, dict()),
             ("fp8 20 heads, balanced", "fp8", q20, fp8_pages, slots, fp8_scale, dict(programs=9))]
    for name, fmt, eq, epages, eslots, escale, extra in edges:
        cfg = dict(config.WGMMA_FEW_HEADS, **extra, ws=False)
        fn = (lambda cfg=cfg, fmt=fmt, eq=eq, epages=epages, eslots=eslots, escale=escale:
              sparse_mla_wgmma(eq, epages, eslots, fmt, escale, SOFTMAX_SCALE, **cfg))
        ref_slots = torch.where(eslots >= pool, -1, eslots)
        ok, msg = check(torch, fn, eq, epages, ref_slots, fmt, escale)
        print(f"  edge {name}: {'ok' if ok else 'FAIL'} {msg}", flush=True)
        if not ok:
            failures.append(f"edge {name}: {msg}")
        ws_cfg = dict(cfg, ws=True)
        ws_fn = (lambda ws_cfg=ws_cfg, fmt=fmt, eq=eq, epages=epages, eslots=eslots, escale=escale:
                 sparse_mla_wgmma(eq, epages, eslots, fmt, escale, SOFTMAX_SCALE, **ws_cfg))
        if bitwise(torch, f"edge {name} ws", ws_fn, fn, failures):
            print(f"  edge {name} ws: bit for bit", flush=True)

    print("\n| format | H | tokens | launch | GPU us (graph) | FlashMLA / this | base / this |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for fmt, heads, tokens, times in table:
        peer = times.get("FlashMLA (h pad 64)")
        for name, us in times.items():
            base = times.get(name.split(" ws")[0])
            print(f"| {fmt} | {heads} | {tokens} | {name} | {us:.1f} | {'-' if peer is None else f'{peer / us:.3f}'} |"
                  f" {'-' if base is None else f'{base / us:.3f}'} |")
    if failures:
        raise CheckError(f"{len(failures)} check(s) failed: {failures[0]}")
    return 0


if __name__ == "__main__":
    run("ws_sweep", main)
