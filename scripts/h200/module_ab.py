"""A kernel module against a frozen copy of itself, same run: the outputs compared bit for bit first, then both
timed through the backend's own launch (the copy swapped in for the module while it runs).

Usage (on a CUDA machine, from the repository root; the copy carried in ``.baseline/``, which is not in the
repository, and copied into the package before the run)::

    cp .baseline/_baseline_indexer_gluon.py backends/triton_kernels/
    python3 scripts/h200/module_ab.py indexer_gluon sparse_mla_wgmma_fp4 [--quick]

For each module NAME the copy is ``dsahal.backends.triton_kernels._baseline_NAME``; a module without its copy is
reported and skipped. The families:

- ``indexer_gluon``: ``indexer.indexer_score`` with the backend's options (``config.indexer_config``) at 64 x 1, 64 x 2,
  64 x 5 at 128K (FP8 keys with FP8 and bf16 queries, MXFP4 keys with FP8 queries), 8 x 1 at 1M, and edge cases (8 x 3
  at 100,037 keys with unmapped blocks and a request's tokens well inside the context);
- ``sparse_mla_wgmma_fp4``: the NVFP4 launcher with the nvidia backend's fixed-split launch parameters by token count
  (``ops.wgmma_fp4_launch``) and on the balanced schedule (two programs a SM) at H = 16, 64 x 5, 64 x 8, 192, 128
  and 64 tokens over a 1M-token pool, and edge cases (5 heads, 2,000 slots a row: a partial last split,
  skipped and out-of-range slots, a row with none valid; the balanced schedule also on 7 programs, each meeting many
  rows). A launch option the copy predates is left out of the copy's call (a new launch is checked bit for bit
  against the copy's launch without it);
- ``sparse_mla_wgmma``: the fp8_ds_mla and per-tensor FP8 launcher (``ops.wgmma_launch``) on the same cases.

A change meant to keep every result (a schedule, a layout) must give the copy's outputs bit for bit: a difference is a
failure. Timing: the GPU time of each launch from CUDA-graph replays (eager calls of few tokens are host-bound),
``do_bench`` medians in the order copy, module, module, copy (the pairs averaged). Exits with one ``error:`` line
when a check fails.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import sys

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from script_cli import finish, run, start  # scripts/h200/script_cli.py

PACKAGE = "dsahal.backends.triton_kernels"


@contextlib.contextmanager
def swapped(name: str, module):
    """``PACKAGE.name`` resolves to ``module`` (imports inside functions, ``from . import name``, see it)."""
    package = importlib.import_module(PACKAGE)
    full = f"{PACKAGE}.{name}"
    importlib.import_module(full)  # (imported first: the backend imports it lazily, at its first call)
    saved = sys.modules[full], getattr(package, name)
    sys.modules[full] = module
    setattr(package, name, module)
    try:
        yield
    finally:
        sys.modules[full] = saved[0]
        setattr(package, name, saved[1])


def same_bits(torch, a, b) -> bool:
    """Whether two tensors (or tuples of them) hold the same bytes."""
    if isinstance(a, tuple):
        return all(same_bits(torch, x, y) for x, y in zip(a, b))
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def indexer_cases(torch):
    """(label, call, timed): the backend's indexer launch on each case."""
    from fused_maxima_check import build  # scripts/h200/fused_maxima_check.py

    from dsahal.backends.nvidia import config
    from dsahal.backends.triton_kernels import indexer

    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    ctx = 128 * 1024
    shapes = [("64 x 1 at 128K, fp8 keys, fp8 q", 64, 1, ctx, "fp8", fp8, False),
              ("64 x 2 at 128K, fp8 keys, fp8 q", 64, 2, ctx, "fp8", fp8, False),
              ("64 x 5 at 128K, fp8 keys, fp8 q", 64, 5, ctx, "fp8", fp8, False),
              ("64 x 5 at 128K, fp8 keys, bf16 q", 64, 5, ctx, "fp8", bf16, False),
              ("64 x 1 at 128K, mxfp4 keys, fp8 q", 64, 1, ctx, "mxfp4", fp8, False),
              ("64 x 5 at 128K, mxfp4 keys, fp8 q", 64, 5, ctx, "mxfp4", fp8, False),
              ("8 x 1 at 1M, fp8 keys, fp8 q", 8, 1, 1024 * 1024, "fp8", fp8, False),
              ("8 x 3 at 100,037 (edges), fp8 keys, fp8 q", 8, 3, 100037, "fp8", fp8, True),
              ("8 x 3 at 100,037 (edges), fp8 keys, bf16 q", 8, 3, 100037, "fp8", bf16, True),
              ("8 x 3 at 100,037 (edges), mxfp4 keys, fp8 q", 8, 3, 100037, "mxfp4", fp8, True),
              ("64 x 2 at 100,037 (edges), fp8 keys, fp8 q", 64, 2, 100037, "fp8", fp8, True)]
    out = []
    for label, requests, per_request, context, fmt, q_dtype, edges in shapes:
        args = build(torch, requests, per_request, context, fmt, q_dtype, edges, "cuda")
        options = config.indexer_config(args[0].shape[1], q_dtype, fmt)
        out.append((label, (lambda a=args, c=context, f=fmt, o=options: indexer.indexer_score(*a, f, c, **o)),
                    not edges))
    return out


def wgmma_cases(torch, name, launches_of, formats):
    """(label, call, timed): the wgmma module ``name``'s launcher with each launch ``launches_of(tokens)`` names
    (``{label: launch keyword arguments}``: the fixed splits default mode takes without a device, and the balanced
    schedule at two programs a SM, and at 7 programs on the edge case, whose programs then meet many rows), per
    format."""
    def launch(q, *args, kw):
        module = importlib.import_module(f"{PACKAGE}.{name}")  # (the copy while swapped)
        launcher = getattr(module, name)
        # (an option the copy predates is left out of its call: a new launch checked against the copy's own)
        known = inspect.signature(inspect.unwrap(launcher)).parameters
        return launcher(q, *args, **{key: value for key, value in kw.items() if key in known})

    pools = cache_pools.latent_pools(torch, formats, 1 << 20, "cuda")
    out = []
    for fmt in formats:
        pages, scale = pools[fmt]
        pool_slots = pages.shape[0] * pages.shape[1]
        for heads, tokens, width, label in ((16, 320, 2048, "H=16 64 x 5"), (16, 512, 2048, "H=16 64 x 8"),
                                            (16, 192, 2048, "H=16 192 tokens"), (16, 128, 2048, "H=16 128 tokens"),
                                            (16, 64, 2048, "H=16 64 x 1"), (5, 70, 2000, "H=5 70 x 2000 (edges)")):
            if QUICK and tokens in (512, 64):
                continue
            gen = torch.Generator(device="cuda").manual_seed(heads * 1000 + tokens)
            slots = torch.randint(0, pool_slots, (tokens, width), device="cuda", dtype=torch.int32, generator=gen)
            slots[:, -7:] = -1
            if width != 2048:  # skipped and out-of-range slots, a row with none valid
                slots[:, ::13] = -1
                slots[1, :300] = pool_slots + 3
                slots[-1] = -1
            q = torch.randn(tokens, heads, 576, device="cuda", generator=gen).to(torch.bfloat16)
            for kind, kw in launches_of(tokens, edges=width != 2048).items():
                call = (lambda q=q, s=slots, p=pages, f=fmt, k=scale, kw=kw: launch(q, p, s, f, k, 192**-0.5, kw=kw))
                out.append((f"{fmt} {label} {kind}", call, width == 2048))
    return out


def _launches(torch, fixed_of, base):
    """``launches_of`` for :func:`wgmma_cases`: the fixed splits default mode takes without a device
    (``fixed_of(tokens)``), and ``base`` on the balanced schedule at two programs a SM (the edge case: also on 7
    programs, each meeting many rows)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def launches(tokens, edges):
        balanced = dict(base, programs=2 * sms)
        out = {"fixed": fixed_of(tokens), "balanced": balanced}
        if edges:
            out["balanced 7 programs"] = dict(balanced, programs=7)
        return out
    return launches


def sparse_mla_fp4_cases(torch):
    """The NVFP4 launch (``ops.sparse_mla_wgmma_fp4``) on :func:`wgmma_cases`' cases (balanced: its 3-stage launch)."""
    from dsahal.backends.nvidia import config, ops

    return wgmma_cases(torch, "sparse_mla_wgmma_fp4", _launches(torch, ops.wgmma_fp4_launch, config.WGMMA_NVFP4),
                       ("nvfp4",))


def sparse_mla_fp8_cases(torch):
    """The fp8_ds_mla and per-tensor FP8 launch (``ops.sparse_mla_wgmma``) on :func:`wgmma_cases`' cases."""
    from dsahal.backends.nvidia import config, ops

    return wgmma_cases(torch, "sparse_mla_wgmma", _launches(torch, ops.wgmma_launch, config.WGMMA_FEW_HEADS),
                       ("fp8_ds_mla",) if QUICK else ("fp8_ds_mla", "fp8"))


FAMILIES = {"indexer_gluon": indexer_cases, "sparse_mla_wgmma_fp4": sparse_mla_fp4_cases,
            "sparse_mla_wgmma": sparse_mla_fp8_cases}


QUICK = False  # --quick: the wgmma families at 64 x 5, 192 and 128 tokens and the edge case, fp8_ds_mla and NVFP4


def main(argv=None) -> int:
    global QUICK
    names = list(sys.argv[1:] if argv is None else argv)
    QUICK = "--quick" in names
    names = [name for name in names if name != "--quick"] or list(FAMILIES)
    torch, _, started, _ = start("module_ab", "cuda")
    failures = []
    rows = ["| module | case | copy ms | module ms | copy / module |", "| --- | --- | ---: | ---: | ---: |"]
    for name in names:
        if name not in FAMILIES:
            failures.append(f"{name}: no cases (known: {', '.join(FAMILIES)})")
            continue
        try:
            baseline = importlib.import_module(f"{PACKAGE}._baseline_{name}")
        except ImportError as exc:
            print(f"{name}: no frozen copy ({exc}); skipped", flush=True)
            continue
        for label, call, timed in FAMILIES[name](torch):
            with swapped(name, baseline):
                want = call()
            got = call()
            torch.cuda.synchronize()
            same = same_bits(torch, got, want)
            print(f"{name} {label}: {'the same bits' if same else 'FAIL: the outputs differ from the copy'}",
                  flush=True)
            if not same:
                failures.append(f"{name} {label}: the outputs differ from the frozen copy's")
                continue
            if not timed:
                continue
            with swapped(name, baseline):  # (captured with the copy's launch: replays run it)
                copy_graph = timing.captured(torch, call)
            graph = timing.captured(torch, call)
            before = [timing.bench_ms(copy_graph.replay, "cuda")]
            after = [timing.bench_ms(graph.replay, "cuda"), timing.bench_ms(graph.replay, "cuda")]
            before.append(timing.bench_ms(copy_graph.replay, "cuda"))
            b, a = sum(before) / 2, sum(after) / 2
            rows.append(f"| {name} | {label} | {b:.4f} | {a:.4f} | {b / a:.3f} |")
    print("\n".join(rows))
    return finish("module_ab", failures, started)


if __name__ == "__main__":
    run("module_ab", main)
