"""Import fla-core for KDA prefill without first-call autotuning.

fla's chunked KDA runs ~20 Triton kernels, most behind an autotuner that benchmarks every config on
its first call in each process (about 100 s on a fresh H200, measured 2026-12-01). fla can instead
read the best config per kernel from JSON files (``FLA_CACHE_MODE``, ``FLA_CONFIG_DIR``). This module
points fla at the configs measured on the H200 and shipped in ``fla_configs/<GPU>/`` before fla is
first imported, and routes every autotuned fla kernel through fla's config-reading autotuner while the
KDA modules load (the plain ``triton.autotune`` is restored right after, so nothing outside fla changes).

Rules: a user's own ``FLA_CACHE_MODE`` / ``FLA_CONFIG_DIR`` win; if fla was imported before dsahal,
nothing can be changed and fla autotunes as usual; on a GPU without shipped configs fla autotunes
as usual. ``FULL`` mode: exact key, then the nearest key with the same structure, then the kernel's
default (the config measured at the largest shape), so no shape triggers a benchmark.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

CONFIG_ROOT = Path(__file__).with_name("fla_configs")


def config_dir_for(gpu_name: str) -> Path:
    """``fla_configs/<GPU>``, the GPU name sanitised as fla does (``NVIDIA H200`` -> ``NVIDIA_H200``)."""
    return CONFIG_ROOT / (re.sub(r"[^0-9A-Za-z]+", "_", gpu_name).strip("_") or "unknown_gpu")


def shipped_configs() -> Path | None:
    """The shipped config directory for GPU 0, or None (no configs measured for this GPU)."""
    import torch

    if not torch.cuda.is_available():
        return None
    folder = config_dir_for(torch.cuda.get_device_name(0))
    return folder if folder.is_dir() and any(folder.glob("*.json")) else None


def import_chunk_kda():
    """``fla.ops.kda.chunk_kda``, imported with the shipped configs in force where that is possible."""
    if "fla.ops.kda" in sys.modules or "fla.ops.utils.cache" in sys.modules:
        from fla.ops.kda import chunk_kda  # already imported (by the user or earlier): as it is

        return chunk_kda
    folder = shipped_configs()
    if folder is not None and "FLA_CACHE_MODE" not in os.environ and "FLA_CONFIG_DIR" not in os.environ:
        os.environ["FLA_CACHE_MODE"] = "full"
        os.environ["FLA_CONFIG_DIR"] = str(folder)
    import triton

    from fla.ops.utils import cache

    original = triton.autotune
    triton.autotune = cache.fla_cache_autotune  # kernels defined while fla.ops.kda loads read the configs
    try:
        from fla.ops.kda import chunk_kda
    finally:
        triton.autotune = original
    return chunk_kda


def status() -> str:
    """One line for reports: where fla's configs come from in this process."""
    mode, folder = os.environ.get("FLA_CACHE_MODE"), os.environ.get("FLA_CONFIG_DIR")
    if mode and folder:
        return f"fla configs: {mode} from {folder}"
    if "fla.ops.kda" not in sys.modules:
        shipped = shipped_configs()
        if shipped is not None:
            return f"fla configs: shipped for this GPU in {shipped} (read in full mode once fla imports)"
    return "fla configs: none shipped for this GPU (fla autotunes on first use)"
