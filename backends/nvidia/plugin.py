"""NVIDIA CUDA backend plugin: declaration and probe only; kernels are imported on selection."""
from __future__ import annotations

import importlib.util

from dsahal.registry import Backend, Capabilities, hookimpl

MIN_CAPABILITY = (8, 0)


def probe() -> tuple[bool, str]:
    import torch

    if torch.version.hip is not None:
        return False, f"torch is a ROCm build (hip {torch.version.hip}), not CUDA"
    if not torch.cuda.is_available():
        return False, f"no CUDA device visible to torch {torch.__version__}"
    from dsahal.backends.ppu.detect import cuda_device_name, ppu_evidence

    name = cuda_device_name()
    evidence = ppu_evidence(device_name=name)
    if evidence:
        return False, f"the CUDA device is a T-HEAD PPU ({'; '.join(evidence)}); use the 'ppu' backend"
    capability = torch.cuda.get_device_capability(0)
    if capability < MIN_CAPABILITY:
        return False, f"{name} is sm{capability[0]}{capability[1]}; the kernels need sm80 or newer"
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install 'dsahal[nvidia]')"
    return True, f"{name} (sm{capability[0]}{capability[1]})"


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "triton", "fla-core", "flashinfer-python"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def nvidia_backend() -> Backend:
    return Backend(
        name="nvidia",
        ops={},
        tags=frozenset({"gpu", "cuda"}),
        priority=100,
        probe=probe,
        versions=versions,
        capabilities=Capabilities(),
        description="Triton kernels for Hopper and newer, fla-core KDA, FlashInfer on SM100",
    )


@hookimpl
def dsahal_backends():
    return [nvidia_backend()]
