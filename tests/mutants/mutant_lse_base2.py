"""Mutant: sparse MLA returns the log-sum-exp in base 2 instead of the natural log."""
import math

from dsahal.reference.sparse_mla import sparse_mla as reference_sparse_mla
from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "sparse_mla.matches_reference"


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    o, lse = reference_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)
    return o, lse / math.log(2.0)


@hookimpl
def dsahal_backends():
    return [mutant_backend("mutant_lse_base2", {"sparse_mla": sparse_mla}, description="lse in base 2")]
