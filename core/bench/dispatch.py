"""What one op call costs in each layer above its kernel: the dispatch bench.

A tiny ``lse_combine`` (``[2, 4, 16, 512]``: the GPU work is a few microseconds, so host time is what
is measured) is called through each layer in turn, and each layer's median per-call host time printed:

- ``dsahal.ops.lse_combine(...)``: validated;
- ``dsahal.ops.lse_combine(..., check=False)``;
- ``torch.ops.dsahal.lse_combine(...)``: the custom op (what tracers see);
- ``active_table().dispatch["lse_combine"](...)``: the table's route choice;
- the chosen route's function itself;
- the bare kernel launch with its outputs allocated per call, then with them preallocated, where the
  route offers one (``prepare_bare_launch``: Triton's own ``kernel[grid](...)``), then the same launch
  through the route's launch path (the Triton routes' launch cache,
  :mod:`dsahal.kernel_launch`);
- ``torch.empty_like``: one plain torch op, for scale.

Calls are timed in batches with a host clock and the device synchronised after each batch (so a full
launch queue cannot hide host time), one batch of every layer per round (so drift in the host's speed
shifts all layers alike), the median of the rounds reported. ``python -m dsahal.bench.dispatch`` prints the table; it runs on
the CPU too (the reference backend: no kernel layer).
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Callable, Optional

import torch

SHAPE = (2, 4, 16, 512)  # W, T, H, D: a few microseconds of GPU work
CPU_SHAPE = (2, 1, 2, 16)  # on the CPU the reference computes in float64: keep its compute negligible


def _per_call_us(fns: list[Callable[[], object]], device: torch.device, calls: int, repeats: int) -> list[float]:
    """Median per-call host time of each of ``fns``, the layers' batches interleaved (one batch of each
    layer per round): a host whose speed drifts during the run (clocks, a neighbour's load) shifts every
    layer alike instead of whichever layer it happened to be measuring."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for fn in fns:
        for _ in range(max(calls // 10, 5)):
            fn()
    sync()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, samples):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            out.append((time.perf_counter() - start) / calls * 1e6)
    return [statistics.median(out) for out in samples]


def _bare_launch(route_fn, o_parts, lse_parts, **how) -> Optional[Callable[[], object]]:
    """The route's bare kernel launch, where the route offers one: a route function may carry
    ``prepare_bare_launch(*args, allocate=False, cached=False) -> launch()`` (Triton's own
    ``kernel[grid](...)`` with every output preallocated; ``allocate=True``: outputs allocated per launch
    as the route does; ``cached=True``: the route's own launch path, the package's launch cache). Routes
    without it are left out of those layers, never guessed."""
    prepare = getattr(route_fn, "prepare_bare_launch", None)
    return None if prepare is None else prepare(o_parts, lse_parts, **how)


def measure(device: torch.device, *, calls: int = 500, repeats: int = 21, shape=None) -> list[dict]:
    """One row per layer: ``{"layer", "us", "over_route_us"}`` for the active backend on ``device``."""
    from dsahal import ops
    from dsahal.registry import active_table

    shape = shape or (SHAPE if device.type == "cuda" else CPU_SHAPE)
    gen = torch.Generator(device="cpu").manual_seed(0)
    o_parts = torch.randn(shape, generator=gen).to(device)
    lse_parts = torch.randn(shape[:3], generator=gen).to(device)
    table = active_table()
    route_name, _ = table.choose("lse_combine", o_parts, lse_parts)
    entry = table.entries["lse_combine"]
    route_fn = table.reference["lse_combine"] if route_name in (None, "reference") else \
        next(r.fn for r in entry.active if r.name == route_name)
    dispatch = table.dispatch["lse_combine"]
    layers: list[tuple[str, Callable[[], object]]] = [
        ("dsahal.ops.lse_combine (validated)", lambda: ops.lse_combine(o_parts, lse_parts)),
        ("dsahal.ops.lse_combine(check=False)", lambda: ops.lse_combine(o_parts, lse_parts, check=False)),
        ("torch.ops.dsahal.lse_combine", lambda: torch.ops.dsahal.lse_combine(o_parts, lse_parts)),
        ("active_table().dispatch[op]", lambda: dispatch(o_parts, lse_parts)),
        (f"route {route_name or 'reference'!r} function", lambda: route_fn(o_parts, lse_parts)),
    ]
    bare = _bare_launch(route_fn, o_parts, lse_parts)
    if bare is not None:
        # The route's cost over the bare launch is its output allocation (which the bare layer does
        # once, up front) plus its own Python: the middle layer tells the two apart.
        layers.append(("bare launch + output allocation", _bare_launch(route_fn, o_parts, lse_parts, allocate=True)))
        layers.append(("bare kernel[grid](...) launch", bare))
        layers.append(("the route's cached launch, no allocation", _bare_launch(route_fn, o_parts, lse_parts,
                                                                               cached=True)))
    layers.append(("torch.empty_like (a plain torch op)", lambda: torch.empty_like(o_parts)))
    times = _per_call_us([fn for _, fn in layers], device, calls, repeats)
    rows = [{"layer": name, "us": us, "shape": list(shape)} for (name, _), us in zip(layers, times)]
    route_us = next(r["us"] for r in rows if r["layer"].startswith("route "))
    for row in rows:
        row["over_route_us"] = row["us"] - route_us
    return rows


def print_table(rows: list[dict], backend: str, device: torch.device, out=sys.stdout) -> None:
    print(f"dispatch cost per call, lse_combine {rows[0]['shape']}, backend {backend!r} on {device} "
          f"(host time, median of batches; observer off)", file=out)
    print(f"| {'layer':<40} | {'µs/call':>8} | {'vs route fn':>11} |", file=out)
    print(f"| {'-' * 40} | {'-' * 8}: | {'-' * 10}: |", file=out)
    for row in rows:
        print(f"| {row['layer']:<40} | {row['us']:>8.2f} | {row['over_route_us']:>+11.2f} |", file=out)


def main(argv=None) -> int:
    import argparse

    from dsahal.registry import active_table

    parser = argparse.ArgumentParser(prog="python -m dsahal.bench.dispatch", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--calls", type=int, default=500, help="calls per batch (21 rounds)")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = measure(device, calls=args.calls)
    print_table(rows, active_table().name, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
