"""Our own packaging builds without setuptools warnings and ships every data folder (presets, the
``new-backend`` templates, the conformance CI template) as declared package data."""
import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_wheel_builds_without_setuptools_warnings_and_holds_the_data_folders(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), ROOT],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = result.stdout + result.stderr
    # setuptools' own complaints about our configuration (deprecations, undeclared packages)
    complaints = [line.strip() for line in log.splitlines()
                  if "SetuptoolsDeprecationWarning" in line or "_Warning:" in line or "is absent from" in line]
    assert not complaints, "\n".join(complaints)
    wheel = next(p for p in tmp_path.iterdir() if p.suffix == ".whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("dsahal/presets/k31-pro.json", "dsahal/conformance/templates/conformance-ci.yml",
                 "dsahal/templates/new_backend/pyproject.toml.tmpl",
                 "dsahal/templates/new_backend/src/PACKAGE/plugin.py.tmpl",
                 "dsahal/templates/new_backend/dot-github/workflows/conformance.yml.tmpl",
                 "dsahal/templates/new_backend/tests/test_lse_combine.py.tmpl"):
        assert data in names, f"{data} missing from {wheel.name}"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
