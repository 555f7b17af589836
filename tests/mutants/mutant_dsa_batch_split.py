"""Mutant: the DSA layer composed from ops whose sparse MLA splits its reduction by the batch size
(:mod:`mutant_batch_split`'s), while claiming batch invariance: a token's layer output depends on the batch."""
from dsahal.registry import hookimpl

from mutant_base import mutant_backend
from mutant_batch_split import sparse_mla

BROKEN_PROPERTY = "dsa_attention.batch_invariant"


@hookimpl
def dsahal_backends():
    # no dsa_attention of its own: the registry composes the layer from these ops
    return [mutant_backend("mutant_dsa_batch_split", {"sparse_mla": sparse_mla}, batch_invariant=True,
                           description="the DSA layer's sparse MLA splits by the batch size")]
