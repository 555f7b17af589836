"""AMD ROCm backend plugin (MI300-class gfx942, MI355X gfx950). Never run on ROCm hardware.

Every op is an ordered route list (:mod:`.routes`, one route per path); a call takes the first enabled path
that accepts its arguments: AITER's
kernels (sparse MLA decode, FP8 paged indexer logits, top-k, custom all-gather), FlyDSL's (sparse
MLA on fp8 latents, native-FP4 indexer on MXFP4 keys; gfx950), else the shared Triton kernels with
AMD block sizes (:mod:`.config`). The DCP top-k merge defaults to the score-only algorithm
(:mod:`.score_only_merge`; ``DSAHAL_AMD_TOPK_MERGE=packed`` picks the packed 32-bit one).

``DSAHAL_AMD_PATHS=triton`` restricts every op to the Triton kernels; with it the backend also
runs on a CUDA GPU, to verify the shared Triton source with the AMD block sizes on an NVIDIA
machine. That is reported as such and never as a ROCm run.
"""
from __future__ import annotations

import importlib.util
import os

from dsahal.backends.triton_kernels.compile_budget import install as install_compile_budget
from dsahal.registry import Backend, Capabilities, Route, hookimpl

from .arch import ARCHS, rocm_arch
from . import config
from .config import batch_invariant
from .paths import AITER_DIST, FAST_PATHS, FLYDSL_DIST, NEVER_RUN_ON_ROCM, distribution_version
from .routes import ALWAYS_ENABLED, PATHS_ENV, ROUTES

PACKAGE = "dsahal.backends.amd"
TAGS = frozenset({"gpu", "rocm"})
# Not fast paths: one route each. dsa_attention is left to the registry's composite route (the
# composition through the public ops), so each stage takes its own best AMD route.
COLLECTIVE_OPS = {
    "topk_merge": [Route("merge", f"{PACKAGE}.collectives:topk_merge",
                         description="score-only exact merge (DSAHAL_AMD_TOPK_MERGE=packed: the packed one)")],
    "all_gather": [Route("rccl", f"{PACKAGE}.collectives:all_gather",
                         description="AITER custom all-gather where its path is on, else RCCL")],
    "all_to_all": [Route("rccl", f"{PACKAGE}.collectives:all_to_all", description="RCCL via torch.distributed")],
}


def ops() -> dict[str, list[Route]]:
    return {**{op: list(routes) for op, routes in ROUTES.items()}, **COLLECTIVE_OPS}

TRITON_UNVERIFIED = ("triton: never run on ROCm hardware; the same Triton source with these block sizes can be "
                     "checked on an NVIDIA GPU with DSAHAL_AMD_PATHS=triton (conformance/reports lists the runs "
                     "that happened) and its kernels under the Triton interpreter")
COLLECTIVE_UNVERIFIED = "never run on RCCL; the same torch.distributed code runs on gloo in the CPU tests"


def triton_only() -> bool:
    """True when ``DSAHAL_AMD_PATHS`` names only ``triton`` (the verification mode)."""
    allowed = {p.strip() for p in os.environ.get(PATHS_ENV, "").split(",") if p.strip()}
    return allowed == {"triton"}


def probe() -> tuple[bool, str]:
    import torch

    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (ROCm torch ships it as pytorch-triton-rocm)"
    if torch.version.hip is None:
        if triton_only() and torch.cuda.is_available():
            return True, (f"verification mode: Triton paths only ({PATHS_ENV}=triton) on "
                          f"{torch.cuda.get_device_name(0)}; not a ROCm run")
        hint = f"; {PATHS_ENV}=triton runs its Triton paths on a CUDA GPU for verification" \
            if torch.cuda.is_available() else ""
        return False, f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None){hint}"
    if not torch.cuda.is_available():
        return False, f"ROCm torch (HIP {torch.version.hip}) sees no GPU"
    gfx = rocm_arch()
    if gfx not in ARCHS:
        return False, f"{torch.cuda.get_device_name(0)} is {gfx}; supported: " + \
            ", ".join(f"{a} ({f.product})" for a, f in ARCHS.items())
    return True, f"{torch.cuda.get_device_name(0)} ({gfx}, {ARCHS[gfx].product}), HIP {torch.version.hip}"


def versions() -> dict[str, str]:
    """Library versions, the GPU architecture, and each fast path's status (present, or why not)."""
    import torch

    from .routes import enabled_paths

    found = {"torch": torch.__version__, "hip": torch.version.hip or "not a ROCm build",
             "gfx": rocm_arch() or "no ROCm GPU"}
    for dist in ("triton", AITER_DIST, FLYDSL_DIST):
        found[dist] = distribution_version(dist) or "not installed"
    for path, why_not in sorted(enabled_paths().items()):
        if path in ALWAYS_ENABLED:
            continue
        found[f"path {path}"] = "on" if not why_not else f"off ({why_not})"
    return found


def unverified() -> dict[str, str]:
    """Every op, with why its AMD path has never run on AMD hardware."""
    reasons = {op: TRITON_UNVERIFIED for op in ROUTES}
    for path in FAST_PATHS:
        vendor = f"{path.name} ({path.api}): {NEVER_RUN_ON_ROCM}; {path.cpu_check}"
        reasons[path.op] = f"{reasons[path.op]}; {vendor}" if path.op in reasons else vendor
    reasons["all_gather"] = f"{COLLECTIVE_UNVERIFIED}; {reasons['all_gather']}"
    reasons["topk_merge"] = f"{COLLECTIVE_UNVERIFIED} (score-only merge: 2 and 4 gloo ranks, adversarial cases)"
    reasons["all_to_all"] = COLLECTIVE_UNVERIFIED
    reasons["dsa_attention"] = "composition of the routed ops above; never run on ROCm hardware"
    return reasons


def capabilities() -> Capabilities:
    from .routes import enabled_paths

    config.read_mode()  # DSAHAL_BATCH_INVARIANT and DSAHAL_AMD_TILES, once per declaration (launchers ask per call)
    status = enabled_paths()
    enabled = {path for path, why_not in status.items() if why_not == ""}
    vendor_enabled = any(path.name in enabled for path in FAST_PATHS)
    index_formats = {"bf16", "fp8"} | ({"mxfp4"} if "flydsl.indexer_mxfp4" in enabled else set())
    return Capabilities(
        latent_formats=frozenset({"bf16", "fp8", "fp8_ds_mla"}),
        index_formats=frozenset(index_formats),
        # Triton radix top-k and AITER's stable top-k both honour "smaller index wins"; both merges exact.
        deterministic=True,
        # The Triton kernels are row-local and fix their split sizes under DSAHAL_BATCH_INVARIANT=1;
        # AITER's MLA picks its KV splits from the batch: claimed only on the Triton paths in that mode.
        batch_invariant=batch_invariant() and not vendor_enabled,
        distributed=True,
        unverified=unverified(),
    )


def amd_backend() -> Backend:
    from . import routes

    routes.reset()  # path presence and DSAHAL_AMD_PATHS, read once per registry build
    # alignment-free compiles in batch-invariant mode; a compile budget under DSAHAL_TRITON_COMPILE_BUDGET
    install_compile_budget(invariant=config.read_mode())
    return Backend(
        name="amd",
        ops=ops(),
        tags=TAGS,
        priority=100,
        probe=probe,
        versions=versions,
        capabilities=capabilities(),
        description="AITER and FlyDSL kernels where they run (CDNA3/CDNA4), the shared Triton kernels otherwise",
    )


@hookimpl
def dsahal_backends():
    return [amd_backend()]
