"""The bench's one error measure, shared by the cases' checks, the model step and the multi-GPU bench."""
from __future__ import annotations

import torch


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Normwise ``|a - b| / |b|`` in float64 (the bench's and its checks' one measure)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
