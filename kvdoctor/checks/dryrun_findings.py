"""Turn what a dry run reported (kvdoctor.engines.sglang_mlx.dryrun's ChildOutcome) into findings, holding it against the plan.

- An engine exception becomes a finding under the catalog code whose triage pattern names it, or
  ENG051 (unknown engine error) carrying the exact text and the engine frame that raised it.
- What the engine built and attended is compared with kvdoctor's static plan of the same engine
  version: per-layer windows, cache kinds, keys attended, and the refusal the plan predicts. Any
  disagreement is ENG057: kvdoctor's model of this engine version is stale for this model.
- Runs cut short (refused shrink, over budget, a window not crossed, timed out, crashed) each have
  their own code, so a user can tell "the engine failed" from "the dry run could not look".
- A load step kvdoctor's weightless copy cannot satisfy (a sanitize that needs real weights, a shrunk
  copy the family's code refuses) is ENG061, a warning naming kvdoctor's limitation, never ENG051.
"""
from __future__ import annotations

from typing import Any

from kvdoctor.catalog import builtin_catalog
from kvdoctor.catalog.matcher import code_for
from kvdoctor.engines.sglang_mlx.dryrun.record import harness_failed, observed, predicted_refusal, record
from kvdoctor.limits import human_bytes
from kvdoctor.model import Finding, Source

ENGINE = "sglang-mlx"  # the profile whose dry run this reads (the only one with a dry run today)
CACHE_KINDS = {"WindowedAttentionKVCache": "windowed", "ContiguousAttentionKVCache": "contiguous",
               "PoolBackedAttentionKVCache": "contiguous"}
MAX_LISTED = 10
# Refusals the static plan does not model on purpose: the remote-code gate depends on a CLI option.
NOT_PLANNED = {"ENG059"}


def cache_kind(class_name: str | None) -> str:
    """The plan's label for a cache class the engine built: windowed, contiguous, native or none."""
    if class_name is None:
        return "none"
    return CACHE_KINDS.get(class_name, "native")


def _layers_text(layers: list[int]) -> str:
    text = ", ".join(map(str, layers[:MAX_LISTED]))
    return text + (f", ... ({len(layers)} layers)" if len(layers) > MAX_LISTED else "")


def _versions_text(versions: dict[str, str]) -> str:
    return ", ".join(f"{name} {versions[name]}" for name in ("sglang", "mlx-lm", "mlx") if name in versions)


def error_code(error: dict[str, Any], plan: Any, engine: str, catalog: Any = None) -> str | None:
    """The code an engine error stands for: the catalog entry whose pattern matches it, else the plan's
    predicted refusal where the engine raised exactly that exception (same class, text and stage):
    a model class that cannot be built raises a text of its own, which no catalog pattern names in
    advance, and the plan read it off the same class."""
    code = code_for(catalog or builtin_catalog(), engine, error["class"], error["message"])
    predicted = predicted_refusal(plan)
    if code is None and predicted is not None and \
            (predicted.error_class, predicted.message, predicted.stage) == (error["class"], error["message"],
                                                                             error["stage"]):
        return predicted.code
    return code


class Interpreter:
    """Reads one ChildOutcome (kvdoctor.engines.sglang_mlx.dryrun.run) for one model and one static plan."""

    def __init__(self, outcome: Any, spec: Any, plan: Any, catalog: Any,
                 foreseen: frozenset[tuple[str, str, str]] = frozenset()):
        """`foreseen`: (class, message, stage) of the errors kvdoctor's own probes already reported
        (the mask-routing probe's wrapper check): the engine raising one of them adds no finding."""
        self.outcome, self.spec, self.plan, self.catalog = outcome, spec, plan, catalog
        self.foreseen = foreseen
        versions = outcome.first("versions") or {}
        self.versions: dict[str, str] = versions.get("versions", {})
        self.findings: list[Finding] = []
        self.where = self._where()

    def _predicted(self) -> Any:
        return predicted_refusal(self.plan)

    # -- entry point ------------------------------------------------------------------------------

    def interpret(self) -> tuple[list[Finding], dict[str, Any]]:
        """(findings, the run's record as the report shows it)."""
        outcome = self.outcome
        unavailable = outcome.first("engine_unavailable")
        if unavailable is not None:
            self._add("ENG050", f"the sglang MLX backend could not be loaded, so the dry run did not run: "
                                f"{unavailable['reason']} (`kvdoctor engines install sglang-mlx` installs it)",
                      evidence={"reason": unavailable["reason"]})
            return self.findings, record(outcome).to_json()
        seen = observed(outcome)
        error = outcome.first("error")
        if error is not None:
            self._engine_error(error)
        for limit in outcome.all("harness"):
            self._add("ENG061", f"kvdoctor's weightless copy could not run {limit['step']} during {limit['stage']} "
                                f"({limit['class']}: {limit['message']}); with real weights the engine runs it, so "
                                "this is kvdoctor's limitation: the dry run went on without it",
                      evidence={"step": limit["step"], "class": limit["class"], "message": limit["message"]})
        for refused in outcome.all("refused"):
            self._refused(refused)
        self._schedule_cover(seen)
        if outcome.timed_out:
            self._add("ENG055", f"the dry run was stopped after {outcome.timeout:g} s during {seen['reached']}; "
                                "what it saw until then is reported", evidence={"reached": seen["reached"],
                                                                               "timeout_seconds": outcome.timeout})
        elif outcome.first("done") is None:
            last = outcome.stderr_tail.strip().splitlines()[-1:] or ["(no output)"]
            self._add("ENG056", f"the dry run's process ended with exit code {outcome.returncode} during "
                                f"{seen['reached']} without reporting why: {last[0]}",
                      evidence={"returncode": outcome.returncode, "stderr_tail": outcome.stderr_tail})
        self._compare_with_plan(seen, error)
        return self.findings, record(outcome).to_json()

    # -- helpers ----------------------------------------------------------------------------------

    def _where(self) -> Source:
        for key in ("layer_types", "sliding_window", "model_type"):
            if key in self.spec.config:
                return self.spec.key_source(key)
        return Source("key", "model_type", "config.json")

    def _add(self, code: str, message: str, layer: int | None = None, **kw: Any) -> None:
        kw.setdefault("evidence", {})
        if self.versions:
            kw["evidence"].setdefault("versions", self.versions)
        self.findings.append(Finding.at(code, message, self.where, layer=layer, **kw))

    def _code(self, error: dict[str, Any]) -> str | None:
        return error_code(error, self.plan, self.plan.engine if self.plan else ENGINE, self.catalog)

    def _engine_error(self, error: dict[str, Any]) -> None:
        frame, origin = error.get("frame"), error.get("origin") or {}
        where = f"{frame['file']}:{frame['line']} in {frame['function']}" if frame else \
            f"{origin.get('file')}:{origin.get('line')}"
        engine_error = {"class": error["class"], "message": error["message"], "stage": error["stage"]}
        evidence = {"frame": frame, "origin": origin, "layer_running": error.get("layer"), "copy": error.get("copy")}
        if harness_failed(error):
            self._add("ENG058", f"kvdoctor's dry-run harness failed during {error['stage']}: {error['class']}: "
                                f"{error['message']} ({where})", engine_error=engine_error, evidence=evidence)
            return
        if (error["class"], error["message"], error["stage"]) in self.foreseen:
            return  # the probe's finding names it, with the same text
        code = self._code(error) or "ENG051"
        predicted = self._predicted()
        if predicted is not None and predicted.code == code and predicted.stage == error["stage"]:
            return  # the plan's refusal rule reports it; the dry run confirms it (see the record), no duplicate
        versions = _versions_text(self.versions)
        lead = "an error no catalog entry names" if code == "ENG051" else "a known error"
        copy = (f"; it raised on kvdoctor's shrunk copy ({error['copy']}), so a count of heads or layers in the "
                "message is the copy's") if error.get("copy") else ""
        self._add(code, f"dry run ({versions}): the engine raised {lead} during {error['stage']}: "
                        f"{error['class']}: {error['message']} (raised in {where}){copy}",
                  layer=error.get("layer"), engine_error=engine_error, evidence=evidence)

    def _refused(self, refused: dict[str, Any]) -> None:
        if refused["reason"] == "shrink":
            self._add("ENG052", "the dry run found no shrunk copy of the model that keeps every layer as the "
                                f"engine sees it ({'; '.join(refused['diff'][:3])}), so it ran nothing past loading",
                      evidence={"diff": refused["diff"]})
        elif refused["stage"] == "load":  # the shrunk copy's weights alone past the memory bound
            self._add("ENG053", f"{refused['message']}; the dry run stopped after loading, before it built the "
                                "engine's runner", evidence={"weight_bytes": refused["weight_bytes"],
                                                             "budget_bytes": refused["budget_bytes"]})
        else:
            schedules = self.outcome.all("schedule")
            self._add("ENG053", f"{refused['message']}: the smallest schedule needs about "
                                f"{schedules[-1]['estimated_seconds'] if schedules else '?'} s and "
                                f"{_gib(schedules[-1]['peak_bytes']) if schedules else '?'}; start-up was checked, "
                                "prefill and decode were not", evidence={"schedules": schedules})

    def _schedule_cover(self, observed: dict[str, Any]) -> None:
        chosen = next((s for s in self.outcome.all("schedule") if s.get("chosen")), None)
        if chosen is None or chosen["crosses_windows"] or not chosen["windows"]:
            return
        skipped = self.outcome.all("schedule")[0]
        self._add("ENG054", f"the dry run did not cross the {'/'.join(map(str, chosen['windows']))}-token window: "
                            f"a schedule that does needs about {skipped['estimated_seconds']} s and "
                            f"{_gib(skipped['peak_bytes'])} on this machine, past the "
                            f"{chosen['budget_seconds']:g} s budget; it ran {chosen['unit']}-token chunks instead",
                  evidence={"skipped": skipped, "ran": chosen})

    # -- the plan ---------------------------------------------------------------------------------

    def _compare_with_plan(self, observed: dict[str, Any], error: dict[str, Any] | None) -> None:
        if self.plan is None:
            return
        planned = {p.index: p for p in self.plan.layers}
        rows = {row["index"]: row for row in observed["layers"]}
        disagree: dict[str, list[dict[str, Any]]] = {"window": [], "cache": [], "keys": []}
        for index, row in sorted(rows.items()):
            plan = planned.get(index)
            if plan is None:
                continue
            if "engine_window" in row and row.get("attention") and plan.engine_window != row["engine_window"]:
                disagree["window"].append({"layer": index, "plan": plan.engine_window, "engine": row["engine_window"]})
            if "cache" in row and plan.cache is not None and plan.cache != cache_kind(row["cache"]):
                disagree["cache"].append({"layer": index, "plan": plan.cache, "engine": row["cache"]})
        for call in self.outcome.all("attention"):
            plan = planned.get(call["layer"])
            if plan is None or any(d["layer"] == call["layer"] for d in disagree["keys"]):
                continue
            if not _keys_as_planned(call, plan.engine_window):
                disagree["keys"].append({"layer": call["layer"], "stage": call["stage"], "step": call["step"],
                                         "plan_window": plan.engine_window, "pattern": call["pattern"],
                                         "window": call.get("window"), "max_keys": call["max_keys"],
                                         "positions": call["positions"]})
        versions = _versions_text(self.versions)
        describe = {
            "window": lambda d: f"window {d['engine']} where the plan says {d['plan']}",
            "cache": lambda d: f"a {d['engine']} where the plan says {d['plan']}",
            "keys": lambda d: (f"queries attending {d['max_keys']} keys ({d['pattern']}"
                               f"{' ' + str(d['window']) if d.get('window') else ''}) in {d['stage']} where the "
                               f"plan's window {d['plan_window']} allows a different count"),
        }
        for aspect, items in disagree.items():
            if not items:
                continue
            layers = [d["layer"] for d in items]
            self._add("ENG057", f"kvdoctor's sglang-mlx plan is stale for this model: the installed engine "
                                f"({versions}) gave layer{'s' if len(layers) > 1 else ''} {_layers_text(layers)} "
                                f"{describe[aspect](items[0])}", layer=layers[0],
                      evidence={"aspect": aspect, "disagreements": items[:MAX_LISTED]})
        self._compare_refusal(observed, error)

    def _compare_refusal(self, observed: dict[str, Any], error: dict[str, Any] | None) -> None:
        predicted = self._predicted()
        early = error if error and (error["stage"] in ("load", "startup") or
                                    (predicted is not None and error["stage"] == predicted.stage)) else None
        if observed["reached"] in ("load",) and early is None:
            return  # the run never got as far as the plan's prediction
        observed_code = self._code(early) if early else None
        if observed_code in NOT_PLANNED or (predicted is None and early is None):
            return
        if predicted is not None and early is not None and predicted.code == observed_code \
                and predicted.stage == early["stage"]:
            return
        if predicted is not None and early is None and observed["reached"] == "startup" and error is None:
            return  # stopped (budget, timeout) before start-up finished: nothing to compare
        plan_text = (f"{predicted.code} {predicted.error_class} at {predicted.stage}" if predicted
                     else "a clean start")
        engine_text = (f"{observed_code or 'an uncatalogued'} {early['class']} at {early['stage']}" if early
                       else "a clean start")
        self._add("ENG057", f"kvdoctor's sglang-mlx plan is stale for this model: it predicts {plan_text}, the "
                            f"installed engine ({_versions_text(self.versions)}) gave {engine_text}",
                  evidence={"aspect": "refusal", "plan": None if predicted is None else
                            {"code": predicted.code, "class": predicted.error_class, "stage": predicted.stage,
                             "message": predicted.message},
                            "engine": None if early is None else {"code": observed_code, "class": early["class"],
                                                                  "stage": early["stage"],
                                                                  "message": early["message"]}})


def _keys_as_planned(call: dict[str, Any], window: int | None) -> bool:
    """Did every query of this SDPA call attend what the plan's window for its layer allows?"""
    if call["pattern"] == "irregular":
        return False
    if window is None:
        return call["pattern"] == "causal"
    if call["pattern"] == "window":
        return call["window"] == window
    return call["max_keys"] <= window  # causal and never past the window: consistent with it


def _gib(n: int) -> str:
    return human_bytes(n, 1, unit="GiB")
