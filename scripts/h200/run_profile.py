"""cProfile of one ``dsahal run`` in this process (main thread only: the warm-up's jobs run on threads of their
own and show as the main thread's wait), for where start-up time goes before the first token.

Usage::

    python3 scripts/h200/run_profile.py [-- RUN ARGS...]   # default: run --config k31-pro-slice --backend nvidia

A fresh empty Triton cache (``TRITON_CACHE_DIR``) unless ``--keep-cache``. Prints the run's output, then the top
functions by cumulative time and by own time. ``--who-imports MOD[,MOD...]``: the first import of each module
prints the stack that asked for it (the frames outside importlib), to find what pulls a heavy module in.
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import tempfile
import traceback


class _WhoImports:
    """A meta-path finder that finds nothing: it prints the stack of the first import of each watched module."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name in self.names:
            self.names.discard(name)
            frames = [f for f in traceback.extract_stack()[:-1] if "importlib" not in f.filename]
            print(f"--- first import of {name}:\n" + "".join(traceback.format_list(frames[-14:])), flush=True)
        return None


def main(argv) -> int:
    keep = "--keep-cache" in argv
    argv = [a for a in argv if a != "--keep-cache"]
    if "--who-imports" in argv:
        at = argv.index("--who-imports")
        sys.meta_path.insert(0, _WhoImports(argv[at + 1].split(",")))
        del argv[at:at + 2]
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
