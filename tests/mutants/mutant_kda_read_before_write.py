"""Mutant: KDA decode reads the output from the decayed state before the delta-rule write."""
import torch

from dsahal.reference.kda import _prepare
from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "kda_decode.matches_reference"


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    q64, k64 = _prepare(q, k, use_qk_l2norm)
    live = state_ids >= 0
    out = torch.zeros(v.shape, dtype=torch.float64)
    if bool(live.any()):
        ids = state_ids[live].long()
        state = state_pool[ids].double() * torch.exp(g[live].double())[..., :, None]
        o = torch.einsum("...kv,...k->...v", state, scale * q64[live])  # read too early
        u = beta[live].double()[..., None] * (v[live].double() - torch.einsum("...kv,...k->...v", state, k64[live]))
        state = state + k64[live][..., :, None] * u[..., None, :]
        state_pool[ids] = state.float()
        out[live] = o
    return out.to(q.dtype)


@hookimpl
def dsahal_backends():
    return [mutant_backend("mutant_kda_read_before_write", {"kda_decode": kda_decode},
                           description="KDA output read before the state write")]
