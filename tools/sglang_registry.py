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


def layer_types_unchecked(mapping) -> list[str]:
    """The model types SGLang registers a config class for that accept a `layer_types` list whose length is
    not num_hidden_layers: their classes skip transformers' strict `validate_layer_type` (SGLang's Lfm2Config
    subclasses transformers' without being a strict dataclass itself), so SGL002 does not apply to them."""
    out = []
    for model_type, cls in sorted(mapping._extra_content.items()):
        try:
            cls(num_hidden_layers=4, layer_types=["full_attention"] * 3)
        except Exception:  # noqa: BLE001 - any refusal means the class checks the config
            continue
        out.append(model_type)
    return out


def transformers_backend() -> dict[str, list[str]]:
    """transformers' model classes (every name in its auto mappings) split by `is_backend_compatible()`: SGLang
    falls back to its Transformers backend for an architecture it has no class for, and with `--model-impl auto`
    stops at model load where that class is not compatible (model_loader/utils.py `resolve_transformers_arch`)."""
    import transformers
    from transformers.models.auto import modeling_auto

    names: set[str] = set()
    for attr in dir(modeling_auto):
        if attr.startswith("MODEL_") and attr.endswith("_MAPPING_NAMES"):
            for value in getattr(modeling_auto, attr).values():
                names.update(value if isinstance(value, (list, tuple)) else [value])
    out: dict[str, list[str]] = {"compatible": [], "incompatible": []}
    for name in sorted(names):
        cls = getattr(transformers, name, None)
        if cls is not None:
            out["compatible" if cls.is_backend_compatible() else "incompatible"].append(name)
    return out


def composite_text_defaults(mapping) -> dict[str, dict[str, int | None]]:
    """Model types whose configuration class holds the language model in a `text_config` sub-config and, when
    config.json gives none, builds its default one, keeping top-level text keys as unused attributes (classes
    that move them into text_config are left out); with the geometry of that default: what SGLang's
    `hf_text_config` then is, and the context SGLang derives from it (`get_context_length`)."""
    from sglang.srt.utils.hf_transformers.common import get_context_length

    out: dict[str, dict[str, int | None]] = {}
    for model_type in sorted(mapping.keys()):
        try:
            cls = mapping[model_type]
            if "text_config" not in (getattr(cls, "sub_configs", None) or {}):
                continue
            text = cls().text_config
            stated = (text.num_hidden_layers or 0) + 1
            if cls(num_hidden_layers=stated).text_config.num_hidden_layers == stated:
                continue  # the class moves top-level text keys into its text_config (Qwen2-VL's old layout)
            out[model_type] = {k: getattr(text, k, None) for k in ("num_hidden_layers", "num_key_value_heads",
                                                                   "head_dim")}
            out[model_type]["context_length"] = get_context_length(text)
        except Exception:  # noqa: BLE001 - a class that cannot build (or read) its defaults has none to report
            continue
    return out


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
        doc["releases"] = dict(sorted(doc["releases"].items(),
                                      key=lambda kv: [int(p) for p in kv[0].replace(".post", ".").split(".")]))
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}: sglang {sglang.__version__}'s differences")
        return 0
    doc = {"sglang": sglang.__version__, "transformers": transformers.__version__,
           "source": "transformers.CONFIG_MAPPING after sglang.srt.utils.hf_transformers.common registered its classes",
           "sglang_registered": sglang_own, "model_types": types,
           "layer_types_unchecked": layer_types_unchecked(CONFIG_MAPPING),
           "transformers_backend": transformers_backend(),
           "text_config_defaults": composite_text_defaults(CONFIG_MAPPING),
           "architectures": models, **({"releases": old["releases"]} if "releases" in (old := json.loads(
               OUT.read_text()) if OUT.exists() else {}) else {})}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(types)} model types ({len(sglang_own)} registered by SGLang), "
          f"{len(doc['architectures'])} architectures")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
