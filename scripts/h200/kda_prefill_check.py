"""KDA prefill on one Hopper GPU: dsahal's nvidia route (fla's chunk_kda, read from / written to the state
pool) against fla's chunk_kda called plainly, same run.

Usage (on a CUDA machine, from the repository with dsahal importable)::

    python scripts/h200/kda_prefill_check.py [--no-breakdown] [--cpu-smoke]

Steps, in order, each printed:

1. device-to-device copy ceiling (1 GiB copy, read + write bytes / time) measured in this run;
2. correctness on fresh random bf16 inputs (32 heads, K = V = 128, lengths 37, 0, 300, 5, 129, one
   padding id) against the float64 reference on the CPU: the route (pool = every other row of a larger
   buffer, guard rows between, unaddressed rows around) on its output, the addressed rows, and every
   other byte of the buffer (must not change); fla plain (its own dense states) on its output and finals;
3. timing (``triton.testing.do_bench`` median) at 8 x 4096 tokens and at mixed lengths
   (64, 4096, 1000, 17, 8192, 300): fla plain (contiguous inputs, its own state tensor, one cu_seqlens
   tensor reused so fla's chunk-index cache hits: its best case), fla on ``[8, 4096]`` without
   cu_seqlens (uniform case), the route (strided pool, random distinct rows), and the route's state
   gather + scatter alone; one table: ms, essential bytes / time (q, k, v, g, beta read, o written,
   states read and written) in TB/s, % of the copy ceiling, fla plain's time over the variant's;
4. (``--no-breakdown`` skips it) the route's kernels at 8 x 4096 from torch.profiler, GPU time each.

``--cpu-smoke``: tiny shapes on the CPU under TRITON_INTERPRET=1. fla's kernels do not run under the
interpreter, so a float64-recurrence stand-in takes chunk_kda's place for both the route and the peer
(said so in the output): the run exercises every step and the route's own state kernels, times nothing.

A failed check is listed and the script exits with one ``error:`` line (after timing what did pass).
Runs in well under 2 minutes on an H200 (fla's configs are shipped: no autotuning).
"""
from __future__ import annotations

import argparse
import sys
import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
from script_cli import CheckError, finish, run  # scripts/h200/script_cli.py

HEADS, KEY_DIM, VALUE_DIM = 32, 128, 128
CHECK_LENGTHS = [37, 0, 300, 5, 129]
TIMED = [("8 x 4096", [4096] * 8), ("mixed 6 seqs", [64, 4096, 1000, 17, 8192, 300]),
         # short prefills (the first run's 4 prompts; chat-sized batches): where the token-by-token kernel may win
         ("4 prompts 128/112/96/80", [128, 112, 96, 80]), ("64 x 128", [128] * 64), ("8 x 512", [512] * 8),
         ("8 x 1024", [1024] * 8), ("8 x 2048", [2048] * 8)]
RTOL = 2.0 ** -6  # bf16 outputs: the conformance suite's normwise tolerance (conformance/assertions.py)
DEVICE = "cuda"  # --cpu-smoke: "cpu" under TRITON_INTERPRET=1



def _bench(fn):
    return timing.bench_ms(fn, DEVICE, warmup=25, rep=200)


def recurrent_stand_in(torch):
    """chunk_kda's signature and results, computed by the float64 recurrence (smoke runs only)."""
    from dsahal.reference.kda import kda_recurrent_sequence

    def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None):
        if cu_seqlens is None:  # [B, T, ...] batch: flatten it as fla's varlen form
            batch, length = q.shape[:2]
            q, k, v, g, beta = (x.reshape(1, batch * length, *x.shape[2:]) for x in (q, k, v, g, beta))
            cu_seqlens = torch.arange(0, batch * length + 1, length)
        bounds = cu_seqlens.tolist()
        o = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
        finals = []
        for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
            state0 = initial_state[n] if initial_state is not None else v.new_zeros(
                q.shape[2], q.shape[3], v.shape[3], dtype=torch.float32)
            state, out = kda_recurrent_sequence(q[0, start:end], k[0, start:end], v[0, start:end], g[0, start:end],
                                                beta[0, start:end], state0, scale, use_qk_l2norm_in_kernel)
            o[0, start:end] = out.to(q.dtype)
            finals.append(state.float())
        return o, torch.stack(finals) if output_final_state else None

    return chunk_kda


def fla_peer(torch, triton, device: str, smoke_note: str = ""):
    """fla's ``chunk_kda`` on a GPU (device line printed with fla-core's version), its float64-recurrence
    stand-in on the CPU smoke run (also behind the nvidia fla route); returns it. ``smoke_note``: what else the
    smoke run changes, for its line."""
    from dsahal.backends.nvidia import kda_fla
    from dsahal.backends.nvidia.fla_setup import import_chunk_kda, status

    if device == "cuda":
        chunk_kda = import_chunk_kda()
        from importlib.metadata import version

        print(f"device {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
              f"fla-core {version('fla-core')}; {status()}")
    else:
        chunk_kda = recurrent_stand_in(torch)
        kda_fla.import_chunk_kda = lambda: chunk_kda
        print(f"cpu (interpreter smoke run): {smoke_note}fla's chunk_kda replaced by a float64-recurrence "
              f"stand-in; torch {torch.__version__}  triton {triton.__version__}")
    return chunk_kda


def make_inputs(torch, lengths, gen, dtype):
    tokens = sum(lengths)
    q, k = (torch.randn(tokens, HEADS, KEY_DIM, device=DEVICE, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(tokens, HEADS, VALUE_DIM, device=DEVICE, generator=gen).to(dtype)
    # log decays in [-0.32, -0.02]: never zero, strong enough that the state forgets within a chunk or two
    g = (-0.02 - 0.3 * torch.rand(tokens, HEADS, KEY_DIM, device=DEVICE, generator=gen)).to(dtype)
    beta = torch.rand(tokens, HEADS, device=DEVICE, generator=gen).to(dtype)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    return q, k, v, g, beta, cu


def strided_pool(torch, rows, gen):
    """``[rows, H, K, V]`` fp32 pool = every other row of a ``2·rows + 1`` buffer (a packed cache's layer
    view); returns (buffer, pool)."""
    buffer = 0.1 * torch.randn(2 * rows + 1, HEADS, KEY_DIM, VALUE_DIM, device=DEVICE, generator=gen)
    return buffer, buffer[1::2]


def rel_err(torch, got, want) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def check(torch, chunk_kda, route, failures) -> set:
    """The route and fla plain against the float64 reference on the CPU -> the set of those that passed
    (``"route"``, ``"fla"``)."""
    from dsahal.reference.kda import kda_prefill as reference

    gen = torch.Generator(device=DEVICE).manual_seed(7)
    q, k, v, g, beta, cu = make_inputs(torch, CHECK_LENGTHS, gen, torch.bfloat16)
    buffer, pool = strided_pool(torch, 8, gen)
    ids = torch.tensor([5, 2, -1, 0, 7], dtype=torch.int32, device=DEVICE)  # rows 1, 3, 4, 6 unaddressed
    before = buffer.clone()
    want_buffer = buffer.cpu().clone()
    want = reference(*(x.cpu() for x in (q, k, v, g, beta, cu)), want_buffer[1::2], ids.cpu(), KEY_DIM ** -0.5, True)

    got = route(q, k, v, g, beta, cu, pool, ids, KEY_DIM ** -0.5, True)
    got_buffer = buffer.cpu()
    live = [(n, int(sid)) for n, sid in enumerate(ids.tolist()) if sid >= 0]
    addressed = torch.zeros(want_buffer.shape[0], dtype=torch.bool)
    addressed[[1 + 2 * sid for _, sid in live]] = True
    out_err = rel_err(torch, got, want)
    state_err = rel_err(torch, got_buffer[addressed], want_buffer[addressed])
    untouched = torch.equal(got_buffer[~addressed], want_buffer[~addressed])
    passed = set()
    ok = out_err < RTOL and state_err < RTOL and untouched and got.dtype == q.dtype and got.shape == v.shape
    passed |= {"route"} if ok else set()
    print(f"  check {'route (strided pool, guard rows)':<36s} out rel err {out_err:.2e}, states {state_err:.2e}, "
          f"other rows {'unchanged' if untouched else 'CHANGED'}  {'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append(f"route: out {out_err:.2e}, states {state_err:.2e} (tol {RTOL:.1e}), "
                        f"other rows {'unchanged' if untouched else 'changed'}, dtype {got.dtype}")

    h0 = before.new_zeros(len(CHECK_LENGTHS), HEADS, KEY_DIM, VALUE_DIM)
    for n, sid in live:
        h0[n] = before[1 + 2 * sid]
    o, final = chunk_kda(q[None], k[None], v[None], g[None], beta[None], scale=KEY_DIM ** -0.5, initial_state=h0,
                         output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu.long())
    out_err = rel_err(torch, o[0], want)
    state_err = rel_err(torch, final[[n for n, _ in live]], want_buffer[[1 + 2 * sid for _, sid in live]])
    ok = out_err < RTOL and state_err < RTOL
    passed |= {"fla"} if ok else set()
    print(f"  check {'fla chunk_kda plain (dense states)':<36s} out rel err {out_err:.2e}, states {state_err:.2e}  "
          f"{'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append(f"fla plain: out {out_err:.2e}, states {state_err:.2e} (tol {RTOL:.1e})")
    return passed


def essential_bytes(lengths, gate_bytes=2) -> int:
    """q, k, v, g, beta read once, o written once, the sequences' states read and written (fp32)."""
    tokens = sum(lengths)
    per_token = HEADS * (2 * KEY_DIM * 2 + KEY_DIM * gate_bytes + VALUE_DIM * 2 + 2 + VALUE_DIM * 2)
    return tokens * per_token + 2 * len(lengths) * HEADS * KEY_DIM * VALUE_DIM * 4


def time_case(torch, chunk_kda, route, label, lengths, ceiling, passed):
    """[(case, variant, ms or None, TB/s, % copy, fla plain ms / ms, note)] for one set of lengths."""
    from dsahal.backends.nvidia.kda_state_rows import gather_states, scatter_states

    gen = torch.Generator(device=DEVICE).manual_seed(len(lengths))
    q, k, v, g, beta, cu = make_inputs(torch, lengths, gen, torch.bfloat16)
    rows = 4 * len(lengths)
    buffer, pool = strided_pool(torch, rows, gen)
    ids = torch.randperm(rows, device=DEVICE, generator=gen)[: len(lengths)].to(torch.int32)
    h0 = pool[ids.long()].contiguous()
    cu_long = cu.long()  # one object for every call: fla's chunk-index cache hits (its best case)
    scale = KEY_DIM ** -0.5
    variants = [("fla", "fla chunk_kda plain (varlen)", lambda: chunk_kda(
        q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=h0, output_final_state=True,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu_long))]
    if len(set(lengths)) == 1:
        batch, length = len(lengths), lengths[0]
        qb, kb, vb, gb = (x.view(batch, length, *x.shape[1:]) for x in (q, k, v, g))
        betab = beta.view(batch, length, HEADS)
        variants.append(("fla", "fla chunk_kda plain [B, T]", lambda: chunk_kda(
            qb, kb, vb, gb, betab, scale=scale, initial_state=h0, output_final_state=True,
            use_qk_l2norm_in_kernel=True)))
    # what a serving engine pays: a new cu_seqlens tensor every step (fla's chunk-index cache misses)
    variants.append(("fla", "fla chunk_kda, fresh cu_seqlens", lambda: chunk_kda(
        q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=h0, output_final_state=True,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu.long())))
    variants.append(("route", "route (pool rows in place)",
                     lambda: route(q, k, v, g, beta, cu, pool, ids, scale, True)))
    if DEVICE == "cuda":  # the token-by-token Triton kernel (the triton_recurrent route), same pool rows
        from dsahal.backends.nvidia import ops as nvidia_ops

        variants.append(("route", "triton_recurrent route",
                         lambda: nvidia_ops.kda_prefill(q, k, v, g, beta, cu, pool, ids, scale, True)))
    final = h0.clone()
    variants.append(("route", "route's gather + scatter alone",
                     lambda: scatter_states(final, ids, gather_states(pool, ids))))
    total = essential_bytes(lengths)
    out, peer_ms = [], None
    for checked, name, fn in variants:
        if checked not in passed:
            continue  # failed its correctness check: not timed
        try:
            ms = _bench(fn)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            out.append((label, name, None, None, None, None, f"{type(exc).__name__}: {str(exc)[:120]}"))
            continue
        peer_ms = ms if peer_ms is None and name.startswith("fla chunk_kda plain (varlen)") else peer_ms
        moved = 2 * len(lengths) * HEADS * KEY_DIM * VALUE_DIM * 4 * 2 if "alone" in name else total
        tbps = moved / (ms * 1e-3) / 1e12
        out.append((label, name, ms, tbps, 100 * tbps / ceiling, (peer_ms / ms) if peer_ms else None, ""))
        print(f"  {label}, {name}: {ms:.3f} ms", flush=True)
    return out


def breakdown(torch, route):
    """The route's kernels at 8 x 4096 by GPU time (torch.profiler), one line each."""
    from torch.profiler import ProfilerActivity, profile

    lengths = TIMED[0][1]
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    q, k, v, g, beta, cu = make_inputs(torch, lengths, gen, torch.bfloat16)
    _, pool = strided_pool(torch, 2 * len(lengths), gen)
    ids = torch.arange(len(lengths), device=DEVICE, dtype=torch.int32) * 2
    route(q, k, v, g, beta, cu, pool, ids, KEY_DIM ** -0.5, True)
    torch.cuda.synchronize()
    calls = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            route(q, k, v, g, beta, cu, pool, ids, KEY_DIM ** -0.5, True)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) > 0]
    events.sort(key=lambda e: -getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)))
    total = 0.0
    for e in events[:16]:
        us = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) / calls
        total += us
        print(f"  {us / 1e3:7.3f} ms  x{e.count // calls:<3d} {e.key[:90]}")
    print(f"  {total / 1e3:7.3f} ms  in these kernels per call")


def _smoke_mode() -> None:
    import os

    global DEVICE, HEADS, KEY_DIM, VALUE_DIM, CHECK_LENGTHS, TIMED
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    DEVICE, HEADS, KEY_DIM, VALUE_DIM = "cpu", 2, 16, 16
    CHECK_LENGTHS = [5, 0, 9, 3, 2]
    TIMED = [("4 x 8", [8] * 4), ("mixed 3 seqs", [3, 11, 1])]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-breakdown", action="store_true", help="skip the profiler's per-kernel times")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny shapes on the CPU under TRITON_INTERPRET=1, a recurrent stand-in for fla: "
                             "runs every step of the script, times nothing meaningful")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        _smoke_mode()
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise CheckError("kda_prefill_check: needs a CUDA device, none is visible")
    started = time.time()
    import triton

    from dsahal.backends.nvidia import kda_fla

    chunk_kda = fla_peer(torch, triton, DEVICE)
    route = kda_fla.kda_prefill_fla
    ceiling = timing.copy_ceiling_tbps(torch, DEVICE)
    print(f"copy ceiling {ceiling:.2f} TB/s (read + write)", flush=True)
    failures: list[str] = []
    print(f"\ncorrectness against the float64 reference, lengths {CHECK_LENGTHS}, {HEADS} heads, K = V = {KEY_DIM}")
    passed = check(torch, chunk_kda, route, failures)
    print(f"\ntiming ({time.time() - started:.0f} s): {', '.join(sorted(passed)) or 'nothing'} passed its check",
          flush=True)
    rows = []
    for label, lengths in TIMED:
        rows += time_case(torch, chunk_kda, route, label, lengths, ceiling, passed)
    if DEVICE == "cuda" and not args.no_breakdown and "route" in passed:
        print(f"\nthe route's kernels at {TIMED[0][0]} (torch.profiler, GPU time per call)")
        breakdown(torch, route)
    print(f"\n| case | variant | ms | TB/s | % copy | fla plain / variant |")
    print("|---|---|---:|---:|---:|---:|")
    for case, name, ms, tbps, pct, ratio, note in rows:
        if ms is None:
            print(f"| {case} | {name} | failed: {note} | | | |")
        else:
            print(f"| {case} | {name} | {ms:.3f} | {tbps:.2f} | {pct:.1f} | {f'{ratio:.3f}' if ratio else '-'} |")
    return finish("kda_prefill_check", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("kda_prefill_check", main)
