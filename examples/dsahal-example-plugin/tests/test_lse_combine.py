"""The example's own quick checks (pytest tests/); the full certification is the conformance suite."""
import torch

from dsahal.reference.lse_combine import lse_combine as reference_lse_combine
from dsahal_example.lse_combine import lse_combine, verify_lse_combine


def test_matches_the_reference_with_dead_partials():
    o_parts, lse_parts = torch.randn(3, 4, 2, 8), 10 * torch.randn(3, 4, 2)
    lse_parts[1, :2] = float("-inf")
    lse_parts[:, 3, 0] = float("-inf")  # a row with no live partial: o = 0, lse = -inf
    o, lse = lse_combine(o_parts, lse_parts)
    o_ref, lse_ref = reference_lse_combine(o_parts, lse_parts)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, lse_ref)


def test_verifier_rejects_non_contiguous_inputs():
    o_parts = torch.randn(3, 4, 2, 16)[..., ::2]
    ok, reason = verify_lse_combine(o_parts, torch.randn(3, 4, 2))
    assert not ok and "contiguous" in reason
