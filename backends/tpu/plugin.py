"""Google TPU backend plugin (torch-xla): declaration and probe only.

The probe never initialises libtpu: it only looks for torch_xla and for an explicit
``PJRT_DEVICE`` (``TPU`` on a TPU VM, ``CPU`` for XLA's CPU client in CI)."""
from __future__ import annotations

import importlib.util
import os

from dsahal.registry import Backend, Capabilities, hookimpl


def probe() -> tuple[bool, str]:
    if importlib.util.find_spec("torch_xla") is None:
        return False, "torch_xla is not installed (pip install 'dsahal[tpu]')"
    device = os.environ.get("PJRT_DEVICE")
    if not device:
        return False, "torch_xla is installed but PJRT_DEVICE is not set (TPU, or CPU for XLA's CPU client)"
    return True, f"torch_xla with PJRT_DEVICE={device}"


def tpu_backend() -> Backend:
    return Backend(
        name="tpu",
        ops={},
        tags=frozenset({"tpu", "xla"}),
        priority=90,
        probe=probe,
        capabilities=Capabilities(),
        description="XLA formulations: padded buckets, dense matmuls, XLA TopK, chunked KDA",
    )


@hookimpl
def dsahal_backends():
    return [tpu_backend()]
