"""The general sparse MLA kernel on per-tensor FP8 latents with bf16 queries at many heads: its shipped launch against
the ``fp16`` launch option (fp16 MMAs on the codes widened exactly, each head's queries scaled into fp16 by a power of
two, P in fp16: fewer registers a step than the codes widened to fp32 and rounded to bf16), with value splits and
stages, same run. Each launch is checked against the float64 reference on its first rows first (a launch that fails
is reported and not timed), then timed from CUDA-graph replays, beside FlashMLA's decode on the same tokens as
fp8_ds_mla records (FlashMLA has no per-tensor FP8 format; a peer for scale only).

    python3 scripts/h200/general_fp16_sweep.py [--cpu-smoke]

``--cpu-smoke``: one tiny case under the Triton interpreter (checks the script; the interpreter's fp16 dots are not
the GPU's).
"""
from __future__ import annotations

import sys

import timing  # scripts/h200/timing.py
import pools as cache_pools  # scripts/h200/pools.py
from script_cli import finish, run, start  # scripts/h200/script_cli.py

SMOKE = "--cpu-smoke" in sys.argv[1:]
SOFTMAX_SCALE = 192 ** -0.5
VARIANTS = {"shipped": {}, "fp16": dict(fp16=True), "fp16, 2 stages": dict(fp16=True, num_stages=2),
            "fp16, values split 2": dict(fp16=True, v_split=2),
            "fp16, values split 2, 2 stages": dict(fp16=True, v_split=2, num_stages=2),
            "values split 2, 2 stages": dict(v_split=2, num_stages=2)}


def main() -> int:
    import os

    if SMOKE:
        os.environ["TRITON_INTERPRET"] = "1"
    torch, _, started, ceiling = start("general_fp16_sweep", "cpu" if SMOKE else "cuda")
    device = "cpu" if SMOKE else "cuda"
    from dsahal.backends.nvidia import config
    from dsahal.backends.triton_kernels.sparse_mla import sparse_mla
    from dsahal.reference.sparse_mla import sparse_mla as reference

    pool_tokens, width, cases = (1 << 20, 2048, ((128, 320), (128, 512), (64, 320))) if not SMOKE else \
        (256, 40, ((20, 3),))
    pools = cache_pools.latent_pools(torch, ("fp8", "fp8_ds_mla"), pool_tokens, device)
    pages, scale = pools["fp8"]
    failures, rows = [], []
    for heads, tokens in cases:
        gen = torch.Generator(device=device).manual_seed(heads + tokens)
        slots = torch.randint(0, pool_tokens, (tokens, width), device=device, dtype=torch.int32, generator=gen)
        slots[:, -7:] = -1
        q = torch.randn(tokens, heads, 576, device=device, generator=gen).to(torch.bfloat16)
        shipped = config.sparse_mla_config(tokens, heads, width, "fp8", torch.bfloat16)
        if SMOKE:
            shipped = dict(shipped, block_h=16, block_n=16, num_warps=4)
        n = 4
        want_o, want_lse = reference(q[:n].double(), pages, slots[:n], "fp8", scale, SOFTMAX_SCALE)
        times = {}
        for label, change in VARIANTS.items():
            if SMOKE and (label == "shipped" or "2 stages" in label):
                continue  # (the interpreter's bf16 dots are wrong; stages change nothing there)
            launch = dict(shipped, **change)
            call = (lambda launch=launch: sparse_mla(q, pages, slots, "fp8", scale, SOFTMAX_SCALE, **launch))
            try:
                o, lse = call()
            except Exception as exc:  # noqa: BLE001 - a launch that does not compile is reported, the rest run
                failures.append(f"H={heads} {tokens} tokens {label}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            err = float((o[:n].double() - want_o).abs().max() / want_o.abs().max())
            lse_err = float((lse[:n].double() - want_lse.double()).abs().max())
            ok = err < 1e-2 and lse_err < 1e-3
            print(f"H={heads} {tokens} tokens {label} {launch}: o {err:.2e}, lse {lse_err:.2e} "
                  f"{'ok' if ok else 'FAILED'}", flush=True)
            if not ok:
                failures.append(f"H={heads} {tokens} tokens {label}: o {err:.2e}, lse {lse_err:.2e}")
                continue
            times[label] = timing.bench_ms(call if SMOKE else timing.captured(torch, call).replay, device)
        peer = None if SMOKE else flashmla_ms(torch, q, pools["fp8_ds_mla"][0], slots)
        base = times.get("shipped")
        for label, ms in times.items():
            rows.append(f"| H={heads}, {tokens} tokens | {label} | {ms:.4f} | "
                        f"{'-' if base is None else f'{base / ms:.2f}x'} | "
                        f"{'-' if peer is None else f'{peer:.4f} / {peer / ms:.2f}x'} |")
    print(f"\ncopy ceiling {ceiling:.2f} TB/s\n\n| case | launch | ms | shipped / launch | FlashMLA fp8_ds_mla ms / "
          "FlashMLA / launch |\n| --- | --- | ---: | ---: | ---: |")
    print("\n".join(rows))
    return finish("general_fp16_sweep", failures, started)


def flashmla_ms(torch, q, pages, slots):
    """FlashMLA's sparse decode on the same tokens as fp8_ds_mla records (GPU ms, graph replay), or None."""
    try:
        import flash_mla as fm
    except Exception as exc:  # noqa: BLE001 - no peer column
        print(f"FlashMLA not available: {type(exc).__name__}: {exc}")
        return None
    tokens, heads, _ = q.shape
    meta, _ = fm.get_mla_metadata()
    cache = pages.view(pages.shape[0], pages.shape[1], 1, 656)
    q4, idx = q.view(tokens, 1, heads, 576), slots.view(tokens, 1, slots.shape[1])
    call = (lambda: fm.flash_mla_with_kvcache(q4, cache, None, None, 512, meta, softmax_scale=SOFTMAX_SCALE,
                                              is_fp8_kvcache=True, indices=idx, use_legacy=True, kv_format="V32"))
    return timing.bench_ms(timing.captured(torch, call).replay, "cuda")


if __name__ == "__main__":
    run("general_fp16_sweep", main)
