"""The new-backend templates ship in dsahal's wheel (setup.py's ``templates/**/*`` package data)
and the generator works from an installed wheel, not only from the source tree."""
import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = os.path.join(ROOT, "core", "templates", "new_backend")


def _template_files():
    found = set()
    for directory, dirnames, filenames in os.walk(TEMPLATES):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            rel = os.path.relpath(os.path.join(directory, name), TEMPLATES).replace(os.sep, "/")
            found.add(f"dsahal/templates/new_backend/{rel}")
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    ROOT], check=True, capture_output=True, timeout=300)
    return next(p for p in out.iterdir() if p.name.startswith("dsahal-") and p.suffix == ".whl")


@pytest.mark.slow
def test_every_template_file_is_in_the_wheel(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = _template_files()
    assert len(expected) >= 8
    assert expected <= names, f"missing from {wheel.name}: {sorted(expected - names)}"


@pytest.mark.slow
def test_generator_runs_from_the_installed_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    env["PYTHONPATH"] = str(site)
    code = ("import sys, dsahal; from dsahal.cli import main; assert dsahal.__file__.startswith(sys.argv[1]), "
            "dsahal.__file__; sys.exit(main(['new-backend', 'acme', '--dir', sys.argv[2]]))")
    target = tmp_path / "dsahal-acme"
    done = subprocess.run([sys.executable, "-c", code, str(site), str(target)], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr
    assert (target / ".github" / "workflows" / "conformance.yml").is_file()
    assert (target / "src" / "dsahal_acme" / "lse_combine.py").is_file()
