"""KDA (built): build each KDA layer group's caches at every TP size the plan lists, replay the decode
wrapper's checks and the unchecked invariants on them, probe the recipe with distinct dimensions, run
the reference replay kernel against the recurrence and, where CUDA and sglang are importable, the
engine's own kernel.

One finding per (code, layer group): the evidence lists the group's layers and the TP sizes it hit.
Kernel-run figures go to the report's `kda_replayssm` info.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Optional

from kvdoctor.context import Context
from kvdoctor.engines.sglang import KdaPlan
from kvdoctor.kda import latent as latent_probe
from kvdoctor.kda.caches import (BATCH_SLOTS, build_bytes, build_caches, build_inputs, cache_shapes, input_bytes,
                                  negative_shape)
from kvdoctor.kda.dims import Geometry, LayerDims
from kvdoctor.kda.replay import kernel_run
from kvdoctor.kda.validate import WRAPPERS, Failure, invariants
from kvdoctor.limits import require_within_budget
from kvdoctor.model import Finding, Source

KERNEL_RUN_MAX_L = 16  # the run's cost grows with L^2; the protocol is the same at any L
KERNEL_RUN_MAX_KEY_HEADS = 2
# Which recipe entry a code points at (the model's dims are pointed at for the others).
RECIPE_KEYS = {"KDA001": "tensors.g_cache", "KDA002": "tensors.d_cache", "KDA003": "tensors.k_cache",
               "KDA004": "tensors.g_cache", "KDA005": "tensors.d_cache", "KDA006": "write_pos",
               "KDA007": "write_pos", "KDA008": "force_flush", "KDA024": "tensors.initial_state",
               "KDA025": "tensors.initial_state", "KDA040": "tensors", "KDA041": "cursor", "KDA042": "slots",
               "KDA050": "tensors", "KDA051": "cursor", "KDA052": "tensors"}


def run(ctx: Context) -> Iterable[Finding]:
    kp: Optional[KdaPlan] = ctx.plan.data.get("kda")
    if kp is None or kp.L < 1:  # L < 1 is refused at startup (KDA062): no decode ever runs
        return
    info = ctx.plan.data["report"].setdefault("kda_replayssm", {})
    info["kernel_runs"] = []
    for group in kp.groups:
        yield from _group(kp, group, info)


def _group(kp: KdaPlan, group: list[LayerDims], info: dict[str, Any]) -> Iterable[Finding]:
    dims = group[0]
    layers = [d.layer for d in group]
    wrapper = WRAPPERS[kp.validator]
    hits: dict[str, tuple[Failure, dict[int, str], dict]] = {}  # code -> (first failure, text by TP, shapes)
    passed: list[Geometry] = []
    for tp in kp.tp_sizes:
        if dims.tp_error(tp):
            continue
        geom = dims.geometry(tp, kp.L)
        require_within_budget(f"KDA caches of layer {dims.layer} at TP {tp}",
                              build_bytes(kp.recipe, geom, kp.settings.mamba_ssm_dtype) + input_bytes(geom),
                              dims.sources.get("HV"),
                              layer=dims.layer)
        caches = build_caches(kp.recipe, geom, ssm_dtype=kp.settings.mamba_ssm_dtype)
        inputs = build_inputs(geom, act_dtype=kp.act_dtype)
        failures = [f for f in (wrapper(inputs, caches),) if f] + invariants(inputs, caches)
        for failure in failures:
            shapes = {k: list(v) for k, v in cache_shapes(kp.recipe, geom, len(inputs.mixed_qkv)).items()}
            hits.setdefault(failure.code, (failure, {}, shapes))[1][tp] = failure.message
        if not failures:
            passed.append(geom)
    for code, (failure, texts, shapes) in hits.items():
        tps = list(texts)
        first = "" if len(set(texts.values())) == 1 else f" (text at TP {tps[0]}; each size's in evidence)"
        yield _finding(kp, dims, code,
                       f"layer {dims.layer} (KDA, {len(layers)} layer(s) alike) at TP {', '.join(map(str, tps))}: "
                       f"{_raises(kp.validator, failure)}{first}",
                       failure=failure, evidence={"layers": layers, "tp_sizes": tps, "shapes": shapes,
                                                  "messages_by_tp": {str(t): m for t, m in texts.items()}})
    if hits or not passed or passed[0].H <= 0 or passed[0].HV % passed[0].H:
        return
    real = passed[0]
    found = latent_probe.probe(kp.recipe, kp.validator, real)
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
    geometries = [_kernel_geometry(kp, real)]
    if found is None:
        geometries.append(latent_probe.probe_geometry(real))
    for geom in geometries:
        result = kernel_run(kp.recipe, geom)
        info["kernel_runs"].append({"layer": dims.layer, **result.to_json()})
        if result.ok:
            continue
        failure = result.failure
        code = failure.code if failure else "KDA051"
        g = result.geometry
        what = failure.message if failure else "; ".join(result.problems)
        yield _finding(kp, dims, code,
                       f"layer {dims.layer} (KDA): replaying the recipe's rings with its cursor rule "
                       f"({kp.recipe.cursor!r}) over {result.steps} decode steps (H={g['H']}, HV={g['HV']}, "
                       f"K={g['K']}, V={g['V']}, L={g['L']}) disagrees with the gated delta recurrence: {what}",
                       evidence={"layers": layers, "kernel_run": result.to_json()})
    yield from _gpu(kp, dims, layers, geometries[0], info)


def _gpu(kp: KdaPlan, dims: LayerDims, layers: list[int], geom: Geometry,
         info: dict[str, Any]) -> Iterable[Finding]:
    from kvdoctor.kda import gpu

    reason = gpu.unavailable_reason()
    if reason:
        info["gpu"] = f"skipped: {reason}"
        return
    backend = kp.validator
    case = gpu.run_case(gpu.GpuCase(backend=backend, geometry=geom, act_dtype=kp.act_dtype,
                                    state_dtype=kp.settings.mamba_ssm_dtype), gpu.load_kernels()[backend],
                        recipe=kp.recipe)
    info.setdefault("gpu_runs", []).append({"layer": dims.layer, "backend": backend, "case": case.label(),
                                            "output_rel_error": case.output_error,
                                            "state_rel_error": case.state_error, "ok": case.ok,
                                            "raised": case.raised})
    if not case.ok:
        what = case.raised or (f"output error {case.output_error:.2e}, state error {case.state_error:.2e} "
                               f"(tolerance {case.tolerance:.1e}), padded rows zero: {case.padded_rows_zero}, "
                               f"unused slots intact: {case.untouched_slots_intact}")
        yield _finding(kp, dims, "KDA052",
                       f"layer {dims.layer} (KDA): sglang's {backend} ReplaySSM kernel on this GPU, fed the "
                       f"recipe's caches, disagrees with the reference: {what}",
                       evidence={"layers": layers, "case": case.label()})


def _kernel_geometry(kp: KdaPlan, real: Geometry) -> Geometry:
    """The real dims with at most two key heads (grouping kept) and L <= 16, when the recipe builds and
    passes there too; else the real geometry, which passed."""
    heads = min(real.H, KERNEL_RUN_MAX_KEY_HEADS)
    reduced = replace(real.with_heads(heads, heads * (real.HV // real.H)), L=min(real.L, KERNEL_RUN_MAX_L))
    if negative_shape(cache_shapes(kp.recipe, reduced, batch=len(BATCH_SLOTS))):
        return real
    caches = build_caches(kp.recipe, reduced, ssm_dtype="float32")
    inputs = build_inputs(reduced, act_dtype="float32")
    if WRAPPERS[kp.validator](inputs, caches) or invariants(inputs, caches):
        return real
    return reduced


def _raises(validator: str, failure: Failure) -> str:
    if failure.error_class == "silent":
        return failure.message
    return f"the {validator} decode wrapper raises {failure.error_class}: {failure.message}"


def _finding(kp: KdaPlan, dims: LayerDims, code: str, message: str, *,
             failure: Optional[Failure] = None, key: Optional[str] = None, evidence: dict[str, Any]) -> Finding:
    """A finding located in the recipe (or at the model's dims), warning-level while the rings are off."""
    key = key or RECIPE_KEYS.get(code)
    recipe = kp.recipe
    if key is not None:
        source = Source("recipe", key, recipe.path, recipe.lines.get(key))
    else:
        source = dims.sources.get("HV")
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
