"""Errors a user can cause from the command line end in one `error:` line, never a traceback."""
import os
import subprocess
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def run_cli(*args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "dsahal", *args], capture_output=True, text=True, env=full_env,
                          timeout=300)


def test_a_strict_mode_fallback_is_one_error_line():
    # the half_lse plugin serves only lse_combine: `dsahal run` needs other ops, which would fall back
    done = run_cli("run", "--batch", "1", "--prompt-len", "4", "--decode", "1",
                   env={"DSAHAL_STRICT": "1", "DSAHAL_PLUGIN_MODULES": "plugins.half_lse", "DSAHAL_BACKEND": "halflse",
                        "PYTHONPATH": TESTS_DIR})
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "DSAHAL_STRICT=1 forbids it" in errors[0] and "halflse" in errors[0]
    assert "Traceback" not in done.stderr


def test_an_unknown_route_in_the_environment_is_one_error_line_listing_the_routes():
    done = run_cli("run", "--batch", "1", "--prompt-len", "4", "--decode", "1",
                   env={"DSAHAL_ROUTES": "sparse_mla:flash"})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "no route 'flash' for sparse_mla" in done.stderr and done.stderr.startswith("error:")
