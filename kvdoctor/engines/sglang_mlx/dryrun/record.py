"""The dry run's record for the JSON `info`: what the engine built, attended and reached, and whether it
raised the refusal the plan predicted. Data only; the rule kvdoctor.checks.dryrun judges it."""
from __future__ import annotations

from typing import Any

from kvdoctor.engines.sglang_mlx.dryrun.run import ChildOutcome
from kvdoctor.engines.base import STAGES, Plan, Refusal


def record(outcome: ChildOutcome, plan: Plan[object] | None, catalog: Any = None) -> dict[str, Any]:
    """The JSON record of one dry run."""
    unavailable = outcome.first("engine_unavailable")
    if unavailable is not None:
        return {"ran": False, "outcome": "unavailable", "reason": unavailable["reason"]}
    out = observed(outcome)
    out["confirms_plan_refusal"] = confirmed_refusal(outcome, plan, catalog)
    return out


def predicted_refusal(plan: Plan[object] | None) -> Refusal | None:
    """The first refusal the static plan predicts, if any."""
    return plan.refusals[0] if plan is not None and plan.refusals else None


def error_code(error: dict[str, Any], plan: Plan[object] | None, engine: str, catalog: Any = None) -> str | None:
    """The code an engine error stands for: the catalog entry whose pattern matches it, else the plan's
    predicted refusal where the engine raised exactly that exception (same class, text and stage):
    a model class that cannot be built raises a text of its own, which no catalog pattern names in
    advance, and the plan read it off the same class."""
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.catalog.matcher import code_for

    code = code_for(catalog or builtin_catalog(), engine, error["class"], error["message"])
    predicted = predicted_refusal(plan)
    if code is None and predicted is not None and \
            (predicted.error_class, predicted.message, predicted.stage) == (error["class"], error["message"],
                                                                             error["stage"]):
        return predicted.code
    return code


def harness_failed(error: dict[str, Any]) -> bool:
    """The exception came from kvdoctor's own dry-run code, not the engine's."""
    return error.get("frame") is None and "/kvdoctor/" in str((error.get("origin") or {}).get("file", ""))


def confirmed_refusal(outcome: ChildOutcome, plan: Plan[object] | None, catalog: Any = None) -> str | None:
    """The predicted refusal's code when the engine really raised it, at the predicted stage."""
    error, predicted = outcome.first("error"), predicted_refusal(plan)
    if plan is None or error is None or predicted is None or harness_failed(error):
        return None
    code = error_code(error, plan, plan.engine, catalog)
    return code if code == predicted.code and predicted.stage == error["stage"] else None


def observed(outcome: ChildOutcome) -> dict[str, Any]:
    """What the engine built, attended and reached, per layer and stage (no verdicts)."""
    layouts = outcome.all("layout")
    layout = layouts[-1] if layouts else None
    rows: dict[int, dict[str, Any]] = {}
    if layout is not None:
        for row in layout["layers"]:
            rows[row["index"]] = {"index": row["index"], "attention": row["attention_attr"] is not None,
                                  "engine_window": row["engine_window"], "cache": row["cache"]}
    for call in outcome.all("attention"):
        row = rows.setdefault(call["layer"], {"index": call["layer"]}) if call["layer"] is not None else None
        if row is None:
            continue
        if call["stage"] == "prefill":
            row["prefill_max_keys"] = max(row.get("prefill_max_keys", 0), call["max_keys"])
            if call["pattern"] != "causal":
                row["prefill_window"] = call.get("window", "irregular")
        else:
            row.setdefault("decode_keys", []).append(call["last_keys"])
    error = outcome.first("error")
    stages = _stages(outcome)
    started = [stage for stage in STAGES if stages[stage] != "not run"]
    reached = started[-1] if started else "load"
    shrink = outcome.first("shrink") or {}
    chosen = next((s for s in outcome.all("schedule") if s.get("chosen")), None)
    code = outcome.first("engine_code") or {}
    versions = outcome.first("versions") or {}
    return {
        "ran": True,
        "outcome": _outcome(outcome, error),
        "reached": reached,
        "stages": stages,
        "versions": versions.get("versions", {}),
        "pinned": versions.get("pinned"),
        "seconds": outcome.seconds,
        "error": None if error is None else {
            **{k: error.get(k) for k in ("class", "message", "stage", "frame", "layer")},
            **({"copy": error["copy"]} if error.get("copy") else {})},
        "shrink": {k: shrink.get(k) for k in ("candidate", "layers", "changes")} if shrink else None,
        "schedule": None if chosen is None else {k: chosen[k] for k in ("unit", "crosses_windows", "windows", "steps",
                                                                      "estimated_seconds")},
        "pool": (outcome.first("pool") or {}).get("pool"),
        "aot_kernels": None if layout is None else layout.get("aot_kernels"),
        "layers": [rows[i] for i in sorted(rows)],
        "engine_code": code.get("files", {}),
        "modelled": versions.get("modelled", []),
    }


def _stages(outcome: Any) -> dict[str, str]:
    """Per stage: ok, error, refused, stopped (started, never finished) or not run."""
    status = {stage: "not run" for stage in STAGES}
    for event in outcome.all("stage"):
        status[event["stage"]] = "stopped" if event["status"] == "started" else event["status"]
    for event in outcome.all("refused"):
        status[event["stage"]] = "refused"
    error = outcome.first("error")
    if error is not None:
        status[error["stage"]] = "error"
    return status


def _outcome(outcome: Any, error: dict[str, Any] | None) -> str:
    if error is not None:
        return "error"
    if outcome.first("refused") is not None:
        return "refused"
    if outcome.timed_out:
        return "timeout"
    if outcome.first("done") is None:
        return "crashed"
    return "clean"



def summary_line(observations: dict[str, Any]) -> str:
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
    windows: dict[str, set[int]] = {}
    for row in observations.get("layers", []):
        if row.get("decode_keys"):
            kind = "sliding" if row.get("engine_window") else "full"
            windows.setdefault(kind, set()).update(max(step) for step in row["decode_keys"][-1:])
    seen = "; ".join(f"{kind} layers attended {sorted(v)} keys in the last decode step"
                     for kind, v in sorted(windows.items()))
    layers = (observations.get("shrink") or {}).get("layers") or {}
    cut = f" on the first {layers['kept']} of {layers['of']} layers" if layers.get("kept", 0) < layers.get("of", 0) else ""
    return f"dry run ({versions}): {outcome}{cut} in {observations.get('seconds')} s" + (f"; {seen}" if seen else "")
