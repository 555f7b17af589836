"""Mutant: top-k whose tie candidates are gathered tile by tile, last tile first (right in every row of
one tile; rows of ties wider than a tile give ties to larger indices)."""
from dsahal.registry import hookimpl

from mutant_base import mutant_backend
from tiled_topk import tiled_topk

BROKEN_PROPERTY = "topk.exact_tie_rule"


def topk(scores, lengths, k):
    return tiled_topk(scores, lengths, k, ties_last_tile_first=True)


@hookimpl
def dsahal_backends():
    return [mutant_backend("teeth_topk_tile_ties", {"topk": topk}, description="ties resolved last tile first")]
