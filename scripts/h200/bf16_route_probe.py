"""Which route serves ``sparse_mla`` on bf16 latents, and its time beside FlashMLA's bare prefill, same run.

Usage (on the H200, from the repository with dsahal importable)::

    python3 scripts/h200/bf16_route_probe.py

Why: R7 of the twenty-fifth session's ``dsahal bench`` had the default route at 0.55x FlashMLA's padded prefill on
bf16 latents at 320 tokens, H = 16 (0.424 against 0.235 ms) and 0.54x at 8 tokens, H = 128 (0.114 against 0.061),
while FlashMLA's prefill route exists. For each case: the route the table picks (a call log) and every route that
declined before it with its reason; then, each checked first against the default's output, the time of the default,
of ``flashmla_prefill`` forced, and of FlashMLA's bare call (heads padded once, outside the timing), eager and
replayed from a CUDA graph.
"""
from __future__ import annotations

import timing  # scripts/h200/timing.py
from script_cli import CheckError, run  # scripts/h200/script_cli.py

SCALE = 192 ** -0.5


def main() -> int:
    import torch

    import dsahal
    from dsahal import ops
    from dsahal.bench import peers
    from dsahal.bench.inputs import random_pages, random_slots
    from dsahal.registry.observers import OpObserver, observe
    from dsahal.registry.state import use_routes

    if not torch.cuda.is_available():
        raise CheckError("bf16_route_probe: needs a CUDA device")
    dsahal.set_backend("nvidia")
    sync = torch.cuda.synchronize
    pool = 1 << 20
    pages = random_pages("latent", "bf16", pool // 64, 64, "cuda")
    print("| case | route (declined before it) | default ms | flashmla_prefill forced ms | FlashMLA bare ms | "
          "default graph ms | forced graph ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for tokens, heads in ((320, 16), (320, 12), (8, 128), (8, 16), (320, 128), (64, 64)):
        q = torch.randn(tokens, heads, 576, device="cuda", dtype=torch.bfloat16)
        slots = random_slots(tokens, 2048, pool, "cuda")
        call = lambda: ops.sparse_mla(q, pages, slots, kv_fmt="bf16", softmax_scale=SCALE, check=False)  # noqa
        seen = []

        class Seen(OpObserver):
            def before(self, op_call):
                seen.append((op_call.route, op_call.declined))

        with observe(Seen()):
            want = call()
        route, declined = seen[-1]
        declined = "; ".join(f"{r}: {why[:90]}" for r, why in declined)
        with use_routes(sparse_mla="flashmla_prefill"):
            got = call()
        err = float((got[0].float() - want[0].float()).norm() / want[0].float().norm())
        if not err < 2e-2:
            raise CheckError(f"bf16_route_probe: flashmla_prefill forced differs from the default: {err:.2e}")
        bare = next(iter(peers.flashmla_sparse_mla(q, pages, slots, "bf16", SCALE).values()))
        ms = {"default": timing.bench_ms(call, "cuda")}
        with use_routes(sparse_mla="flashmla_prefill"):
            ms["forced"] = timing.bench_ms(call, "cuda")
        ms["bare"] = timing.bench_ms(bare, "cuda")
        graphs = {}
        for name, fn in (("default", call), ("forced", call)):
            with use_routes(**({"sparse_mla": "flashmla_prefill"} if name == "forced" else {})):
                graphs[name] = timing.bench_ms(timing.captured(torch, fn).replay, "cuda")
        sync()
        print(f"| {tokens} x H={heads} | {route} ({declined or '-'}) | {ms['default']:.3f} | "
              f"{ms['forced']:.3f} | {ms['bare']:.3f} | {graphs['default']:.3f} | {graphs['forced']:.3f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    run("bf16_route_probe", main)
