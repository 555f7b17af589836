"""How a test module runs Triton kernels under the interpreter: in a child process of itself.

``TRITON_INTERPRET=1`` must be set before triton is imported, and in the test process other modules
have already imported it, so each such module re-runs itself as a script with the variable set: the
child calls its case groups (:func:`run_groups`) and prints one JSON object of results; the module's
fixture (:func:`child_results`) reads it, and each test asserts one entry.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys


def run_groups(groups, *, keep: tuple = (str,), normalise: bool = True) -> dict:
    """Call each ``group(results)``; a group that raises is recorded as ``error_<name>`` (the tests then
    name what is missing). With ``normalise``, values not of a ``keep`` type become bools (JSON-safe)."""
    results: dict = {}
    for group in groups:
        try:
            group(results)
        except Exception as exc:  # noqa: BLE001 - reported per group, the tests name what is missing
            results[f"error_{group.__name__}"] = f"{type(exc).__name__}: {exc}"
    if not normalise:
        return results
    return {k: (v if isinstance(v, keep) else bool(v)) for k, v in results.items()}


def child_results(test_file: str, *, timeout: int = 600) -> dict:
    """Run ``test_file`` as a script under ``TRITON_INTERPRET=1``; its last stdout line, parsed. Fails on a
    non-zero exit or on any ``error_*`` entry (a group that raised)."""
    import pytest

    pytest.importorskip("triton")
    path = os.path.abspath(test_file)
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, path], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=os.path.dirname(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    errors = {k: v for k, v in results.items() if k.startswith("error_")}
    assert not errors, errors
    return results


@contextlib.contextmanager
def patched_empty(module, empty):
    """Inside the block, ``module.torch.empty`` (a kernel launcher's module) is ``empty``; every other name of
    ``module.torch`` is torch's own."""
    import torch

    class _Torch:
        def __getattr__(self, name):
            return getattr(torch, name)

    stand_in = _Torch()
    stand_in.empty = empty
    real = module.torch
    module.torch = stand_in
    try:
        yield
    finally:
        module.torch = real


def poisoned_empty(module):
    """``torch.empty`` inside ``module`` returns NaN-filled float tensors (others as they are): an output
    element the kernel does not write stays NaN and fails every comparison."""
    import torch

    def empty(*args, **kwargs):
        out = torch.empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    return patched_empty(module, empty)
