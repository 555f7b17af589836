"""Deprecated: moved to :mod:`dsahal.backends.nvidia.tune` (the block-size sweep of the shared Triton kernels on a GPU).

``python -m dsahal.bench.tune`` and ``dsahal.bench.tune.<name>`` still work, with a deprecation warning
(:mod:`.moved`).
"""
from .moved import forwarder, run_moved

MOVED_TO = "dsahal.backends.nvidia.tune"
__getattr__ = forwarder(__name__, MOVED_TO)

if __name__ == "__main__":
    run_moved("dsahal.bench.tune", MOVED_TO)
