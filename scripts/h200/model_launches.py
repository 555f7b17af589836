"""What the eager k31-pro-slice decode step dispatches: aten ops and Triton launches per step and per layer kind.

Usage (from the repository with dsahal importable)::

    python3 scripts/h200/model_launches.py [--backend nvidia] [--requests 64] [--context 4096]   # on the H200
    python3 scripts/h200/model_launches.py --cpu-smoke     # on a CPU: TRITON_INTERPRET=1, a shrunken config
    python3 scripts/h200/model_launches.py --cpu-smoke --fused     # the same, counting the CUDA path's kernels

The step is built exactly as ``dsahal bench --op model`` builds it (:func:`dsahal.bench.model_step.decode_setup`:
the model on the meta device materialised on the device, a randomly filled cache, one token per request at
position ``context``; every op with ``check=False``; bfloat16 unless ``--dtype``). ``--cpu-smoke`` keeps
k31-pro-slice's structure (layer pattern, dense MLPs, formats, bfloat16) with small widths and 4 requests, so its
counts are the H200 step's counts (nothing in the step branches on a width), but for ``F.rms_norm``: the CPU runs
its composite (pow, mean, add, rsqrt, mul), CUDA one ``aten._fused_rms_norm`` kernel, which is what the smoke run
counts (the CUDA run counts what CUDA dispatches).

The model's elementwise chains run as fused Triton kernels on CUDA where they are switched on (:mod:`dsahal.model.fused`:
the CUDA-graph decode path switches them on; this script does for its CUDA step unless ``--unfused``) and as torch
chains on the CPU. ``--fused`` makes the smoke run take the CUDA path (``fused.forced_on_host``: the kernels under
the interpreter), so it counts what the H200 step launches; without it the smoke run counts the torch chains (the
step before the fusion). ``--unfused`` runs (counts, times) the torch chains on CUDA too (``fused.disabled``). On
CUDA the fused step is also checked against the unfused one (logits within rounding, the same greedy tokens, the
same cache rows written) and both eager steps are timed.

Steps, in order:

1. correctness first: :func:`dsahal.bench.model_step.check_model_decode` (the backend's step vs the float64-
   capable reference backend at the ``tiny`` config, the padded step the graph runner captures, and on CUDA its
   replay), then, on CUDA, the bench step's graph replay against the same step run eagerly;
2. one warm-up step (Triton compiles, autotuning), then one counted step: a ``TorchDispatchMode`` counts every
   aten op dispatched (split into the ones that launch a kernel and the views / allocations that do not), a
   wrapper of Triton's ``JITFunction.run`` (``InterpretedFunction.run`` under the interpreter) counts the
   launches, the registry's observer API counts the HAL op calls (and which launches happen inside them: the
   backend's, not the model's); module hooks attribute each to the embedding, a KDA or DSA block, or the head
   (final norm, LM head);
3. on CUDA: the eager step and its CUDA-graph replay timed (``timing.bench_ms``, do_bench median), and the
   host time per launch they imply;
4. one markdown table; a failed check exits 1 with one ``error:`` line (after the table).

A counted dispatch mode makes ``dsahal.ops`` take its custom-op path (``tracing()`` is true under any dispatch
mode); the counter hides itself from that test so the counted step runs the eager path the timed step runs.
Ops inside a Triton launch (the interpreter's copies) are not counted. Well under 150 s on an H200.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
from script_cli import CheckError, finish, run  # scripts/h200/script_cli.py

SMOKE_WIDTHS = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_heads=4, q_lora_rank=64,
                    index_heads=4, index_topk=64, kda_heads=2, kda_gate_rank=16)
SMOKE_REQUESTS, SMOKE_CONTEXT = 4, 100
SECTIONS = ("embed", "kda", "dsa", "head")
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "sym_size", "sym_stride",
             "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type"}
LAUNCHES = ("kernel_ops", "other_ops", "triton")
GRAPH_TOL = 1e-3  # replay vs the same step eager: the same kernels on the same inputs
FUSED_TOL = 2e-2  # fused vs unfused step: bf16 roundings within one ulp, a few of them flipped (test_model_fused)


def op_launches_kernel(func) -> bool:
    """False for an op that only makes a view or allocates (no kernel on a GPU)."""
    return not (func.is_view or func.__name__.split(".")[0] in NO_KERNEL)


class StepCounter:
    """Counts per section: aten ops (kernel / no kernel), other dispatched ops, Triton launches, HAL op calls."""

    def __init__(self):
        self.section = "embed"
        self.in_launch = 0  # inside a Triton launch: the interpreter's own copies are not the step's
        self.in_hal = 0  # inside a HAL op call (the backend's launches, not the model's)
        self.fused = 0  # inside an op CUDA runs as one kernel that this device decomposes
        self.counts = {s: dict(kernel_ops=0, view_ops=0, other_ops=0, triton=0, hal=0, in_hal=0) for s in SECTIONS}
        self.names: dict[str, int] = {}

    def add(self, key: str, name: str = "") -> None:
        self.counts[self.section][key] += 1
        if self.in_hal and key in LAUNCHES:
            self.counts[self.section]["in_hal"] += 1
        if name:
            self.names[name] = self.names.get(name, 0) + 1


def counting(torch, counter: StepCounter, model, device: str):
    """A context manager: ``counter`` counts everything the block dispatches on ``model``.

    Off CUDA, ``F.rms_norm`` counts as the one ``aten._fused_rms_norm`` kernel CUDA dispatches for it (the CPU
    runs its composite: pow, mean, add, rsqrt, mul), so the smoke run counts what the H200 launches."""
    import contextlib

    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    import dsahal.ops._dispatch as hal_dispatch
    from dsahal.registry.observers import OpObserver, observe

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not (counter.in_launch or counter.fused):
                namespace = func.namespace
                if namespace != "aten":
                    counter.add("other_ops", f"{namespace}::{func.__name__}")
                elif op_launches_kernel(func):
                    counter.add("kernel_ops", func.__name__)
                else:
                    counter.add("view_ops")
            return func(*args, **(kwargs or {}))

    class FusedOnCuda(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is not torch.nn.functional.rms_norm or counter.in_launch or counter.fused:
                return func(*args, **(kwargs or {}))
            counter.add("kernel_ops", "_fused_rms_norm (CUDA's one kernel)")
            counter.fused += 1
            try:
                return func(*args, **(kwargs or {}))
            finally:
                counter.fused -= 1

    class Hal(OpObserver):
        def before(self, call):
            if not counter.in_launch:
                counter.add("hal")
            counter.in_hal += 1

        def after(self, call):
            counter.in_hal -= 1

    def wrap(cls, attr):
        original = getattr(cls, attr)

        def run_counted(self, *args, **kwargs):
            if not kwargs.get("warmup", False) and not counter.in_launch:
                counter.add("triton", f"triton::{getattr(self, '__name__', '?')}")
            counter.in_launch += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                counter.in_launch -= 1
        return original, run_counted

    @contextlib.contextmanager
    def block():
        from triton.runtime import interpreter, jit

        from dsahal.kernel_launch import LaunchedKernel

        # the package's launch cache serves repeated launches without JITFunction.run: count both
        classes = [(jit.JITFunction, "run"), (interpreter.InterpretedFunction, "run"), (LaunchedKernel, "launch")]
        patched = [(cls, attr, *wrap(cls, attr)) for cls, attr in classes]
        hooks = [model.embed.register_forward_pre_hook(lambda *_: setattr(counter, "section", "embed")),
                 model.final_norm.register_forward_pre_hook(lambda *_: setattr(counter, "section", "head"))]
        for block_ in model.blocks:
            hooks.append(block_.register_forward_pre_hook(
                lambda module, _args: setattr(counter, "section", module.kind)))
        depth = hal_dispatch._dispatch_mode_depth
        hal_dispatch._dispatch_mode_depth = lambda: depth() - 1  # the counter is no tracer: keep the eager path
        for cls, attr, _, counted in patched:
            setattr(cls, attr, counted)
        try:
            with contextlib.ExitStack() as stack:
                if device != "cuda":
                    stack.enter_context(FusedOnCuda())
                stack.enter_context(observe(Hal()))
                stack.enter_context(Mode())
                yield counter
        finally:
            hal_dispatch._dispatch_mode_depth = depth
            for cls, attr, original, _ in patched:
                setattr(cls, attr, original)
            for hook in hooks:
                hook.remove()

    return block()


def count_step(torch, setup, device: str) -> StepCounter:
    counter = StepCounter()
    with counting(torch, counter, setup.model, device):
        setup.step()
    return counter


def table(counter: StepCounter, config, timings) -> list[str]:
    """Markdown rows: per section per step and per layer, then the step with its times."""
    layers = {"embed": 1, "head": 1, "kda": len(config.kda_layers), "dsa": len(config.dsa_layers)}
    head = ("| part | layers | aten ops | of which launch | views / allocs | other ops | Triton launches | "
            "HAL calls | launches (aten + other + Triton) | of which in HAL ops | per layer | eager ms | graph ms | "
            "graph/eager |")
    rows = [head, "| " + " | ".join(["---"] + ["---:"] * 13) + " |"]
    total = dict(kernel_ops=0, view_ops=0, other_ops=0, triton=0, hal=0, in_hal=0)
    for section in SECTIONS:
        c = counter.counts[section]
        for key in total:
            total[key] += c[key]
        launches = c["kernel_ops"] + c["other_ops"] + c["triton"]
        per = launches / max(layers[section], 1)
        rows.append(f"| {section} | {layers[section]} | {c['kernel_ops'] + c['view_ops']} | {c['kernel_ops']} | "
                    f"{c['view_ops']} | {c['other_ops']} | {c['triton']} | {c['hal']} | {launches} | {c['in_hal']} | "
                    f"{per:.0f} | — | — | — |")
    launches = total["kernel_ops"] + total["other_ops"] + total["triton"]
    eager, graph = timings if timings else (None, None)
    times = (f"{eager:.3f} | {graph:.3f} | {graph / eager:.2f}" if timings else "— | — | —")
    rows.append(f"| **step** | {config.num_layers} | {total['kernel_ops'] + total['view_ops']} | "
                f"{total['kernel_ops']} | {total['view_ops']} | {total['other_ops']} | {total['triton']} | "
                f"{total['hal']} | **{launches}** | {total['in_hal']} | — | {times} |")
    return rows


def lift_device_checks(backend: str) -> None:
    """``--cpu-smoke``: the interpreter's "device" is the host, so the backend is marked available and the shared
    kernels' verifiers accept CPU tensors (as tests/test_amd_triton_interpreter.py does); routes that need a
    vendor library (FlashMLA, fla) still decline where it is not installed."""
    import inspect

    from dsahal.backends.triton_kernels import limits
    from dsahal.registry.discovery import BackendRecord
    from dsahal.registry.state import registry

    def host_ok(**tensors):
        return True, ""

    limits.on_gpu = host_ok
    for _, fn in inspect.getmembers(limits, inspect.isfunction):
        if fn.__kwdefaults__ and "device_check" in fn.__kwdefaults__:
            fn.__kwdefaults__["device_check"] = host_ok
    records = registry().records
    if backend not in records:
        raise CheckError(f"model_launches: --backend expected one of {sorted(records)}, got {backend!r}")
    record = records[backend]
    records[backend] = BackendRecord(record.backend, record.plugin, True, "Triton interpreter (--cpu-smoke)")


def smoke_config(config):
    """k31-pro-slice's structure at widths the interpreter runs in seconds."""
    return dataclasses.replace(config, name=f"{config.name}-smoke", **SMOKE_WIDTHS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="nvidia")
    parser.add_argument("--config", default="k31-pro-slice")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="the step's dtype (the bench's: bfloat16; the smoke run counts in it too: the casts "
                             "a bf16 step dispatches are part of its count)")
    parser.add_argument("--top-ops", type=int, default=12, help="also list the most dispatched ops (0: none)")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="the CPU under TRITON_INTERPRET=1: shrunken widths, 4 requests; counts, no timing")
    parser.add_argument("--fused", action="store_true",
                        help="force the model's fused Triton kernels (the CUDA path, CUDA's default) on the CPU "
                             "of --cpu-smoke")
    parser.add_argument("--unfused", action="store_true",
                        help="count and time the model's torch chains, not its fused Triton kernels (the CPU's "
                             "default)")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    if args.fused and args.unfused:
        raise CheckError("model_launches: --fused and --unfused expected at most one of them, got both")
    if args.requests < 1 or args.context < 1:
        raise CheckError(f"model_launches: --requests and --context expected ints >= 1, got {args.requests} and "
                         f"{args.context}")
    import torch

    # decode_setup draws the cache pages from torch's global generator: seeded, a run is repeatable (some random
    # caches put check_model_decode's float32 step over its tolerance on the CPU, ~2 seeds in 25, fused or not)
    torch.manual_seed(0)
    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise CheckError("model_launches: needs a CUDA device, none is visible (use --cpu-smoke on a CPU)")
    started = time.time()
    import triton

    from dsahal.bench.model_step import check_model_decode, decode_setup
    from dsahal.config import load_config
    from dsahal.model import fused
    from dsahal.registry import use_backend

    if args.cpu_smoke and args.backend != "reference":
        lift_device_checks(args.backend)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter smoke run)"
    print(f"device {name}  torch {torch.__version__}  triton {triton.__version__}  backend {args.backend}")
    failures = []
    unfused = args.unfused or (args.cpu_smoke and not args.fused)
    path = (fused.forced_on_host() if args.cpu_smoke and args.fused
            else fused.disabled() if args.unfused else fused.enabled() if device == "cuda"
            else contextlib.nullcontext())  # the CUDA-graph path's steps; eager dsahal run leaves them off
    with use_backend(args.backend), path:
        ok, detail = check_model_decode(device, args.backend)
        print(f"check_model_decode: {'pass' if ok else 'FAIL'}: {detail} ({time.time() - started:.0f} s)", flush=True)
        if not ok:
            failures.append(f"check_model_decode: {detail}")
        config = load_config(args.config)
        requests, context, dtype = args.requests, args.context, getattr(torch, args.dtype)
        if args.cpu_smoke:
            config, requests, context = smoke_config(config), SMOKE_REQUESTS, SMOKE_CONTEXT
        setup = decode_setup(config, [context] * requests, device, dtype=dtype)
        pool_before = setup.cache.pool.clone()
        eager = setup.step().clone()  # warm-up: compiles, autotunes
        if not bool(torch.isfinite(eager).all()):
            failures.append("eager step: non-finite logits")
        counter = count_step(torch, setup, device)
        timings = other_ms = None
        if device == "cuda":
            timings = time_step(torch, setup, requests, pool_before, eager, failures)
            if not unfused:
                other_ms = check_against_unfused(torch, fused, setup, pool_before, failures)
    print(f"\n{config.name}, {requests} requests at context {context}, {str(dtype).replace('torch.', '')}, backend "
          f"{args.backend}; {'unfused torch chains' if unfused else 'fused elementwise kernels'}; counted on the "
          f"second eager step" + ("; F.rms_norm counted as CUDA's one fused kernel" if device != "cuda" else ""))
    print("\n".join(table(counter, config, timings)))
    if args.top_ops:
        top = sorted(counter.names.items(), key=lambda kv: -kv[1])[:args.top_ops]
        print("\nmost dispatched (kernel-launching aten ops, other ops, Triton kernels): " +
              ", ".join(f"{n} {c}" for n, c in top))
    if timings:
        launches = sum(c["kernel_ops"] + c["other_ops"] + c["triton"] for c in counter.counts.values())
        print(f"host time per launch implied by (eager - graph) / launches: "
              f"{1e3 * (timings[0] - timings[1]) / launches:.1f} us")
    if other_ms is not None:
        print(f"the same step unfused (the torch chains): eager {other_ms:.3f} ms; fused / unfused "
              f"{timings[0] / other_ms:.2f}")
    return finish("model_launches", failures, started)


def check_against_unfused(torch, fused, setup, pool_before, failures) -> float:
    """The fused step against the same step with the torch chains (logits within :data:`FUSED_TOL`, the same greedy
    tokens, the same cache rows written); returns the unfused eager step's ms."""
    from dsahal.bench.measure import relative_error

    setup.cache.pool.copy_(pool_before)
    got = setup.step().clone()
    wrote = (setup.cache.pool != pool_before).any(dim=-1)
    setup.cache.pool.copy_(pool_before)
    with fused.disabled():
        want = setup.step().clone()
        wrote_unfused = (setup.cache.pool != pool_before).any(dim=-1)
        unfused_ms = timing.bench_ms(setup.step, "cuda")
    err = relative_error(got, want)
    same_tokens = bool(torch.equal(got.argmax(dim=-1), want.argmax(dim=-1)))
    same_rows = bool(torch.equal(wrote, wrote_unfused))
    print(f"fused vs unfused step: logits rel err {err:.1e} (tol {FUSED_TOL:.0e}), greedy tokens equal: {same_tokens}, "
          f"same cache rows written: {same_rows}", flush=True)
    if not (err < FUSED_TOL and same_tokens and same_rows):
        failures.append(f"fused vs unfused step: rel err {err:.1e} (tol {FUSED_TOL:.0e}), tokens equal {same_tokens}, "
                        f"rows equal {same_rows}")
    return unfused_ms


def time_step(torch, setup, requests, pool_before, eager, failures):
    """(eager ms, graph ms) of the bench step; first the graph replay vs the same step run eagerly."""
    graphs = setup.graphs(sizes=[requests])
    graphs.capture(requests)
    graphs.load(setup.inputs, setup.block_table)
    setup.cache.pool.copy_(pool_before)
    replayed = graphs.replay(requests).clone()
    torch.cuda.synchronize()
    setup.cache.pool.copy_(pool_before)
    again = setup.step()
    from dsahal.bench.measure import relative_error

    err = relative_error(replayed, again)
    print(f"graph replay vs the eager step: rel err {err:.1e} (tol {GRAPH_TOL:.0e})", flush=True)
    if not err < GRAPH_TOL:
        failures.append(f"graph replay vs the eager step: rel err {err:.1e} > {GRAPH_TOL:.0e}")
    eager_ms = timing.bench_ms(setup.step, "cuda")
    graph_ms = timing.bench_ms(lambda: graphs.replay(requests), "cuda")
    return eager_ms, graph_ms


if __name__ == "__main__":
    run("model_launches", main)
