"""How the sparse-MLA check scripts of this folder judge an edge case against the float64 reference (the indexer
scripts' twin is ``score_check.py``)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class EdgeErrors:
    """A case's errors: ``o`` the relative norm error over the rows with slots, ``head`` the worst head's, ``lse`` the
    largest lse error relative past 1 (or past the given floor), ``empty`` whether the last row (no valid slot) gave
    o = 0 and lse = -inf, ``finite`` whether every other row's lse is finite."""

    o: float
    head: float
    lse: float
    empty: bool
    finite: bool


def edge_errors(torch, o, lse, want_o, want_lse, lse_floor=None) -> EdgeErrors:
    """A kernel's ``o [T, H, 512]`` and ``lse [T, H]`` (any device and float dtype) against the reference's, whose
    last row has no valid slot. ``lse_floor`` (``[T, H]``, optional): each lse error relative to the larger of |lse|
    and it (e.g. a row's largest sum |q k|: an FP8-accumulated logit's error grows with it), past 1 either way."""
    o, lse = o.float().cpu().double(), lse.float().cpu().double()
    want_o, want_lse = want_o.double(), want_lse.double()
    diff_o = o[:-1] - want_o[:-1]
    head = (diff_o.norm(dim=(0, 2)) / want_o[:-1].norm(dim=(0, 2)).clamp(min=1e-30)).max()
    finite = torch.isfinite(want_lse)
    scale = want_lse[finite].abs()
    if lse_floor is not None:
        scale = torch.maximum(scale, lse_floor[finite].double())
    lse_err = ((lse[finite] - want_lse[finite]).abs() / scale.clamp(min=1.0)).max()
    return EdgeErrors(o=float(diff_o.norm() / want_o[:-1].norm()), head=float(head), lse=float(lse_err),
                      empty=bool(torch.isneginf(lse[-1]).all()) and bool((o[-1] == 0).all()),
                      finite=bool(torch.isfinite(lse[:-1]).all()))
