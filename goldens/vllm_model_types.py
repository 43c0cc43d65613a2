"""Writes kvdoctor/engines/vllm/model_types.json: the `model_type`s vLLM 0.33.0 can read a config.json
for without remote code, i.e. those of the transformers it runs with (CONFIG_MAPPING_NAMES of the
newest transformers its requirements admit, <5.21) and those of its own config registry
(vllm/transformers_utils/config.py _CONFIG_REGISTRY). Run in goldens/.venv/vllm:
`.venv/vllm/bin/python vllm_model_types.py [OUT]` (stdout with no OUT; tests compare the two).
"""
from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
from vllm.transformers_utils.config import _CONFIG_REGISTRY

OUT = Path(__file__).resolve().parent.parent / "kvdoctor" / "engines" / "vllm" / "model_types.json"


def table() -> dict:
    return {"vllm": importlib.metadata.version("vllm"), "transformers": importlib.metadata.version("transformers"),
            "transformers_model_types": sorted(CONFIG_MAPPING_NAMES),
            "vllm_model_types": sorted(_CONFIG_REGISTRY.keys())}


if __name__ == "__main__":
    text = json.dumps(table(), indent=1) + "\n"
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    else:
        sys.stdout.write(text)
