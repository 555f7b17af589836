"""Google TPU backend plugin (torch-xla): declaration and probe.

Every op is an XLA formulation (static shapes, dense matmuls, XLA TopK, a scanned chunked KDA)
in this folder; the op table names them lazily so discovery imports neither torch_xla nor
libtpu. The probe reads only package metadata and ``PJRT_DEVICE`` (``TPU`` on a TPU VM, ``CPU``
for XLA's CPU client, which is how CI runs this backend: verified on XLA:CPU, not on a TPU).
"""
from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os

from dsahal.ops.catalog import OP_NAMES
from dsahal.registry import Backend, Capabilities, Route, hookimpl

from .support import INDEX_FORMATS, LATENT_FORMATS, UNVERIFIED_REASON

_OPS_MODULE = "dsahal.backends.tpu.ops"
_SUPPORT_MODULE = "dsahal.backends.tpu.support"
_FORMAT_CHECKED_OPS = ("cache_write", "indexer_score", "sparse_mla", "dsa_attention")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def probe() -> tuple[bool, str]:
    """Available when torch_xla is installed, built for the installed torch, and PJRT_DEVICE is set."""
    if importlib.util.find_spec("torch_xla") is None:
        return False, "torch_xla is not installed (pip install 'dsahal[tpu]', or scripts/tpu-env.sh)"
    xla_version, torch_version = _version("torch_xla") or _version("torch-xla"), _version("torch")
    if xla_version and torch_version and _release(xla_version) != _release(torch_version):
        return False, (f"torch_xla {xla_version} needs torch {'.'.join(_release(xla_version))}.*, "
                       f"found torch {torch_version}")
    device = os.environ.get("PJRT_DEVICE")
    if not device:
        return False, "torch_xla is installed but PJRT_DEVICE is not set (TPU, or CPU for XLA's CPU client)"
    if device.upper() == "CPU":
        return True, f"torch_xla {xla_version} on XLA's CPU client (PJRT_DEVICE=CPU), not a TPU"
    return True, f"torch_xla {xla_version} with PJRT_DEVICE={device}"


def versions() -> dict[str, str]:
    """Library versions, plus the XLA device when that is safe to start (XLA:CPU only)."""
    found = {name: v for name in ("torch", "torch_xla", "libtpu") if (v := _version(name))}
    ok, _ = probe()
    if ok:
        from .device import describe_device

        found["xla_device"] = describe_device()
    return found


def routes() -> dict[str, list[Route]]:
    """One route per op, ``xla``: the XLA formulation of :mod:`.ops` (staging host tensors onto the XLA
    device), verified by the formats it has codecs for where the op reads a cache."""
    return {op: [Route("xla", f"{_OPS_MODULE}:{op}",
                       f"{_SUPPORT_MODULE}:verify_{op}" if op in _FORMAT_CHECKED_OPS else None,
                       description="XLA formulation (static buckets, dense matmuls, XLA TopK, scanned KDA)")]
            for op in OP_NAMES}


def tpu_backend() -> Backend:
    return Backend(
        name="tpu",
        ops=routes(),
        tags=frozenset({"tpu", "xla"}),
        priority=90,
        probe=probe,
        capabilities=Capabilities(
            latent_formats=LATENT_FORMATS,
            index_formats=INDEX_FORMATS,
            deterministic=True,  # exact tie rule in top-k; fixed reduction order per compiled graph
            batch_invariant=False,
            distributed=False,  # collectives written for torch-xla's process group, run at world size 1 only
            unverified={op: UNVERIFIED_REASON for op in OP_NAMES},
        ),
        versions=versions,
        description="XLA formulations: padded buckets, dense matmuls, XLA TopK, chunked KDA with a scan",
    )


@hookimpl
def dsahal_backends():
    return [tpu_backend()]
