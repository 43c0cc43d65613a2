"""Load a model directory (or a Hugging Face id found in the local cache) into a ModelSpec."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from kvdoctor.checkpoint import FLOAT_DTYPES, load_checkpoint
from kvdoctor.errors import InputError
from kvdoctor.families import UNKNOWN_FAMILY, Lookup, build_layers, family_for
from kvdoctor.jsonfile import load_json
from kvdoctor.model import ATTENTION_KINDS, ModelSpec, Source

HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
MAX_LAYERS = 10_000
MAX_HEADS = 65_536
MAX_DIM = 1 << 24

# Config keys that hold sizes: each must be a positive integer within a sane bound when present.
SIZE_KEYS = {
    "num_hidden_layers": MAX_LAYERS, "num_attention_heads": MAX_HEADS, "num_key_value_heads": MAX_HEADS,
    "head_dim": MAX_DIM, "hidden_size": MAX_DIM, "vocab_size": 1 << 31, "sliding_window": 1 << 40,
    "intermediate_size": 1 << 30,
}


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def resolve_target(target: str) -> tuple[Path, Path, str | None]:
    """(model dir, root symlinks may resolve into, HF id or None). Never touches the network."""
    path = Path(target)
    if path.exists():
        if not path.is_dir():
            raise InputError(f"{target}: expected a model directory, found a file")
        return path, path, None
    if HF_ID.match(target):
        repo = hf_cache_dir() / ("models--" + target.replace("/", "--"))
        ref = repo / "refs" / "main"
        snapshots = repo / "snapshots"
        if ref.is_file():
            snap = snapshots / ref.read_text(encoding="utf-8", errors="replace").strip()
        elif snapshots.is_dir() and any(snapshots.iterdir()):
            snap = max(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
        else:
            raise InputError(f"{target}: no such directory, and no snapshot of this Hugging Face id in the local cache {hf_cache_dir()} (kvdoctor never downloads)")
        if not snap.is_dir():
            raise InputError(f"{target}: the local Hugging Face cache points at a missing snapshot {snap}")
        return snap, repo, target
    raise InputError(f"{target}: no such model directory")


def _check_sizes(cfg: dict[str, Any], prefix: str, path: Path, lines: dict[str, int]) -> None:
    for key, bound in SIZE_KEYS.items():
        if key not in cfg or cfg[key] is None:
            continue
        value = cfg[key]
        line = lines.get(prefix + key)
        where = f"{path}:{line}" if line else str(path)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"{where}: {prefix + key} must be a positive integer, got {value!r}")
        if value <= 0 or value > bound:
            raise InputError(f"{where}: {prefix + key} = {value} is out of range; expected 1..{bound}")


def load_model(target: str, with_checkpoint: bool = True) -> ModelSpec:
    model_dir, root, hf_id = resolve_target(target)
    config_path = model_dir / "config.json"
    if not config_path.exists():
        raise InputError(f"{model_dir}: no config.json in the model directory")
    raw, lines = load_json(config_path, "config.json")
    if not isinstance(raw, dict):
        raise InputError(f"{config_path}: expected a JSON object, got {type(raw).__name__}")

    text = raw.get("text_config")
    if isinstance(text, dict):
        cfg, prefix = text, "text_config."
    else:
        cfg, prefix = raw, ""
    model_type = cfg.get("model_type") or raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError(f"{config_path}: missing 'model_type'; expected a string such as \"llama\"")
    _check_sizes(cfg, prefix, config_path, lines)

    family = family_for(model_type)
    notes: list[str] = []
    if family is None:
        family = UNKNOWN_FAMILY
        notes.append(f"unknown model_type {model_type!r}: spec built from the common keys")

    def source_of(key: str) -> Source:
        path = prefix + key
        probe = path
        while probe and probe not in lines:
            probe = probe.rpartition(".")[0]
        return Source("key", path, "config.json", lines.get(probe))

    look = Lookup(cfg, family.defaults, source_of)
    n_layers = look.get("num_hidden_layers")
    if n_layers is None:
        pattern = cfg.get("hybrid_override_pattern")
        n_layers = len(pattern) if isinstance(pattern, str) and pattern else None
    if not isinstance(n_layers, int) or isinstance(n_layers, bool) or not 0 < n_layers <= MAX_LAYERS:
        raise InputError(f"{config_path}: missing or invalid 'num_hidden_layers' ({n_layers!r}); expected 1..{MAX_LAYERS}")
    layers = build_layers(family, look, n_layers)

    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or raw.get("torch_dtype") or raw.get("dtype")
    spec = ModelSpec(
        target=target, model_dir=model_dir, model_type=model_type, family=family.name,
        raw_config=raw, config=cfg, config_prefix=prefix, layers=layers, num_hidden_layers=n_layers,
        hidden_size=cfg.get("hidden_size"), vocab_size=cfg.get("vocab_size"),
        dtype=dtype if isinstance(dtype, str) else None,
        checkpoint=None, key_lines=lines, defaults=dict(look.used_defaults), notes=notes, hf_id=hf_id,
    )
    for layer in layers:
        layer.dtype = spec.dtype
    if with_checkpoint:
        spec.checkpoint = load_checkpoint(model_dir, root)
        _apply_checkpoint_dtypes(spec)
    return spec


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
