"""Not a mutant: a correct backend with partial coverage, for the suite's fallback reporting.

It implements ``topk`` natively behind a verifier that accepts only rows of width <= 48 (the suite's
ordinary rows; its wide rows, past one kernel tile, decline), and
``lse_combine`` behind a verifier that rejects everything; every other op falls back to the
reference. The suite must report the fallbacks as "fallback", never as this backend's passes.
"""
from dsahal.reference.lse_combine import lse_combine
from dsahal.reference.topk import topk
from dsahal.registry import Backend, Capabilities, hookimpl


def narrow_rows_only(scores, lengths, k):
    return (scores.shape[1] <= 48, "needs rows of at most 48 scores")


def never(o_parts, lse_parts):
    return (False, "this device has no lse_combine kernel for these shapes")


@hookimpl
def dsahal_backends():
    return [Backend(name="partial", ops={"topk": topk, "lse_combine": lse_combine},
                    verifiers={"topk": narrow_rows_only, "lse_combine": never}, priority=-100,
                    capabilities=Capabilities(latent_formats=frozenset({"bf16"}), deterministic=True,
                                              distributed=False),
                    description="partial coverage, for fallback reporting tests")]
