"""The AMD backend's routes: per op, one route per path (AITER, FlyDSL, Triton) in order of preference,
each verified by its limits (:mod:`.limits`) and probed by its path's presence (:mod:`.paths`). The
registry picks the first route that is usable here and accepts the arguments, like every backend's.

``DSAHAL_AMD_PATHS`` (comma-separated) limits the paths used: ``triton`` forces every op onto the
shared Triton kernels; ``aiter`` enables every ``aiter.*`` path; unset means every present path.
The collectives (RCCL through torch.distributed) and the top-k merge are not fast paths and are
always enabled.
"""
from __future__ import annotations

import functools
import os
import threading

from dsahal.registry import Route

from .paths import presence_report

PACKAGE = "dsahal.backends.amd"
PATHS_ENV = "DSAHAL_AMD_PATHS"
ALWAYS_ENABLED = frozenset({"rccl", "merge"})


def enabled_paths(report: dict[str, tuple[bool, str]] | None = None, allow: str | None = None) -> dict[str, str]:
    """``{path: ""}`` for each usable path, ``{path: reason}`` for each unusable one."""
    report = presence_report() if report is None else report
    allow = os.environ.get(PATHS_ENV, "") if allow is None else allow
    allowed = {name.strip() for name in allow.split(",") if name.strip()}
    status = {}
    for path, (present, reason) in report.items():
        if not present:
            status[path] = reason
        elif allowed and path not in allowed and path.split(".")[0] not in allowed:
            status[path] = f"disabled by {PATHS_ENV}={allow}"
        else:
            status[path] = ""
    for path in ALWAYS_ENABLED:
        status[path] = ""
    return status


_status: dict[str, str] | None = None
_lock = threading.Lock()


def path_status() -> dict[str, str]:
    """:func:`enabled_paths`, computed once per process (until :func:`reset`)."""
    global _status
    if _status is None:
        with _lock:
            if _status is None:
                _status = enabled_paths()
    return _status


def reset(status: dict[str, str] | None = None) -> None:
    """Forget the path status so the next use re-reads presence and ``DSAHAL_AMD_PATHS``; tests may
    pin a status instead (``{path: ""}`` usable, ``{path: reason}`` not)."""
    global _status
    with _lock:
        _status = status


def path_probe(path: str) -> tuple[bool, str]:
    """A route's probe: is its path present and enabled here?"""
    why_not = path_status().get(path, f"unknown path {path}")
    return (True, f"path {path} enabled") if not why_not else (False, why_not)


PATH_DESCRIPTIONS = {
    "triton": "the shared Triton kernels with AMD block sizes",
    "aiter.sparse_mla": "AITER mla_decode_fwd (CDNA3/4)",
    "aiter.indexer_fp8": "AITER deepgemm_fp8_paged_mqa_logits (CDNA3/4)",
    "aiter.topk": "AITER top_k_per_row (CDNA3/4)",
    "flydsl.sparse_mla": "FlyDSL sparse MLA decode on fp8 latents (gfx950)",
    "flydsl.indexer_mxfp4": "FlyDSL native-FP4 indexer on MXFP4 keys (gfx950)",
}


def _route(path: str, limits: str, run: str) -> Route:
    """The route of one path: named after it, verified by ``limits`` (in :mod:`.limits`), probed by the
    path's presence and ``DSAHAL_AMD_PATHS``."""
    return Route(path, f"{PACKAGE}.{run}", f"{PACKAGE}.limits:{limits}", probe=functools.partial(path_probe, path),
                 description=PATH_DESCRIPTIONS[path])


def _triton(op: str) -> Route:
    return _route("triton", f"triton_{op}", f"triton_ops:{op}")


ROUTES: dict[str, tuple[Route, ...]] = {
    "cache_write": (_triton("cache_write"),),
    "indexer_score": (
        _route("flydsl.indexer_mxfp4", "flydsl_indexer_mxfp4", "vendor_ops:indexer_score_mxfp4"),
        _route("aiter.indexer_fp8", "aiter_indexer_fp8", "vendor_ops:indexer_score_fp8"),
        _triton("indexer_score"),
    ),
    "topk": (_route("aiter.topk", "aiter_topk", "vendor_ops:topk"), _triton("topk")),
    "positions_to_slots": (_triton("positions_to_slots"),),
    "sparse_mla": (
        _route("aiter.sparse_mla", "aiter_sparse_mla", "vendor_ops:sparse_mla_aiter"),
        _route("flydsl.sparse_mla", "flydsl_sparse_mla", "vendor_ops:sparse_mla_flydsl"),
        _triton("sparse_mla"),
    ),
    "lse_combine": (_triton("lse_combine"),),
    "kda_decode": (_triton("kda_decode"),),
    "kda_prefill": (_triton("kda_prefill"),),
}
