"""Which KDA prefill inputs make the fla route disagree with the reference (the 200-example conformance
failures of 2026-12-01: bf16, V = 16, padding ids, 65-token sequences). Prints one line per variant."""
import dataclasses
import sys

import torch

import dsahal
from dsahal import ops
from dsahal.conformance.cases import KdaCase

BASE = KdaCase(seqlens=(65,), heads=1, key_dim=16, value_dim=16, dtype="bfloat16", use_qk_l2norm=True, scale=None,
               decay="strong", padded=(True,), spare_states=0, seed=0, index_dtype="int32", pool_layout="dense",
               fused=False)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run(case, route):
    a = case.build()
    args = [x.cuda() if isinstance(x, torch.Tensor) else x for x in
            (a.q, a.k, a.v, a.g, a.beta, a.cu_seqlens, a.state_pool, a.state_ids)]
    ref_pool = a.state_pool.clone()
    with dsahal.use_backend("reference"):
        want = ops.kda_prefill(a.q, a.k, a.v, a.g, a.beta, a.cu_seqlens, ref_pool, a.state_ids, scale=a.scale,
                               use_qk_l2norm=a.use_qk_l2norm)
    with dsahal.use_routes(kda_prefill=route):
        got = ops.kda_prefill(*args, scale=a.scale, use_qk_l2norm=a.use_qk_l2norm)
    torch.cuda.synchronize()
    return rel(got.cpu(), want), rel(args[6].cpu(), ref_pool)


def main():
    variants = [("as drawn", {}), ("not padded", dict(padded=(False,))), ("V=128 K=128", dict(key_dim=128, value_dim=128)),
                ("V=128 K=128 not padded", dict(key_dim=128, value_dim=128, padded=(False,))),
                ("V=32", dict(value_dim=32)), ("V=64", dict(value_dim=64)), ("decay none", dict(decay="none")),
                ("no l2norm", dict(use_qk_l2norm=False)), ("16 tokens", dict(seqlens=(16,))),
                ("2 seqs, 2nd padded", dict(seqlens=(65, 30), padded=(False, True)))]
    for route in ("fla_chunk", "triton_recurrent"):
        for name, change in variants:
            case = dataclasses.replace(BASE, **change)
            try:
                o_err, pool_err = run(case, route)
                print(f"{route:17s} {name:26s} o rel err {o_err:.2e}  pool rel err {pool_err:.2e}"
                      f"  {'FAIL' if o_err > 2 ** -6 else 'ok'}", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"{route:17s} {name:26s} {type(exc).__name__}: {exc}"[:300], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
