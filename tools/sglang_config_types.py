"""Write kvdoctor/data/sglang_config_types.json: the model types SGLang's config loader resolves without
remote code, and the versions they were read from.

    goldens/.venv/sglang/bin/python tools/sglang_config_types.py

Run with the SGLang oracle venv (goldens/README.md). SGLang loads a config with transformers' AutoConfig
and `trust_remote_code=False` (its default); AutoConfig knows transformers' own model types plus the config
classes SGLang registers (`utils/hf_transformers/common.py`, `_CONFIG_REGISTRY`). A config whose model_type
is outside that set stops the server before anything is built (the refusals in
kvdoctor/engines/sglang/refusals.py). Importing SGLang's registry needs the CUDA shims the oracles use.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "kvdoctor" / "data" / "sglang_config_types.json"


def main() -> int:
    sys.path[:0] = [str(ROOT / "kvdoctor" / "engines" / "sglang" / "shims"), str(ROOT / "goldens" / "stubs")]
    import cudafake
    import fakemods

    cudafake.install()
    fakemods.install()
    import sglang
    import transformers
    from sglang.srt.utils.hf_transformers import common
    from transformers import CONFIG_MAPPING

    sglang_own = sorted(common._CONFIG_REGISTRY)
    types = sorted(set(CONFIG_MAPPING.keys()) | set(sglang_own))
    doc = {"sglang": sglang.__version__, "transformers": transformers.__version__,
           "source": "transformers.CONFIG_MAPPING after sglang.srt.utils.hf_transformers.common registered its classes",
           "sglang_registered": sglang_own, "model_types": types}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(types)} model types ({len(sglang_own)} registered by SGLang)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
