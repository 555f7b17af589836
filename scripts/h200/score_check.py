"""How the indexer scripts of this folder compare scores with the float64 reference."""


def score_error(torch, got, want):
    """``[T, W]`` scores against the reference's: (relative norm error on the reference's finite scores,
    whether the -inf mask is the same: finite where the reference is, -inf elsewhere)."""
    finite = torch.isfinite(want)
    same = torch.equal(torch.isfinite(got), finite) and bool(torch.isneginf(got[~finite]).all())
    diff = (got[finite].double() - want[finite].double()).norm()
    return float(diff / want[finite].double().norm().clamp_min(1e-300)), same
