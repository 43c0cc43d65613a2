"""Smaller copies for the dry run (fewer attention heads, fewer layers), accepted only when the engine
sees the same model otherwise.

The attention score matrices, which dominate a dry run's time and memory on CPU, grow with the number
of query heads. The engine's cache choices (layer classes, which layers slide, their windows, the
cache classes) do not depend on how many heads there are, only on their ratio and head dim; so the
shrunk copy may keep one KV head and the query heads that go with it. The copy is used only when its
signature (shrink.py) equals the full model's with every head count and projection width divided by
that one factor; a mixer the change did not reach (a linear-attention block with its own head
counts) must match the full model unchanged. Otherwise the run falls back to the full head count.

Fewer layers: the engine's cost per forward pass, and the memory its caches take, grow with the layer
count, while its choices are made layer by layer from each layer's kind. A copy cut to the first
layers that show every kind twice (`layer_period`) is used when its signature is the full model's
first layers (`first_layers`) and its layers hold the settings the uncut copy's do (driver.py).
"""
from __future__ import annotations

import copy
import json
from typing import Any

from kvdoctor.engines.sglang_mlx.dryrun.shrink import text_sections

HEAD_FIELDS = ("heads", "kv_heads", "q_width", "k_width", "v_width")
# A cut copy shows each kind of layer twice where the model has it twice: the second of a kind is
# where the engine's maps from a layer to its slot in a per-kind pool stop being the identity.
REPEATS = 2


def head_factor(config: dict[str, Any]) -> int:
    """The factor that leaves one KV head in every text section, or 1 when the counts do not allow it."""
    factors = set()
    for section in text_sections(config):
        heads = section.get("num_attention_heads")
        if heads is None:
            continue
        counts = _kv_counts(section, heads)
        if counts is None:
            return 1
        factors.update(counts)
    return factors.pop() if len(factors) == 1 else 1


def _kv_counts(section: dict[str, Any], heads: Any) -> set[int] | None:
    """The KV head counts a section's attention layers have, or None where one does not divide the
    query heads into groups. A section with DeciLM's `block_configs` (Nemotron-NAS) gives each
    attention block its group size (`n_heads_in_group`), and its `num_key_value_heads` is null: the
    copy keeps the group sizes, so dividing the query heads by the KV count leaves one KV head."""
    blocks = section.get("block_configs")
    if isinstance(blocks, list) and section.get("num_key_value_heads") is None:
        groups = [(b.get("attention") or {}).get("n_heads_in_group") for b in blocks if isinstance(b, dict)]
        sizes = {g for g in groups if g is not None}
        if not sizes or any(type(g) is not int or g < 1 or type(heads) is not int or heads % g for g in sizes):
            return None
        return {heads // g for g in sizes}
    kv = section.get("num_key_value_heads", heads)
    if type(heads) is not int or type(kv) is not int or kv < 1 or heads % kv:
        return None
    return {kv}


def fewer_heads(config: dict[str, Any], factor: int) -> dict[str, Any]:
    """`config` with its query and KV head counts divided by `factor`; the head dim is pinned so that a
    model class deriving it from hidden size / heads still gets the full model's. A null KV count
    (block_configs' group sizes) stays null."""
    out = copy.deepcopy(config)
    for section in text_sections(out):
        heads = section.get("num_attention_heads")
        if heads is None:
            continue
        if section.get("head_dim") is None and isinstance(section.get("hidden_size"), int):
            section["head_dim"] = section["hidden_size"] // heads
        section["num_attention_heads"] = heads // factor
        kv = section.get("num_key_value_heads", heads)
        if kv is not None:
            section["num_key_value_heads"] = kv // factor
    return out


def head_sized_hidden(config: dict[str, Any]) -> dict[str, Any] | None:
    """For model classes that derive the head dim from hidden size / heads (Qwen2, Phi-3 in mlx-lm):
    the fewer-heads config with the hidden size that gives the full model's head dim again, or None
    when that is no smaller than the config's own."""
    out = copy.deepcopy(config)
    changed = False
    for section in text_sections(out):
        heads, head_dim, hidden = section.get("num_attention_heads"), section.get("head_dim"), section.get("hidden_size")
        if not (type(heads) is int and type(head_dim) is int and type(hidden) is int) or heads * head_dim >= hidden:
            continue
        section["hidden_size"] = heads * head_dim
        changed = True
    return out if changed else None


def _mixer_matches(full: dict[str, Any], small: dict[str, Any], factor: int) -> bool:
    if {k: v for k, v in full.items() if k not in HEAD_FIELDS} != {k: v for k, v in small.items() if k not in HEAD_FIELDS}:
        return False
    for scale in (factor, 1):  # every head field scaled by the factor, or (a mixer it did not reach) none
        if all((full[k] is None and small[k] is None) or
               (full[k] is not None and small[k] is not None and small[k] * scale == full[k]) for k in HEAD_FIELDS):
            return True
    return False


def matches_scaled(full_sig: dict[str, Any], small_sig: dict[str, Any], factor: int) -> bool:
    """True when the fewer-heads copy's signature is the full model's with head counts divided by
    `factor`, and at least one mixer was actually scaled (else the copy proves nothing new)."""
    if any(full_sig[k] != small_sig[k] for k in ("num_layers", "discovery_error", "window_map", "container_window")):
        return False
    scaled = False
    for a, b in zip(full_sig["layers"], small_sig["layers"]):
        if {k: v for k, v in a.items() if k != "mixers"} != {k: v for k, v in b.items() if k != "mixers"}:
            return False
        if len(a["mixers"]) != len(b["mixers"]):
            return False
        for m, n in zip(a["mixers"], b["mixers"]):
            if not _mixer_matches(m, n, factor):
                return False
            scaled = scaled or m["heads"] != n["heads"]
    return scaled


def _layer_kinds(sig: dict[str, Any]) -> list[str]:
    """Each layer's row of a signature with its window, as one comparable string."""
    windows = sig["window_map"]
    return [json.dumps([row, windows.get(str(i))], sort_keys=True, default=str) for i, row in enumerate(sig["layers"])]


def layer_period(sig: dict[str, Any], repeats: int = REPEATS) -> int:
    """How many leading layers show every kind of layer the model has `repeats` times (or as often as
    the model has it): the shortest prefix a copy cut to fewer layers may keep."""
    kinds = _layer_kinds(sig)
    wanted = {kind: min(repeats, kinds.count(kind)) for kind in set(kinds)}
    seen: dict[str, int] = {}
    for count, kind in enumerate(kinds, start=1):
        seen[kind] = seen.get(kind, 0) + 1
        if all(seen.get(k, 0) >= n for k, n in wanted.items()):
            return count
    return len(kinds)


def first_layers(sig: dict[str, Any], count: int) -> dict[str, Any]:
    """The signature a copy cut to the first `count` layers must show: the full model's, cut."""
    return {**sig, "num_layers": count, "layers": sig["layers"][:count],
            "window_map": {k: v for k, v in sig["window_map"].items() if int(k) < count}}


def fewer_layers(config: dict[str, Any], count: int) -> dict[str, Any] | None:
    """`config` cut to its first `count` layers: the layer count and every per-layer list (one entry a
    layer, as `layer_types`) truncated; None when that is no smaller."""
    out = copy.deepcopy(config)
    changed = False
    for section in text_sections(out):
        layers = section.get("num_hidden_layers")
        if type(layers) is not int or layers <= count:
            continue
        for key, value in list(section.items()):
            if isinstance(value, list) and len(value) == layers:
                section[key] = value[:count]
        section["num_hidden_layers"] = count
        changed = True
    return out if changed else None
