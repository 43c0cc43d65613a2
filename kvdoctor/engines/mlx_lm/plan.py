"""mlx-lm 0.32.2's caches for one model, predicted from the config: per layer the class
`make_prompt_cache` builds, and what mlx-lm's own code then does with those caches under the deploy
section's settings (quantization, batching, prompt-cache reuse, speculative decoding).

`make_prompt_cache` (mlx_lm/models/cache.py:15-40) defers to the model's `make_cache` when its class
defines one (then `--max-kv-size` is ignored); the classes that do build KVCache for full and MLA
attention, RotatingKVCache(max_size=sliding_window, keep=0) for sliding layers, ChunkedKVCache for
chunked layers, ArraysCache for recurrent state (Mamba, GatedDeltaNet, KDA, short convolutions),
CacheList(KVCache, KVCache) for DSA-indexed MLA, and nothing for a block that caches nothing. Without
`make_cache` every layer gets a KVCache, or RotatingKVCache(max_kv_size, keep=4) under `--max-kv-size`.
tests/test_mlx_lm_check.py holds this to goldens/mlx_check.json, written by mlx-lm's own code.
"""
from __future__ import annotations

from typing import Any

import msgspec

from kvdoctor.engines.base import LayerPlan, Plan, Refusal
from kvdoctor.engines.mlx_lm.settings import MlxLmSettings
from kvdoctor.engines.pins import PINS
from kvdoctor.model import (ATTN_MAMBA, CHUNKED, CONV, FULL, GDN, KDA, LINEAR, MAMBA, MLA, NO_ATTENTION, SLIDING,
                            SPARSE_MLA, ModelSpec)

VERSION = PINS["mlx-lm"]
WHEEL = f"mlx_lm {VERSION} wheel"
# Exact texts of mlx-lm 0.32.2.
ROTATING_NYI = "RotatingKVCache Quantization NYI"  # models/cache.py:554, RotatingKVCache.to_quantized
NO_MERGE = "<class 'mlx_lm.models.cache.{cls}'> does not yet support batching with history"  # generate.py:836
# mlx's own text (mlx/ops.cpp, quantize), raised through KVCache.to_quantized (models/cache.py:396-407)
GROUP_SIZE = ("[quantize] The last dimension of the matrix needs to be divisible by the quantization group size "
              "{group}. However the provided  matrix has shape ({shape})")
NOT_TRIMMABLE = "Speculative decoding requires a trimmable prompt cache (got {types})."  # generate.py:542-546

# The class a make_cache model builds for each layer kind (None: the block keeps no cache).
MAKE_CACHE_CLASS = {FULL: "KVCache", MLA: "KVCache", SLIDING: "RotatingKVCache", CHUNKED: "ChunkedKVCache",
                    GDN: "ArraysCache", KDA: "ArraysCache", MAMBA: "ArraysCache", LINEAR: "ArraysCache",
                    CONV: "ArraysCache", SPARSE_MLA: "CacheList", ATTN_MAMBA: "CacheList", NO_ATTENTION: None}
# llama's make_cache slides a layer only where `layer_types` says so (llama.py:266-274): a bare
# `sliding_window` (Mistral-7B-v0.1, remapped to llama) leaves every layer a KVCache.
LAYER_TYPES_ONLY = frozenset({"llama"})
STATE_CLASSES = frozenset({"ArraysCache"})  # no trim, no to_quantized: kept as they are
UNMERGEABLE = frozenset({"ChunkedKVCache", "QuantizedKVCache"})  # no `merge` classmethod


class LayerCache(msgspec.Struct, frozen=True, omit_defaults=True):
    """The mlx-lm cache object one layer gets, as mlx-lm spells its class."""

    layer: int
    cls: str | None  # None: this block keeps no cache (no entry in mlx-lm's cache list)
    max_size: int | None = None  # RotatingKVCache's window
    keep: int | None = None  # RotatingKVCache's pinned first tokens
    chunk_size: int | None = None  # ChunkedKVCache's chunk
    parts: tuple[str, ...] = ()  # CacheList's caches

    @property
    def trimmable(self) -> bool:
        """`is_trimmable()` of the fresh cache (a RotatingKVCache stops being trimmable once it wraps)."""
        return self.cls not in STATE_CLASSES and not STATE_CLASSES.intersection(self.parts)

    @property
    def quantized(self) -> bool:
        """`maybe_quantize_kv_cache` converts it to a QuantizedKVCache (it has `to_quantized` and it works)."""
        return self.cls == "KVCache"

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mlx_class": self.cls}
        for key in ("max_size", "keep", "chunk_size"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.parts:
            out["parts"] = list(self.parts)
        return out


class MlxLmFacts(msgspec.Struct, frozen=True):
    """What the mlx-lm rules, probes and dry run read: the plan's `facts`."""

    module: str  # mlx_lm.models.<module>
    make_cache: bool  # the class builds its own caches (then --max-kv-size is ignored)
    caches: tuple[LayerCache, ...] = ()  # one per layer, in layer order
    loads: bool = True  # mlx-lm builds the model class

    @property
    def built(self) -> list[LayerCache]:
        """mlx-lm's cache list: the layers that keep a cache, in order."""
        return [c for c in self.caches if c.cls is not None]

    def classes(self) -> set[str]:
        return {c.cls for c in self.built if c.cls is not None}


def text_config(spec: ModelSpec) -> dict[str, Any]:
    text = spec.raw_config.get("text_config")
    return text if isinstance(text, dict) else dict(spec.raw_config)


def sliding_size(spec: ModelSpec, window: int | None) -> int | None:
    """The RotatingKVCache size a make_cache class gives a sliding layer: the config's `sliding_window`."""
    value = text_config(spec).get("sliding_window")
    return value if isinstance(value, int) and not isinstance(value, bool) else window


def layer_caches(spec: ModelSpec, module: str, make_cache: bool, max_kv_size: int | None) -> tuple[LayerCache, ...]:
    out = []
    for layer in spec.layers:
        if not make_cache:
            out.append(LayerCache(layer.index, "KVCache") if max_kv_size is None else
                       LayerCache(layer.index, "RotatingKVCache", max_size=max_kv_size, keep=4))
            continue
        cls = MAKE_CACHE_CLASS.get(layer.kind, "KVCache")
        if cls == "RotatingKVCache" and module in LAYER_TYPES_ONLY and "layer_types" not in text_config(spec):
            cls = "KVCache"
        if cls == "RotatingKVCache":
            out.append(LayerCache(layer.index, cls, max_size=sliding_size(spec, layer.window), keep=0))
        elif cls == "ChunkedKVCache":
            out.append(LayerCache(layer.index, cls, chunk_size=layer.window))
        elif cls == "CacheList":
            parts = ("KVCache", "KVCache") if layer.kind == SPARSE_MLA else ("ArraysCache", "KVCache")
            out.append(LayerCache(layer.index, cls, parts=parts))
        else:
            out.append(LayerCache(layer.index, cls))
    return tuple(out)


def module_of(spec: ModelSpec) -> str:
    from kvdoctor.engines.sglang_mlx.mlxlm import module_name_for

    cfg = dict(spec.raw_config)
    cfg.setdefault("model_type", spec.model_type)
    return module_name_for(cfg)


def load_refusal(spec: ModelSpec, module: str) -> Refusal | None:
    """mlx-lm's own refusal to build the class: no module of that name (the pinned release's list), or the
    class's constructor raising on this config (weightless; without mlx-lm, the fields its ModelArgs
    cannot do without, from the pinned release's list)."""
    from kvdoctor.engines.sglang_mlx.mlxlm import build_skeleton, shipped_models

    evidence = {"mlx_lm_module": module}
    if module not in shipped_models()["modules"]:
        return Refusal("ENG001", "ValueError", f"Model type {module} not supported.", "load",
                       source=f"mlx_lm/utils.py:224 @ {VERSION}", evidence=evidence)
    cfg = dict(spec.raw_config)
    cfg.setdefault("model_type", spec.model_type)
    skeleton = build_skeleton(cfg)
    if skeleton.model is not None or skeleton.error_class is None:
        return None
    return Refusal("ENG001" if skeleton.missing_module else "ENG002", skeleton.error_class,
                   skeleton.error_message or "", "load", evidence=evidence)


def refusals(caches: tuple[LayerCache, ...], settings: MlxLmSettings) -> list[Refusal]:
    """What mlx-lm's own cache code raises with these caches and settings, in the order a request meets it."""
    built = [c for c in caches if c.cls is not None]
    out: list[Refusal] = []
    rotating = [c.layer for c in built if c.cls == "RotatingKVCache"]
    if settings.kv_bits is not None and rotating:
        out.append(Refusal(
            "MEM011", "NotImplementedError", ROTATING_NYI, "prefill", layer=rotating[0], setting="mlx_lm.kv_bits",
            source=f"mlx_lm/models/cache.py:554 (called from generate.py:309-310) @ {VERSION}",
            evidence={"rotating_layers": rotating, "quantized_kv_start": settings.quantized_kv_start},
            explanation=(f"--kv-bits {settings.kv_bits} quantizes every cache that has `to_quantized` once a request "
                         f"reaches {settings.quantized_kv_start} tokens, and the RotatingKVCache of "
                         f"{len(rotating)} layer(s) (first: {rotating[0]}) raises there")))
    unmergeable = [c for c in built if c.cls in UNMERGEABLE]
    if settings.batch_generate and settings.kv_bits is None and settings.draft_model is None and unmergeable:
        first = unmergeable[0]
        out.append(Refusal(
            "MLX102", "ValueError", NO_MERGE.format(cls=first.cls), "prefill", layer=first.layer,
            setting="mlx_lm.batch_generate", source=f"mlx_lm/generate.py:826-838 @ {VERSION}",
            evidence={"layers": [c.layer for c in unmergeable]},
            explanation=(f"BatchGenerator merges every request's caches into one batch, and {first.cls} "
                         f"(layer {first.layer}, {len(unmergeable)} layer(s) in all) has no merge")))
    stuck = sorted({c.cls or "" for c in built if not c.trimmable})
    if settings.draft_model is not None and stuck:
        types = "{" + ", ".join(repr(t) for t in stuck) + "}"
        out.append(Refusal(
            "MLX103", "ValueError", NOT_TRIMMABLE.format(types=types), "prefill",
            layer=next(c.layer for c in built if not c.trimmable), setting="mlx_lm.draft_model",
            source=f"mlx_lm/generate.py:542-546 @ {VERSION}",
            evidence={"layers": [c.layer for c in built if not c.trimmable]},
            explanation=("speculative decoding trims the rejected draft tokens off every cache, and a recurrent "
                         "state (ArraysCache) cannot be trimmed")))
    return out


def first_quantized_length(settings: MlxLmSettings) -> int:
    """The token length of a KVCache's buffer when generate_step first converts it: for the shortest
    request that reaches quantized_kv_start, fed in prefill_step_size chunks, the last token alone."""
    from kvdoctor.engines.mlx_lm.budget import CacheSim

    sim, start = CacheSim(kind="kv"), settings.quantized_kv_start
    remaining = start + 1
    while True:
        n = min(settings.prefill_step_size, remaining - 1) if remaining > 1 else 1
        sim.update(n)
        remaining -= n
        if sim.offset >= start:
            return sim.length


def group_refusal(spec: ModelSpec, caches: tuple[LayerCache, ...], settings: MlxLmSettings) -> Refusal | None:
    """A KVCache whose key (or value) head size --kv-group-size does not divide: mx.quantize raises when
    --kv-bits converts it (the first such layer in mlx-lm's cache order)."""
    if settings.kv_bits is None:
        return None
    group = settings.kv_group_size
    for cache in caches:
        layer = spec.layers[cache.layer]
        if not cache.quantized or layer.kv_lora_rank or layer.head_dim is None or layer.n_kv_heads is None:
            continue
        for dim in (layer.head_dim, layer.v_head_dim or layer.head_dim):
            if dim % group:
                shape = f"1,{layer.n_kv_heads},{first_quantized_length(settings)},{dim}"
                return Refusal("MLX133", "ValueError", GROUP_SIZE.format(group=group, shape=shape), "prefill",
                               layer=cache.layer, setting="mlx_lm.kv_group_size",
                               source=f"mlx_lm/models/cache.py:396-407 @ {VERSION}",
                               evidence={"head_dim": dim, "kv_group_size": group},
                               explanation=(f"--kv-bits {settings.kv_bits} quantizes layer {cache.layer}'s KVCache in "
                                            f"groups of {group} along its head size {dim}, which {group} does not "
                                            "divide: the first request that reaches "
                                            f"{settings.quantized_kv_start} tokens fails"))
    return None


def notes(spec: ModelSpec, facts: MlxLmFacts, settings: MlxLmSettings) -> list[str]:
    """What mlx-lm does silently with these settings: knobs it ignores, layers it leaves as they are."""
    built = facts.built
    out = []
    if settings.max_kv_size is not None and facts.make_cache:
        out.append(f"mlx-lm ignores max_kv_size for {facts.module}: its class builds its own caches (make_cache)")
    if settings.max_kv_size is not None and not facts.make_cache:
        out.append(f"max_kv_size {settings.max_kv_size}: every layer gets a RotatingKVCache that keeps the first 4 "
                   f"tokens and the latest {max(settings.max_kv_size - 4, 0)}; a longer context forgets the rest")
    if not facts.make_cache and any(l.kind == SLIDING for l in spec.layers) and settings.max_kv_size is None:
        out.append(f"mlx-lm's {facts.module} class keeps every key of its sliding-window layers (KVCache): the "
                   "window is applied by the mask, the cache grows with the context")
    state = [c.layer for c in built if not c.trimmable]
    if settings.kv_bits is not None:
        quantized = [c.layer for c in built if c.quantized]
        left = len(built) - len(quantized)
        out.append(f"--kv-bits {settings.kv_bits} converts {len(quantized)} of {len(built)} caches to "
                   f"QuantizedKVCache from token {settings.quantized_kv_start}; {left} keep their class"
                   + (" (mlx_lm.server then serves one request at a time)" if not settings.batch_generate else ""))
    if state and settings.prompt_cache_size > 0:
        out.append(f"prompt-cache reuse: {len(state)} recurrent-state caches cannot be trimmed, so mlx_lm.server "
                   "reuses a cached prompt only where it is a prefix of the new one")
    if not settings.batch_generate and facts.classes() & UNMERGEABLE:
        out.append("mlx_lm.server serves this model one request at a time: "
                   + ", ".join(sorted(facts.classes() & UNMERGEABLE)) + " cannot be merged into a batch")
    if settings.draft_model is not None and "RotatingKVCache" in facts.classes() and not state:
        out.append("speculative decoding: once a RotatingKVCache wraps it is no longer trimmable, and a prompt "
                   "cache that long is refused (MLX103)")
    return out


def cache_label(cache: LayerCache) -> str | None:
    return {"KVCache": "full", "RotatingKVCache": "windowed", "ChunkedKVCache": "chunked", "ArraysCache": "state",
            "CacheList": "list", None: "none"}.get(cache.cls)


def plan_from(spec: ModelSpec, settings: MlxLmSettings) -> Plan[MlxLmFacts]:
    from kvdoctor.engines.sglang_mlx.mlxlm import make_cache_module

    module = module_of(spec)
    load = load_refusal(spec, module)
    make_cache = make_cache_module(module)
    if load is not None:
        facts = MlxLmFacts(module=module, make_cache=make_cache, loads=False)
        layers = tuple(LayerPlan(index=l.index, engine_window=None, cache="unknown") for l in spec.layers)
        return Plan(engine="mlx-lm", versions={"mlx-lm": VERSION}, layers=layers, refusals=(load,), facts=facts)
    caches = layer_caches(spec, module, make_cache, settings.max_kv_size)
    facts = MlxLmFacts(module=module, make_cache=make_cache, caches=caches)
    layers = tuple(LayerPlan(index=c.layer, engine_window=c.max_size if c.cls == "RotatingKVCache" else None,
                             cache=cache_label(c), extra=c.json()) for c in caches)
    group = group_refusal(spec, caches, settings)
    found = refusals(caches, settings) + ([group] if group is not None else [])
    return Plan(engine="mlx-lm", versions={"mlx-lm": VERSION}, layers=layers, refusals=tuple(found), facts=facts,
                notes=tuple(notes(spec, facts, settings)))


def summary(plan: Plan[object]) -> dict[str, Any]:
    """The JSON `info` of an mlx-lm check: the notes, and the cache classes by count."""
    out: dict[str, Any] = {"engine_notes": list(plan.notes)}
    if plan.refusals:
        first = plan.refusals[0]
        out["engine_notes"].append(f"mlx-lm would fail at {first.stage}: {first.error_class}: {first.message}")
    facts = plan.facts
    if isinstance(facts, MlxLmFacts):
        counts: dict[str, int] = {}
        for cache in facts.built:
            counts[cache.cls or ""] = counts.get(cache.cls or "", 0) + 1
        out["mlx_lm"] = {"module": facts.module, "make_cache": facts.make_cache, "loads": facts.loads,
                         "caches": len(facts.built), "classes": counts}
    return out
