"""Cache formats by name: ``latent_format("fp8_ds_mla")``, ``index_format("fp8")``.

Latent formats hold the 576-dim MLA latent (512 "nope" + 64 RoPE); index formats hold the
128-dim indexer key. Every format is a fixed number of bytes per token (the last argument below).
Each format's docstring states its byte layout, its rounding and its error bound; docs/cache.md §1
tabulates them all.
"""
from __future__ import annotations

from .base import CacheFormat
from .ds_mla import Fp8DsMlaFormat
from .fp4 import Mxfp4IndexFormat, Nvfp4LatentFormat
from .simple import Bf16Format, Fp8TensorScaleFormat, Fp8TokenScaleFormat

LATENT_DIM = 576
LATENT_NOPE_DIM = 512
LATENT_ROPE_DIM = 64
INDEX_DIM = 128

LATENT_FORMATS: dict[str, CacheFormat] = {
    "bf16": Bf16Format("bf16", "latent", LATENT_DIM, 2 * LATENT_DIM),  # 1152
    # e4m3 with one external per-tensor fp32 scale: 576
    "fp8": Fp8TensorScaleFormat("fp8", "latent", LATENT_DIM, LATENT_DIM, needs_tensor_scale=True),
    "fp8_ds_mla": Fp8DsMlaFormat("fp8_ds_mla", "latent", LATENT_DIM, 656),  # 512 e4m3 + 4 fp32 + 64 bf16 (FlashMLA)
    "nvfp4": Nvfp4LatentFormat("nvfp4", "latent", LATENT_DIM, 352),  # 256 e2m1 + 64 e4m3 RoPE + 32 e4m3 scales
}
INDEX_FORMATS: dict[str, CacheFormat] = {
    "bf16": Bf16Format("bf16", "index", INDEX_DIM, 2 * INDEX_DIM),  # 256
    "fp8": Fp8TokenScaleFormat("fp8", "index", INDEX_DIM, INDEX_DIM + 4),  # 128 e4m3 + fp32 scale (DeepSeek-V3.2)
    "mxfp4": Mxfp4IndexFormat("mxfp4", "index", INDEX_DIM, 68),  # 64 e2m1 + 4 UE8M0 scales
}


def _lookup(table: dict[str, CacheFormat], kind: str, name: str) -> CacheFormat:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} format {name!r}; expected one of {sorted(table)}") from None


def latent_format(name: str) -> CacheFormat:
    return _lookup(LATENT_FORMATS, "latent", name)


def index_format(name: str) -> CacheFormat:
    return _lookup(INDEX_FORMATS, "index", name)


def cache_format(kind: str, name: str) -> CacheFormat:
    if kind == "latent":
        return latent_format(name)
    if kind == "index":
        return index_format(name)
    raise ValueError(f"unknown cache kind {kind!r}; expected 'latent' or 'index'")


__all__ = [
    "CacheFormat", "LATENT_FORMATS", "INDEX_FORMATS", "latent_format", "index_format", "cache_format",
    "LATENT_DIM", "LATENT_NOPE_DIM", "LATENT_ROPE_DIM", "INDEX_DIM",
]
