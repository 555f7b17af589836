#!/usr/bin/env bash
# Create or update the project's virtual environment (.venv): torch 2.13.0 (the CPU build this
# machine caches), then dsahal in editable mode with its test extras. Sourced by run.sh/test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DSAHAL_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
export PATH="$VENV/bin:$PATH"
