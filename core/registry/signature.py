"""Holding a route's implementation and verifier to its op's spec (:data:`dsahal.ops.catalog.SPECS`).

The table calls every route positionally in the spec's order. When a route is resolved, its
signature is read once:

- the spec's names in the spec's order, or ``*args``: used as it is;
- the spec's names in another order (a plugin written against an older order): wrapped so it is
  called by keyword, with a ``DeprecationWarning``;
- the spec's arity under other names: used positionally (names are the plugin's business);
- anything else (missing or extra required arguments): :class:`SignatureMismatch`, which makes the
  route unavailable with a reason naming the op, both argument lists and the backend.
"""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class SignatureMismatch(TypeError):
    """A route's implementation or verifier cannot take its op's arguments."""


def adapt_to_spec(op: str, fn: Callable[..., Any], who: str) -> Callable[..., Any]:
    """``fn`` itself, or a keyword-calling wrapper of it, such that ``fn(*spec_args)`` works."""
    from ..ops.catalog import SPECS  # (the ops package imports the registry: import at call time)

    params = SPECS[op].params
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to read, trust it
        return fn
    given = list(signature.parameters.values())
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in given):
        return fn
    positional = [p for p in given if p.kind in _POSITIONAL]
    names = tuple(p.name for p in positional)
    required = [p for p in given if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_KEYWORD,)]
    if names[:len(params)] == params and len(required) <= len(params):
        return fn
    if set(params) <= {p.name for p in given if p.kind is not inspect.Parameter.POSITIONAL_ONLY} \
            and len(required) <= len(params):
        warnings.warn(f"{who} takes dsahal.{op}'s arguments in an older order {names}; it is called by keyword "
                      f"now: declare it as ({', '.join(params)})", DeprecationWarning, stacklevel=2)

        @functools.wraps(fn)
        def by_keyword(*args):
            return fn(**dict(zip(params, args)))

        return by_keyword
    if len(positional) >= len(params) and len(required) <= len(params):
        return fn
    raise SignatureMismatch(f"{who} for dsahal.{op} takes ({', '.join(names)}); the op's spec passes "
                            f"({', '.join(params)})")
