"""ENG / SWA005: what sglang's MLX backend does with this model at load and start-up, and where it
serves the model differently from what the model means (static: reads the sglang-mlx plan)."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.context import Context
from kvdoctor.engines.sglang_mlx import NO_LAYER_MAP_WARNING, MlxFacts, Refusal
from kvdoctor.model import CHUNKED, SLIDING, Finding, ModelSpec, Source


def run(ctx: Context) -> Iterable[Finding]:
    facts: MlxFacts = ctx.plan.data["sglang_mlx"]
    basis = ("" if facts.basis == "mlx-lm" else
             " (predicted from kvdoctor's table of mlx-lm 0.32.2: the installed mlx-lm lacks this model class)")
    for refusal in facts.refusals:
        message, source = _explain(refusal, facts, ctx.spec)
        yield Finding.at(refusal.code, message + basis, source, layer=refusal.layer,
                         engine_error=refusal.engine_error(), evidence=refusal.evidence)
    if not facts.serves:
        return
    view, layout = facts.view, facts.layout
    if not layout.windows and view.window is not None:
        yield Finding.at(
            "ENG011",
            f"{view.container_class} exposes a window ({view.window_attr} = {view.window}) but no layer_types list, "
            "so the backend has no per-layer window map: prefill masks come from the model's own code, while "
            "batched decode attends the full history" + basis,
            ctx.spec.key_source("sliding_window"),
            engine_error={"class": "logger.warning", "stage": "startup",
                          "message": NO_LAYER_MAP_WARNING.format(model=view.model_class.rpartition(".")[2])})
    yield from _divergence(ctx, facts, basis)


def _explain(refusal: Refusal, facts: MlxFacts, spec: ModelSpec) -> tuple[str, Source]:
    view = facts.view
    module = facts.skeleton.module_name if facts.skeleton else spec.model_type
    if refusal.code == "ENG001":
        return (f"mlx-lm has no model class for model_type {spec.model_type!r} (no module mlx_lm.models.{module}); "
                "sglang's MLX backend loads every model through mlx-lm, so it cannot load this one"), \
            spec.key_source("model_type")
    if refusal.code == "ENG002":
        key = "layer_types" if "layer_types" in spec.config else "model_type"
        return (f"mlx-lm's {module} model class cannot be built from this config: "
                f"{refusal.error_class}: {refusal.message}"), spec.key_source(key)
    if refusal.code == "ENG003":
        near = view.layers[0].near_miss
        lacks = f"; its closest child, {near[0]}, lacks {', '.join(near[1])}" if near else ""
        return (f"no layer of {view.layers[0].layer_class} has a direct child the backend counts as attention "
                f"(q_proj, k_proj, v_proj, o_proj, rope, a scale and head counts){lacks}: the backend "
                "refuses the model"), spec.key_source("model_type")
    if refusal.code == "ENG004":
        flagged = refusal.evidence["flagged_layers"]
        key = "sliding_window_pattern" if "sliding_window_pattern" in spec.config else "sliding_window"
        lacks = ("no layer_types list" if not view.layer_types else
                 f"layer_types but no window ({view.window_attr or 'sliding_window'} is null)")
        return (f"{len(flagged)} attention layers are flagged sliding by mlx-lm "
                f"({view.layers[flagged[0]].sliding_flag} on layer {flagged[0]}), but {view.container_class} "
                f"exposes {lacks}, so the backend has no window for them and refuses to start"), spec.key_source(key)
    if refusal.code == "ENG005":
        ev = refusal.evidence
        same_shape = ev["first_config"][:2] == ev["config"][:2]
        return (f"attention layers {ev['first']} and {refusal.layer} need KV of different shapes or dtypes "
                f"({tuple(ev['first_config'])} vs {tuple(ev['config'])}); the backend's shared pool and decode "
                "kernels need one (n_kv_heads, head_dim, dtype) for every attention layer"), \
            facts.kv[refusal.layer].dtype_source if same_shape else spec.key_source("head_dim")
    if refusal.code == "ENG006":
        return (f"layers {_short(refusal.evidence['auxiliary_layers'])} keep recurrent (auxiliary) state and "
                f"layers {_short(refusal.evidence['sliding_layers'])} slide; the backend serves one or the other, "
                "not both"), spec.key_source("layer_types")
    if refusal.code == "ENG008":
        return (f"layers {_short(refusal.evidence['auxiliary_layers'])} keep auxiliary state but the mlx-lm model "
                "has no make_cache() to create it"), spec.key_source("model_type")
    return refusal.message, spec.key_source("model_type")


def _short(layers: list[int], limit: int = 8) -> str:
    text = ", ".join(map(str, layers[:limit]))
    return text + (f" ... ({len(layers)} layers)" if len(layers) > limit else "")


def _divergence(ctx: Context, facts: MlxFacts, basis: str) -> Iterable[Finding]:
    """SWA005: a layer whose window the backend applies differently from the model's meaning."""
    spec, layout, view = ctx.spec, facts.layout, facts.view
    context_length = ctx.deploy.context_length
    groups: dict[tuple, list[int]] = {}
    for layer in spec.layers:
        if layer.index >= layout.num_layers or layer.index not in layout.attention:
            continue
        meant = layer.window if layer.kind in (SLIDING, CHUNKED) else None
        applied = layout.window(layer.index)
        if meant == applied:
            continue
        bound = min(w for w in (meant, applied) if w is not None)
        if context_length is not None and context_length <= bound:
            continue  # the window never binds at this context length
        groups.setdefault((meant, applied), []).append(layer.index)
    for (meant, applied), layers in groups.items():
        first = spec.layers[layers[0]]
        source = first.sources.get("window") or first.sources.get("kind")
        if applied is None:
            if view.layer_types is None:
                why = "exposes no layer_types, so the backend cannot see the window"
            elif view.window is None:
                why = "exposes no window attribute"
            elif "layer_types" not in spec.config:
                why = "lists every layer as full_attention (config.json has no layer_types, and that is its default)"
            else:
                why = "lists them as full_attention in its layer_types"
            message = (f"{len(layers)} layers the model means as sliding-window attention (W = {meant}) run as full "
                       f"attention under sglang-mlx: {view.container_class} {why}. Prompts longer than {meant} "
                       "tokens attend to more context than the model was trained on")
        elif meant is None:
            message = (f"{len(layers)} layers the model means as full attention run with a {applied}-token window "
                       "under sglang-mlx: prompts longer than that lose context the model expects")
        else:
            message = (f"{len(layers)} layers slide over {meant} tokens in the model but over {applied} under "
                       "sglang-mlx")
        yield Finding.at("SWA005", message + basis, source, layer=layers[0],
                         evidence={"layers": layers, "model_window": meant, "engine_window": applied,
                                   "context_length": context_length})
