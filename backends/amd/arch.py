"""What the AMD backend needs to know about the GPU: its gfx architecture and the facts that
follow from it (FP8 flavour, native FP4 matrix instructions, wavefront width).

Nothing here touches a device unless torch is a ROCm build that sees one, so it is safe to
call from a probe on any machine.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

WAVEFRONT = 64  # CDNA executes 64 lanes per wavefront (NVIDIA warps are 32)


@dataclass(frozen=True)
class ArchFacts:
    """What one CDNA generation offers the kernels.

    Attributes:
        gfx: LLVM target name (``"gfx942"``).
        product: marketing names, for messages.
        fp8_dtype: the FP8 e4m3 flavour its matrix cores read. gfx942 reads ``float8_e4m3fnuz``
            (bias 8, no -0, max 240); gfx950 reads OCP ``float8_e4m3fn`` (bias 7, max 448),
            the flavour dsahal's caches store.
        native_fp4: has MFMA instructions on e2m1 (MXFP4) operands with E8M0 block scales.
        lds_bytes: local data share per compute unit.
    """

    gfx: str
    product: str
    fp8_dtype: torch.dtype
    native_fp4: bool
    lds_bytes: int


ARCHS: dict[str, ArchFacts] = {
    "gfx942": ArchFacts("gfx942", "MI300X / MI300A / MI325X", torch.float8_e4m3fnuz, False, 64 * 1024),
    "gfx950": ArchFacts("gfx950", "MI350X / MI355X", torch.float8_e4m3fn, True, 160 * 1024),
}


def parse_gcn_arch(gcn_arch_name: str) -> str:
    """``"gfx942:sramecc+:xnack-"`` -> ``"gfx942"`` (the target features are irrelevant here)."""
    if not isinstance(gcn_arch_name, str) or not gcn_arch_name.startswith("gfx"):
        raise ValueError(f"dsahal.amd: expected a gcnArchName like 'gfx942:sramecc+:xnack-', got {gcn_arch_name!r}")
    return gcn_arch_name.split(":", 1)[0]


def rocm_arch(device: int | torch.device = 0) -> str | None:
    """The gfx target of a ROCm device, or None when torch is not ROCm or sees no GPU."""
    if torch.version.hip is None or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    return parse_gcn_arch(getattr(props, "gcnArchName", "") or "unknown")


def arch_facts(gfx: str | None) -> ArchFacts | None:
    """The facts of a supported architecture, None for any other (e.g. gfx90a, gfx1100)."""
    return ARCHS.get(gfx) if gfx else None


@functools.lru_cache(maxsize=None)
def _gfx_of_device(device_index: int) -> str | None:
    return rocm_arch(device_index)


def gfx_of(tensor: torch.Tensor) -> str | None:
    """The gfx target of the device a tensor lives on; None off ROCm (CPU, or a CUDA device)."""
    if tensor.device.type != "cuda" or torch.version.hip is None:
        return None
    index = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    return _gfx_of_device(index)
