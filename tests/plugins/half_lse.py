"""A correct plugin overriding one op (lse_combine) with a verifier that rejects fp16 inputs."""
import torch

from dsahal.registry import Backend, hookimpl

CALLS = {"lse_combine": 0}


def lse_combine(o_parts, lse_parts):
    CALLS["lse_combine"] += 1
    lse = torch.logsumexp(lse_parts, dim=0)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    weights = torch.where(torch.isfinite(lse)[None], torch.exp(lse_parts - safe[None]), torch.zeros_like(lse_parts))
    return (weights[..., None] * o_parts.float()).sum(0).to(o_parts.dtype), lse


def no_fp16(o_parts, lse_parts):
    if o_parts.dtype == torch.float16:
        return False, "fp16 partial outputs are not supported"
    return True, ""


@hookimpl
def dsahal_backends():
    return [Backend(name="halflse", ops={"lse_combine": lse_combine}, verifiers={"lse_combine": no_fp16},
                    tags=frozenset({"test"}), priority=10)]
