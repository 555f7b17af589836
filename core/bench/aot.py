"""Deprecated: moved to :mod:`dsahal.backends.nvidia.aot` (the sm_90 ahead-of-time compile of the
NVIDIA backend's kernel variants).

``python -m dsahal.bench.aot`` and ``dsahal.bench.aot.<name>`` still work, with a deprecation warning
(:mod:`.moved`).
"""
from .moved import forwarder, run_moved

MOVED_TO = "dsahal.backends.nvidia.aot"
__getattr__ = forwarder(__name__, MOVED_TO)

if __name__ == "__main__":
    run_moved("dsahal.bench.aot", MOVED_TO)
