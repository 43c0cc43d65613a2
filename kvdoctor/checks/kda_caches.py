"""KDA (built): what the `kda_caches` probe saw when it built each KDA layer group's caches at every TP
size the plan lists, replayed the decode wrapper's checks and the unchecked invariants on them, probed
the recipe with distinct dimensions, ran the reference replay kernel against the recurrence and, where
CUDA and sglang are importable, the engine's own kernel.

One finding per (code, layer group): the evidence lists the group's layers and the TP sizes it hit.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional

import msgspec

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.model import Finding, Source

if TYPE_CHECKING:
    from kvdoctor.engines.sglang.profile import GroupRun, KdaPlan
    from kvdoctor.engines.sglang.kda.dims import LayerDims
    from kvdoctor.engines.sglang.kda.validate import Failure

PROBE = "kda_caches"  # kvdoctor.engines.sglang.profile.KdaCachesProbe (imported when the rule runs)

# The probe names the check that failed (kvdoctor.engines.sglang.kda.validate); each name is its catalog entry's name.
CODE_OF_CHECK = {
    "replayssm-g-cache-shape": "KDA001", "replayssm-d-cache-shape": "KDA002", "replayssm-k-cache-shape": "KDA003",
    "replayssm-g-cache-dtype": "KDA004", "replayssm-cache-length-zero": "KDA005",
    "replayssm-write-pos-dtype": "KDA006", "replayssm-write-pos-shape": "KDA007",
    "replayssm-force-flush-layout": "KDA008", "replayssm-ring-device": "KDA009",
    "replayssm-force-flush-device": "KDA010", "kda-a-layout": "KDA011", "kda-dt-bias-layout": "KDA012",
    "kda-mixed-qkv-rank": "KDA013", "kda-mixed-qkv-stride": "KDA014", "kda-a-b-rank": "KDA015",
    "kda-a-b-stride": "KDA016", "kda-a-log-rank": "KDA017", "kda-a-log-stride": "KDA018",
    "kda-state-indices-rank": "KDA019", "kda-out-contiguous": "KDA020", "kda-inputs-device": "KDA021",
    "kda-batch-mismatch": "KDA022", "kda-state-indices-batch": "KDA023", "kda-state-rank": "KDA024",
    "kda-state-stride": "KDA025", "helion-kda-power-of-two": "KDA026", "kda-a-shape": "KDA027",
    "kda-b-shape": "KDA028", "kda-a-log-numel": "KDA029", "kda-dt-bias-numel": "KDA030", "kda-out-shape": "KDA031",
    "kda-packed-width": "KDA032", "kda-packed-q-size": "KDA033", "kda-head-grouping": "KDA034",
    "kda-triton-gate-contiguous": "KDA035", "kda-triton-key-tiling": "KDA036",
    "replayssm-slot-dims-differ": "KDA040", "replayssm-cursor-out-of-range": "KDA041",
    "replayssm-slot-index-out-of-range": "KDA042", "replayssm-latent-ring-sizing": "KDA050",
}
RULE = Rule(codes=(*CODE_OF_CHECK.values(), "KDA051", "KDA052"), engines=("sglang",), needs=(f"probe:{PROBE}",))

# Which recipe entry a code points at (the model's dims are pointed at for the others).
RECIPE_KEYS = {"KDA001": "tensors.g_cache", "KDA002": "tensors.d_cache", "KDA003": "tensors.k_cache",
               "KDA004": "tensors.g_cache", "KDA005": "tensors.d_cache", "KDA006": "write_pos",
               "KDA007": "write_pos", "KDA008": "force_flush", "KDA024": "tensors.initial_state",
               "KDA025": "tensors.initial_state", "KDA040": "tensors", "KDA041": "cursor", "KDA042": "slots",
               "KDA050": "tensors", "KDA051": "cursor", "KDA052": "tensors"}


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.engines.sglang.profile import KdaCachesRun, kda_plan

    kp, seen = kda_plan(ctx.plan), ctx.observations.get(PROBE)
    if kp is None or not isinstance(seen, KdaCachesRun):
        return
    for group in seen.groups:
        yield from _group(kp, group)


def _group(kp: KdaPlan, run: GroupRun) -> Iterable[Finding]:
    from kvdoctor.engines.sglang.kda import latent as latent_probe

    dims, layers = run.dims, run.layers
    for check, (failure, texts, shapes) in run.hits.items():
        code = CODE_OF_CHECK[check]
        tps = list(texts)
        first = "" if len(set(texts.values())) == 1 else f" (text at TP {tps[0]}; each size's in evidence)"
        yield _finding(kp, dims, code,
                       f"layer {dims.layer} (KDA, {len(layers)} layer(s) alike) at TP {', '.join(map(str, tps))}: "
                       f"{_raises(kp.validator, failure)}{first}",
                       failure=failure, evidence={"layers": layers, "tp_sizes": tps, "shapes": shapes,
                                                  "messages_by_tp": {str(t): m for t, m in texts.items()}})
    if run.real is None:
        return
    found = run.latent
    if found is not None:
        hidden = (f"this model's shapes hide it ({', '.join(found.hidden_by)})" if found.hidden_by
                  else "this model's shapes hide it")
        yield _finding(kp, dims, "KDA050",
                       f"layer {dims.layer} (KDA): the recipe {kp.recipe.name!r} passes here only because dims "
                       f"coincide: {latent_probe.describe(found)}; with H=2, HV=4, K=32, V=64, L=3 "
                       f"{_raises(kp.validator, found.failure)} — {hidden}, a model with distinct dims fails at "
                       "its first decode step",
                       key=f"tensors.{found.wrong[0].tensor}" if found.wrong else None,
                       evidence={"layers": layers, "probe": {"H": 2, "HV": 4, "K": 32, "V": 64, "L": 3},
                                 "probe_error": found.failure.message, "hidden_by": found.hidden_by,
                                 "wrong_dims": [msgspec.structs.asdict(w) for w in found.wrong]})
    for _, result in run.kernel_runs:
        if result.ok:
            continue
        wrong = result.failure
        code = CODE_OF_CHECK[wrong.check] if wrong else "KDA051"
        g = result.geometry
        what = wrong.message if wrong else "; ".join(result.problems)
        yield _finding(kp, dims, code,
                       f"layer {dims.layer} (KDA): replaying the recipe's rings with its cursor rule "
                       f"({kp.recipe.cursor!r}) over {result.steps} decode steps (H={g['H']}, HV={g['HV']}, "
                       f"K={g['K']}, V={g['V']}, L={g['L']}) disagrees with the gated delta recurrence: {what}",
                       evidence={"layers": layers, "kernel_run": result.to_json()})
    case = run.gpu_case
    if case is not None and not case.ok:
        what = case.raised or (f"output error {case.output_error:.2e}, state error {case.state_error:.2e} "
                               f"(tolerance {case.tolerance:.1e}), padded rows zero: {case.padded_rows_zero}, "
                               f"unused slots intact: {case.untouched_slots_intact}")
        yield _finding(kp, dims, "KDA052",
                       f"layer {dims.layer} (KDA): sglang's {kp.validator} ReplaySSM kernel on this GPU, fed the "
                       f"recipe's caches, disagrees with the reference: {what}",
                       evidence={"layers": layers, "case": case.label()})


def _raises(validator: str, failure: Failure) -> str:
    if failure.error_class == "silent":
        return failure.message
    return f"the {validator} decode wrapper raises {failure.error_class}: {failure.message}"


def _finding(kp: KdaPlan, dims: LayerDims, code: str, message: str, *,
             failure: Optional[Failure] = None, key: Optional[str] = None, evidence: dict[str, Any]) -> Finding:
    """A finding located in the recipe (or at the model's dims), warning-level while the rings are off."""
    key = key or RECIPE_KEYS.get(code)
    recipe = kp.recipe
    source: Source | None = (Source("recipe", key, recipe.path, recipe.lines.get(key)) if key is not None
                             else dims.sources.get("HV"))
    engine_error = None
    if failure is not None and failure.error_class != "silent":
        engine_error = {"class": failure.error_class, "message": failure.message, "stage": "decode"}
    severity = None
    if not kp.settings.enable_linear_replayssm and code != "KDA050":
        severity = "warning"
        message += " (latent: enable_linear_replayssm is off)"
    evidence = {"recipe": recipe.name, "decode_backend": kp.validator, **evidence}
    return Finding.at(code, message, source, layer=dims.layer, engine_error=engine_error, severity=severity,
                      evidence=evidence)
