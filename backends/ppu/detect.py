"""The PPU backend's device classification: the shared CUDA-device classifier (kept under this name for
existing imports; the classifier itself lives in :mod:`dsahal.backends.cuda_device`, which the ``nvidia``
backend's probe reads too, so exactly one of the two backends claims a device)."""
from dsahal.backends.cuda_device import (  # noqa: F401
    NVIDIA_NAME_MARKERS, PPU_NAME_MARKERS, PPU_SMI, classify_cuda_device, cuda_device_name, ppu_evidence,
)
