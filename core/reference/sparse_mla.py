"""Reference sparse MLA: per query token, gather its slots, dense softmax attention in float64."""
from __future__ import annotations

import torch

from ..formats import LATENT_NOPE_DIM
from .cache import read_tokens


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    tokens, heads, _ = q.shape
    o = torch.zeros((tokens, heads, LATENT_NOPE_DIM), dtype=torch.float64, device=q.device)
    lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float64, device=q.device)
    for t in range(tokens):
        chosen = slots[t][slots[t] >= 0]
        if chosen.numel() == 0:
            continue  # nothing to attend to: o = 0, lse = -inf
        kv = read_tokens(kv_pages, chosen, "latent", kv_fmt, kv_scale).double()  # [S, 576]
        logits = softmax_scale * (q[t].double() @ kv.T)  # [H, S]
        lse[t] = torch.logsumexp(logits, dim=-1)
        o[t] = torch.softmax(logits, dim=-1) @ kv[:, :LATENT_NOPE_DIM]
    return o.to(q.dtype), lse.float()
