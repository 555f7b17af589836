"""Alibaba T-HEAD PPU backend plugin (Zhenwu M890, 810E). Never run on PPU hardware.

The PPU presents itself to torch as a CUDA device, so this backend has its own probe
(:mod:`.detect`), shared with the ``nvidia`` backend's so exactly one of them claims a device.
Each op runs a shared Triton kernel (:mod:`dsahal.backends.triton_kernels`) when :mod:`.routes`
says the PPU's toolchain takes the call (no FP8 involved), and the portable torch formulation of
this folder otherwise (batched fp32 tensor code that any torch device runs). cache_write and the
collectives stay on the reference, which is already batched torch (pack + scatter) and
``torch.distributed``.
"""
from __future__ import annotations

from dsahal.backends.triton_kernels.compile_budget import install as install_compile_budget
from dsahal.registry import Backend, Capabilities, Route, hookimpl, package_versions

from dsahal.backends.cuda_device import classify_cuda_device, cuda_device_name, ppu_evidence

PACKAGE = "dsahal.backends.ppu"
NEVER_RUN = "never run on PPU hardware; checked on the CPU only"

PORTABLE = {"indexer_score": "portable_index", "topk": "portable_index", "positions_to_slots": "portable_index",
            "sparse_mla": "portable_attention", "lse_combine": "portable_attention", "kda_decode": "portable_kda"}
PORTABLE_LIMITS = {"topk": f"{PACKAGE}.verifiers:portable_topk", "sparse_mla": f"{PACKAGE}.verifiers:portable_sparse_mla"}


def routes() -> dict[str, list[Route]]:
    """Per op: the shared Triton kernel when the PPU's toolchain takes the call (no FP8), else the
    portable torch formulation. kda_prefill is portable only."""
    declared = {
        op: [Route("triton", f"{PACKAGE}.ops:{op}", f"{PACKAGE}.routes:takes_{op}",
                   probe=f"{PACKAGE}.routes:triton_enabled", description="shared Triton kernel, no FP8"),
             Route("portable", f"{PACKAGE}.{module}:{op}", PORTABLE_LIMITS.get(op),
                   description="batched fp32 torch")]
        for op, module in PORTABLE.items()
    }
    declared["kda_prefill"] = [Route("portable", f"{PACKAGE}.portable_kda:kda_prefill",
                                     description="batched fp32 torch, chunk by chunk")]
    for collective in ("all_gather", "all_to_all"):  # plain torch.distributed calls, whatever the device
        declared[collective] = [Route("torch_distributed", f"dsahal.reference.collectives:{collective}",
                                      description="torch.distributed (the PPU's collective library behind it)")]
    declared["topk_merge"] = [Route("exact_merge", "dsahal.distributed.merge:exact_topk_merge",
                                    description="packed 32-bit exact DCP merge over torch.distributed")]
    return declared


OPS = tuple(PORTABLE) + ("kda_prefill", "topk_merge", "all_gather", "all_to_all")
TAGS = frozenset({"gpu", "cuda", "ppu"})


def probe() -> tuple[bool, str]:
    """Available when torch sees a CUDA device and :func:`.detect.classify_cuda_device` calls it a PPU."""
    import torch

    if torch.version.hip is not None:
        return False, f"torch is a ROCm build (hip {torch.version.hip}); the PPU needs a CUDA-compatible torch"
    if not torch.cuda.is_available():
        evidence = ppu_evidence()
        hint = f" ({'; '.join(evidence)} found)" if evidence else ""
        return False, f"no CUDA-compatible device visible to torch{hint}"
    verdict = classify_cuda_device(device_name=cuda_device_name())
    if not verdict.is_ppu:
        return False, f"the CUDA device is not a PPU: {verdict.reason()}"
    return True, verdict.reason()


def versions() -> dict[str, str]:
    import os
    import shutil
    found = package_versions("torch", "triton")
    found["PPU_SDK"] = os.environ.get("PPU_SDK", "unset")
    found["ppu-smi"] = shutil.which("ppu-smi") or "not found"
    return found


def ppu_backend() -> Backend:
    install_compile_budget()  # only under DSAHAL_TRITON_COMPILE_BUDGET (the conformance suite)
    return Backend(
        name="ppu",
        ops=routes(),
        tags=TAGS,
        priority=110,
        probe=probe,
        versions=versions,
        # Not claimed: batch invariance (torch's GPU matmuls pick split sizes by shape) and any
        # format limit (the portable ops read every format through its own unpack).
        capabilities=Capabilities(deterministic=True, batch_invariant=False, distributed=True,
                                  unverified={op: NEVER_RUN for op in OPS}),
        description="shared Triton kernels for non-FP8 calls, portable batched torch otherwise",
    )


@hookimpl
def dsahal_backends():
    return [ppu_backend()]
