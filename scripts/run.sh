#!/usr/bin/env bash
# The main job on the embedded default: the tiny model on the reference backend (CPU).
# Extra arguments go to `dsahal run`, e.g. scripts/run.sh --batch 4 --decode 32 --check
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec dsahal run "$@"
