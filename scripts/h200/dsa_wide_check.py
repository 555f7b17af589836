"""The DSA layer at 8 requests x 1 token at 1M context (the seed's long-context decode) on the nvidia backend, with
the top-k's wide-row groups (64-entry groups from 1M on, ``config.WIDE_TOPK_ROWS``) and without them, checked
equal bit for bit, then timed in the same run; H = 128 and 16, fp8_ds_mla latents, FP8 index keys.

Usage (on a CUDA machine, from the repository root with dsahal importable)::

    python3 scripts/h200/dsa_wide_check.py [--cpu-smoke]
"""
from __future__ import annotations

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from script_cli import finish, run, smoke_args, start  # scripts/h200/script_cli.py

HEADS_INDEX = 32
BLOCK_TOKENS = 64
DEVICE = "cuda"  # --cpu-smoke: "cpu" under TRITON_INTERPRET=1, on the reference backend (it checks the script)


def main(argv=None) -> int:
    global DEVICE, BLOCK_TOKENS
    if smoke_args(__doc__.splitlines()[0], argv).cpu_smoke:
        DEVICE, BLOCK_TOKENS = "cpu", 16
    torch, triton, started, ceiling = start("dsa_wide_check", DEVICE)
    from dsahal import ops
    from dsahal.backends.nvidia import config
    from dsahal.registry import use_backend

    requests, context, topk = (8, 1 << 20, 2048) if DEVICE == "cuda" else (2, 256, 16)
    blocks = requests * context // BLOCK_TOKENS
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    index_pages = cache_pools.index_pool(torch, "fp8", blocks, gen, DEVICE, BLOCK_TOKENS)
    kv_pages, _ = cache_pools.latent_pools(torch, ["fp8_ds_mla"], blocks * BLOCK_TOKENS, DEVICE,
                                           BLOCK_TOKENS)["fp8_ds_mla"]
    table, req, pos = cache_pools.decode_batch(torch, requests, 1, context, blocks, gen, DEVICE, BLOCK_TOKENS)
    q_index = torch.randn(requests, HEADS_INDEX, 128, device=DEVICE, generator=gen).to(torch.float8_e4m3fn)
    w = torch.rand(requests, HEADS_INDEX, device=DEVICE, generator=gen) + 0.01
    failures = []
    print("\n| DSA layer 8x1 @1M, fp8_ds_mla | wide-row top-k (default) | 16-entry groups | ratio |\n|---|---|---|---|")
    backend = use_backend("nvidia" if DEVICE == "cuda" else "reference")  # (the smoke run checks the script)
    backend.__enter__()
    for heads in (128, 16):
        q = torch.randn(requests, heads, 576, device=DEVICE, generator=gen).to(torch.bfloat16)
        kw = dict(index_fmt="fp8", kv_fmt="fp8_ds_mla", kv_scale=None, topk=topk, max_context=context,
                  softmax_scale=192 ** -0.5, check=False)

        def layer():
            return ops.dsa_attention(q_index, w, index_pages, q, kv_pages, table, req, pos, **kw)

        wide = config.WIDE_TOPK_ROWS

        def narrow(on: bool) -> None:  # the sixteen-entry groups at every width, as before, or the default
            config.WIDE_TOPK_ROWS = 1 << 62 if on else wide
            config.topk_config.cache_clear()

        try:
            narrow(False)
            new = layer()
            narrow(True)
            old = layer()
            times = {True: [], False: []}
            for _ in range(5):  # rounds interleaved: a drift of the host or the clocks hits both alike
                for on in (False, True):
                    narrow(on)
                    times[on].append(timing.bench_ms(layer, DEVICE, warmup=3, rep=20))
        finally:
            narrow(False)
        new_ms, old_ms = (sorted(times[on])[len(times[on]) // 2] for on in (False, True))
        same = torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])
        if not same:
            failures.append(f"H={heads}: the layer's outputs differ between the two top-k configurations")
        print(f"| H={heads} | {new_ms:.3f} ms | {old_ms:.3f} ms | {old_ms / new_ms:.2f}x{'' if same else ' (DIFFER)'} |",
              flush=True)
    return finish("dsa_wide_check", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("dsa_wide_check", main)
