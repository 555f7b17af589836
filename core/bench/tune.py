"""Deprecated: moved to :mod:`dsahal.backends.nvidia.tune` (the block-size sweep of the shared Triton kernels on a GPU).

It is an NVIDIA/Triton tool and the core imports no backend. ``python -m dsahal.bench.tune`` still
runs it and ``dsahal.bench.tune.<name>`` still resolves, each with a deprecation warning; the module
is named here only as a string, resolved when used.
"""
from __future__ import annotations

import importlib
import sys
import warnings

MOVED_TO = "dsahal.backends.nvidia.tune"


def __getattr__(name: str):
    if name.startswith("__"):  # the import system's and tools' probes: not forwarded
        raise AttributeError(name)
    warnings.warn(f"dsahal.bench.tune is deprecated: use {MOVED_TO}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(MOVED_TO), name)


if __name__ == "__main__":
    import runpy

    print(f"note: python -m dsahal.bench.tune is deprecated; use python -m {MOVED_TO}", file=sys.stderr)
    runpy.run_module(MOVED_TO, run_name="__main__", alter_sys=True)
