"""ENG050-ENG060: the engine dry run (`--dry-run`). Runs only when the option asks for it; the run
itself happens in a child process (kvdoctor.dryrun), so nothing heavy is imported here."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.context import Context
from kvdoctor.model import Finding

def run(ctx: Context) -> Iterable[Finding]:
    if not ctx.options.get("dry_run"):
        return []
    from kvdoctor.dryrun import dry_run

    findings, observations = dry_run(ctx.spec, ctx.deploy, ctx.plan, ctx.options)
    report = ctx.plan.data.setdefault("report", {})
    report["dry_run"] = observations
    report.setdefault("engine_notes", []).append(summary_line(observations))
    return findings


def summary_line(observations: dict) -> str:
    """One line for the human report: what ran and what it found."""
    if not observations.get("ran"):
        return f"dry run: not run ({observations.get('reason', 'engine unavailable')})"
    versions = ", ".join(f"{k} {v}" for k, v in observations.get("versions", {}).items())
    outcome = observations["outcome"]
    if observations.get("error"):
        err = observations["error"]
        frame = err.get("frame") or {}
        confirmed = observations.get("confirms_plan_refusal")
        return (f"dry run ({versions}): {err['class']} during {err['stage']}"
                f"{' at ' + frame['file'] + ':' + str(frame['line']) if frame else ''}"
                f"{' (confirms ' + confirmed + ')' if confirmed else ''}")
    windows = {}
    for row in observations.get("layers", []):
        if row.get("decode_keys"):
            kind = "sliding" if row.get("engine_window") else "full"
            windows.setdefault(kind, set()).update(max(step) for step in row["decode_keys"][-1:])
    seen = "; ".join(f"{kind} layers attended {sorted(v)} keys in the last decode step"
                     for kind, v in sorted(windows.items()))
    return f"dry run ({versions}): {outcome} in {observations.get('seconds')} s" + (f"; {seen}" if seen else "")
