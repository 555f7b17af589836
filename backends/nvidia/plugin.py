"""NVIDIA CUDA backend plugin: declaration and probe; kernels are imported on selection.

Each op is an ordered list of routes (:func:`routes`): FlashMLA's SM90 sparse kernels for sparse MLA
where they serve the call (:mod:`.flashmla`, installed with ``pip install --no-deps sgl-flash-mla``),
the shared Triton kernels (:mod:`dsahal.backends.triton_kernels`) with this backend's block sizes
(:mod:`.config`), KDA prefill through fla-core's chunked kernel when installed, collectives on NCCL.
Route modules are named as strings, so discovery imports no kernel library. FlashInfer's sparse MLA
(SM100 only) is not wired in: nothing here claims it.
"""
from __future__ import annotations

import importlib.util

from dsahal.backends.triton_kernels.compile_budget import install as install_compile_budget
from dsahal.registry import Backend, Capabilities, Route, hookimpl, package_versions

from .verifiers import SHORT_PREFILL_TOKENS

MIN_CAPABILITY = (8, 0)
PACKAGE = "dsahal.backends.nvidia"
LIMITS = "dsahal.backends.triton_kernels.limits"

TRITON = "the shared Triton kernels with this backend's block sizes"


def _triton(op: str, *, name: str = "triton", description: str = TRITON) -> Route:
    """A shared-Triton-kernel route: its limits (:mod:`dsahal.backends.triton_kernels.limits`) verify it."""
    return Route(name, f"{PACKAGE}.ops:{op}", f"{LIMITS}:{op}", description=description)


def routes() -> dict[str, list[Route]]:
    """Every op's routes, in the order calls try them (the default per shape measured on the H200)."""
    flashmla = f"{PACKAGE}.flashmla"
    return {
        "cache_write": [_triton("cache_write")],
        "indexer_score": [_triton("indexer_score", description="block tiles for FP8/MXFP4 keys (one MMA per query token; "
                                                               "on Hopper in default mode the Gluon kernel, any tokens "
                                                               "a request), the general kernel otherwise")],
        "topk": [_triton("topk", description="exact (tie rule honoured): by row width, group bound >= 64K, lane-max "
                                             "bound 8K-64K, one radix program per row 4K-8K, the row in "
                                             "one program's registers <= 4K")],
        "topk_merge": [Route("exact_merge", f"{PACKAGE}.collectives:topk_merge",
                             description="packed 32-bit exact DCP merge over NCCL")],
        "positions_to_slots": [_triton("positions_to_slots")],
        "sparse_mla": [
            # The wgmma few-heads kernel on sm_90, fp8_ds_mla at <= 16 heads and per-tensor FP8 records at <= 32
            # (config.WGMMA_ROUTE_MAX_HEADS): the gathered slots as the logit MMA's M side, so 12 or 16 heads are not
            # padded to 64; 1.31x / 1.32x FlashMLA (heads padded) at 64 x 5 tokens, H = 16 / 12, 1.38x at 64 x 8;
            # per-tensor FP8 2.34x / 1.94x the general kernel at H = 16 / 32 (H100, thirty-seventh session: its
            # logits fp16 MMAs, exact). Ahead of FlashMLA: in default mode it leaves calls of < 16 query tokens
            # (config.WGMMA_MIN_TOKENS) that FlashMLA's decode takes to it (as fast there; 16-63 tokens with smaller
            # splits); in batch-invariant mode it takes every call it can (fixed splits: the route must not depend on
            # the batch).
            Route("gluon_wgmma_few_heads", f"{PACKAGE}.ops:sparse_mla_wgmma",
                  f"{PACKAGE}.verifiers:wgmma_few_heads_accepts",
                  description="Gluon: fp8_ds_mla at <= 16 heads, per-tensor FP8 at <= 32, the gathered slots as the "
                              "logit wgmma's M side (sm_90; default mode: FlashMLA's decode below 16 tokens)"),
            # The wgmma NVFP4 kernel, nvfp4 latents on sm_90 (FlashMLA reads no NVFP4): the same design, each code
            # decoded exactly into an fp16 MMA operand; 3.8-4.2x the few-heads Triton kernel it replaces at 64 x 5
            # tokens, 1.32x / 1.45x FlashMLA's padded time on the same tokens as fp8_ds_mla at H = 16 / 12 (H200,
            # twenty-third / twenty-fourth sessions), every batch size, both modes; 17-64 heads as groups of 16:
            # 3.5-3.9x the few-heads Triton kernel at 24 / 32, 6.2x / 1.09x the general one at 48 / 64.
            Route("gluon_wgmma_nvfp4", f"{PACKAGE}.ops:sparse_mla_wgmma_fp4", f"{PACKAGE}.verifiers:wgmma_nvfp4_accepts",
                  description="Gluon: NVFP4 latents, 16 heads a program (up to 64), each code decoded exactly into "
                              "an fp16 MMA operand, the gathered slots as the logit wgmma's M side (sm_90)"),
            Route("flashmla_decode", f"{flashmla}:sparse_mla_decode", f"{flashmla}:decode_accepts",
                  probe=f"{flashmla}:probe", description="FlashMLA SM90 sparse decode on fp8_ds_mla (V32) pages"),
            Route("flashmla_prefill", f"{flashmla}:sparse_mla_prefill", f"{flashmla}:prefill_accepts",
                  probe=f"{flashmla}:probe", description="FlashMLA SM90 sparse prefill on contiguous bf16 latents"),
            # The Gluon few-heads kernel, fp8_ds_mla at <= 16 heads: 1.09x the raw-e4m3 Triton kernel below at 64 x 5
            # tokens, H = 16 / 12 (0.426 / 0.419 vs 0.465 / 0.458 ms, H200, sixteenth session); certified as a route
            # in both modes (forced, sparse_mla and dsa_attention at 60 examples, eighteenth session, BENCHMARKS.md).
            # Behind FlashMLA, faster with its heads padded to 64 (0.300 ms) where it serves.
            Route("gluon_few_heads", f"{PACKAGE}.ops:sparse_mla_gluon", f"{PACKAGE}.verifiers:gluon_few_heads_accepts",
                  description="Gluon: fp8_ds_mla at <= 16 heads, gathers staged by cp.async, one warp per 128-dim "
                              "tile (sm_89+)"),
            # Before the general kernel where it measured faster (H <= 32, fp8_ds_mla and nvfp4 latents; fp8_ds_mla
            # at <= 16 heads on the raw-e4m3 kernel); behind FlashMLA, which is faster at fp8_ds_mla in default
            # mode even with its heads padded: 0.297 vs 0.457 ms at H = 16 (H200, eighth session).
            Route("triton_small_heads", f"{PACKAGE}.ops:sparse_mla_small_heads", f"{PACKAGE}.verifiers:small_heads_accepts",
                  description="every head of a token in one program (H <= 32, fp8_ds_mla / nvfp4; fp8_ds_mla at "
                              "<= 16 heads on raw e4m3 codes)"),
            _triton("sparse_mla"),
        ],
        "lse_combine": [_triton("lse_combine")],
        "kda_decode": [_triton("kda_decode")],
        "kda_prefill": [
            Route("triton_short", f"{PACKAGE}.ops:kda_prefill", f"{PACKAGE}.verifiers:short_prefill_accepts",
                  description=f"the token-by-token kernel for calls of <= {SHORT_PREFILL_TOKENS} tokens (faster than fla there)"),
            # Our chunked kernel in its mixed mode (pair products as bf16x3, fp32 qg, bf16 elsewhere), ahead of fla:
            # on the H200 (BENCHMARKS.md, fourteenth session) 1.58-1.63x / 1.54-1.59x fla's chunk_kda itself at
            # 8 x 4096 / mixed lengths, faster still than the fla route (whose pool gather/scatter it does not need),
            # and certified by the conformance suite at 200 examples, which fla's chunk_kda is not (single rows
            # beyond the bf16 bound).
            Route("triton_chunk_mixed", f"{PACKAGE}.ops:kda_prefill_chunked_mixed",
                  f"{PACKAGE}.verifiers:chunk_mixed_accepts",
                  description="our chunked kernel (chunks of 16, two passes, no host sync), mixed precision"),
            _triton("kda_prefill", name="triton_recurrent",
                    description="exact fp32 recurrent Triton kernel (token by token)"),
            # After a route that takes every call: the two below are reached only when forced
            # (DSAHAL_ROUTES=kda_prefill:fla_chunk). fla's chunk_kda served the 16-bit calls of more than 512 tokens
            # with K or V past 128 until the forty-third session, when scripts/h200/fla_route_check.py measured it
            # there past the suite's bf16 bound under strong decay (K = 192, V = 128, gates down to -5: worst row
            # 0.136 against 2^-6, 3.6% of rows; H100), as its forced suite run had in the fifth session.
            Route("fla_chunk", f"{PACKAGE}.kda_fla:kda_prefill_fla", f"{PACKAGE}.kda_fla:accepts",
                  probe=f"{PACKAGE}.kda_fla:probe",
                  description="fla-core chunk_kda (bf16/fp16 inputs); forced only: past the bf16 bound under strong "
                              "decay"),
            # The chunked kernel's tf32 mode: more precise than mixed (worst 3.3e-3 vs 1.1e-2 of the suite's 1.6e-2
            # bound in a float64 emulation), 1.3x slower.
            Route("triton_chunk", f"{PACKAGE}.ops:kda_prefill_chunked", f"{PACKAGE}.verifiers:chunk_prefill_accepts",
                  description="our chunked kernel, tf32 mode (fp32 pair products and scratch, tf32 MMAs); forced only"),
        ],
        "all_gather": [Route("nccl", f"{PACKAGE}.collectives:all_gather", description="torch.distributed")],
        "all_to_all": [Route("nccl", f"{PACKAGE}.collectives:all_to_all", description="torch.distributed")],
        "dsa_attention": [Route("triton_fused", f"{PACKAGE}.ops:dsa_attention", f"{PACKAGE}.verifiers:dsa_attention_accepts",
                                description="indexer, top-k with the slot translation fused in, sparse MLA")],
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
        latent_formats=frozenset({"bf16", "fp8", "fp8_ds_mla", "nvfp4"}),
        index_formats=frozenset({"bf16", "fp8", "mxfp4"}),
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
    from dsahal.backends.cuda_device import cuda_device_name, ppu_evidence

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
    from dsahal.kernel_launch import describe

    return {**package_versions("torch", "triton", "fla-core", "sgl-flash-mla"), "path triton launch": describe()}


def nvidia_backend() -> Backend:
    from .config import read_mode

    invariant = read_mode()  # DSAHAL_BATCH_INVARIANT, read once per registry build (verifiers ask per call)
    # alignment-free compiles in batch-invariant mode; a compile budget under DSAHAL_TRITON_COMPILE_BUDGET
    install_compile_budget(invariant=invariant)
    return Backend(
        name="nvidia",
        ops=routes(),
        tags=frozenset({"gpu", "cuda"}),
        priority=100,
        probe=probe,
        versions=versions,
        capabilities=capabilities(),
        description="FlashMLA on Hopper where it is fastest, Triton kernels for Hopper and newer, fla-core KDA prefill",
    )


@hookimpl
def dsahal_backends():
    return [nvidia_backend()]
