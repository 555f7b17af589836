"""Alibaba T-HEAD PPU backend plugin: declaration and probe only (never run on PPU hardware)."""
from __future__ import annotations

from dsahal.registry import Backend, Capabilities, hookimpl

from .detect import cuda_device_name, ppu_evidence


def probe() -> tuple[bool, str]:
    import torch

    if not torch.cuda.is_available():
        evidence = ppu_evidence()
        hint = f" ({'; '.join(evidence)} found)" if evidence else ""
        return False, f"no CUDA-compatible device visible to torch{hint}"
    evidence = ppu_evidence(device_name=cuda_device_name())
    if not evidence:
        return False, "the CUDA device shows no sign of a PPU (no PPU_SDK, no ppu-smi, device name not a PPU)"
    return True, "; ".join(evidence)


def ppu_backend() -> Backend:
    return Backend(
        name="ppu",
        ops={},
        tags=frozenset({"gpu", "cuda", "ppu"}),
        priority=110,
        probe=probe,
        capabilities=Capabilities(),
        description="CUDA-compatible Triton kernels where the PPU toolchain takes them, portable torch otherwise",
    )


@hookimpl
def dsahal_backends():
    return [ppu_backend()]
