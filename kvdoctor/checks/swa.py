"""SWA001-SWA004, ENG009, ENG010, ENG012: what the mask-routing probe (the caches sglang's MLX backend
would build, driven through the model's own mask routing) saw break."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.model import Finding, Source

if TYPE_CHECKING:
    from kvdoctor.engines.sglang_mlx.profile import MlxFacts, SglangMlxSettings

# The profile is imported when the rule runs (it brings pydantic); the probe's name is its
# MaskRoutingProbe.name (a test holds the two equal).
RULE = Rule(codes=("SWA001", "SWA002", "SWA003", "SWA004", "ENG009", "ENG010", "ENG012"), engines=("sglang-mlx",),
            needs=("probe:mask_routing",))


# What each broken invariant the probe records means (kvdoctor.engines.sglang_mlx.probes).
CODES = {"full_mask_from_window": "SWA001", "mask_width": "SWA002", "attended": "SWA003", "offsets": "SWA004",
         "shim_store": "ENG010", "wrapper_breaks_layer": "ENG012"}


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.engines.sglang_mlx.profile import MaskRouting, MaskRoutingProbe, mlx_facts, routing_source

    seen = ctx.observations.get(MaskRoutingProbe.name)
    if not isinstance(seen, MaskRouting) or seen.report is None:
        return
    yield from _findings(ctx, mlx_facts(ctx.plan), seen.report, routing_source(ctx.spec))


def _settings(ctx: Context) -> SglangMlxSettings:
    from kvdoctor.engines.sglang_mlx.profile import SglangMlxSettings

    assert isinstance(ctx.settings, SglangMlxSettings)
    return ctx.settings


def _reach(ctx: Context) -> str:
    """When requests meet SWA001 under the pinned sglang: a prompt is prefilled in chunks of chunked_prefill_size,
    and every chunk after the first extends the cache (batched decode never asks the windowed caches for masks)."""
    from kvdoctor.engines.sglang_mlx.profile import SGLANG_VERSION

    chunk = _settings(ctx).chunked_prefill_size
    # unset, sglang picks it by the machine's memory: 2048 tokens at the least (srt/arg_groups/memory_hook.py)
    named = f"chunked_prefill_size {chunk}" if chunk else "the smallest default chunked_prefill_size, 2048"
    context = ctx.deploy.context_length
    if context is not None and context <= (chunk or 2048):
        return (f". With context_length {context} <= {named} no prompt is chunked, so sglang "
                f"{SGLANG_VERSION} meets this only on paths that extend a cache (native decode, speculative verify)")
    size = f"{chunk} tokens" if chunk else "sglang's default by the machine's memory, 2048 to 16384 tokens"
    return f"; any prompt longer than chunked_prefill_size ({size}) reaches it"


def _layers(layers: list[int], limit: int = 10) -> str:
    text = ", ".join(map(str, layers[:limit]))
    return text + (f", ... ({len(layers)} layers)" if len(layers) > limit else "")


def _findings(ctx: Context, facts: MlxFacts, report: Any, where: Source) -> Iterable[Finding]:
    from kvdoctor.engines.sglang_mlx.caches import FULL_MASK_FROM_WINDOW, SHIM_STORES

    groups: dict[tuple[Any, ...], list[Any]] = {}
    for problem in report.problems:
        d, code = problem.detail, CODES[problem.kind]
        key: tuple[Any, ...]
        if code == "SWA001":
            key = (code, d["maker"])
        elif code in ("SWA002", "SWA003"):
            key = (code, d.get("window"), d.get("batched", False), problem.stage)
        elif code == "ENG010":
            key = (code, d.get("module"))
        else:
            key = (code,)
        groups.setdefault(key, []).append(problem)

    for key, problems in groups.items():
        first, code = problems[0], key[0]
        d = first.detail
        layers = sorted({p.layer for p in problems if p.layer is not None})
        steps = list(dict.fromkeys(p.step for p in problems))
        evidence = {**d, "layers": layers, "steps": steps}
        if code == "SWA001":
            routes = report.routes.get(first.step, {})
            consumers = sorted(c for c, r in routes.items() if r == (d["maker"], None) and c != d["maker"])
            evidence = {**d, "consumers": consumers, "steps": steps}
            who = (f"layer {consumers[0]} takes its full-context mask from layer {d['maker']}'s sliding-window cache"
                   + (f" (as do layers {_layers(consumers[1:])})" if len(consumers) > 1 else "")
                   if consumers else f"a full-context mask is asked of layer {d['maker']}'s sliding-window cache")
            yield Finding.at(code, f"{who}, which already holds {d['offset']} tokens with a window of {d['window']} "
                             f"({first.step}): the backend refuses and the request fails{_reach(ctx)}", where,
                             layer=consumers[0] if consumers else d["maker"], evidence=evidence,
                             engine_error={"class": "RuntimeError", "message": FULL_MASK_FROM_WINDOW,
                                           "stage": first.stage})
        elif code == "SWA002":
            width = d.get("mask_width", d.get("mask_shape"))
            maker = f" made by layer {d['maker']}'s cache" if d.get("maker") is not None else ""
            yield Finding.at(code, f"{len(layers)} layers ({_layers(layers)}) get a mask{maker} {width} keys wide "
                             f"for the {d['keys']} keys their own cache returns ({first.step}): attention fails "
                             "to broadcast, or lines the mask up with the wrong keys", where, layer=layers[0],
                             evidence=evidence)
        elif code == "SWA003":
            kind = f"sliding (W = {d['window']})" if d["window"] is not None else "full-attention"
            path = "batched-decode" if d.get("batched") else "native"
            extra = ""
            if d["count"] == d["expected_count"] + 1:
                extra = ": one key more than the window (W + 1)"
            elif d["count"] < d["expected_count"]:
                extra = f": {d['expected_count'] - d['count']} positions of context lost"
            yield Finding.at(code, f"{len(layers)} {kind} layers ({_layers(layers)}) on the {path} path attend "
                             f"positions {d['attended']} for the query at position {d['query']}, expected "
                             f"{d['expected']}{extra} ({first.step})", where, layer=layers[0], evidence=evidence)
        elif code == "SWA004":
            offsets = d["offsets"]
            values = sorted(set(offsets.values()))
            odd = [layer for layer, off in offsets.items() if off != offsets[d["first"]]]
            yield Finding.at(code, f"the attention caches of one request disagree on the absolute offset before the "
                             f"{first.step} ({', '.join(map(str, values))} tokens; layers {_layers(odd)} differ from "
                             f"layer {d['first']}): batched decode takes every RoPE position and sequence length "
                             f"from layer {d['first']}'s cache", where, layer=odd[0] if odd else None,
                             evidence=evidence)
        elif code == "ENG010":
            module = d.get("module") or "a module other than the wrapped attention"
            yield Finding.at(code, f"{module} stores keys into the batched-decode offset shim of layer "
                             f"{_layers(layers)}: the backend wraps only one attention child per layer, so this "
                             "module reaches the shim and the first decode step fails", where,
                             layer=layers[0] if layers else None,
                             evidence=evidence, engine_error={"class": "RuntimeError", "message": SHIM_STORES,
                                                              "stage": "decode"})
        elif code == "ENG012":
            yield Finding.at(code, f"the model's layer code fails once the backend's attention wrapper replaces its "
                             f"attention child ({first.step}): {d['class']}: {d['message']}", where,
                             evidence=evidence, engine_error={"class": d["class"], "message": d["message"],
                                                              "stage": first.stage})
    yield from _not_run(ctx, facts, report)


def _not_run(ctx: Context, facts: MlxFacts, report: Any) -> Iterable[Finding]:
    """ENG009: layers of the checkpoint that the mlx-lm model never runs."""
    spec, layout, view = ctx.spec, facts.layout, facts.view
    if report.aborted or layout is None:
        return
    unbuilt = list(range(layout.num_layers, spec.num_hidden_layers))
    idle = [i for i in layout.attention if i not in report.ran]
    if not unbuilt and not idle:
        return
    listed = f"; its layer_types lists {len(view.layer_types)} entries" if view.layer_types is not None else ""
    parts = []
    if unbuilt:
        parts.append(f"mlx-lm builds {layout.num_layers} layers for num_hidden_layers = {spec.num_hidden_layers}, "
                     f"so layers {_layers(unbuilt)} do not exist (the checkpoint's weights for them do not load)")
    if idle:
        parts.append(f"layers {_layers(idle)} are built but the forward pass never runs them")
    source = spec.key_source("layer_types" if "layer_types" in spec.config else "num_hidden_layers")
    yield Finding.at("ENG009", f"{'; '.join(parts)}{listed}: the model computes with fewer layers than it was "
                     "trained with", source, layer=(unbuilt or idle)[0],
                     evidence={"not_built": unbuilt, "never_run": idle, "layers_built": layout.num_layers})
