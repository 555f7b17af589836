"""One distribution, one import name: a built wheel holds dsahal, dsahal.backends and dsahal.conformance."""
import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_built_wheel_contains_the_three_packages_and_entry_points(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), ROOT],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    wheel = next(p for p in tmp_path.iterdir() if p.name.startswith("dsahal-") and p.suffix == ".whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("dsahal/__init__.py", "dsahal/ops/sparse_mla.py", "dsahal/reference/plugin.py",
                   "dsahal/backends/nvidia/plugin.py", "dsahal/backends/ppu/detect.py",
                   "dsahal/conformance/__init__.py", "dsahal/presets/tiny.json"):
        assert module in names, f"{module} missing from {wheel.name}"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[dsahal.backends]" in text
    for backend in ("reference", "nvidia", "amd", "tpu", "ppu"):
        assert f"{backend} = " in text
