"""dsahal's own chunked KDA prefill (``backends/triton_kernels/kda_chunk.py``) on one Hopper GPU, against
fla's ``chunk_kda`` and the nvidia backend's fla route, same run.

Usage (on a CUDA machine, from the repository with dsahal importable)::

    python scripts/h200/kda_chunk_check.py [--cpu-smoke]

Steps, in order, each printed:

1. device-to-device copy ceiling (1 GiB copy, read + write bytes / time) measured in this run;
2. correctness at a small shape (32 heads, K = V = 128, lengths 37, 0, 300, 5, 129, 16, 17, one padding id)
   against the float64 reference on the CPU, for every variant timed below (bf16 inputs) and the fp32-operand
   path (fp32 inputs): output, the addressed pool rows, and every other byte of the pool's buffer (every
   other row of a larger buffer: must not change);
3. correctness at 8 x 4096 tokens, bf16 inputs: each variant, fla's chunk_kda and the fla route against dsahal's exact
   token-by-token Triton kernel (``kda_prefill_recurrent``, fp32 state: the float64 reference is too slow
   on the CPU at this size), outputs and final states;
4. timing (``triton.testing.do_bench`` median) at 8 x 4096 and at mixed lengths (128 ... 8192), with bf16 and
   with fp32 gates: the variants, pass A alone for each, pass B alone for the default and for bf16 operands
   throughout, fla's chunk_kda (a contiguous copy of the live rows as
   its ``initial_state``, one ``cu_seqlens`` tensor reused and the host copy given: its best case), and the
   nvidia backend's fla route (``kda_fla.kda_prefill_fla``: gather, fla, scatter); one table: ms,
   essential bytes / time (q, k, v, g, beta read, o written, states read and written) in TB/s, % of the
   copy ceiling, fla's time over the variant's.

``--cpu-smoke``: tiny shapes on the CPU under TRITON_INTERPRET=1; every variant runs with fp32 operands
(the interpreter's bf16 dots are not bf16) and a float64-recurrence stand-in takes fla's place (said so in
the output): the run exercises every step, times nothing meaningful.

A failed check is listed and the script exits with one ``error:`` line (after timing what did pass).
Runs in well under 150 s on an H200 (fla's configs are shipped: no autotuning; fla's import ~8 s).
"""
from __future__ import annotations

import argparse
import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
from script_cli import CheckError, finish, run  # scripts/h200/script_cli.py

HEADS, KEY_DIM, VALUE_DIM = 32, 128, 128
CHECK_LENGTHS = [37, 0, 300, 5, 129, 16, 17]
CHECK_IDS = [5, 2, -1, 0, 7, 9, 11]  # sequence 2 a padding request; pool rows 1, 3, 4, 6, 8, 10 unaddressed
SCALE_LENGTHS = [4096] * 8
# (label, lengths, gate dtype): g and beta bf16 as the earlier sessions timed them, and fp32 as the model passes them
TIMED = [("8 x 4096", [4096] * 8, "bf16"),
         ("8 x 4096, fp32 g", [4096] * 8, "fp32"),
         ("mixed 128..8192", [128, 8192, 1000, 4096, 300, 2048, 512, 8192, 640, 3000], "bf16"),
         ("mixed 128..8192, fp32 g", [128, 8192, 1000, 4096, 300, 2048, 512, 8192, 640, 3000], "fp32")]
# (name, launcher options): the default first. Fourteenth session, first run: pass B's slab / warps / stages in
# the mixed mode were all slower or equal (BENCHMARKS.md); pass A is 69% of the default's time, at 247 registers
# (2 programs a SM). Second run: pass A with its outputs stored as formed and v loaded last (180 registers), under
# a register cap (168: 3 programs a SM, 24 B of spills in the local sm_90 compile), the inverse's products on the
# tensor cores (bf16x3 or tf32 instead of FMA dots), the cumulative gate as one MMA.
_BEFORE = dict(operands="mixed", pair="bf16x3", block_v=64, num_warps=4, num_stages=3, prepare_warps=4)
_EARLY = dict(_BEFORE, prepare_maxnreg=168, scan_mma=True)
# Third run: every gate-derived tile as an MMA (no reduction over the chunk's tokens) was no faster than the
# cumulative gate alone (slower with fp32 gates); removed. Fourth: the new default against its neighbours. Fifth: pass
# B's programs longest sequence first (mixed lengths: a call lasts at least its longest sequence's chain of steps).
VARIANTS = [("chunked mixed (default: A early, 168 regs, gate scan MMA, inverse tf32)", None),
            ("mixed, no register cap, tl.cumsum, FMA inverse (pass A's own order since 7db19e4)", _BEFORE),
            ("default, pass B in sequence order", None),
            ("mixed, A early, 168 regs, gate scan MMA, inverse ieee", _EARLY),
            ("mixed, A early, 168 regs, gate scan MMA, inverse bf16x3", dict(_EARLY, inverse="bf16x3")),
            ("mixed, A early, 168 regs, gate scan MMA, inverse tf32x3", dict(_EARLY, inverse="tf32x3")),
            ("bf16 operands throughout (below the suite's bound)",
             dict(operands="bf16", block_v=64, num_warps=4, num_stages=3))]
PASS_A_OPTIONS = ("pair", "prepare_warps", "inverse", "scan_mma", "prepare_maxnreg")
PASSES_TIMED = {name for name, _ in VARIANTS}  # pass A alone for each (pass B alone for the default and bf16)
PASS_B_TIMED = {VARIANTS[0][0], VARIANTS[-1][0]}
RTOL = 2.0 ** -6  # bf16 operands / outputs: the conformance suite's normwise tolerance
FP32_RTOL = 1e-5  # the fp32-operand path on fp32 inputs, normwise
DEVICE = "cuda"  # --cpu-smoke: "cpu" under TRITON_INTERPRET=1
SMOKE_OPERANDS = None  # --cpu-smoke: "fp32" for every variant


def _bench(fn):
    return timing.bench_ms(fn, DEVICE, warmup=10, rep=100)


def make_inputs(torch, lengths, gen, dtype, gate_dtype=None):
    """q, k, v in ``dtype``; g and beta in ``gate_dtype`` (default ``dtype``)."""
    tokens = sum(lengths)
    gate_dtype = gate_dtype or dtype
    q, k = (torch.randn(tokens, HEADS, KEY_DIM, device=DEVICE, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(tokens, HEADS, VALUE_DIM, device=DEVICE, generator=gen).to(dtype)
    # log decays in [-0.32, -0.02]: never zero, the state forgets within a chunk or two (as kda_prefill_check)
    g = (-0.02 - 0.3 * torch.rand(tokens, HEADS, KEY_DIM, device=DEVICE, generator=gen)).to(gate_dtype)
    beta = (0.05 + 0.9 * torch.rand(tokens, HEADS, device=DEVICE, generator=gen)).to(gate_dtype)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    return q, k, v, g, beta, cu


def strided_pool(torch, rows, gen):
    """``[rows, H, K, V]`` fp32 pool = every other row of a ``2·rows + 1`` buffer; returns (buffer, pool)."""
    buffer = 0.1 * torch.randn(2 * rows + 1, HEADS, KEY_DIM, VALUE_DIM, device=DEVICE, generator=gen)
    return buffer, buffer[1::2]


def rel_err(torch, got, want) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def worst_row_ratio(torch, got, want, rtol) -> float:
    """The conformance suite's per-row check of ``o`` (``assertions.row_error_ratios``: each token-head row's
    error norm against ``rtol · (its norm + 1e-3 · the largest row norm)``): the worst row's ratio (> 1 fails)."""
    from dsahal.conformance.assertions import row_error_ratios

    ratio, _, _ = row_error_ratios(got.cpu(), want.cpu(), rtol)
    return float(ratio.max()) if ratio.numel() else 0.0


def _options(options):
    """A variant's launcher options; in the smoke run fp32 operands, and the bf16 MMAs that do not follow the
    operands (the bf16x3 inverse, the gate scan of bf16 gates) as FMA dots: the interpreter's bf16 dots are wrong."""
    if not SMOKE_OPERANDS:
        return dict(options)
    return dict(options, operands=SMOKE_OPERANDS, inverse="ieee" if options.get("inverse") == "bf16x3"
                else options.get("inverse", "ieee"), scan_mma=False)


def check_small(torch, chunked, failures) -> set:
    """Every variant (bf16 inputs) and the fp32-operand path (fp32 inputs) against the float64 reference
    -> the names that passed."""
    from dsahal.reference.kda import kda_prefill as reference

    passed = set()
    # each variant with bf16 gates and with fp32 gates (the model's): a variant passes if both do
    cases = [(name, options, torch.bfloat16, RTOL, gates) for name, options in VARIANTS
             for gates in (torch.bfloat16, torch.float32)]
    cases.append(("chunked fp32 operands (fp32 inputs)", dict(operands="fp32"), torch.float32, FP32_RTOL,
                  torch.float32))
    failed = set()
    for n, (name, options, dtype, tol, gates) in enumerate(cases):
        gen = torch.Generator(device=DEVICE).manual_seed(7 + n)
        q, k, v, g, beta, cu = make_inputs(torch, CHECK_LENGTHS, gen, dtype, gates)
        buffer, pool = strided_pool(torch, 12, gen)
        ids = torch.tensor(CHECK_IDS, dtype=torch.int32, device=DEVICE)
        want_buffer = buffer.cpu().clone()
        want = reference(*(x.cpu() for x in (q, k, v, g, beta, cu)), want_buffer[1::2], ids.cpu(), KEY_DIM ** -0.5,
                         True)
        got = chunked(q, k, v, g, beta, cu, pool, ids, KEY_DIM ** -0.5, True,
                      **(dict(options) if "fp32" in name else _options(options)))
        got_buffer = buffer.cpu()
        addressed = torch.zeros(want_buffer.shape[0], dtype=torch.bool)
        addressed[[1 + 2 * sid for sid in CHECK_IDS if sid >= 0]] = True
        out_err = rel_err(torch, got, want)
        row_ratio = worst_row_ratio(torch, got, want, tol)
        state_err = rel_err(torch, got_buffer[addressed], want_buffer[addressed])
        untouched = torch.equal(got_buffer[~addressed], want_buffer[~addressed])
        ok = out_err < tol and state_err < tol and untouched and got.dtype == q.dtype and got.shape == v.shape
        passed |= {name} if ok else set()
        failed |= set() if ok else {name}
        print(f"  check {name:<38s} g {str(gates)[6:]:<8s} out rel err {out_err:.2e} "
              f"(worst row at {row_ratio:.2f} of the suite's bound), "
              f"states {state_err:.2e} (tol {tol:.1e}), other rows "
              f"{'unchanged' if untouched else 'CHANGED'}  {'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(f"{name} vs float64 reference: out {out_err:.2e}, states {state_err:.2e} (tol {tol:.1e}), "
                            f"other rows {'unchanged' if untouched else 'changed'}, dtype {got.dtype}")
    return passed - failed


def check_scale(torch, chunked, chunk_kda, route, passed, failures) -> set:
    """At SCALE_LENGTHS, bf16: the variants that passed the small check, fla's chunk_kda and the fla route
    against the token-by-token kernel -> the names that passed (``"fla"``, ``"route"`` for the peers)."""
    from dsahal.backends.triton_kernels.kda import kda_prefill_recurrent

    gen = torch.Generator(device=DEVICE).manual_seed(11)
    q, k, v, g, beta, cu = make_inputs(torch, SCALE_LENGTHS, gen, torch.bfloat16)
    _, pool = strided_pool(torch, 2 * len(SCALE_LENGTHS), gen)
    ids = torch.arange(len(SCALE_LENGTHS), device=DEVICE, dtype=torch.int32) * 2
    exact_pool = pool.clone()
    exact = kda_prefill_recurrent(q, k, v, g, beta, cu, exact_pool, ids, KEY_DIM ** -0.5, True)
    live = ids.long()
    out = set()
    for name, options in VARIANTS:
        if name not in passed:
            continue
        mine = pool.clone()
        got = chunked(q, k, v, g, beta, cu, mine, ids, KEY_DIM ** -0.5, True, **_options(options))
        out_err, state_err = rel_err(torch, got, exact), rel_err(torch, mine[live], exact_pool[live])
        ok = out_err < RTOL and state_err < RTOL
        out |= {name} if ok else set()
        print(f"  scale check {name:<32s} vs recurrent: out {out_err:.2e}, states {state_err:.2e}  "
              f"{'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(f"{name} at {len(SCALE_LENGTHS)} x {SCALE_LENGTHS[0]} vs the recurrent kernel: "
                            f"out {out_err:.2e}, states {state_err:.2e} (tol {RTOL:.1e})")
    h0 = pool[live].contiguous()
    o, final = chunk_kda(q[None], k[None], v[None], g[None], beta[None], scale=KEY_DIM ** -0.5, initial_state=h0,
                         output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu.long())
    out_err, state_err = rel_err(torch, o[0], exact), rel_err(torch, final, exact_pool[live])
    ok = out_err < RTOL and state_err < RTOL
    out |= {"fla"} if ok else set()
    print(f"  scale check {'fla chunk_kda':<32s} vs recurrent: out {out_err:.2e}, states {state_err:.2e}  "
          f"{'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append(f"fla chunk_kda vs the recurrent kernel: out {out_err:.2e}, states {state_err:.2e}")
    mine = pool.clone()
    got = route(q, k, v, g, beta, cu, mine, ids, KEY_DIM ** -0.5, True)
    out_err, state_err = rel_err(torch, got, exact), rel_err(torch, mine[live], exact_pool[live])
    ok = out_err < RTOL and state_err < RTOL
    out |= {"route"} if ok else set()
    print(f"  scale check {'nvidia fla route':<32s} vs recurrent: out {out_err:.2e}, states {state_err:.2e}  "
          f"{'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append(f"the nvidia fla route vs the recurrent kernel: out {out_err:.2e}, states {state_err:.2e}")
    return out


def essential_bytes(lengths) -> int:
    """q, k, v, g (bf16), beta read once, o written once, the sequences' states read and written (fp32)."""
    per_token = HEADS * (2 * KEY_DIM * 2 + KEY_DIM * 2 + VALUE_DIM * 2 + 2 + VALUE_DIM * 2)
    return sum(lengths) * per_token + 2 * len(lengths) * HEADS * KEY_DIM * VALUE_DIM * 4


def time_case(torch, kda_chunk, chunk_kda, route, label, lengths, ceiling, passed, gates):
    """[(case, variant, ms or None, TB/s, % copy, fla ms / ms, note)] for one set of lengths."""
    import inspect

    gen = torch.Generator(device=DEVICE).manual_seed(len(lengths))
    q, k, v, g, beta, cu = make_inputs(torch, lengths, gen, torch.bfloat16, gates)
    rows = 4 * len(lengths)
    _, pool = strided_pool(torch, rows, gen)
    ids = torch.randperm(rows, device=DEVICE, generator=gen)[: len(lengths)].to(torch.int32)  # live rows only
    h0 = pool[ids.long()].contiguous()
    cu_long = cu.long()  # one object for every call: fla's chunk-index cache hits (its best case)
    host = {"cu_seqlens_cpu": cu_long.cpu()} if "cu_seqlens_cpu" in inspect.signature(chunk_kda).parameters else {}
    scale = KEY_DIM ** -0.5
    variants = [("fla", "fla chunk_kda (contiguous live states)", lambda: chunk_kda(
        q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=h0, output_final_state=True,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu_long, **host))]
    variants.append(("route", "nvidia fla route (gather, fla, scatter)",
                     lambda: route(q, k, v, g, beta, cu, pool, ids, scale, True)))
    for n, (name, options) in enumerate(VARIANTS):
        options = _options(options)
        variants.append((name, name, lambda options=options: kda_chunk.kda_prefill_chunked(
            q, k, v, g, beta, cu, pool, ids, scale, True, **options)))
        if name in PASSES_TIMED:  # the two passes alone (pass B on one filled scratch)
            operands = options.get("operands", "tf32")
            a_options = {key.replace("prepare_", "") if key != "prepare_warps" else "num_warps": options[key]
                         for key in PASS_A_OPTIONS if key in options}
            pass_a = (lambda operands=operands, a_options=a_options: kda_chunk.prepare(
                q, k, v, g, beta, cu, len(lengths), scale, True, operands=operands, **a_options))
            scratch = pass_a()
            out = torch.empty(v.shape, dtype=q.dtype, device=DEVICE)
            recur_options = {key: options[key] for key in ("block_v", "num_warps", "num_stages", "longest_first")
                             if key in options}
            variants.append((name, f"  pass A alone ({operands})", pass_a))
            if name in PASS_B_TIMED:
                def pass_b(scratch=scratch, out=out, operands=operands, recur_options=recur_options):
                    return kda_chunk.recur(scratch, out, cu, pool, ids, operands=operands, **recur_options)

                variants.append((name, f"  pass B alone ({operands})", pass_b))
    total = essential_bytes(lengths)
    out_rows, peer_ms = [], None
    for checked, name, fn in variants:
        if checked not in passed:
            continue  # failed its correctness check: not timed
        try:
            ms = _bench(fn)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            out_rows.append((label, name, None, None, None, None, f"{type(exc).__name__}: {str(exc)[:120]}"))
            continue
        peer_ms = ms if peer_ms is None and name.startswith("fla chunk_kda") else peer_ms
        tbps = total / (ms * 1e-3) / 1e12
        out_rows.append((label, name, ms, tbps, 100 * tbps / ceiling, (peer_ms / ms) if peer_ms else None, ""))
        print(f"  {label}, {name}: {ms:.3f} ms", flush=True)
    return out_rows


def _smoke_mode() -> None:
    import os

    global DEVICE, HEADS, KEY_DIM, VALUE_DIM, CHECK_LENGTHS, CHECK_IDS, SCALE_LENGTHS, TIMED, SMOKE_OPERANDS
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    DEVICE, HEADS, KEY_DIM, VALUE_DIM, SMOKE_OPERANDS = "cpu", 2, 16, 32, "fp32"
    CHECK_LENGTHS = [5, 0, 19, 3, 16, 17, 1]
    SCALE_LENGTHS = [40] * 4
    TIMED = [("4 x 40", [40] * 4, "bf16"), ("mixed 3 seqs, fp32 g", [7, 50, 16], "fp32")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny shapes on the CPU under TRITON_INTERPRET=1, fp32 operands, a recurrent stand-in "
                             "for fla: runs every step of the script, times nothing meaningful")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        _smoke_mode()
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise CheckError("kda_chunk_check: needs a CUDA device, none is visible")
    started = time.time()
    import triton

    from kda_prefill_check import fla_peer  # scripts/h200/kda_prefill_check.py

    from dsahal.backends.nvidia import kda_fla
    from dsahal.backends.nvidia import config
    from dsahal.backends.triton_kernels import kda_chunk

    default = dict(config.kda_chunk_config(VALUE_DIM, "mixed"))
    VARIANTS[0] = (VARIANTS[0][0], default)  # the backend's default
    VARIANTS[2] = (VARIANTS[2][0], dict(default, longest_first=False))

    chunk_kda = fla_peer(torch, triton, DEVICE, "fp32 operands in every variant, ")
    ceiling = timing.copy_ceiling_tbps(torch, DEVICE)
    print(f"copy ceiling {ceiling:.2f} TB/s (read + write)", flush=True)
    failures: list[str] = []
    print(f"\ncorrectness against the float64 reference, lengths {CHECK_LENGTHS}, ids {CHECK_IDS}, {HEADS} heads, "
          f"K = {KEY_DIM}, V = {VALUE_DIM}")
    passed = check_small(torch, kda_chunk.kda_prefill_chunked, failures)
    print(f"\ncorrectness at {len(SCALE_LENGTHS)} x {SCALE_LENGTHS[0]} against the token-by-token kernel "
          f"({time.time() - started:.0f} s)")
    passed = check_scale(torch, kda_chunk.kda_prefill_chunked, chunk_kda, kda_fla.kda_prefill_fla, passed, failures)
    print(f"\ntiming ({time.time() - started:.0f} s): {', '.join(sorted(passed)) or 'nothing'} passed its checks",
          flush=True)
    rows = []
    for label, lengths, gates in TIMED:
        rows += time_case(torch, kda_chunk, chunk_kda, kda_fla.kda_prefill_fla, label, lengths, ceiling, passed,
                          getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}[gates]))
    print("\n| case | variant | ms | TB/s | % copy | fla / variant |")
    print("|---|---|---:|---:|---:|---:|")
    for case, name, ms, tbps, pct, ratio, note in rows:
        if ms is None:
            print(f"| {case} | {name} | failed: {note} | | | |")
        else:
            print(f"| {case} | {name} | {ms:.3f} | {tbps:.2f} | {pct:.1f} | {f'{ratio:.3f}' if ratio else '-'} |")
    return finish("kda_chunk_check", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("kda_chunk_check", main)
