"""KDA (built): what the `kda_caches` probe saw when it built each KDA layer group's caches at every TP
size the plan lists, replayed the decode wrapper's checks and the unchecked invariants on them, probed
the recipe with distinct dimensions, ran the reference replay kernel against the recurrence and, where
CUDA and sglang are importable, the engine's own kernel.

One finding per (code, layer group): the evidence lists the group's layers and the TP sizes it hit.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional

from kvdoctor.checks import Rule
from kvdoctor.context import Context
from kvdoctor.model import Finding, Source

if TYPE_CHECKING:
    from kvdoctor.engines.sglang import GroupRun, KdaPlan
    from kvdoctor.kda.dims import LayerDims
    from kvdoctor.kda.validate import Failure

PROBE = "kda_caches"  # kvdoctor.engines.sglang.KdaCachesProbe (imported when the rule runs)
RULE = Rule(codes=tuple(f"KDA{n:03d}" for n in (*range(1, 37), 40, 41, 42, 50, 51, 52)), engines=("sglang",),
            needs=(f"probe:{PROBE}",))

# Which recipe entry a code points at (the model's dims are pointed at for the others).
RECIPE_KEYS = {"KDA001": "tensors.g_cache", "KDA002": "tensors.d_cache", "KDA003": "tensors.k_cache",
               "KDA004": "tensors.g_cache", "KDA005": "tensors.d_cache", "KDA006": "write_pos",
               "KDA007": "write_pos", "KDA008": "force_flush", "KDA024": "tensors.initial_state",
               "KDA025": "tensors.initial_state", "KDA040": "tensors", "KDA041": "cursor", "KDA042": "slots",
               "KDA050": "tensors", "KDA051": "cursor", "KDA052": "tensors"}


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.engines.sglang import KdaCachesRun, kda_plan

    kp, seen = kda_plan(ctx.plan), ctx.observations.get(PROBE)
    if kp is None or not isinstance(seen, KdaCachesRun):
        return
    for group in seen.groups:
        yield from _group(kp, group)


def _group(kp: KdaPlan, run: GroupRun) -> Iterable[Finding]:
    from kvdoctor.kda import latent as latent_probe

    dims, layers = run.dims, run.layers
    for code, (failure, texts, shapes) in run.hits.items():
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
                                 "wrong_dims": [w.__dict__ for w in found.wrong]})
    for _, result in run.kernel_runs:
        if result.ok:
            continue
        wrong = result.failure
        code = wrong.code if wrong else "KDA051"
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
