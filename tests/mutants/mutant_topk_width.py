"""Mutant: top-k writes its set best first for narrow calls and in index order for wide ones (a backend that
picks its kernel by the call's width, kernels that order the slots differently), while claiming batch invariance:
a row's slots, the sparse-MLA sum's order, then depend on the call's width."""
import torch

from dsahal.reference.topk import topk as reference_topk
from dsahal.registry import hookimpl

from mutant_base import mutant_backend

BROKEN_PROPERTY = "topk.batch_invariant"
WIDE = 64  # columns from which the "long-row kernel" (index order) is taken


def topk(scores, lengths, k):
    ids = reference_topk(scores, lengths, k)  # best first, -1 padding last
    if scores.shape[1] < WIDE:
        return ids
    # the same set in index order, -1 padding still last
    last = torch.iinfo(torch.int32).max
    ordered = torch.sort(torch.where(ids < 0, last, ids), dim=1).values
    return torch.where(ordered == last, -1, ordered).to(torch.int32)


@hookimpl
def dsahal_backends():
    return [mutant_backend("mutant_topk_width", {"topk": topk}, batch_invariant=True,
                           description="top-k slot order depends on the call's width")]
