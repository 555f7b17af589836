"""Mutant: KDA decode addresses the state pool as if contiguous (state i at i * H*K*V): in the packed
cache's state view (stride(0) = rows_per_state * row_bytes) it reads and overwrites other layers' states."""
from dsahal.reference.kda import kda_decode as reference_kda_decode
from dsahal.registry import hookimpl

from mutant_base import mutant_backend
from strided_views import as_if_contiguous

BROKEN_PROPERTY = "kda_decode.matches_reference"


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    return reference_kda_decode(q, k, v, g, beta, as_if_contiguous(state_pool), state_ids, scale, use_qk_l2norm)


@hookimpl
def dsahal_backends():
    return [mutant_backend("teeth_kda_contiguous_pool", {"kda_decode": kda_decode},
                           description="state pool addressed as if contiguous")]
