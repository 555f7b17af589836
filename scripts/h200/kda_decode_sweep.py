"""KDA decode on one Hopper GPU: the current Triton kernel and a few variants beside fla's fused_recurrent_kda.

Usage (on a CUDA machine, from the repository with dsahal importable)::

    python scripts/h200/kda_decode_sweep.py [--batches 64,256] [--cpu-smoke]

Shapes: B requests, 32 heads, K = V = 128, bf16 q / k / v / g / beta, an fp32 state pool of 2B rows
``[2B, H, K, V]`` that is a strided view of a packed pool (each row padded by 64 floats, as a packed
cache's other per-layer bytes would), updated in place at B random distinct ids.

Steps, in order, each printed:

1. device-to-device copy ceiling (1 GiB copy, read + write bytes / time) measured in this run;
2. per B: every variant (and fla, when it imports) checked on fresh random inputs (never zero; one
   padding id -1) against the float64 reference ``dsahal.reference.kda.kda_decode``: output relative
   error, updated state rows' relative error, untouched pool rows bitwise unchanged, zero output for
   the padding request;
3. ``triton.testing.do_bench`` medians on the same shape without padding; one table: ms, bytes / time
   (state rows read + written plus inputs and outputs), % of the copy ceiling, fla ms / variant ms;
   then registers / spills of every compiled variant.

Variants (``kda_decode`` launcher arguments; the first is the NVIDIA backend's config today):

* ``default``: ``backends/nvidia/config.kda_decode_config`` as it is now (since the sixth session the one-step kernel, ``scalar_row``);
* ``scalar``: ``kda_decode_step_kernel``: one scalar state address per program with 64-bit row offsets
  that fold into immediates (sm_90 compile: 117 registers instead of 151 at 64 columns x 4 warps,
  so 4 programs per SM instead of 3: 128 KB of state in flight per SM instead of 96 KB);
* ``scalar fused``: plus ``o = (S e^g)^T q + u (k . q)``: both K reductions in one pass;
* ``scalar fused stream``: plus evict-first cache hints on the state load and store;
* ``scalar fused 128x4``: whole rows per program (206 registers, no spill: 2 programs x 64 KB per SM;
  q / k / g read once per head instead of twice);
* ``scalar fused 32x2`` / ``32x4`` / ``64x8``: smaller programs, more of them per SM.

A failed check is listed and the script exits with one ``error:`` line (after timing what did pass).
Runs in about a minute on an H200, most of it Triton compiles and the float64 reference.
"""
from __future__ import annotations

import argparse
import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
from script_cli import CheckError, finish, run  # scripts/h200/script_cli.py

HEADS, KEY_DIM, VALUE_DIM = 32, 128, 128
ROW_PAD = 64  # floats after each state row in the packed pool: the pool is a strided view
SCALE = KEY_DIM**-0.5
O_TOL, STATE_TOL = 2e-2, 1e-4  # bf16 output rounding; fp32 state update from exact bf16 inputs
DEVICE, DTYPE = "cuda", "bfloat16"  # --cpu-smoke: "cpu", "float16" (the interpreter's bf16 is wrong)

SCALAR = dict(scalar_row=True)
VARIANTS = (
    ("default", None),  # the NVIDIA config's
    ("scalar 64x4", dict(SCALAR, block_v=64, num_warps=4)),
    ("scalar fused 64x4", dict(SCALAR, block_v=64, num_warps=4, fused_output=True)),
    ("scalar fused stream 64x4", dict(SCALAR, block_v=64, num_warps=4, fused_output=True, stream_state=True)),
    ("scalar fused 128x4", dict(SCALAR, block_v=128, num_warps=4, fused_output=True)),
    ("scalar fused 32x2", dict(SCALAR, block_v=32, num_warps=2, fused_output=True)),
    ("scalar fused 32x4", dict(SCALAR, block_v=32, num_warps=4, fused_output=True)),
    ("scalar fused 64x8", dict(SCALAR, block_v=64, num_warps=8, fused_output=True)),
)


def _bench(fn):
    return timing.bench_ms(fn, DEVICE, warmup=10, rep=60)


def _sync(torch):
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _kwargs(kw):
    from dsahal.backends.nvidia.config import kda_decode_config

    return dict(kda_decode_config(VALUE_DIM)) if kw is None else dict(kw)


def inputs(torch, batch, gen, padded):
    """Random (never zero) q, k, v, g, beta ``[B, H, *]`` in DTYPE, a packed pool's strided view
    ``[2B, H, K, V]`` fp32 and ``B`` distinct random ids (the second one -1 when ``padded``)."""
    dtype = getattr(torch, DTYPE)

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, generator=gen)

    q, k, v = (randn(batch, HEADS, dim).to(dtype) for dim in (KEY_DIM, KEY_DIM, VALUE_DIM))
    g = (-torch.rand(batch, HEADS, KEY_DIM, device=DEVICE, generator=gen) * 0.1 - 1e-3).to(dtype)
    beta = (torch.rand(batch, HEADS, device=DEVICE, generator=gen) * 0.9 + 0.05).to(dtype)
    rows, row = 2 * batch, HEADS * KEY_DIM * VALUE_DIM
    packed = randn(rows, row + ROW_PAD) * 0.05
    pool = packed[:, :row].view(rows, HEADS, KEY_DIM, VALUE_DIM)
    ids = torch.randperm(rows, device=DEVICE, generator=gen)[:batch].to(torch.int32)
    if padded and batch > 1:
        ids[1] = -1
    return (q, k, v, g, beta), packed, pool, ids


def call_bytes(batch) -> int:
    """State rows read + written, plus q / k / g / v / beta / out (2-byte) and the int32 ids."""
    state = 2 * batch * HEADS * KEY_DIM * VALUE_DIM * 4
    vectors = batch * HEADS * (3 * KEY_DIM + 2 * VALUE_DIM + 1) * 2
    return state + vectors + batch * 4


def load_fla():
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

        import fla

        return fused_recurrent_kda_fwd, getattr(fla, "__version__", "?")
    except Exception as exc:  # noqa: BLE001 - any failure means "no peer column"
        return None, f"{type(exc).__name__}: {exc}"


def fla_step(torch, fla_fwd, tensors, pool, ids):
    """fla's decode step on the same pool, in place, indexed per request (vLLM's call, as ``dsahal bench``);
    returns ``o [B, H, V]``."""
    q, k, v, g, beta = tensors
    batch = q.shape[0]
    cu = torch.arange(batch + 1, device=q.device, dtype=torch.int64)
    ids64 = ids.long()

    def step():
        out = fla_fwd(q=q[None], k=k[None], v=v[None], g=g[None], beta=beta[None], scale=SCALE, initial_state=pool,
                      inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=ids64,
                      use_qk_l2norm_in_kernel=True)
        return (out[0] if isinstance(out, tuple) else out)[0]

    return step


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(torch, label, make_step, tensors, packed, ids, want_o, want_packed, peer=False):
    """``make_step(pool) -> step() -> o`` on a copy of ``packed``; compared with the reference's result.
    ``peer``: fla writes no defined output for a padding request (id -1): its output is compared on the
    live requests only. Raises CheckError naming what differs."""
    mine = packed.clone()
    pool = mine[:, :HEADS * KEY_DIM * VALUE_DIM].view(packed.shape[0], HEADS, KEY_DIM, VALUE_DIM)
    o = make_step(pool)()
    _sync(torch)
    live = ids[ids >= 0].long()
    touched = torch.zeros(packed.shape[0], dtype=torch.bool, device=DEVICE)
    touched[live] = True
    o_err = _rel(o[ids >= 0], want_o[ids >= 0]) if peer else _rel(o, want_o)
    state_err = _rel(mine[live], want_packed[live])
    untouched_ok = torch.equal(mine[~touched], packed[~touched])
    padding_ok = peer or bool((o[ids < 0] == 0).all())
    ok = o_err < O_TOL and state_err < STATE_TOL and untouched_ok and padding_ok
    print(f"  check {label:<34s} o rel err {o_err:.2e}  state rel err {state_err:.2e}  untouched rows "
          f"{'same' if untouched_ok else 'CHANGED'}  padding output "
          f"{'not compared' if peer else 'zero' if padding_ok else 'NONZERO'}  "
          f"{'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        raise CheckError(f"{label}: differs from the float64 reference (o rel err {o_err:.3e} vs {O_TOL}, state rel "
                         f"err {state_err:.3e} vs {STATE_TOL}, untouched rows unchanged: {untouched_ok}, padding "
                         f"output zero: {padding_ok})")


def fla_check(torch, fla_fwd, batch, tensors, packed, ids, want_o, want_pool):
    """fla on what it takes: a contiguous pool (a copy of the packed pool's rows: fla addresses rows as
    contiguous, so on the strided view it writes other bytes) and the live requests only (fla checks no
    padding id: -1 reads and writes outside the pool). Raises CheckError naming what differs."""
    live = ids >= 0
    pool = packed[:, :HEADS * KEY_DIM * VALUE_DIM].contiguous().view(packed.shape[0], HEADS, KEY_DIM, VALUE_DIM)
    before = pool.clone()
    live_ids = ids[live]
    o = fla_step(torch, fla_fwd, tuple(t[live] for t in tensors), pool, live_ids)()
    _sync(torch)
    touched = torch.zeros(pool.shape[0], dtype=torch.bool, device=DEVICE)
    touched[live_ids.long()] = True
    o_err = _rel(o, want_o[live])
    state_err = _rel(pool[live_ids.long()], want_pool[live_ids.long()])
    untouched_ok = torch.equal(pool[~touched], before[~touched])
    ok = o_err < O_TOL and state_err < STATE_TOL and untouched_ok
    print(f"  check {'fla fused_recurrent_kda B=' + str(batch):<34s} o rel err {o_err:.2e}  state rel err "
          f"{state_err:.2e}  untouched rows {'same' if untouched_ok else 'CHANGED'}  (contiguous pool, live "
          f"requests)  {'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        raise CheckError(f"fla B={batch}: differs from the float64 reference (o rel err {o_err:.3e}, state rel err "
                         f"{state_err:.3e}, untouched rows unchanged: {untouched_ok})")


def run_batch(torch, batch, fla_fwd, rows_out, failures, ceiling):
    from dsahal.backends.triton_kernels.kda import kda_decode
    from dsahal.reference.kda import kda_decode as reference

    gen = torch.Generator(device=DEVICE).manual_seed(batch)
    tensors, packed, _, ids = inputs(torch, batch, gen, padded=True)
    want_packed = packed.clone()
    want_pool = want_packed[:, :HEADS * KEY_DIM * VALUE_DIM].view(packed.shape[0], HEADS, KEY_DIM, VALUE_DIM)
    # float64 inputs (exact copies): the reference's output stays float64, not rounded to DTYPE
    want_o = reference(*(t.double() for t in tensors), want_pool, ids, SCALE, True)
    _sync(torch)

    def ours(kw):
        return lambda pool: (lambda: kda_decode(*tensors, pool, ids, SCALE, True, **kw))

    passed = []
    for label, kw in VARIANTS:
        kw = _kwargs(kw)
        try:
            check(torch, f"{label} B={batch}", ours(kw), tensors, packed, ids, want_o, want_packed)
            passed.append((label, kw))
        except Exception as exc:  # noqa: BLE001 - recorded; the script fails at the end
            failures.append(f"{label} B={batch}: {type(exc).__name__}: {exc}")
            if not isinstance(exc, CheckError):
                print(f"  {label} B={batch}: FAILED ({type(exc).__name__}: {str(exc)[:300]})", flush=True)
    fla_ok = False
    if fla_fwd is not None:
        try:  # the peer is checked like ours; a peer that disagrees gets no time column
            fla_check(torch, fla_fwd, batch, tensors, packed, ids, want_o, want_pool)
            fla_ok = True
        except Exception as exc:  # noqa: BLE001
            print(f"  fla B={batch}: not timed ({type(exc).__name__}: {str(exc)[:300]})", flush=True)
    del want_packed, want_pool, packed

    # timing: the same shape, no padding, a fresh pool (the checks' copies are gone)
    tensors, _, pool, ids = inputs(torch, batch, gen, padded=False)
    # fla addresses its state pool as contiguous rows: it gets a contiguous copy of the same rows
    fla_ms = _bench(fla_step(torch, fla_fwd, tensors, pool.contiguous(), ids)) if fla_ok else None
    moved = call_bytes(batch)
    for label, kw in passed:
        ms = _bench(lambda kw=kw: kda_decode(*tensors, pool, ids, SCALE, True, **kw))
        tbps = moved / (ms * 1e-3) / 1e12
        rows_out.append((batch, label, ms, tbps, 100 * tbps / ceiling, fla_ms, None if fla_ms is None else fla_ms / ms,
                         ", ".join(f"{k}={v}" for k, v in kw.items() if k != "scalar_row")))


def compiled_variants():
    """{(kernel, key): (n_regs, n_spills, num_warps)} of the KDA kernels Triton compiled in this run."""
    from dsahal.backends.triton_kernels import kda

    found = {}
    for fn in (kda.kda_recurrent_kernel, kda.kda_decode_step_kernel):
        try:
            for cache in fn.device_caches.values():
                kernels = cache[0] if isinstance(cache, tuple) else cache
                for key, kernel in kernels.items():
                    found[(fn.__name__, str(key))] = (getattr(kernel, "n_regs", None), getattr(kernel, "n_spills", None),
                                                      getattr(kernel.metadata, "num_warps", None))
        except Exception as exc:  # noqa: BLE001 - Triton's cache layout is internal; report, don't fail
            found[(fn.__name__, "unavailable")] = (f"{type(exc).__name__}: {exc}",)
    return found


def _smoke_mode() -> None:
    import os

    global DEVICE, DTYPE, HEADS, KEY_DIM, VALUE_DIM, SCALE, ROW_PAD
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    DEVICE, DTYPE, HEADS, KEY_DIM, VALUE_DIM, ROW_PAD = "cpu", "float16", 2, 32, 64, 16
    SCALE = KEY_DIM**-0.5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,256", help="comma-separated request counts (default 64,256)")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny shapes (2 heads, K=32, V=64, B=3) on the CPU under TRITON_INTERPRET=1 with fp16 "
                             "inputs: runs every step of the script, times nothing meaningful")
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise CheckError(f"kda_decode_sweep: --batches expected comma-separated integers, got {args.batches!r}") from None
    if any(b < 1 for b in batches):
        raise CheckError(f"kda_decode_sweep: --batches expected positive integers, got {args.batches!r}")
    if args.cpu_smoke:
        _smoke_mode()
        batches = [3]
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise CheckError("kda_decode_sweep: needs a CUDA device, none is visible (use --cpu-smoke on a CPU machine)")
    started = time.time()
    import triton

    ceiling = timing.announce(torch, triton, DEVICE)
    fla_fwd, version = load_fla()
    print(f"fla: {'version ' + version if fla_fwd else 'not available, timing ours only: ' + version}", flush=True)
    rows, failures = [], []
    for batch in batches:
        run_batch(torch, batch, fla_fwd, rows, failures, ceiling)
    print(f"\n| B | variant | ms | TB/s | % copy | fla ms | fla/ours | config |\n|---|---|---|---|---|---|---|---|")
    for batch, label, ms, tbps, pct, fla_ms, ratio, cfg in rows:
        fla_s = "-" if fla_ms is None else f"{fla_ms:.4f}"
        ratio_s = "-" if ratio is None else f"{ratio:.2f}"
        print(f"| {batch} | {label} | {ms:.4f} | {tbps:.2f} | {pct:.1f} | {fla_s} | {ratio_s} | {cfg} |")
    print("\ncompiled KDA kernels: n_regs, n_spills, num_warps")
    for (kernel, key), info in sorted(compiled_variants().items()):
        print(f"  {kernel:<24s} {info}  {key[:200]}")
    return finish("kda_decode_sweep", failures, started, "variant(s) failed the reference check or did not run")


if __name__ == "__main__":
    run("kda_decode_sweep", main)
