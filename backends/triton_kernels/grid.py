"""CUDA's cap on grid axes 1 and 2, and the consecutive ranges a launcher splits a longer count into.

CUDA launches at most 65,535 programs along grid axes 1 and 2 (axis 0: 2^31 - 1); a larger count fails
at launch ("invalid configuration argument"), whatever the kernel. A launcher that puts a count that
grows with the call (query tokens, splits of a slot list) on axis 1 or 2 keeps its single launch when
the count fits and otherwise launches the same kernel once per range of :func:`ranges`, on sub-views of
the tensors the kernel indexes by that program id: every program does the same work as in one launch,
so the results are bitwise the same.

Launchers read :data:`MAX_GRID_YZ` from this module at call time (``grid.MAX_GRID_YZ``, not a copy
imported by name), so a test can lower it to exercise the chunked path on tiny inputs.
"""
from __future__ import annotations

MAX_GRID_YZ = 65535  # programs along grid axis 1 or 2 (CUDA's gridDim.y / gridDim.z limit)


def ranges(count: int, limit: int | None = None) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: consecutive ranges covering ``[0, count)``, each at most ``limit`` long
    (default :data:`MAX_GRID_YZ`, read at call time); ``[]`` for ``count == 0``."""
    limit = MAX_GRID_YZ if limit is None else limit
    if limit < 1:
        raise ValueError(f"grid.ranges: limit expected >= 1 programs per grid axis, got {limit}")
    if count < 0:
        raise ValueError(f"grid.ranges: count expected >= 0, got {count}")
    return [(start, min(start + limit, count)) for start in range(0, count, limit)]
