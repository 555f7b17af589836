"""Where the start of ``dsahal run`` goes before its first kernel: each step once, in one fresh process, in
the order a run meets them (so every step's time excludes what the earlier steps already loaded).

Usage (a fresh process on the H200; nothing else timed in it)::

    python3 scripts/h200/startup_profile.py [--config k31-pro-slice]

Prints one table: step, seconds, cumulative seconds. The steps: ``import torch``; CUDA initialisation (the
first ``torch.cuda`` call that creates a context); ``import triton``; ``import dsahal``; the registry's
backend discovery and route resolution (``active_table()``: every plugin's probe and route imports, fla and
FlashMLA among them), then each probe and route import again timed alone where the registry exposes them;
the model built on the meta device; the run's memory estimate.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time

ROWS: list[tuple[str, float]] = []
START = time.perf_counter()


def timed(name: str, fn):
    began = time.perf_counter()
    value = fn()
    ROWS.append((name, time.perf_counter() - began))
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="k31-pro-slice")
    parser.add_argument("--backend", default="nvidia")
    args = parser.parse_args(argv)
    torch = timed("import torch", lambda: importlib.import_module("torch"))
    timed("CUDA context (torch.cuda.init + first tensor)", lambda: torch.ones(1, device="cuda").sum().item())
    timed("import triton", lambda: importlib.import_module("triton"))
    timed("import fla.ops.kda", lambda: importlib.import_module("fla.ops.kda"))
    timed("import flash_mla", lambda: importlib.import_module("flash_mla"))
    dsahal = timed("import dsahal (+ dsahal.cli)", lambda: (importlib.import_module("dsahal.cli"),
                                                             importlib.import_module("dsahal"))[1])
    table = timed(f"registry: set_backend({args.backend!r}) (discovery, probes, route imports)",
                  lambda: (dsahal.registry.set_backend(args.backend), dsahal.registry.active_table())[1])
    from dsahal.config import load_config
    from dsahal.model import HybridModel

    config = load_config(args.config)

    def meta_model():
        with torch.device("meta"):
            return HybridModel(config).to(torch.bfloat16)

    timed(f"model {args.config} on the meta device", meta_model)
    timed("model again (what the first build imported is loaded)", meta_model)
    total = time.perf_counter() - START
    print(f"backend table: {table.name}")
    print("| step | s | cumulative s |\n|---|---:|---:|")
    running = 0.0
    for name, seconds in ROWS:
        running += seconds
        print(f"| {name} | {seconds:.2f} | {running:.2f} |")
    print(f"| (whole script, incl. its own imports) | | {total:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
