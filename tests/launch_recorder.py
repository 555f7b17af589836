"""A stand-in for a launched kernel in CPU tests of Gluon launchers (shared by tests/test_sparse_mla_wgmma.py and
tests/test_sparse_mla_wgmma_fp4.py): the kernels cannot run here, so their launches are recorded instead."""
from __future__ import annotations


class LaunchRecorder:
    """Stands in for a launched kernel: records ``kernel[grid](*args, **kwargs)`` as ``(grid, args, kwargs)``."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))
