"""Mutant: sparse MLA in fp32 with a split-K reduction whose split count depends on the batch size
(the classic way a decode kernel loses batch invariance), while claiming batch invariance."""
import torch

from dsahal.formats import LATENT_NOPE_DIM
from dsahal.reference.cache import read_tokens
from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "sparse_mla.batch_invariant"


def _row(q, kv, softmax_scale, splits):
    logits = softmax_scale * (q.float() @ kv.T)  # [H, S]
    lse_parts, o_parts = [], []
    for columns in torch.arange(kv.shape[0]).chunk(splits):
        part = logits[:, columns]
        lse_parts.append(torch.logsumexp(part, dim=-1))
        o_parts.append(torch.softmax(part, dim=-1) @ kv[columns, :LATENT_NOPE_DIM])
    lse_parts = torch.stack(lse_parts)
    lse = torch.logsumexp(lse_parts, dim=0)
    o = (torch.exp(lse_parts - lse)[..., None] * torch.stack(o_parts)).sum(dim=0)
    return o, lse


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    tokens, heads, _ = q.shape
    splits = 1 if tokens == 1 else 4  # a lone row gets one split, a batch four: rounding differs
    o = torch.zeros((tokens, heads, LATENT_NOPE_DIM), dtype=torch.float32)
    lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float32)
    for t in range(tokens):
        chosen = slots[t][slots[t] >= 0]
        if chosen.numel():
            kv = read_tokens(kv_pages, chosen, "latent", kv_fmt, kv_scale).float()
            o[t], lse[t] = _row(q[t], kv, softmax_scale, splits)
    return o.to(q.dtype), lse


@hookimpl
def dsahal_backends():
    return [mutant_backend("mutant_batch_split", {"sparse_mla": sparse_mla}, batch_invariant=True,
                           description="split-K count depends on the batch size")]
