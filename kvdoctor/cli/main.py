"""The entry point: `kvdoctor ARGS`.

Every command line goes to the typer application (app.py). Input errors exit 2 with one line, never
a traceback.

The modules load after the collector is paused (collector.py), so they are imported inside main.
"""
from __future__ import annotations

import atexit
import os
import sys

from kvdoctor.cli import collector


def entry() -> None:
    """The `kvdoctor` command (its console script and `python -m kvdoctor`): main, then, where the
    process has nothing left to do at exit, an exit that skips tearing the interpreter down.

    A static check leaves some 200 modules and a tensor table of 20k entries; freeing them object
    by object took 3 ms of a 95 ms check of the Kimi-Linear layout. "Nothing left to do": no exit
    hook registered (warm dry-run children, Ray and temporary files register theirs; CPython's
    atexit._ncallbacks counts them, and without it the exit is the usual one), no profiler or tracer
    that writes its results once the command returns (`python -m cProfile -o FILE -m kvdoctor`, a
    debugger), no other thread running, and standard output and error flushed. `main` stays a plain
    function for callers in the same process."""
    try:
        main()
    except SystemExit as done:
        if isinstance(done.code, int) and _nothing_left_at_exit():
            os._exit(done.code)
        raise


def _nothing_left_at_exit() -> bool:
    hooks = getattr(atexit, "_ncallbacks", None)
    threading = sys.modules.get("threading")
    if hooks is None or hooks() or sys.getprofile() is not None or sys.gettrace() is not None:
        return False
    if threading is not None and threading.active_count() > 1:
        return False
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe or stream: the usual exit reports it as before
        return False
    return True


def main() -> None:
    collector.pause()
    from kvdoctor.cli.check import RUN, echo
    from kvdoctor.errors import InputError

    try:
        code = _run(sys.argv[1:])
    except InputError as exc:
        echo(f"kvdoctor: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except ModuleNotFoundError as exc:
        from kvdoctor.extras import extra_for_module

        extra = extra_for_module(exc.name)
        if extra is None or RUN["debug"]:
            raise
        echo(f"kvdoctor: error: {exc.name} is not installed: pip install 'kvdoctor[{extra}]'", err=True)
        sys.exit(2)
    except Exception as exc:  # a bug in kvdoctor: one line unless --debug asks for the traceback
        if RUN["debug"]:
            raise
        echo(f"kvdoctor: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True)
        sys.exit(2)
    finally:
        collector.resume()  # whichever way the command ended
    sys.exit(code)


def _run(args: list[str]) -> int:
    from kvdoctor.cli.app import run

    return run(args)
