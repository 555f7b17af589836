"""The PPU backend's op table on the CPU, for machines without a PPU.

Not loaded by default (no entry point): name it in ``DSAHAL_PLUGIN_MODULES`` to register the
backend ``ppu-cpu-twin``, which serves exactly the ``ppu`` backend's routes on any
device, so the conformance suite can check the portable formulations the PPU would run::

    DSAHAL_PLUGIN_MODULES=dsahal.backends.ppu.cpu_twin dsahal conformance --backend ppu-cpu-twin

It proves the formulations, not the PPU: nothing here touches PPU hardware or its toolchain.
"""
from __future__ import annotations

from dsahal.registry import Backend, Capabilities, hookimpl

from .plugin import routes

NAME = "ppu-cpu-twin"


def probe() -> tuple[bool, str]:
    return True, "the ppu backend's portable ops on whatever device the tensors are on (no PPU involved)"


def ppu_cpu_twin_backend() -> Backend:
    return Backend(
        name=NAME,
        ops=routes(),
        tags=frozenset({"cpu", "ppu-twin"}),
        priority=-1,  # never chosen automatically, only by name
        probe=probe,
        capabilities=Capabilities(deterministic=True, batch_invariant=False, distributed=True),
        description="the ppu backend's op table on the CPU (checks its formulations, not PPU hardware)",
    )


@hookimpl
def dsahal_backends():
    return [ppu_cpu_twin_backend()]
