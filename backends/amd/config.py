"""Block sizes the AMD backend passes to the shared Triton kernels (CDNA3 gfx942, CDNA4 gfx950).

Two hardware facts drive every choice:

- A wavefront is 64 lanes, and Triton's ``num_warps`` counts wavefronts on ROCm. To give a program
  the same number of threads the NVIDIA configuration gives it (``num_warps`` x 32), we pass half
  as many: 4 wavefronts = 256 lanes = 8 NVIDIA warps.
- Triton on AMD stages both ``tl.dot`` operands in LDS: 64 KiB per CU on gfx942, 160 KiB on gfx950
  (H100/H200 have 228 KiB of shared memory). Sparse MLA's tiles are therefore smaller on gfx942:
  a ``[block_h, 576]`` bf16 query tile plus a ``[block_n, 576]`` latent tile must fit.

``num_stages`` stays 1 (gfx942) or 2 (gfx950's larger LDS leaves room to double-buffer the latent
gather). Unknown architectures (and the NVIDIA verification run, ``DSAHAL_AMD_PATHS=triton`` on a
CUDA device) get the gfx942 choices: the smallest tiles, valid everywhere.

None of these numbers has been timed on an MI300 or MI355: they are derived from the limits above,
not tuned. ``dsahal bench --backend amd`` on the hardware is what would tune them.
"""
from __future__ import annotations

import os

from ..batch_mode import invariant_requested
from .arch import WAVEFRONT

LDS_BYTES = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}
COMPUTE_UNITS = {"gfx942": 304, "gfx950": 256}  # MI300X, MI355X
LATENT_DIM = 576
NVIDIA_WARP = 32


def wavefronts_for_threads(threads: int) -> int:
    """``num_warps`` on ROCm for a program of ``threads`` lanes (at least one wavefront)."""
    return max(1, threads // WAVEFRONT)


_batch_invariant: bool | None = None
_tiles_override: str | None = None
TILES_ENV = "DSAHAL_AMD_TILES"


def read_mode() -> bool:
    """Read ``DSAHAL_BATCH_INVARIANT`` and ``DSAHAL_AMD_TILES`` (the backend's declaration does, once per
    registry build): the launchers ask on every call, which must not cost environment lookups."""
    global _batch_invariant, _tiles_override
    _batch_invariant = invariant_requested()
    _tiles_override = os.environ.get(TILES_ENV) or None
    return _batch_invariant


def batch_invariant() -> bool:
    if _batch_invariant is None:
        read_mode()
    return _batch_invariant


def tiles_override() -> str | None:
    """``DSAHAL_AMD_TILES`` as last read (``gfx942`` or ``gfx950`` block sizes off ROCm), or None."""
    if _batch_invariant is None:
        read_mode()
    return _tiles_override


def sparse_mla_tile_bytes(block_h: int, block_n: int, latent_bytes_per_dim: int = 2) -> int:
    """LDS bytes of one query tile and one latent tile (the operands of the QK dot)."""
    return (block_h + block_n) * LATENT_DIM * latent_bytes_per_dim


def sparse_mla_config(gfx: str | None, tokens: int, heads: int, k: int) -> dict:
    """Kernel parameters for ``q [tokens, heads, 576]`` over ``k`` slots per row."""
    lds = LDS_BYTES.get(gfx or "", LDS_BYTES["gfx942"])
    block_h = 16 if heads <= 16 or lds < 128 * 1024 else (32 if heads <= 32 else 64)
    block_n = 64 if sparse_mla_tile_bytes(block_h, 64) <= lds // 2 else 32
    cfg = dict(block_h=block_h, block_n=block_n, num_warps=wavefronts_for_threads(256),
               num_stages=2 if lds >= 128 * 1024 else 1)
    if batch_invariant():
        cfg["split_size"] = 512
        return cfg
    # Split a row's slots until about two programs per compute unit are in flight.
    target = 2 * COMPUTE_UNITS.get(gfx or "", COMPUTE_UNITS["gfx942"])
    programs = tokens * -(-heads // block_h)
    splits = 1
    while programs * splits < target and k // (splits * 2) >= 256:
        splits *= 2
    # a multiple of block_n, so every split but the last is full
    cfg["split_size"] = None if splits == 1 else _ceil_div(_ceil_div(k, splits), block_n) * block_n
    return cfg


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def indexer_config(heads: int) -> dict:
    # q tile [heads<=64, 128] + key tile [128, 128] in fp8/bf16 fit either LDS.
    return dict(block_n=128, group=8, num_warps=wavefronts_for_threads(256), num_stages=1)


def topk_config() -> dict:
    # 256 lanes per row: the same thread count as the NVIDIA choice of 8 warps.
    return dict(chunk=2048, row_levels=2, num_warps=wavefronts_for_threads(256))


def lse_combine_config() -> dict:
    return dict(block_d=512, num_warps=wavefronts_for_threads(128))


def kda_decode_config(value_dim: int) -> dict:
    return dict(block_v=32, num_warps=wavefronts_for_threads(128))


def small_kernel_warps() -> int:
    """cache_write and positions_to_slots: element-wise, one wavefront pair per program."""
    return wavefronts_for_threads(128)
