"""Ask mlx-lm what it builds for a config, the way the sglang MLX backend sees it.

sglang's MLX runner never reads window keys from config.json: it loads the mlx-lm model class for
the `model_type` and reads attributes off the object (the container's `layer_types` and scalar
window, each layer's attention child). So kvdoctor builds that same class from a shrunken copy of
the config and reads the same attributes. MLX parameters are lazy: nothing here evaluates weights.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import importlib.util
import re
import sys
import types
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import msgspec

from kvdoctor.extras import missing_modules
from kvdoctor.resources import data_dir

# The backend's attention-module contract (sglang 0.5.23, attention_contract.py): attribute names.
ATTENTION_API_ATTRS = ("q_proj", "k_proj", "v_proj", "o_proj", "rope")
SCALE_ATTRS = ("scale", "sm_scale")
HEAD_ATTRS = ("n_heads", "num_heads", "num_attention_heads")
KV_HEAD_ATTRS = ("n_kv_heads", "num_k_heads", "num_kv_heads", "num_key_value_heads")
SLIDING_FLAG_ATTRS = ("is_sliding", "use_sliding", "is_sliding_window", "use_sliding_window", "is_swa")
WINDOW_ATTRS = ("window_size", "sliding_window")

MODULE_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")
SMALL_VOCAB = 128
SMALL_FFN = 64
SMALL_HIDDEN = 256
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k")
# The pinned mlx-lm's model modules and model_type remaps, written by tools/mlx_lm_models.py: what the
# plan knows of mlx-lm when it is not installed (the base install).
MODELS_DATA = data_dir("mlx_lm_models.json")


def mlx_lm_installed() -> bool:
    """mlx and mlx-lm can be imported (kvdoctor[mlx]): the plan builds mlx-lm's own classes."""
    return not missing_modules("mlx")


@lru_cache(maxsize=1)
def shipped_models() -> dict[str, Any]:
    """The pinned mlx-lm's module names and remaps, as tools/mlx_lm_models.py wrote them."""
    data: dict[str, Any] = json.loads(MODELS_DATA.read_text(encoding="utf-8"))
    return data


def make_cache_module(module: str) -> bool:
    """The module's Model builds its own caches, so mlx-lm ignores --max-kv-size (the pinned wheel's list,
    tools/mlx_lm_models.py): the one answer the mlx-lm plan and budget both read."""
    return module in shipped_models()["make_cache"]


def use_cheap_import() -> None:
    """Make `import mlx_lm.models.<type>` cost ~50 ms instead of ~2.7 s.

    `mlx_lm/__init__.py` imports its generate/convert helpers, which pull in transformers and torch;
    the model modules themselves only need mlx. We register a stand-in `mlx_lm` package with the
    real search path, so submodules import normally. The first access to any other package-level
    name (`from mlx_lm import load`) runs the real `__init__` into the same module object, so code
    that wants the whole package later still gets it. Does nothing when mlx_lm is already imported.
    """
    if "mlx_lm" in sys.modules:
        return
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return
    package = types.ModuleType("mlx_lm")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    package.__package__ = "mlx_lm"
    completed = []

    def complete_on_demand(name: str) -> Any:
        if name.startswith("__") or completed:
            raise AttributeError(f"module 'mlx_lm' has no attribute {name!r}")
        completed.append(True)
        spec.loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = complete_on_demand
    sys.modules["mlx_lm"] = package


def installed_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def _remappings() -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """mlx-lm's model_type remaps (e.g. mistral -> llama), read from its utils.py without running it
    (running it imports transformers); the pinned release's, shipped, when mlx-lm is not installed."""
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations or not mlx_lm_installed():
        shipped = shipped_models()
        return dict(shipped["remapping"]), {(t, a): m for t, a, m in shipped["architecture_remapping"]}
    path = Path(list(spec.submodule_search_locations)[0]) / "utils.py"
    found: dict[str, Any] = {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return {}, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("MODEL_REMAPPING", "MODEL_ARCHITECTURE_REMAPPING"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found.get("MODEL_REMAPPING", {}), found.get("MODEL_ARCHITECTURE_REMAPPING", {})


def module_name_for(config: dict[str, Any]) -> str:
    """The `mlx_lm.models.<name>` that mlx-lm's loader picks for this config."""
    model_type = str(config.get("model_type"))
    remap, by_arch = _remappings()
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    for arch in architectures:
        if isinstance(arch, str) and (model_type, arch) in by_arch:
            return by_arch[(model_type, arch)]
    return remap.get(model_type, model_type)


class ModuleExit(Exception):
    """An mlx-lm model module ended the process while it was imported (olmo.py does without ai2-olmo)."""


def import_model_module(name: str) -> types.ModuleType | None:
    """The mlx-lm model module, or None when mlx-lm has none of that name (mlx-lm then refuses)."""
    if not MODULE_NAME.match(name):
        return None
    use_cheap_import()
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return importlib.import_module(f"mlx_lm.models.{name}")
    except ImportError:
        return None
    except SystemExit as exc:
        raise ModuleExit(printed.getvalue().strip() or f"exit status {exc.code}") from None


def shrunk_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy that builds the same layer structure with tiny embeddings, FFNs and expert counts.

    Layer count, layer types, windows, patterns, head counts and head dims are kept. The hidden size
    shrinks only where `head_dim` is explicit, since several classes derive head_dim from it.
    """

    def shrink(cfg: dict[str, Any]) -> dict[str, Any]:
        out = dict(cfg)
        if isinstance(out.get("vocab_size"), int):
            out["vocab_size"] = min(out["vocab_size"], SMALL_VOCAB)
        for key, value in cfg.items():
            if isinstance(value, int) and not isinstance(value, bool) and key.endswith("intermediate_size"):
                out[key] = min(value, SMALL_FFN)
        top_k = next((cfg[k] for k in TOP_K_KEYS if isinstance(cfg.get(k), int)), 1)
        for key in EXPERT_KEYS:
            if isinstance(cfg.get(key), int) and not isinstance(cfg.get(key), bool):
                out[key] = min(cfg[key], max(top_k, 2))
        if isinstance(cfg.get("head_dim"), int) and isinstance(cfg.get("hidden_size"), int):
            out["hidden_size"] = min(cfg["hidden_size"], SMALL_HIDDEN)
        for key in ("text_config", "language_config"):
            if isinstance(cfg.get(key), dict):
                out[key] = shrink(cfg[key])
        return out

    return shrink(config)


class Skeleton(msgspec.Struct):
    """The mlx-lm model object built for a config, or why mlx-lm could not build it."""

    module_name: str
    model: Any = None
    error_class: str | None = None
    error_message: str | None = None
    missing_module: bool = False
    shrunk: bool = True
    not_installed: bool = False  # mlx-lm is not installed; the pinned release has this module (shipped list)
    unreadable: str | None = None  # why the installed module could not be imported here (its own exit)


def build_skeleton(config: dict[str, Any], expected: Callable[[Any], bool] | None = None,
                   importer: Callable[[str], types.ModuleType | None] = import_model_module) -> Skeleton:
    """Instantiate mlx-lm's `Model` for `config`, as `mlx_lm.load` would, without weights.

    Builds from the shrunken config first; if that fails or `expected(model)` says the shrinking
    changed the attention geometry, builds from the full config (still lazy, still no weights).
    An error from the full config is mlx-lm's own construction error and is returned as such.
    """
    name = module_name_for(config)
    if not mlx_lm_installed() and importer is import_model_module:
        if name not in shipped_models()["modules"]:
            return Skeleton(name, error_class="ValueError", error_message=f"Model type {name} not supported.",
                            missing_module=True)
        missing = shipped_args_error(name, config)
        if missing is not None:
            return Skeleton(name, error_class="TypeError", error_message=missing, not_installed=True)
        return Skeleton(name, not_installed=True)
    try:
        module = importer(name)
    except ModuleExit as exc:
        return Skeleton(name, unreadable=f"importing mlx_lm.models.{name} ended the process here: {exc}")
    if module is None:
        # mlx_lm.utils._get_classes words it this way (ValueError) when the import fails.
        return Skeleton(name, error_class="ValueError", error_message=f"Model type {name} not supported.",
                        missing_module=True)
    try:
        model = module.Model(module.ModelArgs.from_dict(shrunk_config(config)))
        if expected is None or expected(model):
            return Skeleton(name, model=model)
    except Exception:  # noqa: BLE001 - any failure here is retried with the untouched config
        pass
    try:
        model = module.Model(module.ModelArgs.from_dict(dict(config)))
    except Exception as exc:  # noqa: BLE001 - mlx-lm's own construction error, reported verbatim
        return Skeleton(name, error_class=type(exc).__name__, error_message=str(exc))
    return Skeleton(name, model=model, shrunk=False)


def shipped_args_error(module: str, config: dict[str, Any]) -> str | None:
    """The TypeError mlx-lm raises building the module's ModelArgs (or its wrapped language model's, from
    `text_config`) when config.json lacks a field without a default, from the pinned release's list
    (tools/mlx_lm_models.py): its loader passes only the keys a ModelArgs names."""
    entry = shipped_models().get("model_args", {}).get(module)
    if entry is None:
        return None
    checks = [] if entry["own_from_dict"] else [("ModelArgs", entry["required"], config)]
    text = config.get("text_config")
    if "text_args" in entry and isinstance(text, dict):
        checks.append((entry["text_args"]["class"], entry["text_args"]["required"], text))
    for cls, required, given in checks:
        missing = [name for name in required if name not in given]
        if missing:
            return missing_arguments(cls, missing)
    return None


def missing_arguments(cls: str, names: list[str]) -> str:
    """Python's own wording of a dataclass __init__ called without required fields."""
    quoted = [f"'{name}'" for name in names]
    listed = quoted[0] if len(quoted) == 1 else (
        f"{quoted[0]} and {quoted[1]}" if len(quoted) == 2 else ", ".join(quoted[:-1]) + f", and {quoted[-1]}")
    plural = "argument" if len(names) == 1 else "arguments"
    return f"{cls}.__init__() missing {len(names)} required positional {plural}: {listed}"


# ---- mlx-lm's loader: the quantization it reads before the weights ----------------------------------

# mlx_lm/utils.py @ 0.32.2, load_model: a compressed-tensors config is packed only in these formats
# (_compressed_tensors_quantization), and of NVIDIA ModelOpt's algorithms only NVFP4 is read; any other
# raises ValueError once the model is built, before a weight is loaded.
PACKED_COMPRESSED_TENSORS = ("nvfp4-pack-quantized", "mxfp4-pack-quantized", "pack-quantized")
MODELOPT_ALGOS = ("NVFP4",)


def quantization_refusal(config: dict[str, Any]) -> tuple[str, str] | None:
    """(quant_method, mlx-lm's message) where load_model refuses config.json's `quantization_config`;
    None where it reads it or never looks (an mlx `quantization` key comes first)."""
    settings = config.get("quantization_config")
    if config.get("quantization") is not None or not isinstance(settings, dict) or not settings:
        return None
    method = settings.get("quant_method")
    if method == "compressed-tensors" and settings.get("format") not in PACKED_COMPRESSED_TENSORS:
        return method, (f"unsupported compressed-tensors format {settings.get('format')!r}; "
                          "dequantize to bf16 before converting")
    if method == "modelopt":
        nested = settings.get("quantization", settings)  # hf_quant_config.json's layout nests it
        algo = nested.get("quant_algo") if isinstance(nested, dict) else None
        if algo is not None and algo not in MODELOPT_ALGOS:
            return method, f"Unsupported modelopt quant_algo: {algo}"
    return None


# ---- reading the object the way the backend does -------------------------------------------------

def first_present(obj: Any, names: tuple[str, ...]) -> tuple[str | None, Any]:
    """(name, value) of the first attribute present on obj; a present attribute set to None still wins."""
    for name in names:
        if hasattr(obj, name):
            return name, getattr(obj, name)
    return None, None


def satisfies_attention_contract(module: Any) -> bool:
    return (all(hasattr(module, a) for a in ATTENTION_API_ATTRS)
            and any(hasattr(module, a) for a in SCALE_ATTRS)
            and first_present(module, HEAD_ATTRS)[1] is not None
            and first_present(module, KV_HEAD_ATTRS)[1] is not None)


def attention_head_dim(module: Any) -> int | None:
    """head_dim as the backend derives it: the attribute, else from the key projection's rows."""
    _, value = first_present(module, ("head_dim",))
    if value is not None:
        return value
    _, n_kv = first_present(module, KV_HEAD_ATTRS)
    if n_kv is None:
        return None
    if hasattr(module, "hidden_size") and hasattr(module, "num_k_heads"):
        return module.hidden_size // module.num_k_heads
    weight = getattr(getattr(module, "k_proj", None), "weight", None)
    if weight is not None:
        return weight.shape[0] // n_kv
    return None


class RopeView(msgspec.Struct, frozen=True):
    class_name: str
    traditional: bool
    dims: int
    base: float | None
    precomputed_freqs: bool
    mscale: float
    scale: float


def read_rope(module: Any) -> RopeView | None:
    rope = getattr(module, "rope", None)
    if rope is None:
        return None
    base = getattr(rope, "base", None)
    return RopeView(class_name=type(rope).__name__, traditional=bool(getattr(rope, "traditional", False)),
                    dims=int(getattr(rope, "dims", 0) or 0), base=None if base is None else float(base),
                    precomputed_freqs=getattr(rope, "_freqs", None) is not None,
                    mscale=float(getattr(rope, "mscale", 1.0)), scale=float(getattr(rope, "scale", 1.0)))


class LayerView(msgspec.Struct):
    index: int
    layer_class: str
    attention_attr: str | None = None
    attention_class: str | None = None
    contract_children: list[str] = msgspec.field(default_factory=list)
    near_miss: tuple[str, list[str]] | None = None  # (child, contract attributes it lacks) if none qualifies
    sliding_flag: str | None = None  # "self_attn.is_sliding": the first truthy sliding flag, if any
    n_heads: int | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None
    rope: RopeView | None = None


class ModelView(msgspec.Struct):
    """What the backend reads off an mlx-lm model object."""

    model_class: str
    container_class: str
    layer_types: Any  # the container's `layer_types` attribute as exposed (None when absent)
    window: Any  # the first present of window_size / sliding_window on the container
    window_attr: str | None
    layers: list[LayerView]
    has_make_cache: bool
    source: str = "mlx-lm"  # or "table" when read from kvdoctor's fallback table
    cache_entries: int | None = None  # the table's count of the caches make_cache() returns (no model object)

    def window_map(self) -> dict[int, int | None]:
        """The per-layer window map: {} unless the container has a non-empty layer_types and a window."""
        if not self.layer_types or self.window is None:
            return {}
        return {i: (self.window if t == "sliding_attention" else None) for i, t in enumerate(self.layer_types)}


def missing_contract(module: Any) -> list[str]:
    """The parts of the attention contract a module lacks."""
    missing = [a for a in ATTENTION_API_ATTRS if not hasattr(module, a)]
    if not any(hasattr(module, a) for a in SCALE_ATTRS):
        missing.append("scale or sm_scale")
    if first_present(module, HEAD_ATTRS)[1] is None:
        missing.append("a head count (" + ", ".join(HEAD_ATTRS) + ")")
    if first_present(module, KV_HEAD_ATTRS)[1] is None:
        missing.append("a KV-head count (" + ", ".join(KV_HEAD_ATTRS) + ")")
    return missing


def _near_miss(children: dict[str, Any]) -> tuple[str, list[str]] | None:
    """The child closest to meeting the attention contract, and what it lacks."""
    import mlx.nn as nn

    scored = [(len(missing_contract(child)), name, missing_contract(child))
              for name, child in children.items() if isinstance(child, nn.Module)]
    if not scored:
        return None
    _, name, missing = min(scored, key=lambda t: (t[0], t[1]))
    return name, missing


def qualified(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def container_of(model: Any) -> tuple[Any, Any]:
    """(root, container) as the backend resolves them: language_model if any, then its .model if any."""
    root = getattr(model, "language_model", model)
    return root, getattr(root, "model", root)


def layer_list(model: Any) -> list[Any]:
    root, container = container_of(model)
    return list(getattr(container, "layers", None) or getattr(root, "layers", []) or [])


def read_view(model: Any) -> ModelView:
    _, container = container_of(model)
    window_attr, window = first_present(container, WINDOW_ATTRS)
    layers = []
    for i, layer in enumerate(layer_list(model)):
        view = LayerView(index=i, layer_class=qualified(layer))
        children = layer.children().items() if hasattr(layer, "children") else ()
        view.contract_children = [name for name, child in children if satisfies_attention_contract(child)]
        if view.contract_children:
            view.attention_attr = view.contract_children[0]
            attn = getattr(layer, view.attention_attr)
            view.attention_class = qualified(attn)
            view.n_heads = first_present(attn, HEAD_ATTRS)[1]
            view.n_kv_heads = first_present(attn, KV_HEAD_ATTRS)[1]
            view.head_dim = attention_head_dim(attn)
            view.rope = read_rope(attn)
            view.sliding_flag = next((f"{where}{a}" for where, m in (("", layer), (f"{view.attention_attr}.", attn))
                                      for a in SLIDING_FLAG_ATTRS if bool(getattr(m, a, False))), None)
        else:
            view.near_miss = _near_miss(dict(children))
        layers.append(view)
    return ModelView(model_class=qualified(model), container_class=qualified(container),
                     layer_types=getattr(container, "layer_types", None), window=window, window_attr=window_attr,
                     layers=layers, has_make_cache=hasattr(model, "make_cache"))
