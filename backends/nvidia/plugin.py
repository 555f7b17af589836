"""NVIDIA CUDA backend plugin: declaration and probe; kernels are imported on selection.

Ops are the shared Triton kernels (:mod:`dsahal.backends.triton_kernels`) with this backend's block
sizes (:mod:`.config`), KDA prefill through fla-core's chunked kernel when installed, collectives
on NCCL. FlashInfer's sparse MLA (SM100 only) is not wired in: nothing here claims it.
"""
from __future__ import annotations

import importlib.util

from dsahal.registry import Backend, Capabilities, hookimpl, package_versions

MIN_CAPABILITY = (8, 0)
PACKAGE = "dsahal.backends.nvidia"

OPS = {
    "cache_write": f"{PACKAGE}.ops:cache_write",
    "indexer_score": f"{PACKAGE}.ops:indexer_score",
    "topk": f"{PACKAGE}.ops:topk",
    "topk_merge": f"{PACKAGE}.collectives:topk_merge",
    "positions_to_slots": f"{PACKAGE}.ops:positions_to_slots",
    "sparse_mla": f"{PACKAGE}.ops:sparse_mla",
    "lse_combine": f"{PACKAGE}.ops:lse_combine",
    "kda_decode": f"{PACKAGE}.ops:kda_decode",
    "kda_prefill": f"{PACKAGE}.ops:kda_prefill",
    "all_gather": f"{PACKAGE}.collectives:all_gather",
    "all_to_all": f"{PACKAGE}.collectives:all_to_all",
    "dsa_attention": f"{PACKAGE}.ops:dsa_attention",
}
VERIFIERS = {
    op: f"{PACKAGE}.verifiers:verify_{op}"
    for op in ("cache_write", "indexer_score", "topk", "positions_to_slots", "sparse_mla", "lse_combine",
               "kda_decode", "kda_prefill", "dsa_attention")
}
UNVERIFIED = {
    "topk_merge": "multi-GPU NCCL path not run (single-GPU machine)",
    "all_gather": "multi-GPU NCCL path not run (single-GPU machine)",
    "all_to_all": "multi-GPU NCCL path not run (single-GPU machine)",
}


def capabilities() -> Capabilities:
    """What the backend claims. Batch invariance only under ``DSAHAL_BATCH_INVARIANT=1`` (read when
    the backend is discovered): by default sparse MLA splits rows by the batch size for occupancy
    and KDA prefill uses fla's chunked kernel, whose tiles depend on the batch."""
    from .config import batch_invariant

    return Capabilities(
        latent_formats=frozenset({"bf16", "fp8", "fp8_ds_mla"}),
        index_formats=frozenset({"bf16", "fp8"}),
        deterministic=True,  # exact radix-select top-k (tie rule honoured), fixed reduction orders
        batch_invariant=batch_invariant(),
        distributed=True,
        unverified=dict(UNVERIFIED),
    )


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
    return package_versions("torch", "triton", "fla-core", "flashinfer-python")


def nvidia_backend() -> Backend:
    return Backend(
        name="nvidia",
        ops=dict(OPS),
        verifiers=dict(VERIFIERS),
        tags=frozenset({"gpu", "cuda"}),
        priority=100,
        probe=probe,
        versions=versions,
        capabilities=capabilities(),
        description="Triton kernels for Hopper and newer, fla-core KDA prefill",
    )


@hookimpl
def dsahal_backends():
    return [nvidia_backend()]
