"""A NaN-guarded, strided KDA state pool for the interpreter tests of the KDA kernels (shared by
tests/test_kda_chunk.py and tests/test_kda_decode_variants.py)."""
from __future__ import annotations

import torch

ROW_GAP, COL_PAD = 2, 8  # the pool view's rows are ROW_GAP buffer rows apart; each K row has COL_PAD spare floats


def pool_view(buffer: torch.Tensor, rows: int, value_dim: int) -> torch.Tensor:
    """The ``[rows, H, K, V]`` pool view of a :func:`strided_pool` buffer."""
    return buffer[2:2 + ROW_GAP * rows:ROW_GAP, :, :, :value_dim]


def strided_pool(rows: int, heads: int, key_dim: int, value_dim: int, seed: int):
    """``(buffer, pool)``: buffer ``[ROW_GAP * rows + 4, H, K, V + COL_PAD]``, pool the view
    ``buffer[2 : 2 + ROW_GAP * rows : ROW_GAP, :, :, :V]`` (``[rows, H, K, V]``, K stride ``V + COL_PAD``),
    random; every buffer element outside the view is NaN.

    Pool row -1 and pool row ``rows`` both lie inside the buffer (buffer rows 0 and ``2 + ROW_GAP * rows``),
    so a write at a padding id or one past the pool lands on bytes the check watches. The NaNs catch a
    read a correct kernel never makes: a K or V tail loaded without its mask (the slab of the last head
    runs into the guard row after it, the V tail into the spare columns) turns the output NaN, which a
    read-then-write-back of the same bits would not show in the pool."""
    gen = torch.Generator().manual_seed(seed)
    buffer = torch.full((ROW_GAP * rows + 4, heads, key_dim, value_dim + COL_PAD), float("nan"))
    pool = pool_view(buffer, rows, value_dim)
    pool.copy_(0.1 * torch.randn(pool.shape, generator=gen))
    assert pool.shape[0] == rows and pool.stride(2) == value_dim + COL_PAD and pool.stride(-1) == 1
    return buffer, pool


def pool_mask(buffer: torch.Tensor, rows: int, value_dim: int, live) -> torch.Tensor:
    """Bool mask over ``buffer``: True exactly on the pool view's elements of rows ``live``."""
    mask = torch.zeros(buffer.shape, dtype=torch.bool)
    pool_view(mask, rows, value_dim)[live] = True
    return mask
