"""The TPU plugin's declaration and probe, checked without torch_xla (the main suite's torch 2.13).

The XLA formulations themselves are tested in tests_tpu/ (scripts/test-tpu.sh, .venv-tpu)."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from dsahal.backends.tpu import plugin
from dsahal.ops.catalog import OP_NAMES


def test_discovery_imports_neither_torch_xla_nor_the_ops_module():
    plugin.tpu_backend()
    assert "dsahal.backends.tpu.ops" not in sys.modules
    if importlib.util.find_spec("torch_xla") is None:
        assert "torch_xla" not in sys.modules


def test_the_backend_claims_every_op_and_names_its_ops_lazily():
    backend = plugin.tpu_backend()
    assert set(backend.ops) == set(OP_NAMES)
    routes = [route for op in OP_NAMES for route in backend.routes(op)]
    assert [r.name for r in routes] == ["xla"] * len(OP_NAMES)
    assert all(isinstance(r.fn, str) and r.fn.startswith("dsahal.backends.tpu.ops:") for r in routes)
    assert set(backend.capabilities.unverified) == set(OP_NAMES)  # never claimed verified on a TPU


def test_probe_without_torch_xla_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(plugin.importlib.util, "find_spec", lambda name: None)
    ok, reason = plugin.probe()
    assert not ok and "dsahal[tpu]" in reason


def test_probe_rejects_a_torch_xla_built_for_another_torch(monkeypatch):
    monkeypatch.setattr(plugin.importlib.util, "find_spec", lambda name: object())
    versions = {"torch_xla": "2.9.0", "torch": "2.13.0+cpu"}
    monkeypatch.setattr(plugin, "_version", lambda name: versions.get(name))
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    ok, reason = plugin.probe()
    assert not ok and "torch_xla 2.9.0 needs torch 2.9.*, found torch 2.13.0+cpu" in reason


@pytest.mark.parametrize("device,available", [(None, False), ("CPU", True), ("TPU", True)])
def test_probe_needs_an_explicit_pjrt_device(monkeypatch, device, available):
    monkeypatch.setattr(plugin.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(plugin, "_version", lambda name: "2.9.0")
    if device is None:
        monkeypatch.delenv("PJRT_DEVICE", raising=False)
    else:
        monkeypatch.setenv("PJRT_DEVICE", device)
    ok, reason = plugin.probe()
    assert ok is available
    if device == "CPU":
        assert "not a TPU" in reason
    if device is None:
        assert "PJRT_DEVICE is not set" in reason


def test_verifiers_route_unclaimed_formats_away_and_accept_claimed_ones():
    from dsahal.backends.tpu import support

    assert support.verify_sparse_mla(None, None, None, "bf16", None, 1.0) == (True, "")
    ok, reason = support.verify_cache_write(None, None, None, "latent", "fp6_future", None)
    assert not ok and "fp6_future" in reason
