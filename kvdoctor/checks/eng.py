"""ENG011 / SWA005: where sglang's MLX backend serves the model differently from what the model means
(static: reads the sglang-mlx plan). Its refusals at load and start-up are the plan's, reported by
kvdoctor.checks.refusals."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.model import CHUNKED, SLIDING, Finding

if TYPE_CHECKING:
    from kvdoctor.engines.sglang_mlx.profile import MlxFacts

RULE = Rule(codes=("ENG011", "SWA005"), engines=("sglang-mlx",))


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.engines.sglang_mlx.profile import NO_LAYER_MAP_WARNING, mlx_facts

    facts = mlx_facts(ctx.plan)
    if not facts.serves:
        return
    basis = facts.basis_note
    view = facts.view
    assert facts.layout is not None
    if not facts.layout.windows and view.window is not None:
        yield Finding.at(
            "ENG011",
            f"{view.container_class} exposes a window ({view.window_attr} = {view.window}) but no layer_types list, "
            "so the backend has no per-layer window map: prefill masks come from the model's own code, while "
            "batched decode attends the full history" + basis,
            ctx.spec.key_source("sliding_window"),
            engine_error={"class": "logger.warning", "stage": "startup",
                          "message": NO_LAYER_MAP_WARNING.format(model=view.model_class.rpartition(".")[2])})
    yield from _divergence(ctx, facts, basis)


def _divergence(ctx: Context, facts: MlxFacts, basis: str) -> Iterable[Finding]:
    """SWA005: a layer whose window the backend applies differently from the model's meaning."""
    spec, layout, view = ctx.spec, facts.layout, facts.view
    assert layout is not None
    context_length = ctx.deploy.context_length
    groups: dict[tuple[int | None, int | None], list[int]] = {}
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
