"""The ``example`` backend: one op (``lse_combine``) in plain torch; every other op falls back
to dsahal's reference. dsahal imports this module through the ``dsahal.backends`` entry point
and calls :func:`dsahal_backends` once, at start-up."""
from __future__ import annotations

from dsahal.registry import Backend, Capabilities, Route, hookimpl


def probe() -> tuple[bool, str]:
    """Cheap and side-effect free. A real backend checks for its hardware here; this one needs
    only torch, which dsahal itself needs, so it is available wherever dsahal is."""
    import torch

    return True, f"plain torch {torch.__version__}, any device"


def example_backend() -> Backend:
    return Backend(
        name="example",
        # Each op is an ordered list of routes; "module:attribute" strings are imported only when the
        # backend is selected. The verifier declines what the route cannot serve (the reference then does).
        ops={"lse_combine": [Route("torch", "dsahal_example.lse_combine:lse_combine",
                                   "dsahal_example.lse_combine:verify_lse_combine",
                                   description="plain torch, contiguous inputs")]},
        tags=frozenset({"example", "cpu"}),
        # Below the reference (0): installing the example never changes what a machine runs by
        # default; select it by name with DSAHAL_BACKEND=example.
        priority=-1,
        probe=probe,
        capabilities=Capabilities(deterministic=False, batch_invariant=False),
        description="teaching example: lse_combine in plain torch",
    )


@hookimpl
def dsahal_backends():
    return [example_backend()]
