"""`sglang`: sglang on CUDA (version in kvdoctor.engines.pins), the KDA ReplaySSM state caches.

KDA layers get the per-slot state the allocation recipe gives (sglang's MambaPool rule unless the
deploy file names another recipe) at each tensor-parallel size: TP 1, 2, 4 and 8, or only the deploy
file's `sglang.tp_size`. Shapes are computed here without torch; the `kda_caches` probe builds them.
What sglang refuses before any cache exists (heads not divisible by the TP size at load, the
ReplaySSM server-argument guards at start-up) is part of the plan. The same section sizes the
budget (`kvdoctor.engines.sglang.budget`).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import msgspec
from msgspec.structs import replace
from pydantic import BaseModel

from kvdoctor.engines.base import Cost, DryRunner, EngineProfile, Plan, Probe, Refusal
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.sglang.settings import SglangSettings
from kvdoctor.errors import InputError
from kvdoctor.model import ModelSpec

if TYPE_CHECKING:
    from kvdoctor.engines.budget.common import Budget, BudgetView
    from kvdoctor.engines.budget.facts import ModelFacts
    from kvdoctor.engines.budget.settings import BudgetSettings
    from kvdoctor.engines.sglang.layout import SglangCudaFacts
    from kvdoctor.engines.sglang.kda.dims import Geometry, LayerDims
    from kvdoctor.engines.sglang.kda.recipe import Recipe
    from kvdoctor.engines.sglang.kda.latent import Latent
    from kvdoctor.engines.sglang.kda.replay import KernelRun
    from kvdoctor.engines.sglang.kda.validate import Failure

DEFAULT_TP_SIZES = (1, 2, 4, 8)
REPLAYSSM_BACKENDS = ("triton", "helion")
# MLA keeps its compressed latent for the whole context: a full cache, as the report's legend reads it.


class KdaPlan(msgspec.Struct, frozen=True):
    """What the KDA rules and the probe need: the recipe, the settings and each group of identical KDA layers."""

    recipe: Recipe
    settings: SglangSettings
    tp_sizes: tuple[int, ...]
    tp_from_deploy: bool
    validator: str  # which wrapper's checks apply: the decode backend's, Helion's for the others
    act_dtype: str
    groups: tuple[tuple[LayerDims, ...], ...]
    states: Mapping[int, Mapping[str, Any]] = msgspec.field(default_factory=dict)  # first layer of a group -> state by TP

    @property
    def L(self) -> int:
        return self.settings.linear_replayssm_cache_len


class SglangFacts(msgspec.Struct, frozen=True):
    """The sglang plan's facts: the CUDA pool plan of every layer, and the KDA state plan (None without KDA)."""

    pools: SglangCudaFacts
    kda: KdaPlan | None = None


def kda_plan(plan: Plan[object]) -> KdaPlan | None:
    """The KDA facts of an sglang plan (None: the model has no KDA layers, or another engine's plan)."""
    return plan.facts.kda if isinstance(plan.facts, SglangFacts) else None


def pool_facts(plan: Plan[object]) -> SglangCudaFacts | None:
    """The CUDA pool facts of an sglang plan (None: another engine's plan)."""
    return plan.facts.pools if isinstance(plan.facts, SglangFacts) else None


def _act_dtype(spec: ModelSpec) -> str:
    return spec.dtype if spec.dtype in ("bfloat16", "float16", "float32") else "bfloat16"


def _state_by_tp(kp: KdaPlan, dims: LayerDims) -> dict[str, Any]:
    from kvdoctor.engines.sglang.kda.caches import BATCH_SLOTS, cache_shapes, negative_shape, per_slot_report

    out: dict[str, Any] = {}
    for tp in kp.tp_sizes:
        refusal = dims.tp_error(tp)
        if refusal:
            out[str(tp)] = {"error": refusal}
            continue
        geom = dims.geometry(tp, max(kp.L, 0))
        negative = negative_shape(cache_shapes(kp.recipe, geom, batch=len(BATCH_SLOTS)))
        if negative:
            raise InputError(f"{kp.recipe.path}: KDA recipe gives {negative} a negative size for layer "
                             f"{dims.layer} at TP {tp}")
        out[str(tp)] = per_slot_report(kp.recipe, geom, kp.settings.ssm_dtype)
    return out


def _refusals(kp: KdaPlan) -> list[Refusal]:
    """sglang's refusals before any cache exists: the ReplaySSM start-up guards, then TP at load."""
    settings, out = kp.settings, []
    if settings.enable_linear_replayssm and settings.linear_attn_decode_backend not in REPLAYSSM_BACKENDS:
        message = ("--enable-linear-replayssm requires Triton, or Helion for KDA, as the linear-attn decode "
                   f"backend; got --linear-attn-decode-backend={settings.linear_attn_decode_backend!r}.")
        out.append(Refusal("KDA061", "ValueError", message, "startup", explanation=f"sglang refuses to start: {message}",
                           setting="sglang.linear_attn_decode_backend",
                           evidence={"decode_backend": settings.linear_attn_decode_backend}))
    if kp.L < 1:
        message = f"--linear-replayssm-cache-len must be >= 1, got {kp.L}."
        on = settings.enable_linear_replayssm
        out.append(Refusal("KDA062", "ValueError", message, "startup", setting="sglang.linear_replayssm_cache_len",
                           explanation=(f"sglang refuses to start: {message}" if on else
                                        f"{message} (refused at startup once enable_linear_replayssm is on)"),
                           severity=None if on else "warning", latent=not on, evidence={"cache_len": kp.L}))
    for group in kp.groups:
        dims = group[0]
        for tp in kp.tp_sizes:
            refusal = dims.tp_error(tp)
            if refusal is None:
                continue
            if kp.tp_from_deploy:
                text = f"layer {dims.layer} (KDA): sglang cannot load this model at TP {tp}: {refusal}"
            else:
                text = (f"layer {dims.layer} (KDA): this model cannot be served at TP {tp} (one of the sizes checked "
                        f"by default): {refusal}")
            out.append(Refusal("KDA060", "ValueError", refusal, "load", layer=dims.layer, explanation=text,
                               key=None if kp.tp_from_deploy else "linear_attn_config.num_heads",
                               setting="sglang.tp_size" if kp.tp_from_deploy else None,
                               severity=None if kp.tp_from_deploy else "warning",
                               evidence={"tp_size": tp, "num_heads": dims.config_heads,
                                         "layers": [d.layer for d in group]}))
    return out


# ---- the KDA cache probe -------------------------------------------------------------------------

class GroupRun(msgspec.Struct, frozen=True):
    """What the probe saw for one group of identical KDA layers."""

    dims: LayerDims
    layers: list[int]
    # the check of the first failure -> (that failure, its text by TP, the cache shapes it was seen with)
    hits: dict[str, tuple[Failure, dict[int, str], dict[str, list[int]]]]
    real: Geometry | None  # the first geometry that passed every check, when the group is clean
    latent: Latent | None = None
    kernel_runs: tuple[tuple[Geometry, KernelRun], ...] = ()
    gpu: Mapping[str, Any] | None = None  # the GPU run's record, or {"skipped": reason}
    gpu_case: Any = None  # kvdoctor.engines.sglang.kda.gpu's case result


class KdaCachesRun(msgspec.Struct, frozen=True):
    groups: tuple[GroupRun, ...] = ()
    ran: bool = False  # False: nothing to run (no KDA layers, or the rings are refused at start-up)


class KdaCachesProbe(Probe):
    """Build each KDA group's caches at every TP size of the plan, replay the decode wrapper's checks and
    the invariants on them, probe the recipe with distinct dimensions, run the reference replay kernel
    and, where CUDA and sglang are importable, the engine's own kernel."""

    name = "kda_caches"

    def costs(self, spec: ModelSpec, plan: Plan[object], settings: BaseModel) -> Sequence[Cost]:
        from kvdoctor.engines.sglang.kda.caches import build_bytes, input_bytes

        kp = kda_plan(plan)
        if kp is None or kp.L < 1:
            return ()
        out = []
        for group in kp.groups:
            dims = group[0]
            for tp in kp.tp_sizes:
                if dims.tp_error(tp):
                    continue
                geom = dims.geometry(tp, kp.L)
                out.append(Cost(f"KDA caches of layer {dims.layer} at TP {tp}",
                                build_bytes(kp.recipe, geom, kp.settings.ssm_dtype) + input_bytes(geom),
                                dims.sources.get("HV"), dims.layer))
        return out

    def run(self, spec: ModelSpec, plan: Plan[object], settings: BaseModel, fits: int) -> KdaCachesRun:
        kp = kda_plan(plan)
        if kp is None or kp.L < 1:  # L < 1 is refused at startup (KDA062): no decode ever runs
            return KdaCachesRun()
        groups, budget = [], fits
        for group in kp.groups:
            units = sum(1 for tp in kp.tp_sizes if not group[0].tp_error(tp))
            if units > budget:
                break  # this group's caches pass the budget: it and the groups after it are not built
            budget -= units
            groups.append(_run_group(kp, group))
        return KdaCachesRun(groups=tuple(groups), ran=True)


def _run_group(kp: KdaPlan, group: tuple[LayerDims, ...]) -> GroupRun:
    from kvdoctor.engines.sglang.kda import latent as latent_probe
    from kvdoctor.engines.sglang.kda.caches import build_caches, build_inputs, cache_shapes
    from kvdoctor.engines.sglang.kda.replay import kernel_run
    from kvdoctor.engines.sglang.kda.validate import WRAPPERS, invariants

    dims = group[0]
    layers = [d.layer for d in group]
    wrapper = WRAPPERS[kp.validator]
    hits: dict[str, tuple[Failure, dict[int, str], dict[str, list[int]]]] = {}
    passed: list[Geometry] = []
    for tp in kp.tp_sizes:
        if dims.tp_error(tp):
            continue
        geom = dims.geometry(tp, kp.L)
        caches = build_caches(kp.recipe, geom, ssm_dtype=kp.settings.ssm_dtype)
        inputs = build_inputs(geom, act_dtype=kp.act_dtype)
        failures = [f for f in (wrapper(inputs, caches),) if f] + invariants(inputs, caches)
        for failure in failures:
            shapes = {k: list(v) for k, v in cache_shapes(kp.recipe, geom, len(inputs.mixed_qkv)).items()}
            hits.setdefault(failure.check, (failure, {}, shapes))[1][tp] = failure.message
        if not failures:
            passed.append(geom)
    if hits or not passed or passed[0].H <= 0 or passed[0].HV % passed[0].H:
        return GroupRun(dims, layers, hits, None)
    real = passed[0]
    found = latent_probe.probe(kp.recipe, kp.validator, real)
    geometries = [_kernel_geometry(kp, real)]
    if found is None:
        geometries.append(latent_probe.probe_geometry(real))
    runs = tuple((geom, kernel_run(kp.recipe, geom)) for geom in geometries)
    gpu, case = _gpu(kp, geometries[0])
    return GroupRun(dims, layers, hits, real, found, runs, gpu, case)


def _gpu(kp: KdaPlan, geom: Geometry) -> tuple[dict[str, Any], Any]:
    from kvdoctor.engines.sglang.kda import gpu

    reason = gpu.unavailable_reason()
    if reason:
        return {"skipped": reason}, None
    backend = kp.validator
    case = gpu.run_case(gpu.GpuCase(backend=backend, geometry=geom, act_dtype=kp.act_dtype,
                                    state_dtype=kp.settings.ssm_dtype), gpu.load_kernels()[backend],
                        recipe=kp.recipe)
    return {"backend": backend, "case": case.label(), "output_rel_error": case.output_error,
            "state_rel_error": case.state_error, "ok": case.ok, "raised": case.raised}, case


KERNEL_RUN_MAX_L = 16  # the run's cost grows with L^2; the protocol is the same at any L
KERNEL_RUN_MAX_KEY_HEADS = 2


def _kernel_geometry(kp: KdaPlan, real: Geometry) -> Geometry:
    """The real dims with at most two key heads (grouping kept) and L <= 16, when the recipe builds and
    passes there too; else the real geometry, which passed."""
    from kvdoctor.engines.sglang.kda.caches import BATCH_SLOTS, build_caches, build_inputs, cache_shapes, negative_shape
    from kvdoctor.engines.sglang.kda.validate import WRAPPERS, invariants

    heads = min(real.H, KERNEL_RUN_MAX_KEY_HEADS)
    reduced = replace(real.with_heads(heads, heads * (real.HV // real.H)), L=min(real.L, KERNEL_RUN_MAX_L))
    if negative_shape(cache_shapes(kp.recipe, reduced, batch=len(BATCH_SLOTS))):
        return real
    caches = build_caches(kp.recipe, reduced, ssm_dtype="float32")
    inputs = build_inputs(reduced, act_dtype="float32")
    if WRAPPERS[kp.validator](inputs, caches) or invariants(inputs, caches):
        return real
    return reduced


# ---- the pool probe: SGLang's own pool classes on the CPU device ---------------------------------

class PoolsRun(msgspec.Struct, frozen=True):
    """What the pool probe saw: the invariants and the start-up outcome beside the plan, or why it was skipped."""

    skipped: str | None = None
    invariants: Mapping[str, Any] = msgspec.field(default_factory=dict)  # each a list of breaches, empty when it holds
    startup: Mapping[str, Any] = msgspec.field(default_factory=dict)  # probe.startup_agreement's record
    classes: Mapping[str, Any] = msgspec.field(default_factory=dict)  # the pool classes SGLang built

    def to_json(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        return {"invariants": dict(self.invariants), "startup": dict(self.startup), "built": dict(self.classes)}


def sglang_python() -> str | None:
    """An interpreter with SGLang: KVDOCTOR_SGLANG_PYTHON when set (none if it names no file), else the
    repository's goldens/.venv/sglang."""
    import os

    from kvdoctor.engines.sglang import probe

    if os.environ.get("KVDOCTOR_SGLANG_PYTHON"):
        return probe.interpreter()
    local = Path(__file__).resolve().parents[3] / "goldens" / ".venv" / "sglang" / "bin" / "python"
    return str(local) if local.exists() else None


class SglangPoolsProbe(Probe):
    """Build the model's pools with SGLang's own classes, tiny, on the CPU device (a child process with
    SGLang), write a canary through each layer's accessor and set where it lands against the plan."""

    name = "sglang_pools"

    def run(self, spec: ModelSpec, plan: Plan[object], settings: BaseModel, fits: int) -> PoolsRun:
        import json
        import tempfile

        from kvdoctor.engines.sglang import probe

        assert isinstance(settings, SglangSettings)
        python = sglang_python()
        if python is None:
            return PoolsRun(skipped="no SGLang " + PINS["sglang"] + " Python: set KVDOCTOR_SGLANG_PYTHON to one")
        args = settings.server_args()
        with tempfile.TemporaryDirectory(prefix="kvdoctor-sglang-") as tmp:  # never the model's own directory
            (Path(tmp) / "config.json").write_text(json.dumps(spec.raw_config))
            seen = probe.observe(Path(tmp), args, python)
        refusals = [r for r in plan.refusals if r.code.startswith("SGL") and not r.latent]
        startup = probe.startup_agreement(seen, refusals)
        if not seen.get("ok"):
            return PoolsRun(startup=startup)
        return PoolsRun(invariants=probe.invariants(seen, plan.layers), startup=startup,
                        classes={k: seen[k] for k in ("token_to_kv_pool", "req_to_token_pool") if k in seen})


# ---- the profile ---------------------------------------------------------------------------------

class SglangProfile(EngineProfile):
    name = "sglang"
    probe_extra = ("torch", "its probes build torch state caches")
    pins = {"sglang": PINS["sglang"]}
    release_dist = "sglang"
    Settings = SglangSettings
    refusal_codes = ("KDA060", "KDA061", "KDA062", "SGL001", "SGL002", "SGL003", "SGL005", "SGL009", "SGL010",
                     "SGL012")
    answers_unread = True  # its config loader (remote code, an unknown model_type) comes before any layer

    def plan(self, spec: ModelSpec, settings: BaseModel) -> Plan[SglangFacts]:
        from kvdoctor.engines.sglang.layout import plan_layers
        from kvdoctor.engines.sglang.kda.dims import kda_groups
        from kvdoctor.engines.sglang.kda.recipe import load_recipe

        assert isinstance(settings, SglangSettings)
        states: dict[int, Mapping[str, Any]] = {}
        groups = kda_groups(spec)
        kp: KdaPlan | None = None
        if groups:
            recipe = load_recipe(settings.kda_recipe)
            backend = settings.linear_attn_decode_backend
            kp = KdaPlan(recipe=recipe, settings=settings,
                         tp_sizes=(settings.tp_size,) if settings.tp_size else DEFAULT_TP_SIZES,
                         tp_from_deploy=settings.tp_size is not None,
                         validator=backend if backend in REPLAYSSM_BACKENDS else "helion",
                         act_dtype=_act_dtype(spec), groups=tuple(tuple(g) for g in groups))
            for group in kp.groups:
                states[group[0].layer] = _state_by_tp(kp, group[0])
            kp = replace(kp, states=states)
        state_of = {dims.layer: states[group[0].layer] for group in (kp.groups if kp else ()) for dims in group}
        cuda_layers, cuda_refusals, pools = plan_layers(spec, settings)
        layers = tuple(replace(lp, state=state_of[lp.index]) if lp.index in state_of else lp for lp in cuda_layers)
        notes = []
        if kp is not None:
            if not settings.enable_linear_replayssm:
                notes.append("enable_linear_replayssm is off: the d/k/g rings are what the flag would allocate; "
                             "problems with them are reported as warnings")
            if settings.linear_attn_decode_backend not in REPLAYSSM_BACKENDS:
                notes.append(f"decode backend {settings.linear_attn_decode_backend!r} has no ReplaySSM kernel; the "
                             "rings were checked against the Helion wrapper's contract")
        refusals = (tuple(_refusals(kp)) if kp else ()) + tuple(cuda_refusals)
        return Plan(engine=self.name, versions={"sglang": settings.release or PINS["sglang"]}, layers=layers,
                    refusals=refusals,
                    facts=SglangFacts(pools=pools, kda=kp), notes=tuple(notes))

    def probes(self) -> Sequence[Probe]:
        return (KdaCachesProbe(), SglangPoolsProbe())

    def dry_run(self) -> DryRunner:
        from kvdoctor.engines.sglang.dryrun import SglangDryRunner

        return SglangDryRunner()

    def report(self, plan: Plan[object], observations: Mapping[str, object]) -> dict[str, Any]:
        out: dict[str, Any] = {"engine_notes": list(plan.notes)}
        pools = pool_facts(plan)
        if pools is not None:
            out["sglang"] = pools.to_json()
            seen = observations.get(SglangPoolsProbe.name)
            if isinstance(seen, PoolsRun):
                out["sglang"]["pool_probe"] = seen.to_json()
        kp = kda_plan(plan)
        if kp is None:
            return out
        settings = kp.settings
        info: dict[str, Any] = {
            "recipe": kp.recipe.name, "recipe_file": kp.recipe.path, "enabled": settings.enable_linear_replayssm,
            "cache_len": settings.linear_replayssm_cache_len, "decode_backend": settings.linear_attn_decode_backend,
            "checked_as": kp.validator, "tp_sizes": list(kp.tp_sizes), "ssm_dtype": settings.ssm_dtype,
            "layer_dims": {str(g[0].layer): {**g[0].to_json(), "layers": [d.layer for d in g]} for g in kp.groups},
        }
        run = observations.get(KdaCachesProbe.name)
        if isinstance(run, KdaCachesRun) and run.ran:
            info["kernel_runs"] = [{"layer": g.dims.layer, **result.to_json()}
                                   for g in run.groups for _, result in g.kernel_runs]
            for g in run.groups:
                if g.gpu is None:
                    continue
                if "skipped" in g.gpu:
                    info["gpu"] = f"skipped: {g.gpu['skipped']}"
                else:
                    info.setdefault("gpu_runs", []).append({"layer": g.dims.layer, **g.gpu})
        out["kda_replayssm"] = info
        return out

    budget_setting_keys = {key: key for key in ("swa_full_tokens_ratio", "max_running_requests", "mamba_ssm_dtype",
                                                "disable_hybrid_swa_memory", "page_size")}

    def budget_view(self, row: Mapping[str, Any]) -> BudgetView:
        from kvdoctor.engines.sglang.budget import view

        return view(dict(row))

    def budget(self, facts: ModelFacts, config: Mapping[str, Any], settings: BaseModel, inputs: BudgetSettings,
               all_modes: bool) -> tuple[Sequence[Budget], dict[str, Any]]:
        from kvdoctor.engines.sglang.budget import budgets

        from kvdoctor.engines.sglang.pools import default_page_size, minimax_index, minimax_page

        assert isinstance(settings, SglangSettings)
        dsa = bool(facts.kinds()["dsa"])
        raw = {"architectures": facts.architectures, **config}
        facts.minimax_index = minimax_index(raw, len(facts.layers))
        if settings.page_size is None or dsa:  # the backend's default; DSA's override replaces a given one too
            minimax = minimax_page(next(iter(facts.architectures), None), settings.attention_backend,
                                   settings.release or PINS["sglang"])
            settings = settings.model_copy(update={"page_size": default_page_size(dsa, config, minimax)})
        return budgets(facts, settings, inputs, all_modes)

    def fit(self, spec: ModelSpec, facts: ModelFacts, gpu: Any, layout: Mapping[str, Any], request: Any,
            settings: Mapping[str, Any]) -> Any:
        from kvdoctor.engines.sglang import fit as fit_sglang

        return fit_sglang.fit(spec, facts, gpu, dict(layout), request, dict(settings))

    def fit_layouts(self, facts: ModelFacts, config: Mapping[str, Any], gpus: int) -> list[dict[str, Any]]:
        from kvdoctor.engines.sglang import fit as fit_sglang

        return fit_sglang.layouts(facts, dict(config), gpus)

    def budget_facts(self, spec: ModelSpec) -> "ModelFacts":
        """The layers as SGLang builds them, with the Mamba-2 state, DSA and LFM2 conv layers its calculator
        prices (the reading `check --engine sglang` sizes its pools from)."""
        import msgspec

        from kvdoctor.engines.sglang.pools import as_sglang_builds
        from kvdoctor.engines.sglang.sizing import priced
        from kvdoctor.model import CHUNKED, SLIDING

        built = as_sglang_builds(spec)
        # a chunked layer is an SWA layer to SGLang (configs/model_config.py get_hybrid_layer_ids)
        built = msgspec.structs.replace(built, layers=[msgspec.structs.replace(l, kind=SLIDING) if l.kind == CHUNKED else l
                                                   for l in built.layers])
        return priced(built, spec)
