"""Which backend claims a CUDA device: the PPU presents itself to torch as CUDA, so the ``ppu`` and
``nvidia`` probes must split every device between them, never both. Only the probes' *inputs* are
faked here (torch's device answers, the PPU_SDK environment, a ``ppu-smi`` executable on PATH);
the probes, discovery and selection run for real."""
import os
import stat

import pytest
import torch

from dsahal.backends.ppu.detect import classify_cuda_device, ppu_evidence
from dsahal.registry import registry, select

NVIDIA_NAMES = ("NVIDIA H200", "Tesla T4", "NVIDIA GeForce RTX 4090")
PPU_NAMES = ("T-HEAD PPU M890", "Zhenwu 810E")
NEUTRAL_NAME = "CUDA-compatible accelerator"


def _fake_cuda_device(monkeypatch, name: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def _put_ppu_smi_on_path(monkeypatch, tmp_path) -> str:
    tool = tmp_path / "bin" / "ppu-smi"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho 'PPU 0: fake'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return str(tool)


def _claimants() -> set[str]:
    records = registry().records
    return {name for name in ("nvidia", "ppu") if records[name].available}


@pytest.fixture
def no_ppu_signs(monkeypatch, tmp_path):
    """An environment with neither PPU_SDK nor ppu-smi, whatever the machine running the tests has."""
    monkeypatch.delenv("PPU_SDK", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))


@pytest.mark.parametrize("sdk", [False, True], ids=["no-sdk", "PPU_SDK"])
@pytest.mark.parametrize("tool", [False, True], ids=["no-tool", "ppu-smi"])
@pytest.mark.parametrize("name", NVIDIA_NAMES + PPU_NAMES + (NEUTRAL_NAME,))
def test_exactly_one_of_nvidia_and_ppu_claims_a_cuda_device(monkeypatch, tmp_path, no_ppu_signs, name, sdk, tool):
    _fake_cuda_device(monkeypatch, name)
    if sdk:
        monkeypatch.setenv("PPU_SDK", "/opt/ppu-sdk")
    if tool:
        _put_ppu_smi_on_path(monkeypatch, tmp_path)
    if name in PPU_NAMES:
        expected = "ppu"
    elif name in NVIDIA_NAMES:
        expected = "nvidia"  # a stray PPU SDK on an NVIDIA machine never hands it to the ppu backend
    else:
        expected = "ppu" if (sdk or tool) else "nvidia"
    assert _claimants() == {expected}
    assert select(registry()).backend.name == expected


def test_nvidia_device_with_ppu_sdk_reports_the_ignored_signs(monkeypatch, no_ppu_signs):
    _fake_cuda_device(monkeypatch, "NVIDIA H200")
    monkeypatch.setenv("PPU_SDK", "/opt/ppu-sdk")
    record = registry().records["ppu"]
    assert not record.available
    assert "'NVIDIA H200' is NVIDIA" in record.reason and "ignored: PPU_SDK=/opt/ppu-sdk" in record.reason


def test_ppu_probe_names_the_evidence_it_found(monkeypatch, tmp_path, no_ppu_signs):
    _fake_cuda_device(monkeypatch, NEUTRAL_NAME)
    tool = _put_ppu_smi_on_path(monkeypatch, tmp_path)
    record = registry().records["ppu"]
    assert record.available and f"ppu-smi at {tool}" in record.reason
    assert "refuse" not in record.reason
    assert "T-HEAD PPU" in registry().records["nvidia"].reason


def test_ppu_needs_a_cuda_device_even_with_every_other_sign(monkeypatch, tmp_path, no_ppu_signs):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("PPU_SDK", "/opt/ppu-sdk")
    _put_ppu_smi_on_path(monkeypatch, tmp_path)
    record = registry().records["ppu"]
    assert not record.available
    assert "no CUDA-compatible device" in record.reason and "PPU_SDK=/opt/ppu-sdk" in record.reason


def test_ppu_refuses_a_rocm_torch(monkeypatch, no_ppu_signs):
    _fake_cuda_device(monkeypatch, NEUTRAL_NAME)
    monkeypatch.setenv("PPU_SDK", "/opt/ppu-sdk")
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    record = registry().records["ppu"]
    assert not record.available and "ROCm" in record.reason


def test_ppu_wins_automatic_selection_over_the_reference(monkeypatch, no_ppu_signs):
    _fake_cuda_device(monkeypatch, "Zhenwu M890")
    assert select(registry()).backend.name == "ppu"


def test_ppu_backend_declares_its_tags_and_unverified_ops():
    backend = registry().records["ppu"].backend
    assert backend.tags == frozenset({"gpu", "cuda", "ppu"})
    assert set(backend.capabilities.unverified) == set(backend.ops)
    assert all("never run on PPU hardware" in why for why in backend.capabilities.unverified.values())


def test_classification_uses_only_its_injected_inputs():
    no_tool = lambda name: None  # noqa: E731
    assert not classify_cuda_device({}, no_tool, None).is_ppu
    assert classify_cuda_device({"PPU_SDK": "/sdk"}, no_tool, None).is_ppu
    assert classify_cuda_device({}, lambda name: "/usr/bin/ppu-smi", "Some GPU").evidence == (
        "ppu-smi at /usr/bin/ppu-smi",)
    assert ppu_evidence({"PPU_SDK": "/sdk"}, no_tool, "NVIDIA A100-SXM4-80GB") == []
    assert ppu_evidence({}, no_tool, "zhenwu 810e") == ["device name 'zhenwu 810e'"]
