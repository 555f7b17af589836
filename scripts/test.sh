#!/usr/bin/env bash
# The test suite, from nothing but Python: builds the environment, then runs pytest.
# Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
python -m pytest -q "$@"
