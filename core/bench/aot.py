"""Deprecated: moved to :mod:`dsahal.backends.nvidia.aot` (the sm_90 ahead-of-time compile of the
NVIDIA backend's kernel variants).

It is an NVIDIA/Triton tool and the core imports no backend. ``python -m dsahal.bench.aot`` still
runs it and ``dsahal.bench.aot.<name>`` still resolves, each with a deprecation warning; the module
is named here only as a string, resolved when used.
"""
from __future__ import annotations

import importlib
import sys
import warnings

MOVED_TO = "dsahal.backends.nvidia.aot"


def __getattr__(name: str):
    if name.startswith("__"):  # the import system's and tools' probes: not forwarded
        raise AttributeError(name)
    warnings.warn(f"dsahal.bench.aot is deprecated: use {MOVED_TO}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(MOVED_TO), name)


if __name__ == "__main__":
    import runpy

    print(f"note: python -m dsahal.bench.aot is deprecated; use python -m {MOVED_TO}", file=sys.stderr)
    runpy.run_module(MOVED_TO, run_name="__main__", alter_sys=True)
