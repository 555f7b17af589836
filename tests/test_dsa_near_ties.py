"""The DSA layer property's near-tie rule (``conformance/test_dsa_attention.py``): a row whose k-th place an indexer
within tolerance may legitimately swap is left out of the output comparison, judged against the scores' terms'
magnitudes, not the scores themselves."""
from __future__ import annotations

import torch

from dsahal.conformance.test_dsa_attention import NEAR_TIE_RTOL, ambiguous_rows


def _rows(scores, magnitudes, k=2, exact_ties_too=True):
    scores = torch.tensor(scores, dtype=torch.float64)
    magnitudes = torch.tensor(magnitudes, dtype=torch.float64)
    lengths = torch.full((scores.shape[0],), scores.shape[1], dtype=torch.int32)
    return ambiguous_rows(scores, magnitudes, lengths, k, exact_ties_too).tolist()


def test_a_cancelling_near_tie_is_ambiguous_and_a_clear_gap_is_not():
    # the thirty-ninth session's draw: 4th and 5th scores 0.1774 / 0.1736, the 4th a sum of terms of magnitude 12.9
    scores = [[3.0, 0.1774, 0.1736, -1.0], [3.0, 0.1774, 0.1736, -1.0], [3.0, 2.0, 1.0, -1.0]]
    magnitudes = [[3.0, 12.9, 0.1736, 1.0], [3.0, 0.1774, 0.1736, 1.0], [3.0, 2.0, 1.0, 1.0]]
    assert 0.1774 - 0.1736 <= NEAR_TIE_RTOL * 12.9 and 0.1774 - 0.1736 > NEAR_TIE_RTOL * 0.1774
    assert _rows(scores, magnitudes) == [True, False, False]


def test_exact_ties_count_only_when_asked_and_short_rows_never():
    scores = [[5.0, 1.0, 1.0, 0.0], [5.0, 1.0, float("-inf"), float("-inf")]]
    magnitudes = [[5.0, 1.0, 1.0, 0.0], [5.0, 1.0, 0.0, 0.0]]
    assert _rows(scores, magnitudes, exact_ties_too=True) == [True, False]  # (row 1: two finite scores, k = 2)
    assert _rows(scores, magnitudes, exact_ties_too=False) == [False, False]  # (a deterministic backend: ties exact)
