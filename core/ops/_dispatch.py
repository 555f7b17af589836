"""When a public op may skip the ``torch.library`` dispatcher.

The custom ops (``torch.ops.dsahal.*``) are what ``torch.compile``, ``make_fx`` and fake-tensor
tracing see; in plain eager code their dispatcher adds tens of microseconds per call for nothing.
So a public op calls its backend's table directly unless something is tracing: dynamo compiling,
or any torch dispatch mode active (fake tensors, proxy tracing, functionalization modes).
CUDA-graph capture is plain eager execution and takes the direct path.
"""
from __future__ import annotations

import torch

_is_compiling = torch.compiler.is_compiling
_dispatch_mode_depth = torch._C._len_torch_dispatch_stack


def tracing() -> bool:
    """True when the call must go through the custom op so a tracer records it."""
    return _is_compiling() or _dispatch_mode_depth() > 0


def recording(device) -> bool:
    """True when work done now is recorded rather than run, so its result must not be kept for later eager
    use: while tracing (the tensor would be a fake one) or while the current CUDA stream captures a graph
    (its kernels only run at replay: a tensor cached now would hold nothing until the first replay)."""
    if tracing():
        return True
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()
