"""Entry point of the dry run's child process: `python -m kvdoctor.dryrun.child REQUEST.json EVENTS.jsonl`.

The engine is loaded, patched and run only here, never in the CLI's own process: its modules are
imported in an unusual way (engine_import.py), a trusted checkpoint's model code may run, and the
parent must be able to stop a run that outlives its time bound. Events are appended to EVENTS one JSON
object a line and flushed at once, so whatever happened before a kill is still there.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    request_path, events_path = Path(argv[0]), Path(argv[1])
    request = json.loads(request_path.read_text())
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from kvdoctor.dryrun.driver import DryRun, apply_environment

    apply_environment(request.get("deploy", {}))
    with events_path.open("a", encoding="utf-8") as out:
        def emit(event: dict) -> None:
            out.write(json.dumps(event, default=str) + "\n")
            out.flush()

        DryRun(request, emit).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
