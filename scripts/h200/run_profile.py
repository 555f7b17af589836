"""cProfile of one ``dsahal run`` in this process (main thread only: the warm-up's jobs run on threads of their
own and show as the main thread's wait), for where start-up time goes before the first token.

Usage::

    python3 scripts/h200/run_profile.py [-- RUN ARGS...]   # default: run --config k31-pro-slice --backend nvidia

A fresh empty Triton cache (``TRITON_CACHE_DIR``) unless ``--keep-cache``. Prints the run's output, then the top
functions by cumulative time and by own time.
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import tempfile


def main(argv) -> int:
    keep = "--keep-cache" in argv
    argv = [a for a in argv if a != "--keep-cache"]
    run_args = argv[argv.index("--") + 1:] if "--" in argv else ["run", "--config", "k31-pro-slice", "--backend",
                                                                  "nvidia"]
    if not keep:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="fresh-triton-")
    profile = cProfile.Profile()
    profile.enable()
    from dsahal.cli import main as cli

    rc = cli(run_args)
    profile.disable()
    for key, count in (("cumulative", 70), ("tottime", 30)):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(key).print_stats(count)
        print(f"--- by {key}")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip()))
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
