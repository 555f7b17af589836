"""Static sizes for XLA: length buckets and token tiles.

Every distinct input shape is a new XLA compilation. A serving loop keeps the number of
graphs small by padding the lengths that grow step by step (context length, batch size) up to
a bucket: :func:`length_bucket` gives powers of two from a floor, so decode steps whose
context falls in one bucket share one compiled graph. Inside an op, work over many query
tokens is cut into tiles of a static size (:func:`token_tiles`) so the dense intermediates
(``[tile, context, 128]`` keys, ``[tile, heads, k]`` logits) stay within a memory budget.
"""
from __future__ import annotations

MIN_BUCKET = 128
TILE_ELEMENT_BUDGET = 1 << 25  # fp32 elements of the largest per-tile intermediate (128 MiB)


def length_bucket(length: int, minimum: int = MIN_BUCKET) -> int:
    """The smallest power of two >= ``length`` and >= ``minimum``."""
    if length < 0:
        raise ValueError(f"length_bucket: expected a length >= 0, got {length}")
    bucket = max(1, minimum)
    while bucket < length:
        bucket *= 2
    return bucket


def token_tiles(tokens: int, elements_per_token: int, budget: int = TILE_ELEMENT_BUDGET) -> list[slice]:
    """Slices covering ``range(tokens)`` whose tiles hold at most ``budget`` elements (at least 1
    token each). All tiles but the last have the same size, so they share one XLA sub-graph shape."""
    tile = max(1, budget // max(1, elements_per_token))
    return [slice(start, min(start + tile, tokens)) for start in range(0, tokens, tile)]
