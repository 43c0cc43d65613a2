"""The entry point: `kvdoctor ARGS`.

A plain `check` command line (what a fleet, a CI gate or a pre-deploy hook runs) is read by argv.py
and run without importing typer, whose import and command tree cost about what a static check of a
large checkpoint does; every other command line, and any `check` line argv.py does not read with
certainty, goes to the typer application (commands.py). Input errors exit 2 with one line, never a
traceback.

The modules load after the collector is paused (collector.py), so they are imported inside main.
"""
from __future__ import annotations

import sys

from kvdoctor import collector


def main() -> None:
    collector.pause()
    from kvdoctor.check_command import RUN, echo
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
    from kvdoctor.argv import read_check
    from kvdoctor.check_command import RUN, run_check

    line = read_check(args)
    if line is None:
        from kvdoctor.commands import run

        collector.resume()  # typer's command tree is loaded
        return run(args)
    RUN.update(line.root)
    return run_check(line.request)
