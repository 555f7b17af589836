"""Mutant: LSE combine of a kernel that unrolls at most 8 partials and silently drops the rest
(DCP over 16 ranks, split-K over 9 parts)."""
from dsahal.reference.lse_combine import lse_combine as reference_lse_combine
from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "lse_combine.matches_reference"
MAX_PARTS = 8


def lse_combine(o_parts, lse_parts):
    return reference_lse_combine(o_parts[:MAX_PARTS], lse_parts[:MAX_PARTS])


@hookimpl
def dsahal_backends():
    return [mutant_backend("teeth_lse_eight_parts", {"lse_combine": lse_combine},
                           description="only the first 8 partials are combined")]
