"""Let dsahal's in-place custom ops run on functionalized XLA tensors.

torch-xla runs eager XLA tensors through functionalization, whose generic fallback refuses
custom ops that mutate an argument (``dsahal::cache_write`` writes ``pages``,
``dsahal::kda_decode`` / ``kda_prefill`` write ``state_pool``): "Found a custom (non-ATen)
operator whose output has alias annotations". Registering a kernel at the ``Functionalize``
key for exactly those ops lets the op body run on the functional tensors themselves; its
in-place ATen ops (``index_put_`` into the page or pool view) are then functionalized one by
one as ordinary XLA code, and the write propagates through views to the base tensor.

The kernel dispatches through the active op table like the custom op's own body, so it is
backend-neutral; it is registered when the TPU backend's ops are first imported.
"""
from __future__ import annotations

import torch

from dsahal.registry.state import active_table

MUTATING_OPS = ("cache_write", "kda_decode", "kda_prefill")

_library: torch.library.Library | None = None


def _kernel(op: str):
    def run(*args):
        return active_table().call(op, *args)
    return run


def register() -> None:
    """Idempotent: register the Functionalize kernels once per process."""
    global _library
    if _library is not None:
        return
    import dsahal.ops  # noqa: F401 - defines the dsahal:: custom ops before we add kernels to them

    library = torch.library.Library("dsahal", "IMPL")
    for op in MUTATING_OPS:
        library.impl(op, _kernel(op), "Functionalize")
    _library = library
