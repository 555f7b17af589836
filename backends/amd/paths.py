"""The AMD backend's fast paths, and whether each can run here (and why not).

A path is one vendor kernel behind one op (AITER's sparse MLA decode, FlyDSL's FP4 indexer...).
Presence is decided without importing AITER or FlyDSL: ``amd-aiter`` raises at import time on
a machine without ROCm, and on ROCm its import is heavy. We read the installed distributions'
metadata, torch's build, and the GPU architecture; the kernels themselves are imported only when
an op of the selected backend first runs.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import torch

from .arch import rocm_arch

AITER_DIST = "amd-aiter"
FLYDSL_DIST = "flydsl"

# Every vendor path carries this until someone runs it on an MI300/MI355: it is in
# Capabilities.unverified and in the conformance report, whether or not the path is present here.
NEVER_RUN_ON_ROCM = "never run on ROCm hardware"
MARSHALLING_CHECKED = ("marshalling checked on the CPU: our layouts converted, a plain-torch emulation of the "
                       "kernel's documented ABI, result compared with the reference")


@dataclass(frozen=True)
class FastPath:
    """One vendor kernel the backend can route an op to.

    Attributes:
        name: ``"<library>.<what>"``, as printed by ``dsahal backends``.
        op: the dsahal op it serves.
        distributions: the pip distributions it imports.
        archs: gfx targets it runs on.
        api: the vendor entry point (module:function), for messages and reports.
        cpu_check: what has been checked without the hardware.
    """

    name: str
    op: str
    distributions: tuple[str, ...]
    archs: frozenset[str]
    api: str
    cpu_check: str = MARSHALLING_CHECKED


CDNA3_4 = frozenset({"gfx942", "gfx950"})
CDNA4 = frozenset({"gfx950"})

FAST_PATHS: tuple[FastPath, ...] = (
    FastPath("aiter.sparse_mla", "sparse_mla", (AITER_DIST,), CDNA3_4, "aiter.mla:mla_decode_fwd"),
    FastPath("aiter.indexer_fp8", "indexer_score", (AITER_DIST,), CDNA3_4,
             "aiter.ops.triton.attention.pa_mqa_logits:deepgemm_fp8_paged_mqa_logits"),
    FastPath("aiter.topk", "topk", (AITER_DIST,), CDNA3_4, "aiter.ops.topk:top_k_per_row_prefill"),
    FastPath("aiter.all_gather", "all_gather", (AITER_DIST,), CDNA3_4,
             "aiter.dist.device_communicators.custom_all_reduce:CustomAllreduce",
             "not checkable without GPUs (HIP IPC between peers); RCCL is used whenever AITER declines a tensor"),
    FastPath("flydsl.sparse_mla", "sparse_mla", (AITER_DIST, FLYDSL_DIST), CDNA4,
             "aiter.ops.flydsl:flydsl_sparse_mla_decode"),
    FastPath("flydsl.indexer_mxfp4", "indexer_score", (AITER_DIST, FLYDSL_DIST), CDNA4,
             "aiter.ops.flydsl:flydsl_pa_mqa_logits_fp4"),
)
PATHS_BY_NAME = {path.name: path for path in FAST_PATHS}


def distribution_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def path_presence(path: FastPath, gfx: str | None = None, *, detect: bool = True) -> tuple[bool, str]:
    """``(present, reason)`` for one fast path on this machine.

    ``gfx`` overrides the detected architecture (tests, reports for another machine); with
    ``detect=False`` and no ``gfx`` the architecture counts as unknown.
    """
    missing = [d for d in path.distributions if distribution_version(d) is None]
    if missing:
        return False, f"{' and '.join(missing)} not installed; pip install 'dsahal[amd]'"
    if gfx is None and detect:
        if torch.version.hip is None:
            return False, f"installed, but torch {torch.__version__} is not a ROCm build"
        gfx = rocm_arch()
    if gfx is None:
        return False, "installed, but no ROCm GPU is visible"
    if gfx not in path.archs:
        return False, f"installed, but {gfx} is not one of {sorted(path.archs)}"
    return True, f"present on {gfx} ({path.api})"


def triton_presence() -> tuple[bool, str]:
    """The shared Triton kernels: the fallback path for every op the vendor kernels do not take."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    if importlib.util.find_spec("dsahal.backends.triton_kernels") is None:
        return False, "dsahal.backends.triton_kernels is not in this build"
    return True, "shared Triton kernels (AMD block sizes)"


def presence_report(gfx: str | None = None, *, detect: bool = True) -> dict[str, tuple[bool, str]]:
    """``{path name: (present, reason)}`` for the Triton path and every vendor path."""
    report = {"triton": triton_presence()}
    for path in FAST_PATHS:
        report[path.name] = path_presence(path, gfx, detect=detect)
    return report
