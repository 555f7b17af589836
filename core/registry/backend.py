"""What a backend declares: name, tags, probe, per-op ordered routes, capabilities."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence, Union

Probe = Callable[[], "tuple[bool, str]"]
# A verifier takes exactly the op's arguments and says whether this backend can serve them.
Verifier = Callable[..., "tuple[bool, str]"]
# An op or verifier may be given lazily as "package.module:attribute".
Lazy = Union[Callable[..., Any], str]

DEFAULT_ROUTE = "default"


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
class Route:
    """One way a backend serves an op: a name, an implementation, and what it accepts.

    A backend lists an op's routes in order of preference; a call goes to the first route whose
    verifier accepts its arguments, and to the reference only when every route declines.

    Attributes:
        name: short and stable (``"triton"``, ``"flashmla_decode"``); users force or disable it with
            ``DSAHAL_ROUTES=op:name`` / ``op:-name`` and reports name it.
        fn: the implementation (callable or ``"module:attr"``), taking the op's arguments in the order of
            its spec (:data:`dsahal.ops.catalog.SPECS`).
        verifier: ``(*op_args) -> (ok, reason)`` from metadata only (shapes, dtypes, strides, devices:
            never tensor values, so no device sync); None accepts every call.
        probe: ``() -> (ok, reason)`` (or ``"module:attr"``), run once when the op table is resolved (a library that imports,
            a GPU architecture); an unavailable route is skipped and reported with its reason.
        description: one line for ``dsahal backends --routes``.
    """

    name: str
    fn: Lazy
    verifier: Optional[Lazy] = None
    probe: Optional[Union[Probe, str]] = None
    description: str = ""

    def __post_init__(self):
        if not self.name or not self.name.replace("_", "").replace("-", "").replace(".", "").isalnum() \
                or self.name.startswith("-"):
            raise ValueError(f"Route name must be a non-empty identifier (letters, digits, _ - .), got {self.name!r}")
        if self.name == "reference":
            raise ValueError("Route name 'reference' is reserved for the fallback every op has")
        # A "module:attr" typo (a dot for the colon, a non-callable) would otherwise surface only when the
        # backend is selected, as a route that is quietly off: say so where the route is declared.
        for role, value, required in (("implementation", self.fn, True), ("verifier", self.verifier, False),
                                      ("probe", self.probe, False)):
            problem = lazy_problem(value, required)
            if problem:
                raise ValueError(f"Route {self.name!r}: {role} {problem}")


OpDeclaration = Union[Lazy, Route, Sequence[Route]]


@dataclass(frozen=True)
class Backend:
    """One backend: a named set of op implementations for one family of hardware.

    Attributes:
        name: unique name used by ``DSAHAL_BACKEND``.
        ops: op name -> its ordered routes (a list of :class:`Route`), or a single implementation
            (callable or ``"module:attr"``), shorthand for one route named ``"default"``.
        verifiers: op name -> verifier of a single-implementation op (the shorthand's verifier; a
            :class:`Route` carries its own). A call every route declines falls back to the
            reference, logged once per reason.
        tags: e.g. ``{"gpu", "cuda"}``.
        priority: automatic selection picks the highest-priority available backend.
        probe: cheap, side-effect-free ``() -> (ok, reason)``.
        versions: ``() -> {package: version}`` of the libraries the backend uses, for reports.
    """

    name: str
    ops: Mapping[str, OpDeclaration] = field(default_factory=dict)
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
        for op, declared in self.ops.items():
            # Anything but a Route, an implementation or a sequence of Routes (None, a number, a dict) would
            # fail in routes() with a bare TypeError that names neither the backend nor the op.
            if not (isinstance(declared, (Route, list, tuple)) or _is_implementation(declared)):
                raise ValueError(f"backend {self.name!r}: op {op!r} expected an implementation (callable or "
                                 f"'module:attr'), a dsahal.Route or a list of them, got {type(declared).__name__}")
            try:
                routes = self.routes(op)
            except ValueError as exc:  # the shorthand's Route refused its implementation or verifier
                raise ValueError(f"backend {self.name!r}: op {op!r}: {exc}") from None
            strays = [type(r).__name__ for r in routes if not isinstance(r, Route)]
            if strays:
                raise ValueError(f"backend {self.name!r}: op {op!r} expected an implementation or a list of "
                                 f"dsahal.Route, got a list holding {', '.join(strays)}")
            names = [r.name for r in routes]
            if not routes:
                raise ValueError(f"backend {self.name!r}: op {op!r} declares an empty route list")
            if len(set(names)) != len(names):
                raise ValueError(f"backend {self.name!r}: op {op!r} declares a route name twice: {names}")
            if op in self.verifiers and not _is_implementation(self.ops[op]):
                raise ValueError(f"backend {self.name!r}: op {op!r} has routes, so its verifiers belong in "
                                 f"each Route, not in Backend.verifiers")

    def routes(self, op: str) -> tuple[Route, ...]:
        """The ordered routes this backend declares for ``op`` (empty when it does not implement it)."""
        declared = self.ops.get(op)
        if declared is None:
            return ()
        if isinstance(declared, Route):
            return (declared,)
        if _is_implementation(declared):
            return (Route(DEFAULT_ROUTE, declared, self.verifiers.get(op)),)
        return tuple(declared)


def _is_implementation(value) -> bool:
    return callable(value) or isinstance(value, str)


def lazy_problem(value, required: bool = True) -> str:
    """What is wrong with ``value`` as a :data:`Lazy` (a callable or ``"module:attr"``), or ``""``.
    Checks the form only: nothing is imported."""
    if value is None:
        return "is missing" if required else ""
    if callable(value):
        return ""
    if not isinstance(value, str):
        return f"expected a callable or a 'package.module:attribute' string, got {type(value).__name__}"
    module, sep, attr = value.partition(":")
    if not (sep and module and attr and all(p.isidentifier() for p in module.split(".") + attr.split("."))):
        return f"{value!r} expected a callable or a 'package.module:attribute' string"
    return ""


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
