"""Is this CUDA device an Alibaba T-HEAD PPU? The PPU presents itself to torch as a CUDA device,
so the NVIDIA backend asks this before claiming one. Inputs are the environment, the ``ppu-smi``
tool and the device name; each is injectable so tests can fake the *inputs* (never a result)."""
from __future__ import annotations

import os
import shutil
from typing import Callable, Mapping, Optional

PPU_NAME_MARKERS = ("ppu", "t-head", "zhenwu")


def ppu_evidence(
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], Optional[str]] = shutil.which,
    device_name: Optional[str] = None,
) -> list[str]:
    """Every sign of a PPU found, as human-readable strings (empty: no PPU)."""
    environ = os.environ if environ is None else environ
    evidence = []
    if environ.get("PPU_SDK"):
        evidence.append(f"PPU_SDK={environ['PPU_SDK']}")
    tool = which("ppu-smi")
    if tool:
        evidence.append(f"ppu-smi at {tool}")
    if device_name and any(marker in device_name.lower() for marker in PPU_NAME_MARKERS):
        evidence.append(f"device name {device_name!r}")
    return evidence


def cuda_device_name() -> Optional[str]:
    """Name of CUDA device 0, or None when torch sees no CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)
