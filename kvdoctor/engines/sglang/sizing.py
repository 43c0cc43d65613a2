"""Tokens per pool and max running requests for a KV budget, through kvdoctor's SGLang budget calculator
(kvdoctor.engines.sglang.budget, itself checked against SGLang's own sizing in goldens/sglang.json)."""
from __future__ import annotations

from typing import Any

import msgspec

from kvdoctor.engines.sglang import budget
from kvdoctor.engines.budget.facts import Layer, Mamba1Dims, Mamba2Dims, ModelFacts, ShortConvDims, facts_from_spec
from kvdoctor.engines.sglang import archs, pools, swa
from kvdoctor.engines.sglang.pools import as_sglang_builds
from kvdoctor.engines.sglang.refusals import derived_context_length
from kvdoctor.engines.sglang.settings import SglangSettings
from kvdoctor.errors import InputError
from kvdoctor.model import CHUNKED, COMPRESSED, CONV, FULL, MAMBA, NO_ATTENTION, SLIDING, SPARSE_MLA, ModelSpec


def mode(spec: ModelSpec, settings: SglangSettings, kv_budget: int) -> budget.Mode:
    return budget.Mode(
        context_length=settings.context_length or derived_context_length(spec), kv_budget_bytes=kv_budget,
        page_size=pools.resolved_page_size(spec, settings.page_size, settings.attention_backend,
                                            settings.release or budget.VERSION),
        swa_full_tokens_ratio=settings.swa_full_tokens_ratio,
        swa_ratio_set="swa_full_tokens_ratio" in settings.model_fields_set,
        disable_hybrid_swa_memory=settings.disable_hybrid_swa_memory, kv_cache_dtype=settings.kv_cache_dtype,
        tp=settings.tp, max_mamba_cache_size=settings.max_mamba_cache_size, mamba_ssm_dtype=settings.mamba_ssm_dtype,
        radix_cache=settings.radix_cache, max_running_requests=settings.max_running_requests,
        overlap_schedule=not settings.disable_overlap_schedule, release=settings.release or budget.VERSION)


def as_sized(spec: ModelSpec, settings: SglangSettings) -> tuple[ModelSpec, bool]:
    """The layers as SGLang sizes them, and whether hybrid-SWA memory is on. With it on, each attention
    layer is in the SWA or the full pool by SGLang's own SWA layer ids (a chunked layer is an SWA layer,
    configs/model_config.py `get_hybrid_layer_ids`); every layer of a pool has the pool's one shape."""
    built = as_sglang_builds(spec)
    decision = swa.decide(spec, settings)
    swa_ids = set(decision.swa_layer_ids or ()) if decision.on else set()
    shapes = {pool: pools.pool_geometry(spec, pool) for pool in ("full", "swa")}
    layers = []
    for layer in built.layers:
        if layer.kind in (FULL, SLIDING, CHUNKED):
            pool = "swa" if layer.index in swa_ids else "full"
            heads, key, value = shapes[pool]
            kind = SLIDING if pool == "swa" else (FULL if decision.on else layer.kind)
            window = layer.window if layer.kind != FULL else spec.config.get("sliding_window")
            layer = msgspec.structs.replace(layer, kind=SLIDING if kind == CHUNKED else kind, n_kv_heads=heads,
                                        head_dim=key, v_head_dim=value,
                                        window=window if kind == SLIDING else None)
        layers.append(layer)
    return msgspec.structs.replace(built, layers=layers), decision.on


def priced(built: ModelSpec, spec: ModelSpec) -> ModelFacts:
    """The budget facts of `built` (the layers as SGLang builds them): the Mamba (-1 or -2), DSA and LFM2 conv
    layers SGLang's calculator prices, with the model's own state dims (in SGLang's spellings, kvdoctor.engines.
    sglang.pools) and DSA index skips."""
    mamba = [l.index for l in built.layers if l.kind == MAMBA]
    unread = msgspec.structs.replace(built, layers=[msgspec.structs.replace(l, kind=NO_ATTENTION) if l.kind == MAMBA
                                                    else l for l in built.layers])
    facts = facts_from_spec(unread, extra_kinds={SPARSE_MLA: "dsa", CONV: "short_conv", COMPRESSED: "compressed"})
    facts.dsa_index_skips = budget.dsa_index_skips(spec)
    facts.minimax_index = pools.minimax_index(spec.raw_config, len(spec.layers))
    facts.raw_config = spec.raw_config
    if archs.serving_arch(spec.raw_config) in archs.DEEPSEEK_V4_ARCHS:  # sized from compress_ratios, not layer kinds
        facts.dsv4 = dict(spec.config)
    if mamba:
        two, one = pools.mamba2_dims(spec), pools.mamba1_dims(spec)
        if two is None and one is None:
            raise InputError(f"{spec.model_dir / 'config.json'}: Mamba layers without the Mamba-2 (heads, head dim, "
                             "state, groups, conv kernel) or pure Mamba-1 keys SGLang sizes a state from")
        if two is not None:
            heads, head_dim, state, groups, kernel = two
            facts.mamba = Mamba2Dims(heads, head_dim, groups, state, kernel)
        elif one is not None:
            facts.mamba1 = Mamba1Dims(*one)
        facts.layers = sorted(facts.layers + [Layer(i, "mamba") for i in mamba], key=lambda l: l.index)
    if facts.count("short_conv") and archs.serving_arch(spec.raw_config) in archs.TYPED_CONV_ARCHS:
        # Lfm2Config lists its conv state layers from the whole layer_types (configs/lfm2.py:46-51): an entry past
        # num_hidden_layers (an MTP layer appended) is a conv state layer too
        types = spec.config.get("layer_types")
        past = [i for i, t in enumerate(types) if i >= len(spec.layers) and t in ("conv", "short_conv")] \
            if isinstance(types, list) else []
        facts.layers = facts.layers + [Layer(i, "short_conv") for i in past]
    if facts.count("short_conv"):
        conv = pools.conv_dims(spec)
        if conv is None:
            raise InputError(f"{spec.model_dir / 'config.json'}: conv layers need hidden_size and conv_L_cache "
                             "(positive integers) for SGLang's conv state")
        facts.short_conv = ShortConvDims(*conv)
    return facts


def size(spec: ModelSpec, settings: SglangSettings) -> dict[str, Any] | None:
    """None without `kv_budget`; else the pools' tokens, state slots and max_running_requests, or the refusal."""
    if settings.kv_budget is None:
        return None
    try:
        sized, hybrid_swa = as_sized(spec, settings)
        result = budget.plan(priced(sized, spec), msgspec.structs.replace(mode(spec, settings, settings.kv_budget),
                                                                          disable_hybrid_swa_memory=not hybrid_swa))
    except InputError as exc:  # a layer kind the budget cannot price yet: say so, keep the plan
        return {"not_priced": str(exc)}
    if result.error is not None:
        return {"error": {"class": result.error.cls, "message": result.error.message}}
    out: dict[str, Any] = {"kv_budget": settings.kv_budget, "configurator": result.mode.configurator,
                           "pools": {p.pool: p.tokens for p in result.pools or ()},
                           "max_running_requests": result.capacity.max_running_requests}
    if result.state:
        state = result.state
        out["state"] = {"slots": state.slots, "slots_per_request": state.slots_per_request,
                        "mamba_radix_cache_strategy": state.mamba_radix_cache_strategy,
                        "bytes_per_slot": state.bytes_per_slot, "ssm_dtype": state.ssm_dtype}
    return out
