"""What a backend declares: name, tags, probe, ops, per-op verifiers, capabilities."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Union

Probe = Callable[[], "tuple[bool, str]"]
# A verifier takes exactly the op's arguments and says whether this backend can serve them.
Verifier = Callable[..., "tuple[bool, str]"]
# An op or verifier may be given lazily as "package.module:attribute".
Lazy = Union[Callable[..., Any], str]


def always_available() -> tuple[bool, str]:
    return True, "always available"


@dataclass(frozen=True)
class Capabilities:
    """What a backend claims, so the conformance suite tests exactly that and skips the rest.

    ``None`` for a format set means "every format the op accepts". ``unverified`` maps an op
    to the reason its native path has never run on real hardware (reported, never hidden).
    """

    latent_formats: frozenset[str] | None = None
    index_formats: frozenset[str] | None = None
    deterministic: bool = False
    batch_invariant: bool = False
    distributed: bool = True
    unverified: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Backend:
    """One backend: a named set of op implementations for one family of hardware.

    Attributes:
        name: unique name used by ``DSAHAL_BACKEND``.
        ops: op name -> implementation (callable or ``"module:attr"``) with the op's signature.
        verifiers: op name -> ``(*op_args) -> (ok, reason)``; a rejected call falls back to the
            reference, logged once per reason.
        tags: e.g. ``{"gpu", "cuda"}``.
        priority: automatic selection picks the highest-priority available backend.
        probe: cheap, side-effect-free ``() -> (ok, reason)``.
        versions: ``() -> {package: version}`` of the libraries the backend uses, for reports.
    """

    name: str
    ops: Mapping[str, Lazy] = field(default_factory=dict)
    verifiers: Mapping[str, Lazy] = field(default_factory=dict)
    tags: frozenset[str] = frozenset()
    priority: int = 50
    probe: Probe = always_available
    capabilities: Capabilities = Capabilities()
    versions: Callable[[], Mapping[str, str]] = dict
    description: str = ""

    def __post_init__(self):
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"Backend name must be a non-empty identifier, got {self.name!r}")
        unknown = set(self.verifiers) - set(self.ops)
        if unknown:
            raise ValueError(f"backend {self.name!r}: verifiers for ops it does not implement: {sorted(unknown)}")


def package_versions(*distributions: str) -> dict[str, str]:
    """``{distribution: version or "not installed"}`` from package metadata, for ``Backend.versions``
    (reads metadata only: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in distributions:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def resolve_lazy(value: Lazy) -> Callable[..., Any]:
    """Import ``"module:attr"`` (dotted attrs allowed) or return a callable unchanged."""
    if callable(value):
        return value
    module_name, _, attr = value.partition(":")
    if not attr:
        raise ValueError(f"lazy reference {value!r} must look like 'package.module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
