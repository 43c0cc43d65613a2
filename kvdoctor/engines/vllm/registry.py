"""What each vLLM release knows of a config.json before any model code runs: the `model_type`s it can read
and the architectures its model registry resolves.

The tables are in model_types.json, written by goldens/vllm_model_types.py from each release's venv and the
newest transformers it admits (a test compares them): the pinned release's whole, 0.26.0's, 0.28.0's,
0.30.0's, 0.32.0's and 0.33.0's as differences from it. The architecture lookup follows
`_ModelRegistry.inspect_model_cls` (vllm/model_executor/models/registry.py @ 0.34.0): a registered
name, then a name the registry reaches by swapping the auto-class suffix (`...ForCausalLM` ->
`...ForConditionalGeneration`), then the Transformers backend, which needs transformers to export the
architecture or the config to name its code in `auto_map`; otherwise vLLM refuses.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Mapping

from kvdoctor.engines.releases import key
from kvdoctor.engines.vllm.refusals import VERSION, Startup, unsupported_architecture


# Releases whose own table is not in model_types.json read the nearest later release's (0.27.0 reads 0.27.1's):
# the tables are those of the releases whose venvs goldens/releases.py has built.
SET_FIELDS = ("transformers_model_types", "vllm_model_types", "transformers_architectures")


@functools.lru_cache(maxsize=None)
def table(release: str = VERSION) -> dict[str, Any]:
    """The tables as `release` has them: the pinned release's in full, another's as its differences
    (a set field's added / removed names; the ordered or mapped fields whole)."""
    stored = json.loads((Path(__file__).resolve().parent / "model_types.json").read_text())
    releases = stored.pop("releases")
    have = sorted([*releases, stored["vllm"]], key=key)
    nearest = next((r for r in have if key(r) >= key(release)), stored["vllm"])
    if nearest == stored["vllm"]:
        return stored
    out = dict(stored)
    for field, value in releases[nearest].items():
        if field in SET_FIELDS:
            out[field] = sorted((set(stored[field]) | set(value["added"])) - set(value["removed"]))
        else:
            out[field] = value
    return out


@functools.lru_cache(maxsize=None)
def _readable_model_types(release: str) -> frozenset[str]:
    return frozenset(table(release)["transformers_model_types"]) | frozenset(table(release)["vllm_model_types"])


@functools.lru_cache(maxsize=None)
def _registered(release: str) -> frozenset[str]:
    return frozenset(table(release)["vllm_architectures"])


@functools.lru_cache(maxsize=None)
def _transformers_architectures(release: str) -> frozenset[str]:
    return frozenset(table(release)["transformers_architectures"])


def unrecognized_type(config: Mapping[str, Any], release: str = VERSION) -> str | None:
    """The config's model_type when vLLM's AutoConfig cannot read it (no remote code named either)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or "auto_map" in config or model_type in _readable_model_types(release):
        return None
    return model_type


def reads_with_own_class(model_type: object, release: str = VERSION) -> bool:
    """Whether the release reads this model_type with a config class of its own (its _CONFIG_REGISTRY), not
    transformers': a refusal transformers' class would raise is then not that release's."""
    return model_type in table(release)["vllm_model_types"]


def needs_remote_code(config: Mapping[str, Any], release: str = VERSION) -> bool:
    """The config's class is the checkpoint's own code: auto_map names an AutoConfig and the config has no
    model_type, or neither transformers nor vLLM's registry has a class for it (a class of theirs takes precedence)."""
    auto_map = config.get("auto_map")
    model_type = config.get("model_type")
    return (isinstance(auto_map, Mapping) and "AutoConfig" in auto_map
            and (not model_type or isinstance(model_type, str) and model_type not in _readable_model_types(release)))


def _reached_by_suffix(architecture: str, release: str) -> bool:
    """`_normalize_arch`: the first auto-class suffix the name ends with, swapped for each suffix in turn."""
    suffixes = table(release)["architecture_suffixes"]
    suffix = next((s for s in suffixes if architecture.endswith(s)), None)
    return suffix is not None and any(architecture.replace(suffix, other) in _registered(release) for other in suffixes)


def loaded_class(config: Mapping[str, Any], release: str = VERSION) -> str | None:
    """The registered class vLLM loads for the config's first architecture: its own name, else the first
    suffix swap `_normalize_arch` finds registered (None: neither)."""
    names = [str(a) for a in config.get("architectures") or []]
    if not names or names[0] in _registered(release):
        return names[0] if names else None
    suffixes = table(release)["architecture_suffixes"]
    suffix = next((s for s in suffixes if names[0].endswith(s)), None)
    swapped = [names[0].replace(suffix, other) for other in suffixes] if suffix else []
    return next((name for name in swapped if name in _registered(release)), None)


def resolution(config: Mapping[str, Any], release: str = VERSION) -> str:
    """How vLLM resolves the config's `architectures`: "registered", "transformers_backend" (vLLM would
    try its Transformers backend, whose outcome depends on the model class's code) or "unsupported"."""
    names = [str(a) for a in config.get("architectures") or []]
    if not names or any(a in _registered(release) or _reached_by_suffix(a, release) for a in names):
        return "registered"
    if "auto_map" in config or names[0] in _transformers_architectures(release):
        return "transformers_backend"
    return "unsupported"


def architecture_refusal(config: Mapping[str, Any], release: str = VERSION) -> Startup | None:
    """`_raise_for_unsupported`, for architectures neither the registry nor the Transformers backend has."""
    if resolution(config, release) != "unsupported":
        return None
    names = [str(a) for a in config["architectures"]]
    at = table(release)
    return unsupported_architecture(names, at["vllm_architectures"], at["previously_supported"], at["out_of_tree"])
