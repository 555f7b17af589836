"""The wgmma NVFP4 sparse MLA kernel's GPU time by query tokens and slots a split, on one H200: which split default
mode's launch should take for small calls.

Usage (on a CUDA machine, from the repository root)::

    python3 scripts/h200/fp4_split_probe.py

n x 1 query tokens (n = 8 .. 320) x 2048 slots over a 1M-token NVFP4 pool, H = 16: each launch (the backend's
parameters for n tokens, ``ops.wgmma_fp4_launch``, at 1024 / 512 / 256 slots a split) checked on its first rows
against the float64 reference, then its GPU time from CUDA-graph replay (host time excluded: small calls through the
launcher are host-bound on some of these machines) and ``do_bench``'s time of the eager call.
"""
from __future__ import annotations

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from gluon_launch import graph_us  # scripts/h200/gluon_launch.py
from script_cli import CheckError, run, start  # scripts/h200/script_cli.py
from wgmma_mla_check import SOFTMAX_SCALE, check

SPLITS = (1024, 512, 256)


def main() -> int:
    torch, _, _, _ = start("fp4_split_probe", "cuda")
    from dsahal.backends.nvidia import ops
    from dsahal.backends.triton_kernels.sparse_mla_wgmma_fp4 import sparse_mla_wgmma_fp4

    pages = cache_pools.latent_pools(torch, ("nvfp4",), 1 << 20, "cuda")["nvfp4"][0]
    failures = []
    print("| tokens | launch | graph us, split " + " | ".join(str(s) for s in SPLITS) + " | do_bench us, split "
          + " | ".join(str(s) for s in SPLITS) + " |")
    print("|---|---|" + "---:|" * (2 * len(SPLITS)))
    for tokens in (8, 16, 32, 64, 128, 320):
        g = torch.Generator(device="cuda").manual_seed(tokens)
        slots = torch.randint(0, pages.shape[0] * 64, (tokens, 2048), device="cuda", dtype=torch.int32, generator=g)
        slots[:, -7:] = -1
        q = torch.randn(tokens, 16, 576, device="cuda", generator=g).to(torch.bfloat16)
        launch = dict(ops.wgmma_fp4_launch(tokens))
        fns = {}
        for split in SPLITS:
            cfg = dict(launch, split_size=split)
            fn = (lambda cfg=cfg: sparse_mla_wgmma_fp4(q, pages, slots, "nvfp4", None, SOFTMAX_SCALE, **cfg))
            ok, msg = check(torch, fn, q, pages, slots, "nvfp4")
            if not ok:
                failures.append(f"{tokens} tokens split {split}: {msg}")
                print(f"  check {tokens} tokens split {split}: FAIL {msg}", flush=True)
                continue
            fns[split] = fn
        graph = [f"{graph_us(torch, fns[s]):.1f}" if s in fns else "-" for s in SPLITS]
        eager = [f"{1e3 * timing.bench_ms(fns[s], 'cuda'):.1f}" if s in fns else "-" for s in SPLITS]
        shown = {k: v for k, v in launch.items() if k != "split_size"}
        print(f"| {tokens} | {shown} | " + " | ".join(graph) + " | " + " | ".join(eager) + " |", flush=True)
    if failures:
        raise CheckError(f"{len(failures)} launch(es) differ from the reference: {failures[0]}")
    return 0


if __name__ == "__main__":
    run("fp4_split_probe", main)
