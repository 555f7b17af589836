"""Mutant: sparse MLA takes q's data pointer with row-major strides (rows assumed H*576 apart):
right for a q of its own, wrong for q sliced out of a fused projection output."""
from dsahal.reference.sparse_mla import sparse_mla as reference_sparse_mla
from dsahal.registry import hookimpl

from mutant_base import mutant_backend
from strided_views import as_if_contiguous

BROKEN_PROPERTY = "sparse_mla.matches_reference"


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    return reference_sparse_mla(as_if_contiguous(q), kv_pages, slots, kv_fmt, kv_scale, softmax_scale)


@hookimpl
def dsahal_backends():
    return [mutant_backend("teeth_fused_q", {"sparse_mla": sparse_mla}, description="q read as if contiguous")]
