"""What vLLM 0.33.0 knows of a config.json before any model code runs: the `model_type`s it can read
and the architectures its model registry resolves.

The tables are in model_types.json, written by goldens/vllm_model_types.py from the installed vLLM and
the newest transformers it admits (a test compares them). The architecture lookup follows
`_ModelRegistry.inspect_model_cls` (vllm/model_executor/models/registry.py @ 0.33.0): a registered
name, then a name the registry reaches by swapping the auto-class suffix (`...ForCausalLM` ->
`...ForConditionalGeneration`), then the Transformers backend, which needs transformers to export the
architecture or the config to name its code in `auto_map`; otherwise vLLM refuses.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Mapping

from kvdoctor.engines.vllm.refusals import Startup, unsupported_architecture


@functools.lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return json.loads((Path(__file__).resolve().parent / "model_types.json").read_text())


@functools.lru_cache(maxsize=1)
def _readable_model_types() -> frozenset[str]:
    return frozenset(table()["transformers_model_types"]) | frozenset(table()["vllm_model_types"])


@functools.lru_cache(maxsize=1)
def _registered() -> frozenset[str]:
    return frozenset(table()["vllm_architectures"])


@functools.lru_cache(maxsize=1)
def _transformers_architectures() -> frozenset[str]:
    return frozenset(table()["transformers_architectures"])


def unrecognized_type(config: Mapping[str, Any]) -> str | None:
    """The config's model_type when vLLM's AutoConfig cannot read it (no remote code named either)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or "auto_map" in config or model_type in _readable_model_types():
        return None
    return model_type


def needs_remote_code(config: Mapping[str, Any]) -> bool:
    """The config's class is the checkpoint's own code: auto_map names an AutoConfig and neither
    transformers nor vLLM's registry has a class for the model_type (a class of theirs takes precedence)."""
    auto_map = config.get("auto_map")
    model_type = config.get("model_type")
    return (isinstance(auto_map, Mapping) and "AutoConfig" in auto_map and isinstance(model_type, str)
            and model_type not in _readable_model_types())


def _reached_by_suffix(architecture: str) -> bool:
    """`_normalize_arch`: the first auto-class suffix the name ends with, swapped for each suffix in turn."""
    suffixes = table()["architecture_suffixes"]
    suffix = next((s for s in suffixes if architecture.endswith(s)), None)
    return suffix is not None and any(architecture.replace(suffix, other) in _registered() for other in suffixes)


def resolution(config: Mapping[str, Any]) -> str:
    """How vLLM resolves the config's `architectures`: "registered", "transformers_backend" (vLLM would
    try its Transformers backend, whose outcome depends on the model class's code) or "unsupported"."""
    names = [str(a) for a in config.get("architectures") or []]
    if not names or any(a in _registered() or _reached_by_suffix(a) for a in names):
        return "registered"
    if "auto_map" in config or names[0] in _transformers_architectures():
        return "transformers_backend"
    return "unsupported"


def architecture_refusal(config: Mapping[str, Any]) -> Startup | None:
    """`_raise_for_unsupported`, for architectures neither the registry nor the Transformers backend has."""
    if resolution(config) != "unsupported":
        return None
    names = [str(a) for a in config["architectures"]]
    return unsupported_architecture(names, table()["vllm_architectures"], table()["previously_supported"],
                                    table()["out_of_tree"])
