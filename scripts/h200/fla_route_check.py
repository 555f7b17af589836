"""``kda_prefill``'s ``fla_chunk`` route (fla-core's ``chunk_kda``) against the float64 reference, at the calls the
default route chain hands it, beside our chunked kernel where that serves (no timing).

Usage (on a CUDA machine with fla-core importable, from the repository root)::

    python3 scripts/h200/fla_route_check.py

Why: the chain tried ``triton_short`` (<= 512 tokens), then ``triton_chunk_mixed`` (K, V <= 128), then ``fla_chunk``:
so in default mode fla served the 16-bit calls of more than 512 tokens with K or V past 128, and the conformance suite
(calls of at most 240 tokens) never reached it unforced. Its one forced suite run (fifth session) had failed the bf16
bound on single rows. This script measured it where it served (forty-third session, H100: past the bound under strong
decay, worst row 0.136 against 2^-6), and fla's route has been forced only since (``triton_recurrent`` takes those
calls). Per case, once through the default chain and once with ``fla_chunk`` forced: the route that served, the worst
row's normwise relative error of o (a row: one token's head, V values) and the share of rows past the suite's bound
(``RTOL_BY_DTYPE``: 2^-6 for bf16, 2^-8 for fp16), and the final states' worst relative error (the suite allows 4x
the bound). Inputs as the suite draws them: q, k, v N(0, 1), the gate -d * U(0, 1) for decay d, beta sigmoid(N(0,
1)), l2-normalised q and k, random fp32 starting states. The float64 reference runs on the CPU (the slow part).

Exits with one ``error:`` line if a case errs; a case past the bound is reported, not an error (the verdict is the
note's).
"""
from __future__ import annotations

import torch

from edge_check import Routes  # scripts/h200/edge_check.py
from script_cli import finish, run, start  # scripts/h200/script_cli.py

# (lengths, heads, K, V, dtype, decay): each run through the default chain and with fla_chunk forced. The default
# chain takes the first to the chunked kernel in slices of value columns (V past 128), the second to the recurrent
# kernel (K past 128), the third to the chunked kernel as it is
CASES = [((1024,), 2, 128, 256, torch.bfloat16, 5.0), ((600, 700), 2, 192, 128, torch.bfloat16, 5.0),
         ((1024,), 2, 128, 128, torch.bfloat16, 5.0)]


def inputs(lengths, heads, kd, vd, dtype, decay, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tokens = sum(lengths)
    q = torch.randn(tokens, heads, kd, device="cuda", generator=gen).to(dtype)
    k = torch.randn(tokens, heads, kd, device="cuda", generator=gen).to(dtype)
    v = torch.randn(tokens, heads, vd, device="cuda", generator=gen).to(dtype)
    g = (-decay * torch.rand(tokens, heads, kd, device="cuda", generator=gen)).to(dtype)
    beta = torch.sigmoid(torch.randn(tokens, heads, device="cuda", generator=gen)).to(dtype)
    cu = torch.tensor([0, *torch.cumsum(torch.tensor(lengths), 0).tolist()], dtype=torch.int32, device="cuda")
    pool = torch.randn(len(lengths) + 1, heads, kd, vd, device="cuda", generator=gen) * 0.1
    ids = torch.arange(len(lengths), dtype=torch.int32, device="cuda")
    return q, k, v, g, beta, cu, pool, ids


def main(argv=None) -> int:
    _, _, started, _ = start("fla_route_check", "cuda")
    import dsahal
    from dsahal import ops
    from dsahal.conformance.assertions import RTOL_BY_DTYPE
    from dsahal.registry.observers import observe

    failures = []
    rows = ["| lengths | H | K | V | dtype | route | o worst row | rows past the bound | state worst | bound |",
            "| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    with observe(Routes()) as observer:
        check_cases(dsahal, ops, RTOL_BY_DTYPE, observer, rows, failures)
    print("\n".join(rows))
    return finish("fla_route_check", failures, started)


def check_cases(dsahal, ops, RTOL_BY_DTYPE, observer, rows, failures) -> None:
    """Each of :data:`CASES` through the default chain and with ``fla_chunk`` forced, against the reference."""
    for lengths, heads, kd, vd, dtype, decay in CASES:
        q, k, v, g, beta, cu, pool, ids = inputs(lengths, heads, kd, vd, dtype, decay)
        ref_pool = pool.cpu().clone()  # (fp32, as the op takes; the reference computes in float64)
        with dsahal.use_backend("reference"):
            want = ops.kda_prefill(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), cu.cpu(), ref_pool, ids.cpu())
        bound = RTOL_BY_DTYPE[dtype]
        for forced in (None, "kda_prefill:fla_chunk"):
            try:
                with dsahal.use_routes(forced) if forced else dsahal.use_routes():
                    got_pool = pool.clone()
                    observer.take()
                    o = ops.kda_prefill(q, k, v, g, beta, cu, got_pool, ids)
                    torch.cuda.synchronize()
                    routes = observer.take()
            except Exception as exc:  # noqa: BLE001 - reported as a failure, the next case runs
                failures.append(f"{lengths} K={kd} V={vd} {forced}: {type(exc).__name__}: {exc}")
                print(failures[-1], flush=True)
                continue
            err = (o.double().cpu() - want.double()).norm(dim=-1) / want.double().norm(dim=-1).clamp(min=1e-30)
            state = ((got_pool.double().cpu() - ref_pool.double()).norm(dim=(-2, -1))
                     / ref_pool.double().norm(dim=(-2, -1)).clamp(min=1e-30))[: len(lengths)].max().item()
            past = float((err > bound).double().mean())
            rows.append(f"| {lengths} | {heads} | {kd} | {vd} | {str(dtype).replace('torch.', '')} | {routes} | "
                        f"{err.max().item():.2e} | {past:.2%} | {state:.2e} | {bound:.2e} |")
            print(rows[-1], flush=True)


if __name__ == "__main__":
    run("fla_route_check", main)
