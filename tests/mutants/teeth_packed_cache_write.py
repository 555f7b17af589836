"""Mutant: cache write addresses slot s at s * stride(1) from the page start (pages as if contiguous):
in the packed cache, every block but the first lands in other layers' pages."""
from dsahal.reference.cache import cache_write as reference_cache_write
from dsahal.registry import hookimpl

from mutant_base import mutant_backend
from strided_views import pages_as_flat_slots

BROKEN_PROPERTY = "cache_write.no_write_outside_slots"


def cache_write(values, slots, pages, kind, fmt, scale):
    reference_cache_write(values, slots, pages_as_flat_slots(pages), kind, fmt, scale)


@hookimpl
def dsahal_backends():
    return [mutant_backend("teeth_packed_cache_write", {"cache_write": cache_write},
                           description="cache write addresses pages as if contiguous")]
