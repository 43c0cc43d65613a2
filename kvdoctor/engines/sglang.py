"""`sglang`: sglang 0.5.23 on CUDA, the KDA ReplaySSM state caches.

KDA layers get the per-slot state the allocation recipe gives (sglang 0.5.23's MambaPool rule unless
the deploy file names another recipe) at each tensor-parallel size: TP 1, 2, 4 and 8, or only the
deploy file's `sglang.tp_size`. Shapes are computed here without torch; the KDA checks build them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvdoctor.context import EnginePlan
from kvdoctor.deploy import Deploy, SglangSettings
from kvdoctor.errors import InputError
from kvdoctor.kda.caches import BATCH_SLOTS, cache_shapes, negative_shape, per_slot_report
from kvdoctor.kda.dims import LayerDims, kda_groups
from kvdoctor.kda.recipe import Recipe, load_recipe
from kvdoctor.model import CHUNKED, FULL, GDN, KDA, MAMBA, MLA, SLIDING, ATTN_MAMBA, LayerPlan, ModelSpec

VERSION = "0.5.23"
DEFAULT_TP_SIZES = (1, 2, 4, 8)
REPLAYSSM_BACKENDS = ("triton", "helion")
# MLA keeps its compressed latent for the whole context: a full cache, as the report's legend reads it.
CACHE_LABELS = {FULL: "full", MLA: "full", ATTN_MAMBA: "full", SLIDING: "windowed", CHUNKED: "windowed",
                GDN: "state", MAMBA: "state", KDA: "kda-replayssm"}


@dataclass
class KdaPlan:
    """What the KDA checks need: the recipe, the settings and each group of identical KDA layers."""

    recipe: Recipe
    settings: SglangSettings
    tp_sizes: tuple[int, ...]
    tp_from_deploy: bool
    validator: str  # which wrapper's checks apply: the decode backend's, Helion's for the others
    act_dtype: str
    groups: list[list[LayerDims]]
    states: dict[int, dict[str, Any]] = field(default_factory=dict)  # first layer of a group -> state by TP

    @property
    def L(self) -> int:
        return self.settings.linear_replayssm_cache_len


def _act_dtype(spec: ModelSpec) -> str:
    return spec.dtype if spec.dtype in ("bfloat16", "float16", "float32") else "bfloat16"


def _state_by_tp(kp: KdaPlan, dims: LayerDims) -> dict[str, Any]:
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
        out[str(tp)] = per_slot_report(kp.recipe, geom, kp.settings.mamba_ssm_dtype)
    return out


def plan(spec: ModelSpec, deploy: Deploy) -> EnginePlan:
    settings = deploy.sglang
    layers = [LayerPlan(index=l.index, engine_window=l.window if l.kind in (SLIDING, CHUNKED) else None,
                        cache=CACHE_LABELS.get(l.kind, "unknown")) for l in spec.layers]
    data: dict[str, Any] = {"report": {"engine_notes": []}}
    groups = kda_groups(spec)
    if groups:
        relative = Path(deploy.path).parent if deploy.path else None
        recipe = load_recipe(settings.kda_recipe, relative_to=relative)
        backend = settings.linear_attn_decode_backend
        kp = KdaPlan(recipe=recipe, settings=settings,
                     tp_sizes=(settings.tp_size,) if settings.tp_size else DEFAULT_TP_SIZES,
                     tp_from_deploy=settings.tp_size is not None,
                     validator=backend if backend in REPLAYSSM_BACKENDS else "helion",
                     act_dtype=_act_dtype(spec), groups=groups)
        by_index = {p.index: p for p in layers}
        for group in groups:
            state = _state_by_tp(kp, group[0])
            kp.states[group[0].layer] = state
            for dims in group:
                by_index[dims.layer].state = state
        data["kda"] = kp
        data["report"]["kda_replayssm"] = {
            "recipe": recipe.name, "recipe_file": recipe.path, "enabled": settings.enable_linear_replayssm,
            "cache_len": settings.linear_replayssm_cache_len, "decode_backend": backend,
            "checked_as": kp.validator, "tp_sizes": list(kp.tp_sizes), "ssm_dtype": settings.mamba_ssm_dtype,
            "layer_dims": {str(g[0].layer): {**g[0].to_json(), "layers": [d.layer for d in g]} for g in groups},
        }
        notes = data["report"]["engine_notes"]
        if not settings.enable_linear_replayssm:
            notes.append("enable_linear_replayssm is off: the d/k/g rings are what the flag would allocate; "
                         "problems with them are reported as warnings")
        if backend not in REPLAYSSM_BACKENDS:
            notes.append(f"decode backend {backend!r} has no ReplaySSM kernel; the rings were checked against "
                         "the Helion wrapper's contract")
    return EnginePlan(engine="sglang", versions={"sglang": VERSION}, layers=layers, data=data)
