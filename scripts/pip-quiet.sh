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

# retry_on_network_error CMD...: run CMD (a pip install) and, when it fails on the network (a dropped or
# timed-out connection, an incomplete download: what PyPI's multi-GB CUDA wheels meet on a slow link),
# wait and run it again, up to DSAHAL_PIP_ATTEMPTS times in all (default 4), the waits growing by
# DSAHAL_PIP_RETRY_SLEEP seconds (default 30: 30, 60, 90 s). pip's cache keeps the wheels that did arrive,
# so a later attempt downloads only what is missing. Any other failure (no such release, a resolver
# conflict) returns at once: retrying cannot fix it. Each attempt's output is printed after it ends.
retry_on_network_error() {
    local attempts="${DSAHAL_PIP_ATTEMPTS:-4}" pause="${DSAHAL_PIP_RETRY_SLEEP:-30}" attempt=1 rc out
    out="$(mktemp)"
    while true; do
        rc=0
        "$@" >"$out" 2>&1 || rc=$?
        cat "$out"
        if [ "$rc" -eq 0 ]; then rm -f "$out"; return 0; fi
        if [ "$attempt" -ge "$attempts" ] || ! grep -qiE \
            'incomplete-download|connection (interrupted|reset|refused|aborted)|read timed out|timed out|ProtocolError|NewConnectionError|ReadTimeoutError|Max retries exceeded|Temporary failure in name resolution|IncompleteRead|network is unreachable' \
            "$out"; then
            rm -f "$out"; return "$rc"
        fi
        echo "== attempt $attempt of $attempts failed on the network; trying again in $((pause * attempt)) s"
        sleep "$((pause * attempt))"
        attempt=$((attempt + 1))
    done
}

# pip_network_options PYTHON: the options that make PYTHON's pip patient with a slow or dropping link:
# more retries of a request, a longer timeout, and (pip 25.1 and newer) resuming an interrupted download.
pip_network_options() {
    local options="--retries 10 --timeout 60"
    local help
    help="$("$1" -m pip install --help 2>/dev/null || true)"  # (not piped into grep -q: pipefail and SIGPIPE)
    if [[ "$help" == *--resume-retries* ]]; then
        options="$options --resume-retries 20"
    fi
    echo "$options"
}

# install_one_wheel_at_a_time PYTHON REQUIREMENT...: install REQUIREMENT... and everything they pull into
# PYTHON's environment without pip's cache, one distribution at a time. pip first resolves the whole set from the
# index's metadata (`--dry-run --report`: no wheel is downloaded), then each distribution it would install is
# downloaded, installed and its wheel deleted before the next, and last the set is asked for once more (all of it
# installed by then: pip checks it and downloads nothing). Why: one `pip install` of the TPU environment's set
# downloads all its wheels before installing any and keeps them in pip's cache, 3.9 GiB beside the 7.1 GiB
# installed; this way the disk holds the installed packages and at most one wheel (the largest, torch 2.9.0's,
# is 0.86 GiB). A CI run failed with "No space left on device" installing that set (2026-12-05). Each download is
# retried on the network (retry_on_network_error), one wheel again, not the set.
install_one_wheel_at_a_time() {
    local python=$1; shift
    local report pins pin options
    read -r -a options <<<"--progress-bar off --no-cache-dir $(pip_network_options "$python")"
    report="$(mktemp)"
    retry_on_network_error "$python" -m pip install -q "${options[@]}" --dry-run --report "$report" "$@" \
        || { rm -f "$report"; return 1; }
    pins="$("$python" - "$report" <<'PY'
import json, sys
# "name==version" for each distribution the resolve would install (none already present)
for item in json.load(open(sys.argv[1]))["install"]:
    print(f'{item["metadata"]["name"]}=={item["metadata"]["version"]}')
PY
)" || { rm -f "$report"; return 1; }
    rm -f "$report"
    for pin in $pins; do
        retry_on_network_error "$python" -m pip install -q "${options[@]}" --no-deps "$pin" || return
    done
    retry_on_network_error "$python" -m pip install -q "${options[@]}" "$@"  # (asks the index: retried too)
}
