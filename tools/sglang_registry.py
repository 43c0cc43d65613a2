"""Write kvdoctor/data/sglang_registry.json: the model types SGLang's config loader resolves without remote
code, the architectures SGLang has a model class for, and the versions they were read from.

    goldens/.venv/sglang/bin/python tools/sglang_registry.py
    goldens/.venv/sglang-0.5.19/bin/python tools/sglang_registry.py --release   # another release's differences

With `--release` (run in a release's venv from goldens/releases.py, with the transformers that release pins), the
file keeps the default release's lists and records under `releases` what that release's lists lack and add; the
profile reads them for that release and for the unmeasured releases before it down to the previous measured one
(kvdoctor/engines/sglang/refusals.py, `registry`).

Run with the SGLang oracle venv (goldens/README.md). SGLang loads a config with transformers' AutoConfig
and `trust_remote_code=False` (its default); AutoConfig knows transformers' own model types plus the config
classes SGLang registers (`utils/hf_transformers/common.py`, `_CONFIG_REGISTRY`). A config whose model_type
is outside that set stops the server before anything is built (the refusals in
kvdoctor/engines/sglang/refusals.py). Importing SGLang's registry needs the CUDA shims the oracles use.

SGLang's model registry (`models/registry.py`, `import_model_classes`) maps each top-level module's `EntryClass`
(a class or a list of classes) by class name; the names are read from the modules' source here, without
importing them (most need CUDA kernels). An architecture outside that list has no SGLang implementation:
SGLang then tries its Transformers backend (`model_loader/utils.py`, `resolve_transformers_arch`).
"""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "kvdoctor" / "data" / "sglang_registry.json"


def entry_classes(models: Path) -> list[str]:
    """Class names in the `EntryClass = X` / `EntryClass = [X, Y]` assignments of the package's modules."""
    names: set[str] = set()
    for path in sorted(models.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8-sig")).body:  # a BOM in some releases
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
                values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                names.update(v.id if isinstance(v, ast.Name) else v.attr for v in values
                             if isinstance(v, (ast.Name, ast.Attribute)))
    return sorted(names)


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
    models = entry_classes(Path(sglang.__file__).parent / "srt" / "models")
    if sys.argv[1:] == ["--release"]:
        doc = json.loads(OUT.read_text())
        doc.setdefault("releases", {})[sglang.__version__] = {
            "transformers": transformers.__version__,
            "model_types_absent": sorted(set(doc["model_types"]) - set(types)),
            "model_types_added": sorted(set(types) - set(doc["model_types"])),
            "architectures_absent": sorted(set(doc["architectures"]) - set(models)),
            "architectures_added": sorted(set(models) - set(doc["architectures"]))}
        doc["releases"] = dict(sorted(doc["releases"].items(), key=lambda kv: [int(p) for p in kv[0].split(".")]))
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}: sglang {sglang.__version__}'s differences")
        return 0
    doc = {"sglang": sglang.__version__, "transformers": transformers.__version__,
           "source": "transformers.CONFIG_MAPPING after sglang.srt.utils.hf_transformers.common registered its classes",
           "sglang_registered": sglang_own, "model_types": types,
           "architectures": models, **({"releases": old["releases"]} if "releases" in (old := json.loads(
               OUT.read_text()) if OUT.exists() else {}) else {})}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(types)} model types ({len(sglang_own)} registered by SGLang), "
          f"{len(doc['architectures'])} architectures")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
