"""Edge cases through the nvidia backend's routes on the GPU, each against the contract (no timing):

* an **empty cache** (pages of 0 blocks; every block-table entry and slot -1, which is all the ops' checks allow
  there): ``indexer_score`` (bf16 / FP8 / MXFP4 keys, bf16 and FP8 queries, 1 and 5 tokens a request: the block
  tiles and the Gluon kernel), ``sparse_mla`` (fp8_ds_mla at H = 16 and 128: the wgmma kernel and FlashMLA's
  decode; bf16 at H = 128: FlashMLA's prefill; NVFP4 at 16; per-tensor FP8 at 16 and 128; 8 and 320 tokens:
  fixed splits and the balanced schedule) and ``dsa_attention``: scores all -inf, o 0 and lse -inf, no kernel
  fault (since the forty-first session the ops answer these without a route: the routes print as none). Run it
  under ``compute-sanitizer --tool memcheck`` to see that no kernel reads outside the (empty) pages;
* **KDA with an fp64 gate** (the op takes any float gate, used in fp32): ``kda_decode`` and ``kda_prefill`` (short,
  chunked and fla routes by length) served natively (no reference fallback) with the bits of the fp32 gate.

Every call's route is printed from an observer (the reference serving a call is named, not hidden).

    python3 scripts/h200/edge_check.py [--cpu-smoke]

``--cpu-smoke``: the same calls on the CPU through the reference backend (checks the script, proves nothing of the
GPU routes).
"""
from __future__ import annotations

import sys
import time

import torch

from script_cli import CheckError, finish, run  # scripts/h200/script_cli.py

SMOKE = "--cpu-smoke" in sys.argv[1:]
DEVICE = "cpu" if SMOKE else "cuda"


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class Routes:
    """The routes that served the calls since the last :meth:`take` (an op observer)."""

    def __init__(self):
        self.seen = []

    def before(self, call):
        self.seen.append(f"{call.op}:{call.route}" + (" (fallback)" if call.fallback else ""))

    def after(self, call):
        pass

    def take(self) -> str:
        seen, self.seen = self.seen, []
        return ", ".join(dict.fromkeys(seen)) or "no route: the op answered"


def no_keys(o_lse) -> bool:
    """``(o, lse)`` of attention with no key: o all 0, lse all -inf."""
    o, lse = o_lse
    return bool((o == 0).all()) and bool((lse == float("-inf")).all())


def case(label, call, judge, failures, routes):
    """Run ``call()``; print whether ``judge(result)`` holds with the routes that served it; a failure or an
    exception is listed in ``failures`` (the other cases still run)."""
    try:
        result = call()
        synchronize()
        ok = judge(result)
        print(f"{label}: {'ok' if ok else 'WRONG'} [{routes.take()}]")
        if not ok:
            failures.append(f"{label}: not the contract's result")
    except Exception as exc:  # noqa: BLE001 - a failed case is listed, the rest still run
        failures.append(f"{label}: {type(exc).__name__}: {exc}")
        print(f"{label}: FAILED {type(exc).__name__}: {exc}")


def empty_cache_cases(ops, failures, routes):
    from dsahal.formats import index_format, latent_format

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for fmt in ("bf16", "fp8", "mxfp4"):
        pages = torch.empty((0, 64, index_format(fmt).token_bytes), dtype=torch.uint8, device=DEVICE)
        for per, q_dtype in ((1, torch.bfloat16), (5, torch.bfloat16), (1, torch.float8_e4m3fn),
                             (5, torch.float8_e4m3fn)):
            if fmt == "bf16" and q_dtype != torch.bfloat16:
                continue
            requests, context = 8, 4096
            table = torch.full((requests, context // 64), -1, dtype=torch.int32, device=DEVICE)
            req = torch.arange(requests, device=DEVICE, dtype=torch.int32).repeat_interleave(per)
            pos = (context - per + torch.arange(per, device=DEVICE, dtype=torch.int32)).repeat(requests)
            q = torch.randn(requests * per, 32, 128, device=DEVICE, generator=gen).to(q_dtype)
            w = torch.randn(requests * per, 32, device=DEVICE, generator=gen)
            case(f"indexer_score empty {fmt} keys, {str(q_dtype)[6:]} q, {requests} x {per}",
                 lambda: ops.indexer_score(q, w, pages, table, req, pos, index_fmt=fmt, max_context=context),
                 lambda scores: bool((scores == float("-inf")).all()), failures, routes)
    for fmt, heads in (("fp8_ds_mla", 16), ("fp8_ds_mla", 128), ("bf16", 128), ("nvfp4", 16), ("fp8", 16),
                       ("fp8", 128)):
        spec = latent_format(fmt)
        pages = torch.empty((0, 64, spec.token_bytes), dtype=torch.uint8, device=DEVICE)
        scale = torch.tensor(0.02, device=DEVICE) if spec.needs_tensor_scale else None
        for tokens in (8, 320):
            q = torch.randn(tokens, heads, 576, device=DEVICE, generator=gen).to(torch.bfloat16)
            slots = torch.full((tokens, 2048), -1, dtype=torch.int32, device=DEVICE)
            case(f"sparse_mla empty {fmt}, H={heads}, {tokens} tokens",
                 lambda: ops.sparse_mla(q, pages, slots, kv_fmt=fmt, kv_scale=scale, softmax_scale=192**-0.5),
                 no_keys, failures, routes)
    for heads in (16, 128):
        requests, per, context = 8, 5, 4096
        index_pages = torch.empty((0, 64, index_format("fp8").token_bytes), dtype=torch.uint8, device=DEVICE)
        kv_pages = torch.empty((0, 64, latent_format("fp8_ds_mla").token_bytes), dtype=torch.uint8, device=DEVICE)
        table = torch.full((requests, context // 64), -1, dtype=torch.int32, device=DEVICE)
        req = torch.arange(requests, device=DEVICE, dtype=torch.int32).repeat_interleave(per)
        pos = (context - per + torch.arange(per, device=DEVICE, dtype=torch.int32)).repeat(requests)
        tokens = requests * per
        q_index = torch.randn(tokens, 32, 128, device=DEVICE, generator=gen).to(torch.float8_e4m3fn)
        w = torch.randn(tokens, 32, device=DEVICE, generator=gen)
        q = torch.randn(tokens, heads, 576, device=DEVICE, generator=gen).to(torch.bfloat16)
        case(f"dsa_attention empty fp8_ds_mla / fp8 keys, H={heads}, {requests} x {per}",
             lambda: ops.dsa_attention(q_index, w, index_pages, q, kv_pages, table, req, pos, index_fmt="fp8",
                                       kv_fmt="fp8_ds_mla", topk=2048, max_context=context, softmax_scale=192**-0.5),
             no_keys, failures, routes)


def fp64_gate_cases(ops, failures, routes):
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    heads, key_dim, value_dim = 4, 128, 128

    def inputs(tokens, dtype):
        q, k = (torch.randn(tokens, heads, key_dim, device=DEVICE, generator=gen).to(dtype) for _ in range(2))
        v = torch.randn(tokens, heads, value_dim, device=DEVICE, generator=gen).to(dtype)
        g = -torch.rand(tokens, heads, key_dim, device=DEVICE, generator=gen)
        beta = torch.rand(tokens, heads, device=DEVICE, generator=gen).to(dtype)
        return q, k, v, g, beta

    pool0 = torch.randn(6, heads, key_dim, value_dim, device=DEVICE, generator=gen)

    def same_bits(label, call, g):
        """``call(gate, pool)`` with the fp32 gate ``g`` and with it as fp64, each on a fresh copy of the pool: the
        same output and states, and no call left to the reference."""
        results = []
        for gate in (g, g.double()):
            pool = pool0.clone()
            results.append((call(gate, pool), pool))
        routes_used = routes.take()
        same = torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
        print(f"{label}: {'the fp32 gate bits' if same else 'DIFFERENT'} [{routes_used}]")
        if not same or "fallback" in routes_used:
            failures.append(f"{label}: same bits {same}, routes {routes_used}")

    for dtype in (torch.float32, torch.bfloat16):
        q, k, v, g, beta = inputs(4, dtype)
        ids = torch.tensor([3, -1, 0, 5], dtype=torch.int32, device=DEVICE)
        same_bits(f"kda_decode fp64 gate, {str(dtype)[6:]} inputs",
                  lambda gate, pool: ops.kda_decode(q, k, v, gate, beta, pool, ids), g)
        for tokens in (40, 600, 3000):  # the short route, then the chunked kernel (16-bit) or the recurrent one
            q, k, v, g, beta = inputs(tokens, dtype)
            bounds = torch.tensor([0, tokens // 3, tokens], dtype=torch.int32, device=DEVICE)
            ids = torch.tensor([2, 4], dtype=torch.int32, device=DEVICE)
            same_bits(f"kda_prefill fp64 gate, {str(dtype)[6:]} inputs, {tokens} tokens",
                      lambda gate, pool: ops.kda_prefill(q, k, v, gate, beta, bounds, pool, ids), g)

def main() -> int:
    if not SMOKE and not torch.cuda.is_available():
        raise CheckError("edge_check: needs a CUDA device, none is visible (or pass --cpu-smoke)")
    from dsahal import ops, set_backend
    from dsahal.registry.observers import observe

    set_backend("reference" if SMOKE else "nvidia")
    started = time.time()
    print(f"device {torch.cuda.get_device_name() if not SMOKE else 'cpu'}  torch {torch.__version__}")
    failures = []
    with observe(Routes()) as routes:
        empty_cache_cases(ops, failures, routes)
        fp64_gate_cases(ops, failures, routes)
    return finish("edge_check", failures, started)


if __name__ == "__main__":
    run("edge_check", main)
