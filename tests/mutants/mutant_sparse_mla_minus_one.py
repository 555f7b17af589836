"""Mutant: sparse MLA does not skip -1 slots (it reads slot -1, i.e. the pages' last record)."""
import torch

from dsahal.formats import LATENT_NOPE_DIM
from dsahal.reference.cache import read_tokens
from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "sparse_mla.skips_minus_one"


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    tokens, heads, _ = q.shape
    o = torch.zeros((tokens, heads, LATENT_NOPE_DIM), dtype=torch.float64)
    lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float64)
    for t in range(tokens):
        kv = read_tokens(kv_pages, slots[t], "latent", kv_fmt, kv_scale).double()  # -1 wraps to the last record
        logits = softmax_scale * (q[t].double() @ kv.T)
        lse[t] = torch.logsumexp(logits, dim=-1)
        o[t] = torch.softmax(logits, dim=-1) @ kv[:, :LATENT_NOPE_DIM]
    return o.to(q.dtype), lse.float()


@hookimpl
def dsahal_backends():
    return [mutant_backend("mutant_sparse_mla_minus_one", {"sparse_mla": sparse_mla},
                           description="-1 slots are attended to")]
