"""The dry run's record (`DryRun`, the one every engine gives): what the engine built, attended and
reached. Data only; the rule kvdoctor.checks.dryrun judges it."""
from __future__ import annotations

from typing import Any

from kvdoctor.engines.sglang_mlx.dryrun.run import ChildOutcome
from kvdoctor.engines.base import STAGES, DryRun, DryRunError, Plan, Refusal

ENGINE = "sglang-mlx"


def record(outcome: ChildOutcome) -> DryRun:
    """The record of one dry run; `observation` keeps the child's events for the rule."""
    unavailable = outcome.first("engine_unavailable")
    if unavailable is not None:
        return DryRun(engine=ENGINE, outcome="unavailable", reason=unavailable["reason"], observation=outcome)
    seen = observed(outcome)
    note = _note(seen)
    error = outcome.first("error")
    frame = (error or {}).get("frame")
    return DryRun(
        engine=ENGINE, outcome=seen.pop("outcome"), versions=seen.pop("versions"), stages=seen.pop("stages"),
        seconds=seen.pop("seconds"), layers=seen.pop("layers"), stderr_tail=outcome.stderr_tail,
        error=None if error is None else DryRunError(
            error["class"], error["message"], error["stage"], f"{frame['file']}:{frame['line']}" if frame else None,
            layer=error.get("layer"), copy=error.get("copy")),
        extra={**seen, "harness_failed": error is not None and harness_failed(error)}, note=note,
        observation=outcome)


def predicted_refusal(plan: Plan[object] | None) -> Refusal | None:
    """The first refusal the static plan predicts, if any."""
    return plan.refusals[0] if plan is not None and plan.refusals else None


def harness_failed(error: dict[str, Any]) -> bool:
    """The exception came from kvdoctor's own dry-run code, not the engine's."""
    return error.get("frame") is None and "/kvdoctor/" in str((error.get("origin") or {}).get("file", ""))


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
        "outcome": _outcome(outcome, error),
        "reached": reached,
        "stages": stages,
        "versions": versions.get("versions", {}),
        "pinned": versions.get("pinned"),
        "seconds": outcome.seconds,
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


def _note(seen: dict[str, Any]) -> str:
    """How much of the model ran, and the keys each kind of layer attended at the last decode step."""
    layers = (seen.get("shrink") or {}).get("layers") or {}
    cut = f"on the first {layers['kept']} of {layers['of']} layers" if layers.get("kept", 0) < layers.get("of", 0) else ""
    windows: dict[str, set[int]] = {}
    for row in seen.get("layers", []):
        if row.get("decode_keys"):
            kind = "sliding" if row.get("engine_window") else "full"
            windows.setdefault(kind, set()).update(max(step) for step in row["decode_keys"][-1:])
    attended = "; ".join(f"{kind} layers attended {sorted(v)} keys in the last decode step"
                         for kind, v in sorted(windows.items()))
    return "; ".join(part for part in (cut, attended) if part)
