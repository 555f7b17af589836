"""Mutant: sparse MLA reads its slots buffer as int32 words whatever its dtype (int64 slots become
interleaved low and high halves)."""
from dsahal.reference.sparse_mla import sparse_mla as reference_sparse_mla
from dsahal.registry import hookimpl

from mutant_base import mutant_backend
from strided_views import int64_read_as_int32

BROKEN_PROPERTY = "sparse_mla.matches_reference"


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    return reference_sparse_mla(q, kv_pages, int64_read_as_int32(slots), kv_fmt, kv_scale, softmax_scale)


@hookimpl
def dsahal_backends():
    return [mutant_backend("teeth_int64_slots", {"sparse_mla": sparse_mla}, description="int64 slots read as int32")]
