"""Writes kvdoctor/engines/vllm/model_types.json, what vLLM 0.33.0 knows of a config.json before any
model code runs:
- the `model_type`s it can read without remote code: those of the transformers it runs with
  (CONFIG_MAPPING_NAMES of the newest transformers its requirements admit, <5.21) and those of its own
  config registry (vllm/transformers_utils/config.py _CONFIG_REGISTRY);
- its model registry's architectures in the registry's own order (the order its "not supported"
  message prints them in), the ones it names as dropped or moved to a plugin, the suffixes it
  normalizes an architecture by, and the names transformers exports with one of those suffixes (an
  architecture vLLM lacks but transformers has may run on vLLM's Transformers backend).
Run in goldens/.venv/vllm: `.venv/vllm/bin/python vllm_model_types.py [OUT]` (stdout with no OUT;
tests compare the two).
"""
from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
from vllm.config.model import iter_architecture_defaults
from vllm.model_executor.models.registry import _OOT_SUPPORTED_MODELS, _PREVIOUSLY_SUPPORTED_MODELS, ModelRegistry
from vllm.transformers_utils.config import _CONFIG_REGISTRY

OUT = Path(__file__).resolve().parent.parent / "kvdoctor" / "engines" / "vllm" / "model_types.json"


def table() -> dict:
    suffixes = [suffix for suffix, _ in iter_architecture_defaults()]
    registered = set(ModelRegistry.get_supported_archs())
    return {"vllm": importlib.metadata.version("vllm"), "transformers": importlib.metadata.version("transformers"),
            "transformers_model_types": sorted(CONFIG_MAPPING_NAMES),
            "vllm_model_types": sorted(_CONFIG_REGISTRY.keys()),
            "vllm_architectures": list(ModelRegistry.get_supported_archs()),
            "previously_supported": dict(sorted(_PREVIOUSLY_SUPPORTED_MODELS.items())),
            "out_of_tree": dict(sorted(_OOT_SUPPORTED_MODELS.items())),
            "architecture_suffixes": suffixes,
            "transformers_architectures": sorted(
                name for name in dir(transformers) if name.endswith(tuple(suffixes)) and name not in registered)}


if __name__ == "__main__":
    text = json.dumps(table(), indent=1) + "\n"
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    else:
        sys.stdout.write(text)
