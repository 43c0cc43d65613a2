"""Weightless full-size models and shrunk copies that keep the engine's view of every layer.

Both are built by mlx-lm's own loader (`mlx_lm.utils.load_model`, lazy, not strict) from a directory
holding only the config, so no weight file is ever read: the full-size model's parameters are lazy
random initialisers that are never evaluated. The shrunk copy makes the hidden, intermediate, vocab
and expert sizes small; its *signature* (layer count, layer and attention classes, per-layer heads,
KV heads, head dim, projection widths, and the engine's window map) must equal the full model's,
or the shrink is refused.
"""
from __future__ import annotations

import copy
import json
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

SMALL_HIDDEN = 64
SMALL_INTERMEDIATE = 64
SMALL_VOCAB = 512
SMALL_EXPERTS = 4

INTERMEDIATE_KEYS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "ffn_hidden_size")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_top_k")
GROUP_KEYS = ("n_group", "topk_group")
VOCAB_KEYS = ("vocab_size", "vocab_size_per_layer_input")  # the second: Gemma 3n and 4's per-layer embeddings


def text_sections(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The dicts that carry the language model's sizes: the top level and a nested text_config."""
    sections = [config]
    if isinstance(config.get("text_config"), dict):
        sections.append(config["text_config"])
    return sections


def _shrink_section(section: dict[str, Any], keep_hidden: bool) -> None:
    hidden, heads = section.get("hidden_size"), section.get("num_attention_heads")
    if not keep_hidden and isinstance(hidden, int) and hidden > SMALL_HIDDEN:
        if section.get("head_dim") is None and isinstance(heads, int) and heads > 0:
            section["head_dim"] = hidden // heads  # keep the derived head dim explicit
        section["hidden_size"] = SMALL_HIDDEN
    for key in INTERMEDIATE_KEYS:
        if isinstance(section.get(key), int) and section[key] > SMALL_INTERMEDIATE:
            section[key] = SMALL_INTERMEDIATE
    for key in VOCAB_KEYS:
        if isinstance(section.get(key), int) and section[key] > SMALL_VOCAB:
            section[key] = SMALL_VOCAB
    experts = None
    for key in EXPERT_KEYS:
        if isinstance(section.get(key), int) and section[key] > SMALL_EXPERTS:
            section[key] = SMALL_EXPERTS
        if isinstance(section.get(key), int) and section[key] > 0:
            experts = section[key]
    if experts is not None:
        for key in TOP_K_KEYS:
            if isinstance(section.get(key), int) and section[key] > experts:
                section[key] = experts
        for key in GROUP_KEYS:
            if isinstance(section.get(key), int) and section[key] > 1:
                section[key] = 1


def shrink_candidates(config: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Shrunk configs to try, smallest first: a small hidden size with the head dim pinned, then the
    full hidden size (for model classes that derive head_dim from hidden_size / heads)."""
    for label, keep_hidden in (("small hidden size", False), ("full hidden size", True)):
        shrunk = copy.deepcopy(config)
        for section in text_sections(shrunk):
            _shrink_section(section, keep_hidden)
        yield label, shrunk


def vocab_size(config: dict[str, Any]) -> int:
    """The smallest vocabulary any section declares: token ids below it are valid everywhere."""
    sizes = [s[key] for s in text_sections(config) for key in VOCAB_KEYS if isinstance(s.get(key), int)]
    return min(sizes) if sizes else SMALL_VOCAB


def load_weightless(config: dict[str, Any], model_dir: Path | None = None, model_file: str | None = None,
                    limits: list[dict[str, Any]] | None = None):
    """Build the mlx-lm model for `config` with mlx-lm's loader and no weights: parameters stay lazy.

    `model_file` (a trusted checkpoint's own model code) is copied next to the config so that
    mlx-lm's loader can import it; the caller has already passed the engine's remote-code gate.
    Where the family's load step cannot run on a weightless copy, kvdoctor steps around it and
    appends what it did to `limits` (kvdoctor's limitation, never the engine's error).
    """
    from mlx_lm.utils import load_model

    with tempfile.TemporaryDirectory(prefix="kvdoctor-dryrun-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "config.json").write_text(json.dumps(config))
        if model_file is not None and model_dir is not None:
            target = tmp_path / model_file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(model_dir / model_file, target)
        with _weightless_sanitize(limits if limits is not None else []) as get_model_classes:
            model, loaded_config = load_model(tmp_path, lazy=True, strict=False, get_model_classes=get_model_classes,
                                              trust_remote_code=model_file is not None)
    return model, loaded_config


@contextmanager
def _weightless_sanitize(limits: list[dict[str, Any]]) -> Iterator[Any]:
    """mlx-lm's loader hands the checkpoint's weights to the model class's `sanitize`; a weightless
    copy hands it an empty dict. Real weights are never empty, so a sanitize that assumes a non-empty
    tree (Kimi K2.5's unflattens the weights and pops from the result, which for no weights is a
    list) fails only here. Such a failure is recorded in `limits` and the empty weights pass on
    unsanitized: there is nothing to sanitize, and the model's structure is already built. Yields the
    `get_model_classes` hook mlx-lm's `load_model` takes; the class is restored on exit."""
    from mlx_lm.utils import _get_classes as original_get

    wrapped: list[tuple[type, Any]] = []

    def get_model_classes(*args: Any, **kwargs: Any):
        model_class, args_class = original_get(*args, **kwargs)
        sanitize = model_class.__dict__.get("sanitize")
        if sanitize is not None and not any(cls is model_class for cls, _ in wrapped):
            def tolerant(self, weights, _sanitize=sanitize, _cls=model_class):
                if weights:
                    return _sanitize(self, weights)
                try:
                    return _sanitize(self, weights)
                except Exception as exc:  # noqa: BLE001 - the weightless copy's limitation, reported
                    limits.append({"stage": "load", "step": f"{_cls.__module__}.{_cls.__name__}.sanitize",
                                   "class": type(exc).__name__, "message": str(exc)})
                    return weights
            wrapped.append((model_class, sanitize))
            model_class.sanitize = tolerant
        return model_class, args_class

    try:
        yield get_model_classes
    finally:
        for cls, sanitize in wrapped:
            cls.sanitize = sanitize


def cast_floats(model: Any, dtype_name: str | None) -> None:
    """Give floating parameters the checkpoint's dtype, as loading real weights would (lazily)."""
    import mlx.core as mx

    dtype = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}.get(str(dtype_name or ""))
    if dtype is not None:
        model.set_dtype(dtype)


RANDOM_POOL = 1 << 20


def randomize(model: Any, seed: int) -> None:
    """Give every weight matrix fixed-seed random values, cheaply and lazily.

    Drawing a fresh random number for each of a billion weights takes MLX's CPU RNG most of a
    minute; a window of one seeded pool of 2^20 values, taken at a per-parameter offset and scaled by
    1/sqrt(fan-in), evaluates at memory speed. Vectors (norms, biases) keep mlx-lm's own init.
    """
    import hashlib

    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    key = mx.random.key(seed)
    pool = mx.random.uniform(-1.0, 1.0, (RANDOM_POOL,), key=key)
    updates = []
    for name, value in tree_flatten(model.parameters()):
        if value.ndim < 2 or not mx.issubdtype(value.dtype, mx.floating):
            continue
        offset = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little") % RANDOM_POOL
        reps = (offset + value.size) // RANDOM_POOL + 1
        window = mx.tile(pool, (reps,))[offset:offset + value.size]
        scale = float(value.shape[-1]) ** -0.5
        updates.append((name, (window * scale).reshape(value.shape).astype(value.dtype)))
    model.update(tree_unflatten(updates))


def _width(module: Any, name: str) -> int | None:
    proj = getattr(module, name, None)
    weight = getattr(proj, "weight", None)
    return None if weight is None else int(weight.shape[0])


def _mixer(engine: Any, name: str, module: Any) -> dict[str, Any]:
    return {"attr": name, "class": type(module).__name__, "heads": engine.get_num_heads(module),
            "kv_heads": engine.get_num_kv_heads(module), "head_dim": engine.get_head_dim(module),
            "q_width": _width(module, "q_proj"), "k_width": _width(module, "k_proj"),
            "v_width": _width(module, "v_proj")}


def _modules(layer: Any) -> list[str]:
    """The layer's module tree as "path: class" lines, list indices written as * (a copy with fewer
    experts in a list has the same tree): tells a dense layer from a mixture-of-experts one, which the
    engine's discovery functions do not."""
    return sorted({f"{'.'.join('*' if part.isdigit() else part for part in name.split('.'))}: {type(module).__name__}"
                   for name, module in layer.named_modules()})


def decoder_layers(model: Any, backend: Any) -> list[Any]:
    """The decoder layers, found as the engine finds them."""
    container = backend.kv_cache.language_model_container(model)
    root = getattr(model, "language_model", model)
    return getattr(container, "layers", None) or getattr(root, "layers", [])


SCALARS = (bool, int, float, str, type(None))


def layer_states(layers: list[Any]) -> list[list[str]]:
    """Each layer's plain settings: every scalar attribute of every module in it (a layer index, a
    flag, a size), as "path.name=value" lines. Two copies built from one config but for their layer
    counts show the same settings in the layers they share unless a layer depends on how many
    layers follow it (a last layer built differently, layers sharing another's cache)."""
    states = []
    for layer in layers:
        lines = set()
        for path, module in layer.named_modules():
            for name, value in vars(module).items():
                if isinstance(value, SCALARS) or (isinstance(value, (tuple, list)) and
                                                  all(isinstance(v, SCALARS) for v in value)):
                    lines.add(f"{path + '.' if path else ''}{name}={value!r}")
        states.append(sorted(lines))
    return states


def signature(model: Any, backend: Any) -> dict[str, Any]:
    """What the engine sees of each layer, read with the engine's own discovery functions.

    Every direct child of a layer that declares a head count is described (attention or not), so
    layers the engine does not recognise are compared too; when the engine's discovery itself
    refuses the model, its message is part of the signature and the runner will raise it at start-up.
    Each layer's module tree is part of it too, so that a copy cut to fewer layers (compact.py) can be
    shown to keep every kind of layer, feed-forward blocks included.
    """
    engine = backend.kv_cache
    layers = decoder_layers(model, backend)
    try:
        _, attrs = engine.find_attention_layers(model)
        discovery_error = None
    except Exception as exc:  # the runner raises the same at start-up; here it is only compared
        attrs, discovery_error = [None] * len(layers), f"{type(exc).__name__}: {exc}"
    rows = []
    for layer, attr in zip(layers, attrs):
        mixers = [_mixer(engine, name, child) for name, child in sorted(layer.children().items())
                  if engine.get_num_heads(child) is not None]
        rows.append({"layer_class": type(layer).__name__, "attention_attr": attr,
                     "sliding_flag": engine.uses_sliding_window_attention(layer, *(getattr(layer, m["attr"])
                                                                                   for m in mixers)),
                     "mixers": mixers, "modules": _modules(layer)})
    return {"num_layers": len(layers), "layers": rows, "discovery_error": discovery_error,
            "window_map": {str(k): v for k, v in sorted(engine.get_layer_window_sizes(model).items())},
            "container_window": engine.get_container_window_size(model)}


def signature_diff(full: dict[str, Any], shrunk: dict[str, Any]) -> list[str]:
    """Human-readable differences, at most a handful."""
    diff = []
    if full["num_layers"] != shrunk["num_layers"]:
        diff.append(f"layer count {full['num_layers']} -> {shrunk['num_layers']}")
    for index, (a, b) in enumerate(zip(full["layers"], shrunk["layers"])):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                diff.append(f"layer {index} {key}: {a.get(key)} -> {b.get(key)}")
    for key in ("window_map", "container_window", "discovery_error"):
        if full[key] != shrunk[key]:
            diff.append(f"{key}: {full[key]} -> {shrunk[key]}")
    return diff[:8]
