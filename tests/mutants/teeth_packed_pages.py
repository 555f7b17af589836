"""Mutant: sparse MLA reads the latent pages as if blocks were back to back (slot s at s * stride(1)):
right for a page tensor of its own, wrong for a layer's pages in the packed cache (stride(0) = row_bytes),
where it reads other layers' bytes."""
from dsahal.reference.sparse_mla import sparse_mla as reference_sparse_mla
from dsahal.registry import hookimpl

from mutant_base import mutant_backend
from strided_views import pages_as_flat_slots

BROKEN_PROPERTY = "sparse_mla.matches_reference"


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    return reference_sparse_mla(q, pages_as_flat_slots(kv_pages), slots, kv_fmt, kv_scale, softmax_scale)


@hookimpl
def dsahal_backends():
    return [mutant_backend("teeth_packed_pages", {"sparse_mla": sparse_mla},
                           description="latent pages addressed as if contiguous")]
