"""SGLang 0.5.23 on CUDA for every layer kind: pools, layer -> buffer index maps, hybrid-SWA, state pools,
start-up refusals. Pure functions over a ModelSpec and the `sglang:` deploy settings; no torch, no SGLang.

Entry point: `plan_layers(spec, settings) -> (layers, refusals, facts)`. KDA layers are labelled
`kda-replayssm` in the `mamba` pool; their state shapes stay with kvdoctor.engines.sglang.kda (the existing profile).
"""
from __future__ import annotations

from typing import Any

import msgspec

from kvdoctor.engines.base import LayerPlan, Refusal
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.sglang import archs, pools, refusals, sizing, swa
from kvdoctor.engines.sglang.settings import SglangSettings
from kvdoctor.model import CONV, FULL, GDN, KDA, MAMBA, MLA, NO_ATTENTION, SLIDING, SPARSE_MLA, ModelSpec

CACHE_LABELS = {"full": "full", "swa": "swa", "mla": "mla"}


class SglangCudaFacts(msgspec.Struct, frozen=True):
    """What `info.sglang` reports: the decisions behind the per-layer plan."""

    architecture: str
    attention_arch: str  # MHA | MLA
    hybrid_swa: bool
    hybrid_swa_why: str
    hybrid_swa_detail: str
    hybrid_swa_source: str
    swa_layer_ids: tuple[int, ...] | None
    full_layer_ids: tuple[int, ...] | None
    runner_sliding_window: int | None  # what SGLang sizes the SWA pool with (its window_left)
    window_differs_layers: tuple[int, ...]  # SGLang's window is not the model's own (SGL004)
    kind_differs_layers: tuple[int, ...]  # SGLang builds another layer kind than the config means (SGL005)
    pools: dict[str, Any] = msgspec.field(default_factory=dict)
    kv_cache_dtype: str = "bfloat16"
    override_warning: str | None = None
    budget: dict[str, Any] | None = None  # with `kv_budget`: tokens per pool, state slots, max running requests
    unmodeled: str | None = None  # what of SGLang's handling the plan does not model (SGL152)

    def to_json(self) -> dict[str, Any]:
        return {"attention_arch": self.attention_arch, "architecture": self.architecture,
                "hybrid_swa": {"on": self.hybrid_swa, "why": self.hybrid_swa_why, "detail": self.hybrid_swa_detail,
                               "source": self.hybrid_swa_source, "engine_log": self.override_warning},
                "swa_layer_ids": list(self.swa_layer_ids) if self.swa_layer_ids is not None else None,
                "full_layer_ids": list(self.full_layer_ids) if self.full_layer_ids is not None else None,
                "runner_sliding_window": self.runner_sliding_window,
                "window_differs_layers": list(self.window_differs_layers),
                "kind_differs_layers": list(self.kind_differs_layers),
                "kv_cache_dtype": self.kv_cache_dtype, "pools": self.pools, "budget": self.budget,
                "unmodeled": self.unmodeled}


def _cache(kind: str, placement: pools.Placement | None) -> str:
    if kind == KDA:
        return "kda-replayssm"
    if kind in (GDN, MAMBA, CONV):
        return "mamba"
    if placement is None:
        return "none"
    return CACHE_LABELS[placement.pool]


def plan_layers(spec: ModelSpec, settings: SglangSettings | None = None
                ) -> tuple[tuple[LayerPlan, ...], tuple[Refusal, ...], SglangCudaFacts]:
    settings = settings or SglangSettings()
    if spec.unread is not None and refusals.config_loader(spec, settings.release or PINS["sglang"]) is None:
        spec.require_layers()  # only SGLang's config loader answers a config whose layers kvdoctor could not read
    stated, spec = spec, pools.as_dsa_served(spec)
    decision = swa.decide(spec, settings)
    where = pools.placements(spec, decision)
    windows = swa.engine_windows(spec)
    state = pools.state_by_tp(spec, settings)
    kinds = pools.sglang_kinds(spec)
    layers = []
    for layer in spec.layers:
        placement = where.get(layer.index)
        kind = kinds[layer.index]
        extra: dict[str, Any] = {}
        if placement is not None:
            extra = {"pool": placement.pool, "pool_index": placement.index}
        layers.append(LayerPlan(index=layer.index, engine_window=windows.get(layer.index),
                                cache=_cache(kind, placement),
                                state=state if kind in (GDN, MAMBA, CONV) else None, extra=extra))
    differs = tuple(l.index for l in stated.layers if l.kind in (SLIDING, FULL)
                    and (l.window if l.kind == SLIDING else None) != windows.get(l.index))
    refused = refusals.predict(spec, settings)
    tp = settings.tp
    swa_ids = set(decision.swa_layer_ids or ()) if decision.on else set()
    full_ids = {i for i, p in where.items() if p.pool != "mamba"} - swa_ids
    buffers = {"attention_buffer_per_token": pools.attention_buffers(spec, settings, tp, full_ids)}
    if decision.on and archs.serving_arch(spec.raw_config) in archs.DEEPSEEK_V4_ARCHS:  # its SWA buffers hold whole pages
        buffers = {"attention_buffer_per_token": None, "swa_buffer_per_token": pools.dsv4_swa_page(spec)}
    elif decision.on:
        buffers["swa_buffer_per_token"] = pools.attention_buffers(spec, settings, tp, swa_ids, "swa")
    facts = SglangCudaFacts(
        architecture=archs.serving_arch(spec.raw_config),
        attention_arch="SSM" if archs.serving_arch(spec.raw_config) in archs.PURE_SSM_ARCHS
        else "MLA" if spec.kinds() & {MLA, SPARSE_MLA} else "MHA",
        hybrid_swa=decision.on, hybrid_swa_why=decision.why, hybrid_swa_detail=decision.detail,
        hybrid_swa_source=decision.source, swa_layer_ids=decision.swa_layer_ids,
        full_layer_ids=decision.full_layer_ids, runner_sliding_window=swa.runner_window(spec, decision.on),
        window_differs_layers=differs,
        kind_differs_layers=tuple(i for i, k in kinds.items() if k != stated.layers[i].kind),
        kv_cache_dtype=pools.kv_dtype(spec, settings),
        override_warning=decision.override_warning, budget=None if refused else sizing.size(spec, settings),
        pools={**pools.pool_classes(spec, decision), **buffers, "tp_size": tp},
        unmodeled=None if refused else unmodeled(spec, settings.release or PINS["sglang"]))  # a refused start-up builds no pool at all
    return tuple(layers), refused or refusals.pool_build(spec, settings), facts


def unmodeled(spec: ModelSpec, release: str = PINS["sglang"]) -> str | None:
    """Why the plan is not SGLang's own for this model, or None: an architecture SGLang has no model class for
    and serves with its Transformers backend (not modelled; where that backend refuses, SGL250 says so first),
    or Mamba layers whose state is not Mamba-2's (no state pool is planned for them)."""
    arch = archs.serving_arch(spec.raw_config)
    reasons = []
    if arch and arch not in refusals.registry(release)["architectures"]:
        reasons.append(f"sglang {release} has no model class for {arch}: it serves it with its "
                       "Transformers backend, which kvdoctor does not model")
    if MAMBA in spec.kinds() and pools.mamba2_dims(spec) is None and pools.mamba1_dims(spec) is None:
        reasons.append("its Mamba layers carry no Mamba-2 state keys (heads, head dim, groups, state, conv kernel): "
                       "no state pool is planned for them")
    other = sorted(spec.kinds() - set(pools.ATTENTION) - set(pools.STATE) - {NO_ATTENTION})
    if other:
        counts = ", ".join(f"{sum(l.kind == k for l in spec.layers)} {k}" for k in other)
        reasons.append(f"its {counts} layers get no pool in the plan (SGLang's pools for them are not modelled)")
    return "; ".join(reasons) or None
