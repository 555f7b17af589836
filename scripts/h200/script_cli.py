"""How the H200 scripts of this folder end: the failed checks listed, one ``error:`` line, exit status 1.

``CheckError`` is what a script raises for a failed check or a bad argument; :func:`finish` lists the
failures after the tables and raises it; :func:`run` calls a script's ``main`` and turns a ``CheckError``
(or any other exception: a CLI error is one line, never a traceback) into that line and status.
"""
import sys
import time


class CheckError(Exception):
    pass


def finish(name: str, failures: list, started: float, what: str = "check(s) failed") -> int:
    """After the tables: the total time, then each failure and a :class:`CheckError` naming the first."""
    print(f"\ntotal {time.time() - started:.0f} s")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        raise CheckError(f"{name}: {len(failures)} {what} (listed above), first: {failures[0][:300]}")
    return 0


def run(name: str, main) -> None:
    """``sys.exit(main())``, with any exception as one ``error:`` line and status 1."""
    try:
        sys.exit(main())
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - a CLI error is one line, never a traceback
        keep_traceback(name)
        print(f"error: {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)


def keep_traceback(name: str) -> None:
    """An unexpected exception's traceback goes to ``$OUT/traceback-<name>.txt`` (the device call's output
    folder), not to the console, so a failed run can be diagnosed without a second device call."""
    import os
    import traceback

    folder = os.environ.get("OUT")
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, f"traceback-{name}.txt"), "w") as f:
            traceback.print_exc(file=f)
