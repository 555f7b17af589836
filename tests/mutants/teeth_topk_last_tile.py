"""Mutant: top-k that never reads the last, partial tile of a row longer than one tile (a loop over
length // 1024 tiles without the remainder)."""
from dsahal.registry import hookimpl

from mutant_base import mutant_backend
from tiled_topk import tiled_topk

BROKEN_PROPERTY = "topk.valid_selection"


def topk(scores, lengths, k):
    return tiled_topk(scores, lengths, k, drop_last_partial_tile=True)


@hookimpl
def dsahal_backends():
    return [mutant_backend("teeth_topk_last_tile", {"topk": topk}, description="last partial tile ignored")]
