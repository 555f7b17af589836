"""Mutant: LSE combine accumulating the partials in fp32 in an order that changes from call to call
(as atomics or a work-stealing split would), while the backend claims determinism. Every result is
within tolerance; the same call twice differs in the last bits."""
import itertools

import torch

from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "lse_combine.bitwise_repeatable"
_CALLS = itertools.count()


def lse_combine(o_parts, lse_parts):
    parts = o_parts.shape[0]
    order = range(parts) if next(_CALLS) % 2 == 0 else reversed(range(parts))
    lse = torch.logsumexp(lse_parts.float(), dim=0)
    finite = torch.isfinite(lse)
    o = torch.zeros(o_parts.shape[1:], dtype=torch.float32, device=o_parts.device)
    for w in order:
        weight = torch.where(finite, torch.exp(lse_parts[w].float() - torch.where(finite, lse, 0.0)), 0.0)
        o = o + weight[..., None] * o_parts[w].float()
    return o.to(o_parts.dtype), lse


@hookimpl
def dsahal_backends():
    return [mutant_backend("teeth_lse_nondeterministic", {"lse_combine": lse_combine},
                           description="reduction order changes per call")]
