"""Entry point of the dry run's child process.

`python -m kvdoctor.engines.sglang_mlx.dryrun.child REQUEST.json EVENTS.jsonl` runs one dry run (a one-shot child).
`python -m kvdoctor.engines.sglang_mlx.dryrun.child --serve --answer-fd N` is the warm child (run.py keeps one per
kvdoctor process): it imports the engine once, then runs one request after another, each in a fresh
fork of itself (kvdoctor/engines/warm_server.py says why a fork, and the protocol).

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
from typing import Any


def main(argv: list[str]) -> int:
    request_path, events_path = Path(argv[0]), Path(argv[1])
    request = json.loads(request_path.read_text())
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from kvdoctor.engines.sglang_mlx.dryrun.driver import DryRun, apply_environment

    apply_environment(request.get("deploy", {}))
    with events_path.open("a", encoding="utf-8") as out:
        def emit(event: dict) -> None:
            out.write(json.dumps(event, default=str) + "\n")
            out.flush()

        DryRun(request, emit).run()
    return 0


def preload() -> str | None:
    """What a one-shot child has imported when its dry run starts: the driver and the engine's MLX
    backend (engine_import keeps the handles). None when that worked."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from kvdoctor.engines.sglang_mlx.dryrun import driver  # noqa: F401
    from kvdoctor.engines.sglang_mlx.dryrun.engine_import import EngineUnavailable, load_mlx_backend

    try:
        load_mlx_backend()
    except EngineUnavailable as exc:  # a one-shot child reports it, as an event
        return f"engine unavailable: {exc}"
    return None


def run_job(job: dict[str, Any]) -> int:
    return main([job["request"], job["events"]])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        from kvdoctor.engines.warm_server import serve

        sys.exit(serve(preload, run_job, int(sys.argv[sys.argv.index("--answer-fd") + 1])))
    sys.exit(main(sys.argv[1:]))
