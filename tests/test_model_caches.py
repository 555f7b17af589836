"""The model's per-device caches (RoPE frequencies, the indexer's Hadamard matrix) are filled only by work that
runs: never while tracing (the tensor would be a fake one) nor while a CUDA graph is captured (its kernels are
recorded, not run: a cached tensor would hold nothing until the first replay, and an eager step before that
would read it)."""
import torch

from dsahal.model import indexer, rope
from dsahal.ops import _dispatch


def test_recording_is_tracing_or_a_capturing_cuda_stream(monkeypatch):
    assert not _dispatch.recording("cpu")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert _dispatch.recording("cuda") and _dispatch.recording(torch.device("cuda", 0))
    assert not _dispatch.recording("cpu")  # a CPU tensor is computed at once, capture or not
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(_dispatch, "tracing", lambda: True)
    assert _dispatch.recording("cpu")


def test_the_caches_keep_what_ran_and_nothing_recorded(monkeypatch):
    indexer._SYLVESTER.clear()
    rope._INV_FREQ.clear()
    table = rope.Rope(dim=16, theta=10000.0)
    monkeypatch.setattr(indexer, "recording", lambda device: True)
    indexer._sylvester(8, "cpu", torch.float32)
    assert not indexer._SYLVESTER
    monkeypatch.setattr(indexer, "recording", lambda device: False)
    first = indexer._sylvester(8, "cpu", torch.float32)
    assert indexer._sylvester(8, "cpu", torch.float32) is first and len(indexer._SYLVESTER) == 1
    monkeypatch.setattr(rope, "recording", lambda device: True)
    table.inv_freq("cpu", torch.float64)
    assert not rope._INV_FREQ
    monkeypatch.setattr(rope, "recording", lambda device: False)
    kept = table.inv_freq("cpu", torch.float64)
    assert table.inv_freq("cpu", torch.float64) is kept
