"""Which AMD path serves each call: the first route whose path is enabled here and whose limits
(:mod:`.limits`) accept the arguments. The backend's op and verifier for an op both come from here,
so "rejected" always means "no AMD path takes these arguments" and the reason lists why each refused.

``DSAHAL_AMD_PATHS`` (comma-separated) limits the paths used: ``triton`` forces every op onto the
shared Triton kernels; ``aiter`` enables every ``aiter.*`` path; unset means every present path.
The collectives (RCCL through torch.distributed) and the top-k merge are not fast paths and are
always enabled.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable

from dsahal.registry import resolve_lazy

from .paths import presence_report

PACKAGE = "dsahal.backends.amd"
PATHS_ENV = "DSAHAL_AMD_PATHS"
ALWAYS_ENABLED = frozenset({"rccl", "merge"})


@dataclass(frozen=True)
class Route:
    """One way to serve an op: the path it needs, its limits, its implementation."""

    path: str
    accepts: str  # "module:function" (*op_args) -> (ok, reason)
    run: str  # "module:function" with the op's backend-facing signature


def _triton(op: str) -> Route:
    return Route("triton", f"{PACKAGE}.limits:triton_{op}", f"{PACKAGE}.triton_ops:{op}")


ROUTES: dict[str, tuple[Route, ...]] = {
    "cache_write": (_triton("cache_write"),),
    "indexer_score": (
        Route("flydsl.indexer_mxfp4", f"{PACKAGE}.limits:flydsl_indexer_mxfp4", f"{PACKAGE}.vendor_ops:indexer_score_mxfp4"),
        Route("aiter.indexer_fp8", f"{PACKAGE}.limits:aiter_indexer_fp8", f"{PACKAGE}.vendor_ops:indexer_score_fp8"),
        _triton("indexer_score"),
    ),
    "topk": (Route("aiter.topk", f"{PACKAGE}.limits:aiter_topk", f"{PACKAGE}.vendor_ops:topk"), _triton("topk")),
    "positions_to_slots": (_triton("positions_to_slots"),),
    "sparse_mla": (
        Route("aiter.sparse_mla", f"{PACKAGE}.limits:aiter_sparse_mla", f"{PACKAGE}.vendor_ops:sparse_mla_aiter"),
        Route("flydsl.sparse_mla", f"{PACKAGE}.limits:flydsl_sparse_mla", f"{PACKAGE}.vendor_ops:sparse_mla_flydsl"),
        _triton("sparse_mla"),
    ),
    "lse_combine": (_triton("lse_combine"),),
    "kda_decode": (_triton("kda_decode"),),
    "kda_prefill": (_triton("kda_prefill"),),
}


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


class Router:
    """The route choice for one process: path status resolved once, limits checked per call."""

    def __init__(self, status: dict[str, str]):
        self.status = status
        self._resolved: dict[str, Callable] = {}

    def _fn(self, ref: str) -> Callable:
        fn = self._resolved.get(ref)
        if fn is None:
            fn = self._resolved[ref] = resolve_lazy(ref)
        return fn

    def choose(self, op: str, args: tuple) -> tuple[Route | None, str]:
        """The first enabled route accepting ``args``, or None and every refusal."""
        refusals = []
        for route in ROUTES[op]:
            unusable = self.status.get(route.path, f"unknown path {route.path}")
            if unusable:
                refusals.append(f"{route.path}: {unusable}")
                continue
            ok, why = self._fn(route.accepts)(*args)
            if ok:
                return route, ""
            refusals.append(f"{route.path}: {why}")
        return None, "; ".join(refusals)

    def run(self, op: str, args: tuple):
        route, why = self.choose(op, args)
        if route is None:
            raise RuntimeError(f"dsahal.{op}: no AMD path accepts these arguments ({why})")
        return self._fn(route.run)(*args)

    def verify(self, op: str, args: tuple) -> tuple[bool, str]:
        route, why = self.choose(op, args)
        return (True, route.path) if route is not None else (False, why)


_router: Router | None = None
_lock = threading.Lock()


def router() -> Router:
    global _router
    if _router is None:
        with _lock:
            if _router is None:
                _router = Router(enabled_paths())
    return _router


def reset() -> None:
    """Forget the path status so the next call re-reads presence and ``DSAHAL_AMD_PATHS`` (tests)."""
    global _router
    with _lock:
        _router = None


def _make_op(op: str):
    def serve(*args):
        return router().run(op, args)

    serve.__name__ = serve.__qualname__ = op
    serve.__doc__ = f"Serve dsahal.{op} on the first AMD path that accepts the arguments."
    return serve


def _make_verifier(op: str):
    def verify(*args):
        return router().verify(op, args)

    verify.__name__ = verify.__qualname__ = f"verify_{op}"
    verify.__doc__ = f"(True, path) if an AMD path accepts these dsahal.{op} arguments, else (False, every refusal)."
    return verify


# The backend registers "dsahal.backends.amd.routes:<op>" and ":verify_<op>" for each routed op.
for _op in ROUTES:
    globals()[_op] = _make_op(_op)
    globals()[f"verify_{_op}"] = _make_verifier(_op)
