"""`--engine vllm --dry-run`: vLLM's own start-up code (startup.py) in a child process, and what it tells us.

kvdoctor's process never imports vLLM. The child runs in a Python that has a profiled vLLM release (found
by `find_python`, or given as `--engine-python`; startup.py adapts to each release's API), bounded in time
(its whole process group is killed) and in address space, on a directory holding only config.json (no
weights: `load_format="dummy"`, the model built on the meta device). Its outcome is a `DryRun` record
(`record`): kvdoctor.checks.dryrun_vllm turns it into findings.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping

from kvdoctor.engines.base import DryRun, DryRunError, DryRunner, Plan, stages_reached
from kvdoctor.engines.child import STUBS, find_python, run_child
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.vllm import registry
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.model import ModelSpec

CHILD = Path(__file__).resolve().parent / "startup.py"
STAGES = ("config", "specs", "groups", "admission")  # the child's steps, in order (startup.py)
COMPARED = ("start-up outcome", "per-layer specs and windows", "KV cache groups")  # by `disagreements`
ENV_PYTHON = "KVDOCTOR_VLLM_PYTHON"
DEFAULT_TIMEOUT = 600.0
VERSION = PINS["vllm"]
DEFAULT_BUDGET = 40 << 30  # the admission check needs a number; the deploy's kv_budget when given


def engine_args(settings: VllmSettings) -> dict[str, Any]:
    """The deploy section as EngineArgs keyword arguments (only the ones set). Never trust_remote_code: the
    child's model directory holds config.json alone, no code of the checkpoint's."""
    args = settings.model_dump(exclude_none=True, exclude_defaults=True,
                               exclude={"kv_budget", "cudagraph_full", "async_scheduling", "trust_remote_code"})
    if not settings.async_scheduling:
        args["async_scheduling"] = False
    return args


def launch(spec: ModelSpec, settings: VllmSettings, python: Path, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """Run the child; returns its result, with `timed_out`, `returncode`, `seconds` and `stderr_tail`."""
    request = {"config": spec.raw_config, "engine_args": engine_args(settings),
               "kv_budget_bytes": settings.kv_budget_bytes or DEFAULT_BUDGET}
    with tempfile.TemporaryDirectory(prefix="kvdoctor-vllm-") as tmp:
        env = {"VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(STUBS)}
        return run_child(python, CHILD, Path(tmp), request, env, timeout, warm_key={})


class VllmDryRunner(DryRunner):
    """`--dry-run` for `--engine vllm`: the child's result as a record, or an unavailable one without a
    vLLM Python (the rule reports ENG050 then)."""

    def run(self, spec: ModelSpec, settings: Any, plan: Plan[object], options: Mapping[str, Any]) -> DryRun:
        assert isinstance(settings, VllmSettings)
        if settings.trust_remote_code and registry.needs_remote_code(spec.raw_config, settings.release or VERSION):
            return DryRun(engine="vllm", outcome="unavailable",
                          reason="the config's class is the checkpoint's own code (auto_map), which kvdoctor's "
                                 "vLLM dry run does not run")
        python = find_python(options.get("engine_python"), ENV_PYTHON, "vllm")
        if python is None:
            return DryRun(engine="vllm", outcome="unavailable",
                          reason=f"no Python with vLLM {VERSION} found (run `kvdoctor engines install vllm`, or give "
                                 f"--engine-python, or set {ENV_PYTHON})")
        result = launch(spec, settings, python, timeout=options.get("dry_run_timeout") or DEFAULT_TIMEOUT)
        return record(plan, {**result, "python": str(python)})


def record(plan: Plan[Any], result: dict[str, Any]) -> DryRun:
    """The child's result as the dry-run record every engine gives."""
    outcome = result.get("outcome")
    common: dict[str, Any] = {"engine": "vllm", "versions": result.get("versions") or {}, "seconds": result.get("seconds"),
                              "stderr_tail": result.get("stderr_tail", ""), "python": result.get("python"),
                              "observation": result}
    if outcome is None:  # the child ended before vLLM's start-up did
        why = "timed out" if result.get("timed_out") else f"exited with {result.get('returncode')}"
        return DryRun(outcome="timeout" if result.get("timed_out") else "crashed", reason=why,
                      stages=stages_reached(STAGES, ()), **common)
    error = None
    if not outcome["start"]:
        error = DryRunError(outcome["class"], outcome["message"], outcome["stage"],
                            outcome.get("raised_at_vllm") or outcome.get("raised_at"))
    done = STAGES if error is None else STAGES[:STAGES.index(error.stage)] if error.stage in STAGES else ()
    return DryRun(outcome="clean" if error is None else "error", error=error,
                  stages=stages_reached(STAGES, done, None if error is None else error.stage),
                  layers=result.get("layers") or [], compared=COMPARED, differences=disagreements(plan, result),
                  extra={"groups": result.get("groups"), "num_blocks": result.get("num_blocks"),
                         "workarounds": result.get("workarounds", []), "cpu_only": outcome.get("cpu_only", False)},
                  **common)


def disagreements(plan: Plan[Any], result: dict[str, Any]) -> list[str]:
    """What the static plan got wrong, by vLLM's own answer (CPU-only refusals and sizes excluded)."""
    outcome = result["outcome"]
    if not outcome["start"] and outcome.get("cpu_only"):
        return []
    out = []
    if outcome["start"] != (not plan.refusals):
        said = "start" if not plan.refusals else f"{plan.refusals[0].error_class}: {plan.refusals[0].message[:120]}"
        did = "started" if outcome["start"] else f"{outcome['class']}: {outcome['message'][:120]}"
        out.append(f"static plan: {said}; vLLM: {did}")
    mine = {l.index: l for l in plan.layers}
    for row in result.get("layers") or []:
        layer = mine.get(row["index"])
        if layer is None or not layer.extra:
            continue
        window = row.get("window") if row["spec"] == "SlidingWindowSpec" else row.get("attention_chunk_size")
        if (layer.extra.get("engine_spec"), layer.engine_window) != (row["spec"], window):
            out.append(f"layer {row['index']}: plan {layer.extra.get('engine_spec')}/{layer.engine_window}, "
                       f"vLLM {row['spec']}/{window}")
    if result.get("groups") is not None and plan.facts is not None and plan.facts.groups:
        want = sorted(sorted(g["layer_ids"]) for g in result["groups"])
        have = sorted(sorted(g.layer_ids) for g in plan.facts.groups)
        if want != have:
            out.append(f"KV cache groups: plan {len(have)}, vLLM {len(want)} (layer sets differ)")
    return out
