"""Forwarding a module that moved: ``dsahal.bench.aot`` and ``dsahal.bench.tune`` are NVIDIA/Triton tools now
in ``dsahal.backends.nvidia``, and the core imports no backend, so the old names forward by string, with a
deprecation warning, when an attribute is read or the old module is run with ``python -m``."""
from __future__ import annotations

import importlib
import runpy
import sys
import warnings
from typing import Callable


def forwarder(old: str, new: str) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``old`` that resolves names in ``new``."""

    def __getattr__(name: str):
        if name.startswith("__"):  # the import system's and tools' probes: not forwarded
            raise AttributeError(name)
        warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__


def run_moved(old: str, new: str) -> None:
    """``python -m old``: say where it went, then run ``new`` as ``__main__``."""
    print(f"note: python -m {old} is deprecated; use python -m {new}", file=sys.stderr)
    runpy.run_module(new, run_name="__main__", alter_sys=True)
