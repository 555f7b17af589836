"""Where the host time of an eager k31-pro-slice decode step goes: cProfile over eager steps.

Usage (from the repository root, dsahal importable)::

    python3 scripts/h200/step_profile.py [--requests 64] [--context 4096] [--steps 20] [--unfused] [--cpu-smoke]

The step is the bench's (:func:`dsahal.bench.model_step.decode_setup`, every op with ``check=False``), the
model's fused glue on (``fused.enable_by_default``) unless ``--unfused``. Three warm-up steps (compiles), then
the timed steps with and without cProfile (the profiler's own cost shows as the difference), then the top
functions by own time and by cumulative time. ``--cpu-smoke``: the ``tiny`` config on the CPU, 2 steps (proves
the script runs; the numbers mean nothing there).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--unfused", action="store_true")
    parser.add_argument("--cpu-smoke", action="store_true")
    args = parser.parse_args(argv)
    from dsahal.bench.model_step import decode_setup
    from dsahal.config import load_config
    from dsahal.model import fused

    device = "cpu" if args.cpu_smoke else "cuda"
    name = "tiny" if args.cpu_smoke else "k31-pro-slice"
    requests, context, steps = (2, 32, 2) if args.cpu_smoke else (args.requests, args.context, args.steps)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fused.enable_by_default(not args.unfused)
    setup = decode_setup(load_config(name), [context] * requests, device)
    with torch.inference_mode():
        for _ in range(3):
            setup.step()
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            setup.step()
        sync()
        plain = (time.perf_counter() - start) / steps
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        for _ in range(steps):
            setup.step()
        sync()
        profile.disable()
        profiled = (time.perf_counter() - start) / steps
    print(f"{name}, {requests} requests at {context}, fused glue {'off' if args.unfused else 'on'}: eager step "
          f"{plain * 1e3:.3f} ms, under cProfile {profiled * 1e3:.3f} ms ({steps} steps)")
    for key, count in (("tottime", 45), ("cumtime", 45)):
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text).strip_dirs().sort_stats(key)
        stats.print_stats(count)
        print(f"--- by {key} (per step: divide by {steps})")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-12000:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
