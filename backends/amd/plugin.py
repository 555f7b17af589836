"""AMD ROCm backend plugin: declaration and probe only."""
from __future__ import annotations

import importlib.util

from dsahal.registry import Backend, Capabilities, hookimpl


def probe() -> tuple[bool, str]:
    import torch

    if torch.version.hip is None:
        return False, f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None)"
    if not torch.cuda.is_available():
        return False, f"ROCm torch (hip {torch.version.hip}) sees no GPU"
    arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "unknown").split(":")[0]
    if importlib.util.find_spec("triton") is None:
        return False, f"{arch}: triton is not installed"
    return True, f"{torch.cuda.get_device_name(0)} ({arch})"


def amd_backend() -> Backend:
    return Backend(
        name="amd",
        ops={},
        tags=frozenset({"gpu", "rocm"}),
        priority=100,
        probe=probe,
        capabilities=Capabilities(),
        description="shared Triton kernels tuned for CDNA; AITER and FlyDSL where present",
    )


@hookimpl
def dsahal_backends():
    return [amd_backend()]
