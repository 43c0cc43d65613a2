"""Load a model directory, or a Hugging Face id (`org/name[@revision]`), into a ModelSpec.

An id is read from the local Hugging Face cache when it holds the revision, else from the Hub
(`kvdoctor.load.hub`: config.json and the safetensors headers only, never weights).

Sizes are sanity-bounded here, before any layer is built: a value of the wrong type or past the
bounds in `kvdoctor.limits` is an input error naming the key and its line.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec

from kvdoctor.load.checkpoint import FLOAT_DTYPES, load_checkpoint
from kvdoctor.errors import InputError
from kvdoctor.load import hf_config, hub
from kvdoctor.load.families import UNKNOWN_FAMILY, Lookup, ResolvedLookup, build_layers, family_for, transformers_family
from kvdoctor.load.jsonfile import is_utf8, load_json, non_finite, read_bounded, require_inside, show
from kvdoctor.limits import (MAX_CONV_KERNEL, MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS,
                             MAX_TOKENS)
from kvdoctor.model import ATTENTION_KINDS, LayerSpec, ModelSpec, Source

HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@.+)?$")
COMMIT = re.compile(r"^[0-9A-Za-z_-][0-9A-Za-z._-]{0,127}$")
# model_type picks code paths in engines (mlx-lm imports `mlx_lm.models.<model_type>`): no dots or slashes.
MODEL_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

# Config keys (dotted, relative to the text config) that hold sizes: each must be a positive
# integer within its bound when present and not null.
SIZE_KEYS = {
    "num_hidden_layers": MAX_LAYERS, "num_attention_heads": MAX_HEADS, "num_key_value_heads": MAX_HEADS,
    "head_dim": MAX_HEAD_DIM, "hidden_size": MAX_HIDDEN, "vocab_size": 1 << 31, "intermediate_size": 1 << 30,
    "sliding_window": MAX_TOKENS, "attention_chunk_size": MAX_TOKENS, "max_position_embeddings": MAX_TOKENS,
    "linear_num_key_heads": MAX_HEADS, "linear_num_value_heads": MAX_HEADS,
    "linear_key_head_dim": MAX_HEAD_DIM, "linear_value_head_dim": MAX_HEAD_DIM,
    "linear_conv_kernel_dim": MAX_CONV_KERNEL,
    "linear_attn_config.num_heads": MAX_HEADS, "linear_attn_config.head_dim": MAX_HEAD_DIM,
    "linear_attn_config.short_conv_kernel_size": MAX_CONV_KERNEL,
    "kv_lora_rank": MAX_HEAD_DIM, "q_lora_rank": MAX_HIDDEN, "qk_nope_head_dim": MAX_HEAD_DIM,
    "qk_rope_head_dim": MAX_HEAD_DIM, "v_head_dim": MAX_HEAD_DIM,
    "mamba_n_heads": MAX_HEADS, "mamba_head_dim": MAX_HEAD_DIM, "mamba_d_state": MAX_HEAD_DIM,
    "ssm_state_size": MAX_HEAD_DIM, "mamba_d_conv": MAX_CONV_KERNEL, "conv_kernel": MAX_CONV_KERNEL,
}
# Latent-attention sizes a config without a latent (kv_lora_rank null) may state as 0, unused (DeepSeek-VL2-Tiny's
# language_config: use_mla false, both engines build multi-head attention of hidden_size / heads)
MLA_ONLY_KEYS = frozenset({"qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"})
# Per-layer lists (and pattern strings): at most one entry a layer, so at most MAX_LAYERS entries.
LIST_KEYS = ("layer_types", "layers_block_type", "hybrid_override_pattern", "linear_attn_config.kda_layers",
             "linear_attn_config.full_attn_layers")
# Per-layer values every cache is sized from.
LAYER_BOUNDS = {"n_heads": MAX_HEADS, "n_kv_heads": MAX_HEADS, "head_dim": MAX_HEAD_DIM,
                "v_head_dim": MAX_HEAD_DIM, "window": MAX_TOKENS}


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


class Resolved(msgspec.Struct):
    model_dir: Path
    root: Path  # where symlinks may resolve into
    hf_id: str | None = None
    source: dict[str, Any] = msgspec.field(default_factory=lambda: {"kind": "directory"})
    remote: dict[str, int] | None = None  # read from a Hub: each safetensors file's true size


def resolve_target(target: str) -> Resolved:
    """Where a target's files are: a directory, else the local Hugging Face cache, else the Hub
    (through kvdoctor's own cache of what it fetched; offline, only that cache)."""
    if not is_utf8(target):
        raise InputError(f"{show(target, 4096)}: the path is not UTF-8; expected a path a report can show")
    path = Path(target)
    try:
        found = path.exists()
    except OSError as exc:  # ENAMETOOLONG and the like: no such directory can be there
        raise InputError(f"{show(target, 200)}: {exc.strerror or exc}; expected a model directory") from None
    if found:
        if not path.is_dir():
            raise InputError(f"{target}: expected a model directory, found a file")
        return Resolved(path, _cache_repo(path) or path)
    if HF_ID.match(target):
        repo_id, _, revision = target.partition("@")
        if revision:
            hub.check_revision(target, revision)
        repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
        snap = _snapshot(repo, revision or None)
        if snap is not None:
            require_inside(snap, repo, "snapshot")
            if not snap.is_dir():
                raise InputError(f"{target}: the local Hugging Face cache points at {snap}, which is not a directory")
            return Resolved(snap, repo, repo_id, {"kind": "hf-cache", "commit": snap.name})
        try:
            got = hub.fetch(repo_id, revision or None)
        except InputError as exc:  # a mistyped path looks like an id too: say that neither was found
            label = f"{repo_id}@{revision}" if revision else repo_id
            why = str(exc).removeprefix(f"{label}: ")
            raise InputError(f"{target}: no such directory, and as a Hugging Face id: {why}") from None
        source = {"kind": "hub", "revision": revision or "main", "commit": got.commit, "cached": got.cached,
                  "bytes_fetched": got.fetched_bytes, "seconds": round(got.seconds, 3)}
        return Resolved(got.model_dir, got.root, repo_id, source, got.sizes)
    if path.is_symlink():
        raise InputError(f"{target}: the model directory is a broken symlink or a symlink loop")
    raise InputError(f"{target}: no such model directory")


def _cache_repo(path: Path) -> Path | None:
    """For a snapshot folder of the local Hugging Face cache (`models--ORG--NAME/snapshots/COMMIT`),
    the repo folder: its files are symlinks into the repo's `blobs/`."""
    real = path.resolve()
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real.parent.parent
    return None


def _snapshot(repo: Path, revision: str | None) -> Path | None:
    """The snapshot of the local Hugging Face cache `refs/REVISION` names (or a snapshot named by its
    commit); without a revision, `refs/main`'s, or else the newest one in the cache repo. None when
    the cache does not hold it."""
    snapshots = repo / "snapshots"
    if revision is not None:
        ref = repo / "refs" / revision
        if not ref.is_file():
            return snapshots / revision if (snapshots / revision).is_dir() else None
    else:
        ref = repo / "refs" / "main"
    if ref.is_file():
        commit = read_bounded(ref, 256, "Hugging Face cache ref").decode("utf-8", "replace").strip()
        if not COMMIT.match(commit):
            raise InputError(f"{ref}: {show(commit)}; expected a commit hash")
        return snapshots / commit
    try:
        found = [(p.stat().st_mtime, p) for p in snapshots.iterdir() if p.is_dir()] if snapshots.is_dir() else []
    except OSError as exc:
        raise InputError(f"{snapshots}: cannot list snapshots: {exc.strerror or exc}") from None
    return max(found)[1] if found else None


def _dotted(cfg: dict[str, Any], key: str) -> Any:
    value: Any = cfg
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _check_sizes(cfg: dict[str, Any], prefix: str, path: Path, lines: dict[str, int]) -> None:
    for key, bound in SIZE_KEYS.items():
        value = _dotted(cfg, key)
        if value is None or (value == 0 and key in MLA_ONLY_KEYS and cfg.get("kv_lora_rank") is None):
            continue
        line = lines.get(prefix + key)
        where = f"{path}:{line}" if line else str(path)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"{where}: {prefix + key} must be a positive integer, got {show(value)}")
        if value <= 0 or value > bound:
            raise InputError(f"{where}: {prefix + key} = {show(value)} is out of range; expected 1..{bound}")
    for key in LIST_KEYS:
        value = _dotted(cfg, key)
        if isinstance(value, (list, str)) and len(value) > MAX_LAYERS:
            line = lines.get(prefix + key)
            raise InputError(f"{path}{f':{line}' if line else ''}: {prefix + key} has {len(value)} entries; "
                             f"expected at most one a layer ({MAX_LAYERS})")


def _check_rope(raw: dict[str, Any], path: Path, lines: dict[str, int]) -> None:
    """A RoPE parameter (rope_theta, rope_scaling's factors, partial_rotary_factor) that is NaN or infinite
    is an input error: every engine would rotate queries and keys by nan or inf and answer wrongly.
    Non-finite numbers elsewhere are CFG020's warning."""
    for key, value in non_finite(raw):
        parts = key.split(".")
        if any(part.startswith("rope_") or part == "partial_rotary_factor" for part in parts):
            line = lines.get(key)
            raise InputError(f"{path}{f':{line}' if line else ''}: {key} = {value!r} is not a finite number; "
                             "expected the RoPE value the model was trained with")


def _check_layers(layers: list[LayerSpec], path: Path) -> None:
    """Every size a cache would be built from is a positive integer within bounds, or unknown (None)."""
    for layer in layers:
        for name, bound in LAYER_BOUNDS.items():
            value = getattr(layer, name)
            if value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 < value <= bound):
                continue
            source = layer.sources.get(name) or layer.sources.get("head_dim")
            where = f"{path}:{source.line}" if source and source.line else str(path)
            what = source.ref if source else name
            raise InputError(f"{where}: {what} = {show(value)} gives layer {layer.index} {name} out of range; "
                             f"expected an integer 1..{bound}")


def load_model(target: str, with_checkpoint: bool = True, library_check: bool = True) -> ModelSpec:
    where = resolve_target(target)
    model_dir, root = where.model_dir, where.root
    config_path = model_dir / "config.json"
    if not os.path.lexists(config_path):
        raise InputError(f"{model_dir}: no config.json in the model directory")
    require_inside(config_path, root, "config.json")
    raw, lines = load_json(config_path, "config.json")
    if not isinstance(raw, dict):
        raise InputError(f"{config_path}: expected a JSON object, got {type(raw).__name__}")

    # the text model's config: `text_config`, else `language_config` (DeepSeek-VL2: vLLM's DeepseekVLV2Config makes
    # its text_config of it, SGLang's get_hf_text_config takes it), else the config itself
    key = "text_config" if "text_config" in raw or not isinstance(raw.get("language_config"), dict) else "language_config"
    text = raw.get(key)
    if isinstance(text, dict):
        cfg, prefix = text, f"{key}."
    elif text is None:
        cfg, prefix = raw, ""
    else:
        line = lines.get(key)
        raise InputError(f"{config_path}{f':{line}' if line else ''}: {key} must be an object, "
                         f"got {type(text).__name__}")
    model_type = cfg.get("model_type") or raw.get("model_type")
    auto_map = raw.get("auto_map")
    if not model_type and isinstance(auto_map, dict) and auto_map.get("AutoConfig"):
        model_type = ""  # the checkpoint's own configuration code names it (SmallThinker); engines refuse remote code
    elif not model_type:
        raise InputError(f"{config_path}: missing 'model_type'; expected a string such as \"llama\"")
    if not isinstance(model_type, str):
        raise InputError(f"{config_path}: model_type must be a string such as \"llama\", got {show(model_type)}")
    if model_type and not MODEL_TYPE.match(model_type):
        raise InputError(f"{config_path}: model_type {show(model_type)}; expected letters, digits, '_' or '-'")
    _check_sizes(cfg, prefix, config_path, lines)
    _check_rope(raw, config_path, lines)

    def source_of(key: str) -> Source:
        path = prefix + key
        probe = path
        while probe and probe not in lines:
            probe = probe.rpartition(".")[0]
        return Source("key", path, "config.json", lines.get(probe))

    family, look, rejected = _semantics(model_type, cfg, source_of, nested=bool(prefix))
    notes: list[str] = []
    if family.semantics == "guess":
        notes.append(f"unknown model_type {model_type!r}: spec built from the common keys (guessed)")
    elif family.semantics == "transformers":
        view = look.view if isinstance(look, ResolvedLookup) else None
        assert view is not None  # the transformers semantics come with their resolved view
        notes.append(f"per-layer meaning from transformers {view.version}'s {view.class_name}")
    n_layers = look.get("num_hidden_layers")
    if n_layers is None or "num_hidden_layers" not in cfg:
        n_layers = _layer_count(cfg) or n_layers
    elif family.name == "nemotron_h":
        n_layers = _layer_count(cfg, NEMOTRON_H_LISTS) or n_layers
    unread = None
    if not isinstance(n_layers, int) or isinstance(n_layers, bool) or not 0 < n_layers <= MAX_LAYERS:
        unread = (f"{config_path}: missing or invalid 'num_hidden_layers' ({show(n_layers)}); "
                  f"expected 1..{MAX_LAYERS}")
        if n_layers is not None or family.semantics != "guess":
            raise InputError(unread)
        n_layers = 0  # no class reads this config: an engine's config stage may refuse it first (ModelSpec.unread)
    layers = build_layers(family, look, n_layers)
    _check_layers(layers, config_path)

    # the root config's dtype first, then its text config's, as the engines read a composite config's (vLLM's
    # ModelArchConfigConvertorBase.get_torch_dtype; LLaVA-NeXT's float16 over its text_config's bfloat16)
    dtype = raw.get("torch_dtype") or raw.get("dtype") or cfg.get("torch_dtype") or cfg.get("dtype")
    spec = ModelSpec(
        target=target, model_dir=model_dir, model_type=model_type, family=family.name,
        raw_config=raw, config=cfg, config_prefix=prefix, layers=layers, num_hidden_layers=n_layers,
        hidden_size=cfg.get("hidden_size"), vocab_size=cfg.get("vocab_size"),
        dtype=dtype if isinstance(dtype, str) else None,
        checkpoint=None, key_lines=lines, defaults=dict(look.used_defaults), notes=notes, hf_id=where.hf_id,
        semantics=family.semantics, rejected=rejected, origin=where.source, unread=unread,
    )
    for layer in layers:
        layer.dtype = spec.dtype
    if with_checkpoint:
        spec.checkpoint = load_checkpoint(model_dir, root, library_check, where.remote)
        _apply_checkpoint_dtypes(spec)
    return spec


# Per-layer lists a hybrid config may give its layer count by, in the order transformers' classes read them.
LAYER_LISTS = ("layer_types", "layers_block_type", "hybrid_override_pattern", "block_configs")


# NemotronHConfig counts the layers from its block list (`layer_types`, which transformers' class also takes as
# `layers_block_type`), else from the pattern string, and only warns about a `num_hidden_layers` that differs:
# transformers' (configuration_nemotron_h.py:169-186, 240-251 @ 5.22.2) and SGLang's own
# (srt/configs/nemotron_h.py:194-209, 314-321, 441-454 @ 0.5.23).
NEMOTRON_H_LISTS = ("layer_types", "layers_block_type", "hybrid_override_pattern")


def _layer_count(cfg: dict[str, Any], keys: tuple[str, ...] = LAYER_LISTS) -> int | None:
    """The layer count of a config without `num_hidden_layers`: the length of its per-layer list
    (Nemotron-H's `layers_block_type` or pattern, DeciLM's `block_configs`), as the family's class does."""
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, (list, str)) and value:
            return len(value)
    return None


# Sizes a composite config's text_config may leave to its class (LLaVA-NeXT's states none of them: the composite
# class builds the text config's class from the dict, defaults and all, and vLLM reads that), so the layers are
# built from the class's defaults too, each recorded as a default. A top-level config without them stays bad input.
CLASS_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads")


def _class_defaults(model_type: str, cfg: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """`keys` as transformers' configuration class for `model_type` sets them when `cfg` leaves them out; none
    without transformers, or where the class refuses the config (the plan reports that refusal)."""
    try:
        view = hf_config.read(model_type, cfg, attrs=keys)
    except hf_config.Rejected:
        return {}
    return {key: value for key, value in (view.resolved if view else {}).items() if value is not None}


def _semantics(model_type: str, cfg: dict[str, Any], source_of, nested: bool = False) -> tuple[Any, Lookup, Any]:
    """(family, lookup, rejection): kvdoctor's table when it covers the type, else transformers'
    configuration class when installed and it knows the type, else a best-effort guess."""
    family = family_for(model_type)
    if family is not None:
        look = Lookup(cfg, family.defaults, source_of, family.key_aliases(cfg))
        missing = tuple(key for key in CLASS_SIZES if look.get(key) is None) if nested else ()
        if missing:  # the engines build the text config's class, whose defaults fill what it leaves out
            look.defaults = {**family.defaults, **_class_defaults(model_type, cfg, missing)}
        look.used_defaults = {}
        return family, look, None
    try:
        view = hf_config.read(model_type, cfg)
    except hf_config.Rejected as rejected:  # the plan reports the refusal; the layer count is still the class's key
        return UNKNOWN_FAMILY, Lookup(cfg, {}, source_of, hf_config.attribute_map(model_type)), rejected
    if view is None:
        return UNKNOWN_FAMILY, Lookup(cfg, {}, source_of), None
    return transformers_family(view), ResolvedLookup(cfg, view, source_of), None


ATTN_WEIGHT_NAMES = ("self_attn.k_proj.weight", "self_attn.kv_a_proj_with_mqa.weight", "self_attn.qkv_proj.weight",
                     "attention.k_proj.weight", "attn.k_proj.weight")


def layer_tensor(spec: ModelSpec, index: int, suffix: str):
    """The header of `model.layers.{index}.{suffix}`, under the usual prefixes, or None."""
    if spec.checkpoint is None:
        return None
    for prefix in ("model.layers.", "model.language_model.layers.", "language_model.model.layers.",
                   "backbone.layers.", "transformer.h."):
        info = spec.checkpoint.get(f"{prefix}{index}.{suffix}")
        if info is not None:
            return info
    return None


def _apply_checkpoint_dtypes(spec: ModelSpec) -> None:
    """An attention layer's KV dtype is its key projection's dtype when that is a float type."""
    for layer in spec.layers:
        if layer.kind not in ATTENTION_KINDS:
            continue
        for name in ATTN_WEIGHT_NAMES:
            info = layer_tensor(spec, layer.index, name)
            if info is not None and info.dtype in FLOAT_DTYPES:
                layer.dtype = info.dtype
                layer.sources["dtype"] = Source("tensor", info.name, info.file)
                break
