"""The wgmma sparse-MLA kernels' balanced schedule against their fixed splits by query tokens, on one GPU: from which
token count default mode should take it (``config.WGMMA_BALANCED_FROM_TOKENS``).

Usage (on a CUDA machine, from the repository root)::

    python3 scripts/h200/balanced_sweep.py [--heads 16] [--tokens 16,32,64,...]

n query tokens x 2048 slots (the last 7 skipped) over a 1M-token pool, for each record format the wgmma kernels read
(fp8_ds_mla, per-tensor fp8, nvfp4): the fixed-split launch default mode takes today for n tokens
(``ops.wgmma_launch`` / ``ops.wgmma_fp4_launch`` without a device: no balanced schedule), and the balanced schedule
at two programs a SM on the same launch (NVFP4: also the 168-register launch at three a SM), and FlashMLA's decode
(heads padded to 64) on fp8_ds_mla where it loads. Each launch checked first: its first rows against the float64
reference, every row of a balanced launch against the fixed one; then its GPU time from CUDA-graph replays (host time
excluded: small calls are host-bound). One table (us) and, per format, the fastest launch at each n.

Exits with one ``error:`` line when a check fails (after timing what passed).
"""
from __future__ import annotations

import argparse

import pools as cache_pools  # scripts/h200/pools.py
from gluon_launch import graph_us  # scripts/h200/gluon_launch.py
from script_cli import CheckError, run, start  # scripts/h200/script_cli.py
from wgmma_mla_check import SOFTMAX_SCALE, TOPK, check, flash_mla, rows_agree

TOKENS = (16, 32, 48, 64, 96, 128, 192, 256, 320, 512, 1024)
FORMATS = ("fp8_ds_mla", "fp8", "nvfp4")


def candidates(fmt: str, tokens: int, sms: int) -> dict:
    """name -> launch keyword arguments: the fixed launch default mode takes for ``tokens`` and balanced ones."""
    from dsahal.backends.nvidia import config, ops

    if fmt == "nvfp4":
        fixed = dict(ops.wgmma_fp4_launch(tokens))
        many = config.WGMMA_NVFP4_MANY
        return {"fixed (today)": fixed,
                "balanced 3 stages, 2/SM": dict(config.WGMMA_NVFP4, programs=2 * sms),
                "balanced 168 regs, 3/SM": dict(config.WGMMA_NVFP4, stages=many["stages"], maxnreg=many["maxnreg"],
                                                in_flight=many["in_flight"], programs=3 * sms)}
    return {"fixed (today)": dict(ops.wgmma_launch(tokens)),
            "balanced 2/SM": dict(config.WGMMA_FEW_HEADS, programs=2 * sms)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--formats", default=",".join(FORMATS))
    args = parser.parse_args(argv)
    torch, _, _, _ = start("balanced_sweep", "cuda")
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma
    from dsahal.backends.triton_kernels.sparse_mla_wgmma_fp4 import sparse_mla_wgmma_fp4

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    formats = args.formats.split(",")
    pools = cache_pools.latent_pools(torch, formats, 1 << 20, "cuda")
    failures, table = [], []
    for fmt in formats:
        pages, kv_scale = pools[fmt]
        kernel = sparse_mla_wgmma_fp4 if fmt == "nvfp4" else sparse_mla_wgmma
        for tokens in map(int, args.tokens.split(",")):
            gen = torch.Generator(device="cuda").manual_seed(tokens)
            slots = torch.randint(0, pages.shape[0] * pages.shape[1], (tokens, TOPK), device="cuda",
                                  dtype=torch.int32, generator=gen)
            slots[:, -7:] = -1
            q = torch.randn(tokens, args.heads, 576, device="cuda", generator=gen).to(torch.bfloat16)
            times = {}
            if fmt == "fp8_ds_mla":
                peer = flash_mla(torch, q, pages, slots, tokens, 1)
                if peer is not None:
                    times["FlashMLA (h pad 64)"] = graph_us(torch, peer[0])
            launches = candidates(fmt, tokens, sms)
            fixed_fn = None
            for name, cfg in launches.items():
                fn = (lambda cfg=cfg: kernel(q, pages, slots, fmt, kv_scale, SOFTMAX_SCALE, **cfg))
                case = f"{fmt} {tokens} tokens {name} {cfg}"
                ok, msg = check(torch, fn, q, pages, slots, fmt, kv_scale)
                if not ok:
                    print(f"  check {case}: FAIL {msg}", flush=True)
                    failures.append(f"{case}: {msg}")
                    continue
                if fixed_fn is None:
                    fixed_fn = fn
                else:
                    n = len(failures)
                    rows_agree(torch, case, fn, fixed_fn, failures)
                    if len(failures) > n:
                        continue
                times[name] = graph_us(torch, fn)
            best = min(times, key=times.get) if times else "-"
            table.append((fmt, tokens, times, best))
            print(f"{fmt} {tokens}: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()) + f" -> {best}",
                  flush=True)
    print(f"\n| format | tokens (H = {args.heads}) | launch | GPU us (graph) | fixed / this |")
    print("|---|---:|---|---:|---:|")
    for fmt, tokens, times, best in table:
        fixed = times.get("fixed (today)")
        for name, us in times.items():
            mark = " (fastest)" if name == best else ""
            ratio = "-" if fixed is None else f"{fixed / us:.3f}"
            print(f"| {fmt} | {tokens} | {name}{mark} | {us:.1f} | {ratio} |")
    if failures:
        raise CheckError(f"{len(failures)} launch(es) failed their check: {failures[0]}")
    return 0


if __name__ == "__main__":
    run("balanced_sweep", main)
