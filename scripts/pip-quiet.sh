#!/usr/bin/env bash
# Helpers sourced by env.sh and tpu-env.sh: install into a virtual environment only when what the
# install depends on changed, with pip's output kept in a log that is printed only when pip fails.
#   install_if_changed VENV NAME FILE... -- STEP...
# FILE...: what the environment is built from (pyproject.toml, setup.py, the calling script with its
# pins); their SHA-256 is kept in VENV/.dsahal-NAME.stamp, and a matching stamp skips the install.
# STEP...: the command that installs (a shell function; its output goes to the log). It runs as an
# `if` condition, where `set -e` does not apply: it must return non-zero itself when a step fails.

install_if_changed() {
    local venv=$1 name=$2; shift 2
    local files=()
    while [ "$1" != "--" ]; do files+=("$1"); shift; done
    shift
    local stamp="$venv/.dsahal-$name.stamp" log="$venv/.dsahal-$name-pip.log" want
    want="$("$venv/bin/python" - "${files[@]}" <<'PY'
import hashlib, sys
digest = hashlib.sha256()
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        digest.update(path.encode() + b"\0" + f.read() + b"\0")
print(digest.hexdigest())
PY
)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    echo "setting up $venv ($name: first run, or its packaging changed; pip's log: $log)" >&2
    rm -f "$stamp"
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "error: installing $name into $venv failed (pip's output above, also in $log)" >&2
        return 1
    fi
    echo "$want" >"$stamp"
}
