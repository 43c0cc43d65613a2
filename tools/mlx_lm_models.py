"""Write kvdoctor/data/mlx_lm_models.json from the installed mlx-lm: the names of its model modules
(`mlx_lm/models/*.py`), its model_type remaps (read from `mlx_lm/utils.py` without running it), the
modules whose Model builds its own caches, and the config keys each module's ModelArgs cannot do without.

The sglang-mlx plan reads this file when mlx-lm is not installed (the base install), so a model type
mlx-lm has is never reported as one it lacks. Run it with the pinned mlx-lm (kvdoctor.engines.pins):

    .venv/bin/python tools/mlx_lm_models.py
"""
from __future__ import annotations

import ast
import importlib.util
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvdoctor.engines.pins import PINS  # noqa: E402
from kvdoctor.engines.sglang_mlx.mlxlm import MODELS_DATA  # noqa: E402




def installed_models() -> dict:
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("mlx-lm is not installed: pip install 'kvdoctor[mlx]'")
    package = Path(list(spec.submodule_search_locations)[0])
    remaps: dict = {}
    for node in ast.parse((package / "utils.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("MODEL_REMAPPING", "MODEL_ARCHITECTURE_REMAPPING"):
                remaps[node.targets[0].id] = ast.literal_eval(node.value)
    return {
        "mlx-lm": metadata.version("mlx-lm"),
        "modules": sorted(p.stem for p in (package / "models").glob("*.py") if p.stem != "__init__"),
        "remapping": dict(sorted(remaps.get("MODEL_REMAPPING", {}).items())),
        "architecture_remapping": sorted([t, a, m] for (t, a), m in remaps.get("MODEL_ARCHITECTURE_REMAPPING", {}).items()),
        "make_cache": make_cache_modules(package / "models"),
        "model_args": model_args(package / "models"),
    }


def make_cache_modules(models: Path) -> list[str]:
    """Modules whose `Model` class builds its own caches: it defines `make_cache`, or inherits it from a
    sibling module's `Model` (`from .qwen3_5 import Model as Qwen3_5Model`, or `qwen3_5.Model` after
    `from . import qwen3_5`). mlx-lm's make_prompt_cache
    then ignores --max-kv-size (the mlx-lm profile's plan reads this list)."""
    own: set[str] = set()
    bases: dict[str, set[str]] = {}
    for path in models.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {alias.asname or alias.name: node.module for node in tree.body
                    if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
                    for alias in node.names if alias.name == "Model"}
        siblings = {alias.asname or alias.name: alias.name for node in tree.body  # `from . import qwen3_5`
                    if isinstance(node, ast.ImportFrom) and node.level == 1 and not node.module
                    for alias in node.names}
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "Model":
                if any(isinstance(f, ast.FunctionDef) and f.name == "make_cache" for f in node.body):
                    own.add(path.stem)
                bases[path.stem] = {imported[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in imported}
                bases[path.stem] |= {siblings[b.value.id] for b in node.bases if isinstance(b, ast.Attribute)
                                     and b.attr == "Model" and isinstance(b.value, ast.Name) and b.value.id in siblings}
            elif isinstance(node, ast.ImportFrom) and node.level == 1 and any(
                    a.name == "Model" and a.asname is None for a in node.names):
                bases.setdefault(path.stem, set()).add(node.module or "")
    found = set(own)
    while True:
        more = {name for name, parents in bases.items() if parents & found} - found
        if not more:
            return sorted(found)
        found |= more


def model_args(models: Path) -> dict[str, dict]:
    """Per module, the ModelArgs fields without a default (in signature order) and whether ModelArgs has its
    own `from_dict`; for a wrapper whose Model builds its language model from `args.text_config` through one
    other ModelArgs class (`qwen3.ModelArgs.from_dict(args.text_config)`), that class's name and fields too.
    mlx-lm's loader passes only the keys a ModelArgs names, so a missing one is a TypeError at load."""
    import dataclasses  # noqa: TID251 - reads mlx-lm's own dataclasses, defines none

    from kvdoctor.engines.sglang_mlx.mlxlm import ModuleExit, import_model_module

    def load(name: str) -> Any:
        try:
            return import_model_module(name)
        except ModuleExit:  # olmo.py exits without ai2-olmo: its fields cannot be read here
            return None

    def required(cls: type) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]

    out: dict[str, dict] = {}
    for path in sorted(models.glob("*.py")):
        module = load(path.stem) if path.stem != "__init__" else None
        args = getattr(module, "ModelArgs", None)
        if not dataclasses.is_dataclass(args):
            continue
        entry: dict = {"required": required(args), "own_from_dict": "from_dict" in vars(args)}
        targets = {_text_args_call(node) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))} - {None}
        if len(targets) == 1:
            owner, name = targets.pop()
            inner = getattr(load(owner) if owner else module, name, None)
            if dataclasses.is_dataclass(inner):
                entry["text_args"] = {"class": inner.__name__, "required": required(inner)}
        out[path.stem] = entry
    return out


def _text_args_call(node: ast.AST) -> tuple[str | None, str] | None:
    """(sibling module or None, class name) of a `X.from_dict(args.text_config)` call."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_dict"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "text_config"):
        return None
    owner = node.func.value
    if isinstance(owner, ast.Name):
        return None, owner.id
    if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name):
        return owner.value.id, owner.attr
    return None


def main() -> int:
    found = installed_models()
    if found["mlx-lm"] != PINS["mlx-lm"]:
        print(f"mlx-lm {found['mlx-lm']} is installed; the profile describes {PINS['mlx-lm']}", file=sys.stderr)
        return 1
    MODELS_DATA.write_text(json.dumps(found, indent=1) + "\n")
    print(f"{MODELS_DATA.relative_to(ROOT)}: {len(found['modules'])} modules of mlx-lm {found['mlx-lm']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
