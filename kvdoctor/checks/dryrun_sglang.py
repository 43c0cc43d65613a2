"""What SGLang's own CUDA start-up said in a dry run (kvdoctor.engines.sglang.dryrun), as findings: a
start-up exception the plan did not predict under the catalog code whose SGLang pattern matches it
(ENG051 when none does); SGL050 where the static plan and SGLang's own answer disagree; SGL051 where
the torch_native backend read keys outside a sliding layer's window; ENG050 without an SGLang Python,
ENG065 when that Python could not run it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from kvdoctor.catalog import builtin_catalog
from kvdoctor.catalog.matcher import code_for
from kvdoctor.checks import DRY_RUN, Rule
from kvdoctor.checks.context import Context
from kvdoctor.checks.dryrun_child import environment_finding
from kvdoctor.engines.pins import PINS
from kvdoctor.model import Finding, ModelSpec

if TYPE_CHECKING:
    from kvdoctor.catalog import Catalog
    from kvdoctor.engines.base import Plan


RULE = Rule(codes=("ENG050", "ENG051", "ENG065", "SGL050", "SGL051"), engines=("sglang",), needs=(DRY_RUN,))


def run(ctx: Context) -> Iterable[Finding]:
    result = ctx.observations.get(DRY_RUN)
    if not isinstance(result, dict):
        return []
    if result.get("unavailable"):
        return [unavailable(ctx.spec)]
    return findings(ctx.spec, ctx.plan, result, ctx.options.get("catalog") or builtin_catalog(), ctx.deploy)


def unavailable(spec: ModelSpec) -> Finding:
    from kvdoctor.engines.sglang import dryrun

    return Finding.at("ENG050", f"dry run skipped: no Python with SGLang {PINS['sglang']} found (run `kvdoctor "
                      f"engines install sglang`, or give --engine-python, or set {dryrun.ENV_PYTHON}); the static "
                      "SGLang checks still ran",
                      spec.key_source("model_type"))


def findings(spec: ModelSpec, plan: Plan[Any], result: dict[str, Any], catalog: Catalog, deploy: Any = None
             ) -> list[Finding]:
    from kvdoctor.engines.sglang import dryrun

    version = (result.get("versions") or {}).get("sglang", "?")
    where = spec.key_source("model_type")
    outcome = result.get("outcome")
    environment = environment_finding("sglang", spec, result)
    if outcome is None and environment is not None:
        return [environment]
    if outcome is None:
        why = "timed out" if result.get("timed_out") else f"exited with {result.get('returncode')}"
        return [Finding.at("ENG051", f"dry run (sglang {version}): the child {why} before SGLang finished "
                           f"start-up: {result.get('stderr_tail', '')[-300:]}", where,
                           evidence={"seconds": result.get("seconds")})]
    out: list[Finding] = []
    if not outcome["start"] and environment is not None and code_for(catalog, "sglang", outcome["class"],
                                                                      outcome["message"]) is None:
        return [environment]
    if not outcome["start"] and not dryrun.sizing_at_default(outcome, result):
        code = code_for(catalog, "sglang", outcome["class"], outcome["message"]) or "ENG051"
        predicted = next(iter(dryrun.startup_refusals(plan)), None)
        if predicted is None or predicted.code != code:
            frame = outcome.get("raised_at_sglang") or outcome.get("raised_at")
            out.append(Finding.at(code, f"dry run (sglang {version}): SGLang refused to start during "
                                  f"{outcome['step']}: {outcome['class']}: {outcome['message']} (raised in {frame})",
                                  where, engine_error={"class": outcome["class"], "message": outcome["message"],
                                                       "stage": "startup", "frame": frame},
                                  evidence={"step": outcome["step"]}))
    out += torch_native_reads(spec, result, deploy.source("sglang.attention_backend") if deploy else None)
    differences = dryrun.disagreements(plan, result)
    if differences:
        listed = "; ".join(differences[:dryrun.MAX_LISTED]) + (f"; ... ({len(differences)} in all)"
                                                         if len(differences) > dryrun.MAX_LISTED else "")
        out.append(Finding.at("SGL050", f"the static SGLang plan and SGLang {version}'s own start-up disagree: "
                              f"{listed}", where, evidence={"differences": differences}))
    return out


TORCH_NATIVE = "torch_native"
TORCH_NATIVE_READS = ("https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/layers/attention/"
                      "torch_native_backend.py#L140")


def torch_native_reads(spec: ModelSpec, result: dict[str, Any], where: Any = None) -> list[Finding]:
    """SGL051: the deploy runs TorchNativeAttnBackend and a sliding layer, once its SWA slots no longer
    match its full-pool slots, read other keys than its window's (or failed) on SGLang's own pools."""
    args = result.get("server_args") or {}
    backends = {args.get(k) for k in ("attention_backend", "prefill_attention_backend", "decode_attention_backend")}
    if TORCH_NATIVE not in backends:
        return []
    out = []
    for run in result.get("window_reads") or []:
        if not run.get("after_swa_release") or not (run.get("error") or run.get("off_window_count")):
            continue
        if run.get("error"):
            error = run["error"]
            seen = f"raised {error['class']}: {error['message']} (in {error['raised_at_sglang']})"
        else:
            first = run["off_window"][0]
            seen = (f"read other keys than its last {run['window_left'] + 1} for {run['off_window_count']} of "
                    f"{run['queries']} queries (query {first['query']} read {first['count']} keys, "
                    f"{first['first']}..{first['last']})")
        out.append(Finding.at(
            "SGL051", f"layer {run['layer']} (sliding, SWA pool): SGLang's torch_native attention backend, run on "
                      f"SGLang's own pools after an earlier request's out-of-window SWA slots were released, {seen}: "
                      "it reads the SWA buffer at full-pool slot numbers", where or spec.key_source("model_type"),
            layer=run["layer"], engine_error=None if not run.get("error") else {
                "class": run["error"]["class"], "message": run["error"]["message"], "stage": "prefill"},
            evidence={"read": run, "source": TORCH_NATIVE_READS}))
        break
    return out
