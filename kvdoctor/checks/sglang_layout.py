"""SGLang (CUDA) serves some layers otherwise than the config means: a different window (SGL004) or a
different layer kind (SGL006). Both come from the static pool plan (`kvdoctor.engines.sglang.layout`),
which reads the model classes' own window and layout rules. SGL004 fires only for classes whose window
rule kvdoctor has read (`archs.WINDOW_RULES`, `archs.NO_WINDOW_ARCHS`); one finding per group of layers.
SGL152 says where the plan is not SGLang's own: an architecture SGLang has no model class for, or Mamba layers
without Mamba-2 state. SGL251: a composite model type whose config.json keeps its text geometry at the top level
instead of in `text_config`; transformers' class builds its default text config there and SGLang serves that."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.model import CHUNKED, SLIDING, Finding

RULE = Rule(codes=("SGL004", "SGL006", "SGL152", "SGL251"), engines=("sglang",))


def _shown(window: int | None) -> str:
    return "the whole context" if window is None else f"a window of {window}"


def _layers(ids: list[int]) -> str:
    return f"layer {ids[0]}" if len(ids) == 1 else f"{len(ids)} layers ({ids[0]}..{ids[-1]})"


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.engines.sglang.profile import pool_facts
    from kvdoctor.engines.sglang.archs import NO_WINDOW_ARCHS, WINDOW_RULES
    from kvdoctor.engines.sglang.refusals import derived_context_length

    yield from _default_text_config(ctx)
    facts = pool_facts(ctx.plan)
    if facts is None:
        return
    if facts.unmodeled:
        yield Finding.at("SGL152", f"no static SGLang plan of its own for this model: {facts.unmodeled}",
                         ctx.spec.key_source("architectures"), evidence={"architecture": facts.architecture})
    planned = {lp.index: lp for lp in ctx.plan.layers}
    layers = {layer.index: layer for layer in ctx.spec.layers}
    version = ctx.plan.versions.get("sglang")
    if facts.architecture not in WINDOW_RULES and facts.architecture not in NO_WINDOW_ARCHS:
        windows: tuple[int, ...] = ()  # a class whose window rule kvdoctor has not read: no finding from a guess
    else:
        windows = facts.window_differs_layers
    context = getattr(ctx.settings, "context_length", None) or derived_context_length(ctx.spec)
    groups: dict[tuple[int | None, int | None], list[int]] = {}
    for index in windows:
        layer, engine = layers[index], planned[index].engine_window
        meant = layer.window if layer.kind in (SLIDING, CHUNKED) else None
        if engine is None and meant is not None and context <= meant:
            continue  # no request is longer than the window: the missing mask changes nothing
        groups.setdefault((meant, engine), []).append(index)
    key = "sliding_window" if "sliding_window" in ctx.spec.config else "layer_types"
    for (meant, engine), ids in groups.items():
        yield Finding.at("SGL004", f"{_layers(ids)}: sglang {version}'s {facts.architecture} attends over "
                         f"{_shown(engine)} where the config means {_shown(meant)} (context {context})",
                         ctx.spec.key_source(key), layer=ids[0],
                         evidence={"window": meant, "engine_window": engine, "layers": ids, "context": context})
    for index in facts.kind_differs_layers:
        yield Finding.at("SGL006", f"layer {index}: the config means {layers[index].kind}, sglang {version}'s "
                         f"{facts.architecture} builds {planned[index].cache} there (it lays the layers out from "
                         "its own rule, not layer_types)", ctx.spec.key_source("layer_types"), layer=index,
                         evidence={"kind": layers[index].kind, "engine_cache": planned[index].cache})


def _default_text_config(ctx: Context) -> Iterable[Finding]:
    """SGL251: the config states text geometry at its top level, which the composite class ignores."""
    from kvdoctor.engines.sglang.archs import default_text_config

    raw = ctx.spec.raw_config
    found = default_text_config(raw)
    if found is None:
        return
    served, differs = found
    said = ", ".join(f"{k} {stated} (served: {value})" for k, (stated, value) in differs.items())
    yield Finding.at("SGL251", f"model_type {raw['model_type']!r} keeps the language model in text_config, which "
                     f"config.json lacks: transformers' class builds its default text config and SGLang serves "
                     f"that, not the top-level {said}", ctx.spec.key_source(next(iter(differs))),
                     evidence={"model_type": raw["model_type"], "stated": {k: v[0] for k, v in differs.items()},
                               "served": served})
