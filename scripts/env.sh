#!/usr/bin/env bash
# Create or update the project's virtual environment (.venv): torch 2.13.0, then dsahal in editable mode
# with its test extras. Sourced by run.sh/test.sh. pip runs only when the venv is new or pyproject.toml,
# setup.py or this script changed since the last install (a hash in .venv/.dsahal-dsahal.stamp); its
# output is printed only when it fails. The editable install needs no re-install for edited or added
# modules; delete the stamp to force one.
# Where the machine has no local torch wheel, torch 2.13.0 comes from PyPI, whose Linux build is the
# CUDA one (several GB of nvidia-* libraries); TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# takes the CPU build instead. Without pip's cache (--no-cache-dir): a CI machine's disk is small, and a
# wheel kept in the cache after its install is disk that part 2's environment needs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DSAHAL_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
source "$ROOT/scripts/pip-quiet.sh"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
_dsahal_pip_steps() {  # run inside `if`, where set -e does not apply: each step returns on failure
    "$VENV/bin/python" -m pip install -q --upgrade pip || true  # an old pip still installs; not fatal
    # A local wheel where the machine has one, else PyPI's CUDA build: retried when the link drops.
    # shellcheck disable=SC2046  # the options are words
    retry_on_network_error "$VENV/bin/python" -m pip install -q --progress-bar off --no-cache-dir \
        $(pip_network_options "$VENV/bin/python") ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
        "torch==2.13.0" || return
    # shellcheck disable=SC2046
    retry_on_network_error "$VENV/bin/python" -m pip install -q --progress-bar off --no-cache-dir \
        $(pip_network_options "$VENV/bin/python") -e "$ROOT[test]" || return
}
install_if_changed "$VENV" dsahal "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/scripts/env.sh" \
    -- _dsahal_pip_steps
export PATH="$VENV/bin:$PATH"
