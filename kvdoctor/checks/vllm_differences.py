"""VLM020-VLM023, the logic of kvdoctor.checks.vllm (imported when a vLLM check runs): where vLLM 0.33.0
silently does something other than what the config means (findings, not refusals).

The model's meaning is kvdoctor's `ModelSpec` (transformers semantics); what vLLM does is the profile's
`Plan`. Both are read only; each function returns findings for the rule.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvdoctor.engines.budget.common import GiB, cdiv
from kvdoctor.engines.base import Plan
from kvdoctor.engines.vllm import specs as S
from kvdoctor.model import CHUNKED, SLIDING, Finding, ModelSpec, Source

if TYPE_CHECKING:
    from kvdoctor.engines.vllm.profile import VllmFacts

IN_FLIGHT_TOKENS = 2 * 8192  # two batches of the H200 server's max_num_batched_tokens, async scheduling


def differences(spec: ModelSpec, plan: Plan[Any], hma_source: Source | None = None) -> list[Finding]:
    """Only for a plan that starts and has facts (each helper below relies on both). `hma_source`: the
    deploy setting that turned the hybrid manager off, when one did."""
    if plan.refusals or plan.facts is None:
        return []
    return [*window_differences(spec, plan), *promotion_cost(spec, plan, hma_source),
            *model_level_window(spec, plan), *mtp_layers(spec)]


def _meant(layer) -> int | None:
    return layer.window if layer.kind in (SLIDING, CHUNKED) else None


def window_differences(spec: ModelSpec, plan: Plan[VllmFacts]) -> list[Finding]:
    """VLM020: a layer whose window (or chunk) vLLM applies differently from the config's meaning."""
    assert plan.facts is not None
    facts = plan.facts
    if facts.architecture == S.DSV4:  # every layer's sliding cache beside its compressed ones is what its config means
        return []
    by_index = {l.index: l for l in plan.layers}
    out = []
    for layer in spec.layers:
        mine = by_index.get(layer.index)
        if mine is None or mine.extra.get("engine_spec") in (S.MAMBA, S.MLA):
            continue
        meant, applied = _meant(layer), mine.engine_window
        if meant == applied:
            continue
        what = f"window {meant}" if meant else "full attention"
        done = f"{mine.extra['engine_spec']} with window {applied}" if applied else mine.extra["engine_spec"]
        key = "layer_types" if spec.config.get("layer_types") is not None else "sliding_window"
        out.append(Finding.at("VLM020", f"layer {layer.index}: the config means {what}, vLLM "
                              f"{plan.versions.get('vllm')} builds {done} ({facts.architecture} reads "
                              f"{_reads(facts)})", spec.key_source(key), layer=layer.index,
                              evidence={"meant_window": meant, "engine_window": applied,
                                        "engine_spec": mine.extra["engine_spec"]}))
    return out


def _reads(facts) -> str:
    return {"even_layers": "the layer index (even layers slide), not layer_types",
            "model_window": "only the model-level window (all layers or none)",
            "llama4": "no_rope_layers for chunking, no per-layer window"}.get(
        S.RULES.get(facts.architecture, "layer_types"), "layer_types and sliding_window")


def promotion_cost(spec: ModelSpec, plan: Plan[VllmFacts], where: Source | None = None) -> list[Finding]:
    """VLM021: with the hybrid manager off, local layers keep their window for compute but reserve
    blocks for the whole max_model_len; the cost per request at max_model_len."""
    facts = plan.facts
    assert facts is not None
    if facts.hma or not facts.max_model_len:
        return []
    local = [l for l in plan.layers if l.extra.get("engine_spec") in (S.SLIDING, S.CHUNKED) and l.cache == "full"]
    if not local:
        return []
    length = facts.max_model_len
    extra = 0
    for layer in local:
        block, page = layer.extra["block_size"], layer.extra["page_size_bytes"]
        window = layer.engine_window
        assert window is not None  # a sliding or chunked layer has one
        kept = (cdiv(min(window - 1 + IN_FLIGHT_TOKENS, length), block) + 1 if layer.extra["engine_spec"] == S.SLIDING
                else cdiv(min(window + IN_FLIGHT_TOKENS, length), block))
        extra += max(0, cdiv(length, block) - kept) * page
    return [Finding.at("VLM021", f"the hybrid KV cache manager is off: {len(local)} sliding/chunked layers "
                       f"reserve KV for all {length} tokens instead of their window, "
                       f"{extra / GiB:.2f} GiB more per request at max_model_len",
                       where, key="disable_hybrid_kv_cache_manager",
                       evidence={"layers": [l.index for l in local], "extra_bytes_per_request": extra,
                                 "max_model_len": length})]


def model_level_window(spec: ModelSpec, plan: Plan[VllmFacts]) -> list[Finding]:
    """VLM022: a window with no per-layer types is applied by vLLM to every attention layer."""
    facts = plan.facts
    assert facts is not None
    if facts.model_window is None or facts.layer_types is not None:
        return []
    layers = [l.index for l in plan.layers if l.extra.get("engine_spec") == S.SLIDING]
    if not layers:
        return []
    return [Finding.at("VLM022", f"sliding_window {facts.model_window} with no layer_types: vLLM applies it "
                       f"to all {len(layers)} attention layers", spec.key_source("sliding_window"),
                       evidence={"window": facts.model_window, "layers": len(layers)})]


def mtp_layers(spec: ModelSpec) -> list[Finding]:
    """VLM023: MTP modules listed in the config get no KV cache from the main model's class."""
    n = spec.config.get("num_nextn_predict_layers")
    if not isinstance(n, int) or n <= 0:
        return []
    return [Finding.at("VLM023", f"num_nextn_predict_layers = {n}: vLLM builds KV caches for the "
                       f"{spec.num_hidden_layers} decoder layers only; the MTP layer(s) get theirs only when "
                       "served as the draft (speculative_config method mtp)",
                       spec.key_source("num_nextn_predict_layers"),
                       evidence={"num_nextn_predict_layers": n})]
