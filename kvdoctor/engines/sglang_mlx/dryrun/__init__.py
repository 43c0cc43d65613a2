"""Engine dry run: the installed engine's own code on a weightless, shrunk copy of the model.

`observe(spec, settings, options)` is the entry point (sglang-mlx today): it returns the child's
`ChildOutcome`, an observation. `record.py` turns it into the JSON record; the rule
`kvdoctor.checks.dryrun` turns it into findings. The parent side (run.py, record.py) imports nothing
heavy; the child side (child.py, driver.py, engine_import.py, shrink.py, instrument.py) runs in its own
process. See docs/dry-run.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from kvdoctor.engines.sglang_mlx.dryrun.run import ChildOutcome

if TYPE_CHECKING:
    from pydantic import BaseModel

    from kvdoctor.model import ModelSpec


def observe(spec: ModelSpec, settings: BaseModel, options: Mapping[str, Any]) -> ChildOutcome:
    """Run the dry run for one model (or note that the engine is not installed)."""
    from kvdoctor.engines.sglang_mlx.dryrun.engine_import import missing_packages
    from kvdoctor.engines.sglang_mlx.dryrun.run import DEFAULT_TIMEOUT_SECONDS, build_request, launch

    missing = missing_packages()
    if missing:
        return ChildOutcome(events=[{"event": "engine_unavailable", "reason": f"not installed: {', '.join(missing)}"}])
    timeout = float(options.get("dry_run_timeout") or DEFAULT_TIMEOUT_SECONDS)
    return launch(build_request(spec, settings, options), timeout)
