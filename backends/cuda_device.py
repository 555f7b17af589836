"""Is this CUDA device an Alibaba T-HEAD PPU?

The PPU presents itself to torch as a CUDA device, so neither the ``nvidia`` nor the ``ppu``
backend can tell from ``torch.cuda.is_available()`` alone which hardware it is on. Both probes
ask :func:`classify_cuda_device` (through :func:`ppu_evidence`), so they can never both claim
the same device. The inputs are the ``PPU_SDK`` environment variable, the ``ppu-smi`` tool and
torch's device name; each is injectable so tests fake the *inputs*, never the verdict.

Decision, strongest signal first:

1. the device name carries a PPU marker (``ppu``, ``t-head``, ``zhenwu``)  -> PPU;
2. the device name carries an NVIDIA marker (``NVIDIA H200``, ``Tesla T4``...) -> not a PPU,
   whatever the environment says (an NVIDIA box with the PPU SDK installed stays NVIDIA);
3. any other name (or none) with ``PPU_SDK`` set or ``ppu-smi`` on PATH      -> PPU;
4. otherwise                                                                 -> not a PPU.

The tool is looked up, never run: the probe stays cheap and free of side effects.
None of this has been checked against a real PPU: the name markers are assumptions taken from
the vendor's product names (Zhenwu M890, 810E), stated here so a PPU owner can correct them.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

PPU_NAME_MARKERS = ("ppu", "t-head", "zhenwu")
NVIDIA_NAME_MARKERS = ("nvidia", "geforce", "tesla", "quadro", "titan")
PPU_SMI = "ppu-smi"


@dataclass(frozen=True)
class DeviceVerdict:
    """What :func:`classify_cuda_device` concluded and why.

    ``is_ppu``: the CUDA device is a PPU. ``evidence``: the signs that decided it, readable.
    ``ignored``: PPU signs overruled by an NVIDIA device name (reported, so a stray ``PPU_SDK``
    on an NVIDIA machine is visible in ``dsahal backends`` instead of silently deciding).
    """

    is_ppu: bool
    evidence: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()

    def reason(self) -> str:
        text = "; ".join(self.evidence) if self.evidence else "no sign of a PPU (no PPU_SDK, no ppu-smi)"
        if self.ignored:
            text += f" (ignored: {'; '.join(self.ignored)})"
        return text


def _has_marker(name: Optional[str], markers: Sequence[str]) -> bool:
    return bool(name) and any(marker in name.lower() for marker in markers)


def classify_cuda_device(
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], Optional[str]] = shutil.which,
    device_name: Optional[str] = None,
) -> DeviceVerdict:
    """Classify the CUDA device torch sees.

    Args:
        environ: the environment to read ``PPU_SDK`` from (default ``os.environ``).
        which: finds an executable on PATH (default ``shutil.which``).
        device_name: torch's name for CUDA device 0 (:func:`cuda_device_name`), None if unknown.
    """
    environ = os.environ if environ is None else environ
    if _has_marker(device_name, PPU_NAME_MARKERS):
        return DeviceVerdict(True, (f"device name {device_name!r}",))
    signs = []
    sdk = environ.get("PPU_SDK")
    if sdk:
        signs.append(f"PPU_SDK={sdk}")
    tool = which(PPU_SMI)
    if tool:
        signs.append(f"{PPU_SMI} at {tool}")
    if _has_marker(device_name, NVIDIA_NAME_MARKERS):
        return DeviceVerdict(False, (f"device name {device_name!r} is NVIDIA",), tuple(signs))
    return DeviceVerdict(bool(signs), tuple(signs))


def ppu_evidence(
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], Optional[str]] = shutil.which,
    device_name: Optional[str] = None,
) -> list[str]:
    """The signs that the CUDA device is a PPU; empty when it is not one (see the module doc).

    The ``nvidia`` backend's probe refuses the device when this is non-empty; the ``ppu``
    backend's probe claims it exactly then, so the two never claim the same device.
    """
    verdict = classify_cuda_device(environ, which, device_name)
    return list(verdict.evidence) if verdict.is_ppu else []


def cuda_device_name() -> Optional[str]:
    """Name of CUDA device 0, or None when torch sees no CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)
