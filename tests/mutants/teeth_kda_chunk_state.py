"""Mutant: chunked KDA prefill that stores the final state from its tail-chunk branch only: for a
sequence that is a whole number of 64-token chunks it stores the state before the last chunk. The
outputs are right; the state (and every decode step after it) is not."""
import torch

from dsahal.reference.kda import CHUNK_SIZE, _prepare, chunked_sequence
from dsahal.reference.kda import kda_prefill as reference_kda_prefill
from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "kda_prefill.matches_reference"


def kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    bounds = cu_seqlens.tolist()
    initial = {int(s): state_pool[int(s)].clone() for s in state_ids.tolist() if int(s) >= 0}
    out = reference_kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm)
    q64, k64 = _prepare(q, k, use_qk_l2norm)
    for b, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        sid = int(state_ids[b])
        if sid >= 0 and end > start and (end - start) % CHUNK_SIZE == 0:
            cut = end - CHUNK_SIZE  # the last whole chunk's update is never stored
            state, _ = chunked_sequence(initial[sid].double(), q64[start:cut], k64[start:cut],
                                        v[start:cut].double(), g[start:cut].double(), beta[start:cut].double(), scale)
            state_pool[sid] = state.to(torch.float32)
    return out


@hookimpl
def dsahal_backends():
    return [mutant_backend("teeth_kda_chunk_state", {"kda_prefill": kda_prefill},
                           description="final state of whole-chunk sequences not stored")]
