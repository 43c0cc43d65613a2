"""Writes kvdoctor/engines/vllm/model_types.json, what each vLLM release knows of a config.json before any
model code runs:
- the `model_type`s it can read without remote code: those of the transformers it runs with
  (CONFIG_MAPPING_NAMES of the newest transformers its requirements admit, <5.21) and those of its own
  config registry (vllm/transformers_utils/config.py _CONFIG_REGISTRY);
- its model registry's architectures in the registry's own order (the order its "not supported"
  message prints them in), the ones it names as dropped or moved to a plugin, the suffixes it
  normalizes an architecture by, and the names transformers exports with one of those suffixes (an
  architecture vLLM lacks but transformers has may run on vLLM's Transformers backend).
Run in a release's venv: `.venv/vllm-0.34.0/bin/python vllm_model_types.py [OUT]` (stdout with no OUT;
tests compare the two). model_types.json is the pinned release's table whole with the other releases' as their
differences from it (`releases`): `python vllm_model_types.py --merge PINNED.json OTHER.json... > model_types.json`
(any Python; kvdoctor/engines/vllm/registry.py reads it back per release).
"""
from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "kvdoctor" / "engines" / "vllm" / "model_types.json"
SET_FIELDS = ("transformers_model_types", "vllm_model_types", "transformers_architectures")
WHOLE_FIELDS = ("vllm_architectures", "previously_supported", "out_of_tree", "architecture_suffixes")


def merge(pinned: dict, others: list[dict]) -> dict:
    """The pinned release's table, with each other release's differences from it under `releases`."""
    releases = {}
    for other in others:
        diff = {"vllm": other["vllm"], "transformers": other["transformers"]}
        for field in SET_FIELDS:
            if set(other[field]) != set(pinned[field]):
                diff[field] = {"added": sorted(set(other[field]) - set(pinned[field])),
                               "removed": sorted(set(pinned[field]) - set(other[field]))}
        diff |= {field: other[field] for field in WHOLE_FIELDS if other[field] != pinned[field]}
        releases[other["vllm"]] = diff
    return {**pinned, "releases": releases}


def table() -> dict:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from vllm.config.model import iter_architecture_defaults
    from vllm.model_executor.models.registry import _OOT_SUPPORTED_MODELS, _PREVIOUSLY_SUPPORTED_MODELS, ModelRegistry
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

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
    if sys.argv[1:2] == ["--merge"]:
        tables = [json.loads(Path(p).read_text()) for p in sys.argv[2:]]
        sys.stdout.write(json.dumps(merge(tables[0], tables[1:]), indent=1) + "\n")
        raise SystemExit(0)
    text = json.dumps(table(), indent=1) + "\n"
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    else:
        sys.stdout.write(text)
