"""``scripts/pip-quiet.sh`` (used by env.sh and tpu-env.sh): pip runs only when the packaging files
changed since the last install, its output is shown only when it fails."""
import json
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


def _retry(tmp_path, step, attempts=3):
    """Source the helper and run ``retry_on_network_error`` on a fake pip ``step`` (shell code)."""
    script = (f'set -euo pipefail; source "{HELPER}"; step() {{ {step}; }}; '
              'retry_on_network_error step')
    env = dict(os.environ, DSAHAL_PIP_ATTEMPTS=str(attempts), DSAHAL_PIP_RETRY_SLEEP="0")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env)


def test_a_dropped_download_is_tried_again_until_it_arrives(tmp_path):
    calls = tmp_path / "calls"
    # fails twice the way the CI's cublas download did, then succeeds
    step = (f'echo run >> "{calls}"; if [ "$(wc -l < "{calls}")" -lt 3 ]; then '
            'echo "error: incomplete-download"; echo "Connection interrupted while downloading."; return 1; fi; '
            'echo installed')
    done = _retry(tmp_path, step)
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls.read_text().count("run") == 3
    assert done.stdout.count("failed on the network") == 2 and "installed" in done.stdout


def test_network_retries_stop_after_the_last_attempt_with_pips_status(tmp_path):
    calls = tmp_path / "calls"
    step = f'echo run >> "{calls}"; echo "ReadTimeoutError: Read timed out."; return 7'
    failed = _retry(tmp_path, step, attempts=2)
    assert failed.returncode == 7
    assert calls.read_text().count("run") == 2


def test_a_failure_that_is_not_the_network_is_not_retried(tmp_path):
    calls = tmp_path / "calls"
    step = f'echo run >> "{calls}"; echo "ERROR: No matching distribution found for torch==9"; return 1'
    failed = _retry(tmp_path, step)
    assert failed.returncode == 1
    assert calls.read_text().count("run") == 1
    assert "No matching distribution" in failed.stdout


def test_pip_network_options_ask_a_new_pip_to_resume_downloads(tmp_path):
    script = f'set -euo pipefail; source "{HELPER}"; pip_network_options "{sys.executable}"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    options = done.stdout.split()
    assert options[:4] == ["--retries", "10", "--timeout", "60"]
    help_text = subprocess.run([sys.executable, "-m", "pip", "install", "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    assert ("--resume-retries" in options) == ("--resume-retries" in help_text)


def _fake_python(tmp_path, fail_on=""):
    """A ``python`` whose pip logs each call and answers ``--dry-run --report`` with a two-wheel resolve;
    ``python -`` (the helper's report parser) is the real interpreter."""
    log = tmp_path / "pip-calls"
    report = {"install": [{"metadata": {"name": "torch", "version": "2.9.0"}},
                          {"metadata": {"name": "nvidia-cudnn-cu12", "version": "9.10.2.21"}}]}
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
if [ "$1" = "-" ]; then exec "{sys.executable}" "$@"; fi
[ "$4" = "--help" ] && exit 0  # pip_network_options asks what pip offers
echo "$*" >> "{log}"
args=("$@")
for i in "${{!args[@]}}"; do
    if [ "${{args[$i]}}" = "--report" ]; then echo '{json.dumps(report)}' > "${{args[$((i + 1))]}}"; fi
done
case "$*" in *"{fail_on or '@never@'}"*) echo "ERROR: broken wheel"; exit 3 ;; esac
""")
    fake.chmod(0o755)
    return fake, log


def _one_wheel_at_a_time(fake):
    script = (f'set -euo pipefail; source "{HELPER}"; '
              f'install_one_wheel_at_a_time "{fake}" "torch==2.9.0" "numpy>=1.24"')
    env = dict(os.environ, DSAHAL_PIP_ATTEMPTS="1")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env)


def test_a_large_set_is_resolved_first_then_installed_one_wheel_at_a_time_without_the_cache(tmp_path):
    fake, log = _fake_python(tmp_path)
    done = _one_wheel_at_a_time(fake)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 4, calls
    assert "--dry-run" in calls[0] and "torch==2.9.0 numpy>=1.24" in calls[0]
    assert calls[1].endswith("--no-deps torch==2.9.0")
    assert calls[2].endswith("--no-deps nvidia-cudnn-cu12==9.10.2.21")
    assert "--dry-run" not in calls[3] and calls[3].endswith("torch==2.9.0 numpy>=1.24")  # the set, checked
    assert all("--no-cache-dir" in call for call in calls)


def test_a_wheel_that_fails_to_install_stops_the_rest(tmp_path):
    fake, log = _fake_python(tmp_path, fail_on="--no-deps torch==")
    failed = _one_wheel_at_a_time(fake)
    assert failed.returncode == 3
    assert "broken wheel" in failed.stdout
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and "nvidia-cudnn" not in log.read_text()
