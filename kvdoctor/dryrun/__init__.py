"""Engine dry run: the installed engine's own code on a weightless, shrunk copy of the model.

`dry_run(spec, deploy, plan, options)` is the entry point (sglang-mlx today). The parent side
(run.py, findings.py) imports nothing heavy; the child side (child.py, driver.py, engine_import.py,
shrink.py, instrument.py) runs in its own process. See docs/dry-run.md.
"""
from __future__ import annotations

from typing import Any

from kvdoctor.model import Finding


def dry_run(spec: Any, deploy: Any, plan: Any, options: dict[str, Any]) -> tuple[list[Finding], dict[str, Any]]:
    """Run the dry run for one model; returns findings (catalog codes) and the observations record."""
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.dryrun.findings import Interpreter
    from kvdoctor.dryrun.engine_import import missing_packages
    from kvdoctor.dryrun.run import DEFAULT_TIMEOUT_SECONDS, ChildOutcome, build_request, launch

    catalog = options.get("catalog") or builtin_catalog()
    missing = missing_packages()
    if missing:
        outcome = ChildOutcome(events=[{"event": "engine_unavailable",
                                        "reason": f"not installed: {', '.join(missing)}"}])
    else:
        timeout = float(options.get("dry_run_timeout") or DEFAULT_TIMEOUT_SECONDS)
        outcome = launch(build_request(spec, deploy, options), timeout)
    return Interpreter(outcome, spec, plan, catalog).interpret()
