"""The glue between a property test and the suite: the ``@conformance_property`` decorator and
the per-test :class:`PropertyRun` tracker that counts examples, tells native calls from
reference fallbacks, and formats failures with a reproduction snippet."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Iterable

import hypothesis
import pytest
import torch
from hypothesis import HealthCheck, settings

from dsahal.conformance.config import CONFIG
from dsahal.registry.observers import CallLog, observe

# The suite draws cases whose tensors are built from a seed, so hypothesis' own data is small;
# slow reference ops and the per-test tracker fixture are deliberate.
SUPPRESSED_HEALTH_CHECKS = (
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
    HealthCheck.function_scoped_fixture, HealthCheck.large_base_example,
)

# Capability names a property may need; each maps to a Capabilities attribute.
CAPABILITY_FLAGS = ("deterministic", "batch_invariant", "distributed")


def conformance_property(op: str, prop: str, *, needs: Iterable[str] = (), scale: float = 1.0):
    """Mark a ``@given`` test as the property ``prop`` of ``op`` and apply the suite's settings.

    ``needs``: capability flags the backend must claim (else the test is skipped with the reason).
    ``scale``: fraction of the example budget (expensive properties run fewer examples).
    Settings are read when the test module is imported, i.e. after the plugin configured them.
    """
    unknown = set(needs) - set(CAPABILITY_FLAGS)
    if unknown:
        raise ValueError(f"conformance_property: unknown capability flags {sorted(unknown)}")

    def decorate(test: Callable) -> Callable:
        test = settings(
            max_examples=CONFIG.examples(scale), derandomize=CONFIG.derandomize, deadline=None,
            database=None, suppress_health_check=SUPPRESSED_HEALTH_CHECKS, print_blob=False,
        )(test)
        if CONFIG.seed is not None and not CONFIG.derandomize:
            test = hypothesis.seed(CONFIG.seed)(test)
        return pytest.mark.conformance(op=op, prop=prop, needs=tuple(needs))(test)

    return decorate


class PropertyViolation(AssertionError):
    """A backend broke a property; the message names the property and carries a reproduction."""


@dataclass
class ExampleRecord:
    case: Any
    native_calls: int = 0
    fallback_calls: int = 0
    fallback_ops: set = field(default_factory=set)
    routes: set = field(default_factory=set)  # "op:route" of every call that served this example
    fallback_reasons: dict = field(default_factory=dict)  # op -> {reason}


class PropertyRun:
    """Tracks one property test across hypothesis' examples.

    Test bodies call :meth:`begin` with the drawn case, run backend ops through :meth:`call`,
    and report violations through :meth:`fail` (usually via :mod:`dsahal.conformance.assertions`).
    An example in which any op call was served by the reference counts as a fallback example;
    a test whose examples were all fallbacks is reported as "fallback", never as a pass.
    """

    def __init__(self, *, backend: str, table, op: str, prop: str, fmt: str | None, test_id: str,
                 device: str = "cpu"):
        self.backend, self.table, self.op, self.prop, self.fmt, self.test_id = backend, table, op, prop, fmt, test_id
        self.device = torch.device(device)
        self.examples: list[ExampleRecord] = []

    def __repr__(self) -> str:
        return f"PropertyRun(backend={self.backend!r}, prop={self.prop!r}, fmt={self.fmt!r})"

    @property
    def capabilities(self):
        return self.table.record.backend.capabilities

    def begin(self, case: Any) -> None:
        self.examples.append(ExampleRecord(case))

    @property
    def current(self) -> ExampleRecord:
        if not self.examples:
            raise RuntimeError(f"{self.test_id}: call run.begin(case) before running backend ops")
        return self.examples[-1]

    def build(self, case: Any) -> SimpleNamespace:
        """``case.build()`` with every tensor moved to the device under test. Views keep their
        strides and stay views of their (moved) base, so guarded page pools survive the move."""
        return place(case.build(), self.device)

    def call(self, thunk: Callable[[], Any]) -> Any:
        """Run ``thunk`` (which calls ``dsahal.ops``) under an observer and classify each call it made:
        served by a route of the backend, or by the reference (with why)."""
        with observe(CallLog()) as log:
            result = thunk()
        self.record_calls(log.calls)
        return result

    def record_calls(self, calls) -> None:
        """Fold observed calls (:class:`dsahal.registry.observers.CallRecord`) into the current example."""
        record = self.current
        for call in calls:
            if call.fallback:
                record.fallback_calls += 1
                record.fallback_ops.add(call.op)
                record.fallback_reasons.setdefault(call.op, set()).add(call.reason)
            else:
                record.native_calls += 1
            record.routes.add(f"{call.op}:{call.route}")

    @property
    def routes(self) -> dict[str, int]:
        """``{"op:route": examples it served}`` over every example of the property."""
        counts: dict[str, int] = {}
        for example in self.examples:
            for route in example.routes:
                counts[route] = counts.get(route, 0) + 1
        return counts

    @property
    def native_examples(self) -> int:
        return sum(1 for e in self.examples if e.native_calls and not e.fallback_calls)

    @property
    def fallback_examples(self) -> int:
        return sum(1 for e in self.examples if e.fallback_calls)

    def fallback_reason(self) -> str:
        ops = sorted({op for e in self.examples for op in e.fallback_ops})
        reasons = []
        for op in ops:
            entry = self.table.entries[op]
            seen = "; ".join(sorted({r for e in self.examples for r in e.fallback_reasons.get(op, ())}))
            reasons.append(f"{op}: {entry.reason}" if entry.status == "fallback"
                           else f"{op}: every route declined the drawn arguments ({seen or 'no reason'})")
        return "; ".join(reasons) or "no backend call was made"

    def fail(self, detail: str) -> None:
        case = self.current.case if self.examples else None
        raise PropertyViolation(format_failure(self, detail, case))


def default_device(backend) -> str:
    """The device a backend's ops expect, from its tags: CUDA/ROCm (and the PPU, which presents
    itself as CUDA) -> "cuda", XLA/TPU -> "xla", anything else -> "cpu"."""
    if backend.tags & {"cuda", "rocm"}:
        return "cuda"
    if backend.tags & {"xla", "tpu"}:
        return "xla"
    return "cpu"


def place(args: SimpleNamespace, device: torch.device) -> SimpleNamespace:
    if device.type == "cpu":
        return args
    moved_bases: dict[int, torch.Tensor] = {}

    def move(t: torch.Tensor) -> torch.Tensor:
        base = t if t._base is None else t._base
        if t._base is not None and not (base.is_contiguous() and base.storage_offset() == 0):
            return t.to(device)
        if id(base) not in moved_bases:
            moved_bases[id(base)] = base.to(device)
        moved = moved_bases[id(base)]
        return moved if t is base else moved.as_strided(t.size(), t.stride(), t.storage_offset())

    placed = SimpleNamespace(**{k: move(v) if isinstance(v, torch.Tensor) else v for k, v in vars(args).items()})
    guarded = getattr(args, "guarded", None)
    if guarded is not None:
        placed.guarded = type(guarded)(move(guarded.pool), move(guarded.pages), guarded.lead, guarded.guard_blocks)
    return placed


def format_failure(run: PropertyRun, detail: str, case: Any) -> str:
    seed = ("derandomized" if CONFIG.derandomize else
            f"{CONFIG.seed}" if CONFIG.seed is not None else "random")
    lines = [
        f"backend {run.backend!r} violates {run.prop} (op {run.op}"
        + (f", format {run.fmt}" if run.fmt else "") + ")",
        *("  " + line for line in detail.splitlines()),
        f"  drawn: {case!r}",
    ]
    shapes = getattr(case, "describe_shapes", None)
    if callable(shapes):
        lines.append(f"  shapes: {shapes()}")
    selection = "--derandomize" if CONFIG.derandomize else f"--seed {CONFIG.seed if CONFIG.seed is not None else 0}"
    plugins = os.environ.get("DSAHAL_PLUGIN_MODULES")
    env = f"DSAHAL_PLUGIN_MODULES={plugins} " if plugins else ""
    test_name = run.test_id.split("::")[-1].split("[")[0]
    lines += [
        f"  hypothesis seed: {seed}",
        "  reproduce:",
        f"    {env}dsahal conformance --backend {run.backend} --ops {run.op} {selection} -k '{test_name}'",
    ]
    snippet = getattr(case, "snippet", None)
    if callable(snippet):
        lines += ["    # or, self-contained (tensors are rebuilt from the drawn parameters):"]
        lines += ["    " + line for line in snippet(run.backend).splitlines()]
    return "\n".join(lines)
