"""What SGLang's own CUDA start-up said in a dry run (kvdoctor.engines.sglang.dryrun), as findings: the
findings every dry run gives (kvdoctor.checks.dryrun_engine), with SGL050 where the static plan and
SGLang's own answer disagree, and SGL051 where the torch_native backend read keys outside a sliding
layer's window."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from kvdoctor.catalog import builtin_catalog
from kvdoctor.checks import DRY_RUN, Rule, dryrun_engine
from kvdoctor.checks.context import Context
from kvdoctor.engines.base import DryRun
from kvdoctor.model import Finding, ModelSpec

if TYPE_CHECKING:
    from kvdoctor.catalog import Catalog
    from kvdoctor.engines.base import Plan


RULE = Rule(codes=("ENG050", "ENG051", "ENG065", "ENG110", "SGL050", "SGL051"), engines=("sglang",), needs=(DRY_RUN,))


def run(ctx: Context) -> Iterable[Finding]:
    record = ctx.observations.get(DRY_RUN)
    if not isinstance(record, DryRun):
        return []
    return findings(ctx.spec, ctx.plan, record, ctx.options.get("catalog") or builtin_catalog(), ctx.deploy)


def findings(spec: ModelSpec, plan: Plan[Any], record: DryRun, catalog: Catalog, deploy: Any = None
             ) -> list[Finding]:
    from kvdoctor.engines.sglang import dryrun

    result = record.observation or {}
    outcome = result.get("outcome") or {}
    predicted = next(iter(dryrun.startup_refusals(plan)), None)
    out = dryrun_engine.findings(record, spec, catalog, label="SGLang", difference_code="SGL050", predicted=predicted,
                                 judge_error=not dryrun.sizing_at_default(outcome, result),
                                 described=plan.versions.get("sglang"))
    if record.ran and record.outcome not in ("timeout", "crashed"):
        out += torch_native_reads(spec, result, deploy.source("sglang.attention_backend") if deploy else None)
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
