"""``scripts/pip-quiet.sh`` (used by env.sh and tpu-env.sh): pip runs only when the packaging files
changed since the last install, its output is shown only when it fails."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELPER = os.path.join(ROOT, "scripts", "pip-quiet.sh")


def _venv(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    return venv


def _install(venv, files, step):
    """Source the helper and install with a fake pip ``step`` (shell code) that logs each call."""
    script = (f'set -euo pipefail; source "{HELPER}"; step() {{ {step}; }}; '
              f'install_if_changed "{venv}" demo {" ".join(map(str, files))} -- step')
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_installs_once_then_only_when_a_packaging_file_changes(tmp_path):
    venv = _venv(tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[project]\nname = 'x'\n")
    calls = tmp_path / "calls"
    step = f'echo pip noise; echo run >> "{calls}"'
    first = _install(venv, [pyproject], step)
    assert first.returncode == 0, first.stderr
    assert "pip noise" not in first.stdout + first.stderr  # pip's output is kept in the log
    assert "setting up" in first.stderr  # one line says why this run takes long
    again = _install(venv, [pyproject], step)
    assert again.returncode == 0 and again.stdout == again.stderr == ""
    assert calls.read_text().count("run") == 1
    pyproject.write_text("[project]\nname = 'y'\n")
    assert _install(venv, [pyproject], step).returncode == 0
    assert calls.read_text().count("run") == 2


def test_a_failing_install_prints_pips_output_and_leaves_no_stamp(tmp_path):
    venv = _venv(tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("")
    failed = _install(venv, [pyproject], "echo 'ERROR: No matching distribution for torch==9'; return 1")
    assert failed.returncode != 0
    assert "No matching distribution for torch==9" in failed.stderr
    assert "error: installing demo into" in failed.stderr
    assert not (venv / ".dsahal-demo.stamp").exists()  # the next run tries again
    assert _install(venv, [pyproject], "true").returncode == 0
    assert (venv / ".dsahal-demo.stamp").exists()
