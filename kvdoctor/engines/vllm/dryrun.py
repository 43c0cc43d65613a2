"""`--engine vllm --dry-run`: vLLM's own start-up code (startup.py) in a child process, and what it tells us.

kvdoctor's process never imports vLLM. The child runs in a Python that has vLLM 0.33.0 (found by
`find_python`, or given as `--engine-python`), bounded in time (its whole process group is killed)
and in address space, on a directory holding only config.json (no weights: `load_format="dummy"`,
the model built on the meta device). Its outcome becomes findings: an exception under the catalog
code whose vLLM pattern matches it (ENG051 when none does), and VLM030 where the static plan and the
engine disagree.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Mapping

from kvdoctor.engines.base import DryRunner, Plan
from kvdoctor.engines.child import STUBS, run_child
from kvdoctor.engines.vllm import registry
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.model import Finding, ModelSpec

CHILD = Path(__file__).resolve().parent / "startup.py"
REPO = Path(__file__).resolve().parents[3]
ENV_PYTHON = "KVDOCTOR_VLLM_PYTHON"
DEFAULT_TIMEOUT = 600.0
DEFAULT_BUDGET = 40 << 30  # the admission check needs a number; the deploy's kv_budget when given


def find_python(explicit: str | None = None) -> Path | None:
    """--engine-python, else $KVDOCTOR_VLLM_PYTHON, else the oracle venv of this checkout."""
    for candidate in (explicit, os.environ.get(ENV_PYTHON), REPO / "goldens" / ".venv" / "vllm" / "bin" / "python"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def engine_args(settings: VllmSettings) -> dict[str, Any]:
    """The deploy section as EngineArgs keyword arguments (only the ones set). Never trust_remote_code: the
    child's model directory holds config.json alone, no code of the checkpoint's."""
    args = settings.model_dump(exclude_none=True, exclude={"kv_budget", "cudagraph_full", "async_scheduling",
                                                           "trust_remote_code"})
    if not settings.async_scheduling:
        args["async_scheduling"] = False
    if args.get("tensor_parallel_size") == 1:
        args.pop("tensor_parallel_size")
    if args.get("kv_cache_dtype") == "auto":
        args.pop("kv_cache_dtype")
    return args


def launch(spec: ModelSpec, settings: VllmSettings, python: Path, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """Run the child; returns its result, with `timed_out`, `returncode`, `seconds` and `stderr_tail`."""
    request = {"config": spec.raw_config, "engine_args": engine_args(settings),
               "kv_budget_bytes": settings.kv_budget_bytes or DEFAULT_BUDGET}
    with tempfile.TemporaryDirectory(prefix="kvdoctor-vllm-") as tmp:
        env = {"VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(STUBS)}
        return run_child(python, CHILD, Path(tmp), request, env, timeout, warm_key={})


class VllmDryRunner(DryRunner):
    """`--dry-run` for `--engine vllm`: the child's result, or `{"unavailable": True}` without a vLLM
    Python (the rule reports ENG050 then)."""

    def run(self, spec: ModelSpec, settings: Any, plan: Plan[object], options: Mapping[str, Any]) -> dict[str, Any]:
        assert isinstance(settings, VllmSettings)
        if settings.trust_remote_code and registry.needs_remote_code(spec.raw_config):
            return {"unavailable": True, "why": "the config's class is the checkpoint's own code (auto_map), "
                                                "which kvdoctor's vLLM dry run does not run"}
        python = find_python(options.get("engine_python"))
        if python is None:
            return {"unavailable": True}
        return launch(spec, settings, python, timeout=options.get("dry_run_timeout") or DEFAULT_TIMEOUT)


def findings(spec: ModelSpec, plan: Plan[Any], result: dict[str, Any], catalog) -> list[Finding]:
    versions = result.get("versions") or {}
    where = spec.key_source("model_type")
    outcome = result.get("outcome")
    if outcome is None:
        why = "timed out" if result.get("timed_out") else f"exited with {result.get('returncode')}"
        return [Finding.at("ENG051", f"dry run (vllm {versions.get('vllm', '?')}): the child {why} before vLLM "
                           f"finished: {result.get('stderr_tail', '')[-300:]}", where,
                           evidence={"seconds": result.get("seconds")})]
    out: list[Finding] = []
    if not outcome["start"]:
        code = triage_code(catalog, outcome["class"], outcome["message"]) or "ENG051"
        predicted = plan.refusals[0] if plan.refusals else None
        # a bare assert has no text to match a pattern with: the plan predicted it if class and text agree
        foreseen = predicted is not None and (predicted.code == code or (
            predicted.error_class, predicted.message) == (outcome["class"], outcome["message"]))
        if not foreseen:
            frame = outcome.get("raised_at_vllm") or outcome.get("raised_at")
            out.append(Finding.at(code, f"dry run (vllm {versions.get('vllm')}): vLLM refused to start during "
                                  f"{outcome['stage']}: {outcome['class']}: {outcome['message']} (raised in {frame})",
                                  where, engine_error={"class": outcome["class"], "message": outcome["message"],
                                                       "stage": "startup", "frame": frame},
                                  evidence={"cpu_only": outcome.get("cpu_only", False),
                                            "workarounds": result.get("workarounds", [])}))
    differences = disagreements(plan, result)
    if differences:
        out.append(Finding.at("VLM030", f"the static vLLM plan and vLLM's own code disagree: {'; '.join(differences)}",
                              where, evidence={"differences": differences}))
    return out


def triage_code(catalog, error_class: str, message: str) -> str | None:
    from kvdoctor.catalog.matcher import Matcher

    matches = [entry for entry, _, _ in Matcher(catalog).spans(message)
               if entry.error is not None and entry.error.class_ == error_class
               and any(e.name == "vllm" for e in entry.engines)]
    return min(matches, key=lambda e: e.code).code if matches else None


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


def unavailable(spec: ModelSpec, why: str | None = None) -> Finding:
    why = why or f"no Python with vLLM 0.33.0 found (give --engine-python, or set {ENV_PYTHON})"
    return Finding.at("ENG050", f"dry run skipped: {why}; the static vLLM checks still ran",
                      spec.key_source("model_type"))


def version_ok(result: dict[str, Any]) -> bool:
    return bool(re.fullmatch(r"0\.33\.0(\+.*)?", (result.get("versions") or {}).get("vllm", "")))
