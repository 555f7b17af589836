"""Shared driver of the "bad input raises the documented error" properties."""
from __future__ import annotations

from typing import Callable


def check_rejections(run, op: str, corruptions: dict[str, tuple[Callable[[], object], type]],
                     after_each: Callable[[str], None] | None = None) -> None:
    """Call every corrupted variant; each must raise its documented exception type with a message
    that starts ``dsahal.<op>:``. ``after_each(name)`` runs after each rejection (e.g. a guard check)."""
    for name, (call, expected) in corruptions.items():
        documented = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
        try:
            call()
        except expected as exc:
            if not str(exc).startswith(f"dsahal.{op}:"):
                run.fail(f"bad input '{name}' raised {type(exc).__name__} without naming the op: {exc}")
        except Exception as exc:  # noqa: BLE001 - any other exception is the violation we report
            run.fail(f"bad input '{name}' raised {type(exc).__name__} ({exc}), documented: {documented}")
        else:
            run.fail(f"bad input '{name}' was accepted, documented: {documented}")
        if after_each is not None:
            after_each(name)
