"""Mutant: cache write also stamps each record into the next slot (an off-by-one store width)."""
from dsahal.formats import cache_format
from dsahal.reference.cache import split_slots
from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "cache_write.no_write_outside_slots"


def cache_write(values, slots, pages, kind, fmt, scale):
    keep = slots >= 0
    if not bool(keep.any()):
        return
    records = cache_format(kind, fmt).pack(values[keep], scale)
    num_slots = pages.shape[0] * pages.shape[1]
    neighbours = slots[keep].long() + 1
    inside = neighbours < num_slots
    block, offset = split_slots(neighbours[inside], pages.shape[1])
    pages[block, offset] = records[inside]
    block, offset = split_slots(slots[keep], pages.shape[1])
    pages[block, offset] = records


@hookimpl
def dsahal_backends():
    return [mutant_backend("mutant_cache_write_neighbour", {"cache_write": cache_write},
                           description="writes the neighbouring slot too")]
