"""The entry point: `kvdoctor ARGS`.

A plain `check` command line (what a fleet, a CI gate or a pre-deploy hook runs) is read by argv.py
and run without importing typer, whose import and command tree cost about what a static check of a
large checkpoint does; every other command line, and any `check` line argv.py does not read with
certainty, goes to the typer application (commands.py). Input errors exit 2 with one line, never a
traceback.

The modules load after the collector is paused (collector.py), and msgspec without typing_extensions
(`_import_msgspec`), so they are imported inside main.
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
    _import_msgspec()
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
    from kvdoctor.cli.argv import read_check
    from kvdoctor.cli.check import RUN, run_check

    line = read_check(args)
    if line is None:
        from kvdoctor.cli.app import run

        collector.resume()  # typer's command tree is loaded
        return run(args)
    RUN.update(line.root)
    return run_check(line.request)


def _import_msgspec() -> None:
    """Import msgspec, where nothing has loaded it yet, without typing_extensions.

    When it can, msgspec takes `get_type_hints` from typing_extensions, whose import loads `inspect`
    (with ast, dis and tokenize): 31 M of the 231 M instructions a static check of a 7B model's
    layout ran. msgspec falls back to typing's own function when typing_extensions cannot be
    imported, and for kvdoctor's records, which use no typing_extensions construct, both give the
    same hints. So typing_extensions is marked unimportable for this one import; whatever imports it
    later (pydantic for a deploy file, torch) loads it as usual."""
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # None: "cannot be imported"
    try:
        import msgspec  # noqa: F401
    finally:
        del sys.modules["typing_extensions"]
