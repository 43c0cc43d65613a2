"""`sglang-mlx`: sglang 0.5.23's MLX backend serving models through mlx-lm 0.32.2.

The backend loads the mlx-lm model class for the `model_type` and reads the object, never the
config's window keys: a layer is attention when one of its direct children meets the backend's
attention contract, and slides only when the container exposes `layer_types` with that layer
marked exactly "sliding_attention" plus a scalar window. This profile builds the same mlx-lm class
(weightless, from a shrunken config), reads the same attributes, and predicts the layout, the
shared full-attention pool and its index maps, and what the runner refuses at load and start-up.
sglang itself is not needed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kvdoctor.context import EnginePlan
from kvdoctor.deploy import Deploy
from kvdoctor.loader import layer_tensor
from kvdoctor.model import SLIDING, LayerPlan, ModelSpec, Source

SGLANG_VERSION = "0.5.23"
MLX_LM_VERSION = "0.32.2"

# Exact texts of sglang 0.5.23 (model_runner.py, kv_cache/model_patching.py) at load and start-up.
NO_ATTENTION_CHILD = "No attention attribute in layer type {layer_type}"
NO_ATTENTION_LAYERS = "MLX model has no supported attention layers"
NO_MAKE_CACHE = "MLX models with auxiliary cache state require model.make_cache()."
AUX_WITH_SWA = ("MLX runner does not support models with both auxiliary cache state and sliding-window "
                "attention layers.")
SLIDING_WITHOUT_MAP = ("Attention layer {layer} declares sliding-window attention but the model exposes no "
                       "per-layer window map (container `layer_types` plus a scalar window), so the MLX KV "
                       "cache cannot bound its sliding-window KV.")
NO_KV_HEADS = "Cannot determine n_kv_heads from attention module at layer {layer}"
NO_HEAD_DIM = "Cannot determine head_dim from attention module at layer {layer}"
NON_UNIFORM = ("MLX attention KV caching requires uniform softmax-attention KV shape across layers. "
               "Layer {first} has {first_config}, but layer {layer} has {config}. "
               "Heterogeneous attention KV needs per-layer pools.")
NO_LAYER_MAP_WARNING = ("Model {model} declares a sliding window but no per-layer layer_types map; MLX batched "
                        "decode will not apply the window and long-context output may be incorrect.")

MLX_FLOAT_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32",
                    "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}
PROBE_POOL_SLOTS = 64  # slots the pool probe builds when the deploy file asks for more (or none)


@dataclass
class Refusal:
    """An exception the engine raises before serving, as kvdoctor predicts it."""

    code: str
    error_class: str
    message: str
    stage: str  # "load" (mlx-lm) or "startup" (the runner)
    layer: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def engine_error(self) -> dict[str, Any]:
        return {"class": self.error_class, "message": self.message, "stage": self.stage}


@dataclass
class Layout:
    """The runner's cache layout: which layers are attention, which slide, and the two index maps."""

    num_layers: int
    attention: list[int]
    auxiliary: list[int]
    windows: dict[int, int | None]  # the per-layer window map (empty: nothing slides)

    def window(self, layer: int) -> int | None:
        return self.windows.get(layer)

    @property
    def full(self) -> list[int]:
        return [i for i in self.attention if self.window(i) is None]

    @property
    def sliding(self) -> list[int]:
        return [i for i in self.attention if self.window(i) is not None]

    @property
    def attention_index(self) -> dict[int, int]:
        """Dense over all attention layers: addresses per-request caches in batched decode."""
        return {layer: i for i, layer in enumerate(self.attention)}

    @property
    def full_pool_index(self) -> dict[int, int]:
        """Dense over full-attention layers only: addresses the shared pool's buffers."""
        return {layer: i for i, layer in enumerate(self.full)}


@dataclass(frozen=True)
class KvConfig:
    n_kv_heads: int | None
    head_dim: int | None
    dtype: str  # mlx dtype name
    dtype_source: Source

    def as_engine_text(self) -> str:
        return f"({self.n_kv_heads}, {self.head_dim}, mlx.core.{self.dtype})"

    def key(self) -> tuple:
        return (self.n_kv_heads, self.head_dim, self.dtype)


@dataclass
class FusedRope:
    """Whether the fused RoPE + pool-scatter decode kernel would be on (SGLANG_MLX_USE_CUSTOM_ROPE=1)."""

    requested: bool
    eligible: bool
    reason: str

    @property
    def active(self) -> bool:
        return self.requested and self.eligible


@dataclass
class MlxFacts:
    """Everything the sglang-mlx checks read; `plan.data["sglang_mlx"]`."""

    skeleton: Any = None  # kvdoctor.mlx.mlxlm.Skeleton
    view: Any = None  # kvdoctor.mlx.mlxlm.ModelView
    layout: Layout | None = None
    kv: dict[int, KvConfig] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)
    fused: FusedRope | None = None
    pool_slots: int = PROBE_POOL_SLOTS
    stock_pool: bool = False  # sglang 0.5.23's runner allocates the shared pool for this model
    basis: str = "mlx-lm"  # where the layout came from: "mlx-lm" (the real class) or "table"
    notes: list[str] = field(default_factory=list)

    @property
    def serves(self) -> bool:
        """The engine loads and starts (no refusal predicted)."""
        return not self.refusals and self.layout is not None


# ---- building and reading the mlx-lm object ------------------------------------------------------

def mlx_config(spec: ModelSpec) -> dict[str, Any]:
    """The config dict mlx-lm is handed (the whole config.json), with model_type at the top."""
    cfg = dict(spec.raw_config)
    cfg.setdefault("model_type", spec.model_type)
    return cfg


def geometry_check(spec: ModelSpec) -> Callable[[Any], bool]:
    """True when the shrunken build exposes the spec's head counts and head dims on every attention layer."""
    from kvdoctor.mlx.mlxlm import read_view

    def same(model: Any) -> bool:
        for layer in read_view(model).layers:
            if layer.attention_attr is None or layer.index >= len(spec.layers):
                continue
            want = spec.layers[layer.index]
            for got, expected in ((layer.n_heads, want.n_heads), (layer.n_kv_heads, want.n_kv_heads),
                                  (layer.head_dim, want.head_dim)):
                if expected is not None and got != expected:
                    return False
        return True

    return same


# What mlx-lm 0.32.2 exposes for a few model types. Used only when the installed mlx-lm has no module
# for the type (another version), so the prediction says it comes from this table.
# layer_types: "config" = the config's list (default below when absent), None = not exposed;
# window: the container attribute holding the scalar window; flags: layers whose attention is flagged
# sliding without a layer_types map ("pattern": the sliding_window_pattern); no_attention: the layer
# class, when no child meets the attention contract (fused QKV).
FALLBACK_TABLE: dict[str, dict[str, Any]] = {
    "gpt_oss": {"layer_types": "config", "default": "alternating", "window": "window_size"},
    "olmo3": {"layer_types": "config", "default": "three-to-one", "window": "sliding_window"},
    "llama": {"layer_types": "config", "default": "full", "window": "sliding_window"},
    "gemma3_text": {"layer_types": None, "window": "window_size", "flags": "pattern"},
    "gemma2": {"layer_types": None, "window": None},
    "qwen2": {"layer_types": None, "window": None},
    "phi3": {"layer_types": None, "window": None, "no_attention": "mlx_lm.models.phi3.TransformerBlock"},
}


def table_view(module_name: str, spec: ModelSpec) -> Any:
    """A ModelView from FALLBACK_TABLE and the config, or None when the table lacks the type."""
    from kvdoctor.mlx.mlxlm import LayerView, ModelView

    entry = FALLBACK_TABLE.get(module_name)
    if entry is None:
        return None
    cfg, n = spec.config, spec.num_hidden_layers
    layer_types = None
    if entry["layer_types"] == "config":
        layer_types = cfg.get("layer_types")
        if not isinstance(layer_types, list):
            default = {"alternating": lambda i: i % 2 == 0, "three-to-one": lambda i: (i + 1) % 4 != 0,
                       "full": lambda i: False}[entry["default"]]
            layer_types = ["sliding_attention" if default(i) else "full_attention" for i in range(n)]
    window_attr = entry["window"]
    window = cfg.get("sliding_window") if window_attr else None
    layers = []
    for spec_layer in spec.layers:
        view = LayerView(index=spec_layer.index, layer_class=entry.get("no_attention", f"{module_name} layer"))
        if "no_attention" not in entry:
            view.attention_attr, view.contract_children = "self_attn", ["self_attn"]
            view.n_heads, view.n_kv_heads = spec_layer.n_heads, spec_layer.n_kv_heads
            view.head_dim = spec_layer.head_dim
            if entry.get("flags") == "pattern" and spec_layer.kind == SLIDING:
                view.sliding_flag = "self_attn.is_sliding"
        layers.append(view)
    return ModelView(model_class=f"mlx_lm.models.{module_name}.Model", container_class=f"{module_name} container",
                     layer_types=layer_types, window=window, window_attr=window_attr, layers=layers,
                     has_make_cache=False, source="table")


# ---- the runner's decisions ----------------------------------------------------------------------

def build_layout(view: Any) -> Layout:
    attention = [layer.index for layer in view.layers if layer.attention_attr is not None]
    auxiliary = [layer.index for layer in view.layers if layer.attention_attr is None]
    return Layout(num_layers=len(view.layers), attention=attention, auxiliary=auxiliary, windows=view.window_map())


def kv_config(spec: ModelSpec, layer: Any) -> KvConfig:
    """(n_kv_heads, head_dim, dtype) the runner derives for one attention layer.

    The dtype is the key projection's weight dtype; for an integer (quantized) weight, its scales'
    dtype, else float32. Without a checkpoint, the config's dtype stands in for the weight's.
    """
    weight = layer_tensor(spec, layer.index, f"{layer.attention_attr}.k_proj.weight")
    if weight is not None:
        source = Source("tensor", weight.name, weight.file)
        dtype = MLX_FLOAT_DTYPES.get(weight.dtype)
        if dtype is None:
            scales = layer_tensor(spec, layer.index, f"{layer.attention_attr}.k_proj.scales")
            dtype = MLX_FLOAT_DTYPES.get(scales.dtype, "float32") if scales is not None else "float32"
    else:
        dtype = MLX_FLOAT_DTYPES.get(spec.dtype or "", "float32")
        source = spec.key_source("torch_dtype") if spec.dtype else Source("default", "float32 (no dtype)")
    return KvConfig(layer.n_kv_heads, layer.head_dim, dtype, source)


def startup_refusals(view: Any, layout: Layout, kv: dict[int, KvConfig], model: Any) -> list[Refusal]:
    """The runner's start-up checks, in its order; each kind reported once, at its first layer."""
    out: list[Refusal] = []
    if view.layers and not layout.attention:
        out.append(Refusal("ENG003", "ValueError", NO_ATTENTION_CHILD.format(layer_type=_layer_type_text(view, model)),
                           "startup",
                           evidence={"layer_class": view.layers[0].layer_class}))
        return out
    if not layout.attention:
        out.append(Refusal("ENG007", "RuntimeError", NO_ATTENTION_LAYERS, "startup"))
        return out
    if layout.auxiliary and not view.has_make_cache:
        out.append(Refusal("ENG008", "RuntimeError", NO_MAKE_CACHE, "startup",
                           evidence={"auxiliary_layers": layout.auxiliary}))
    if layout.auxiliary and layout.sliding:
        out.append(Refusal("ENG006", "NotImplementedError", AUX_WITH_SWA, "startup", layer=layout.sliding[0],
                           evidence={"auxiliary_layers": layout.auxiliary, "sliding_layers": layout.sliding}))
    flagged = [i for i in layout.attention if layout.window(i) is None and view.layers[i].sliding_flag]
    if flagged:
        out.append(Refusal("ENG004", "NotImplementedError", SLIDING_WITHOUT_MAP.format(layer=flagged[0]), "startup",
                           layer=flagged[0], evidence={"flagged_layers": flagged}))
    for i in layout.attention:
        if kv[i].n_kv_heads is None:
            out.append(Refusal("ENG013", "RuntimeError", NO_KV_HEADS.format(layer=i), "startup", layer=i))
            break
        if kv[i].head_dim is None:
            out.append(Refusal("ENG013", "RuntimeError", NO_HEAD_DIM.format(layer=i), "startup", layer=i))
            break
    first = layout.attention[0]
    for i in layout.attention[1:]:
        if kv[i].key() != kv[first].key():
            out.append(Refusal("ENG005", "NotImplementedError",
                               NON_UNIFORM.format(first=first, first_config=kv[first].as_engine_text(), layer=i,
                                                  config=kv[i].as_engine_text()), "startup", layer=i,
                               evidence={"first": first, "first_config": list(kv[first].key()),
                                         "config": list(kv[i].key())}))
            break
    return out


def _layer_type_text(view: Any, model: Any) -> str:
    """How Python prints the first layer's type: "<class 'mlx_lm.models.phi3.TransformerBlock'>"."""
    if model is not None:
        from kvdoctor.mlx.mlxlm import layer_list

        return str(type(layer_list(model)[0]))
    return f"<class '{view.layers[0].layer_class}'>"


def fused_rope_verdict(view: Any, layout: Layout, kv: dict[int, KvConfig], requested: bool) -> FusedRope:
    """The kernel builds only for plain RoPE on the first attention layer: not traditional, rotating
    the whole head, from a scalar base, without precomputed (scaled) frequencies or scale factors."""
    if not layout.attention:
        return FusedRope(requested, False, "no attention layers")
    first = view.layers[layout.attention[0]]
    rope, head_dim = first.rope, kv[layout.attention[0]].head_dim
    if view.source == "table":
        return FusedRope(requested, False, "RoPE not read (the installed mlx-lm lacks this model class)")
    if rope is None or rope.traditional:
        return FusedRope(requested, False, "RoPE is missing or traditional")
    if rope.dims == 0 or rope.dims != head_dim:
        return FusedRope(requested, False, f"RoPE rotates {rope.dims} of {head_dim} head dims")
    if rope.base is None or rope.precomputed_freqs:
        return FusedRope(requested, False, f"{rope.class_name} is a scaled RoPE (precomputed frequencies)")
    if rope.mscale != 1.0 or rope.scale != 1.0:
        return FusedRope(requested, False, f"{rope.class_name} scales positions (scale {rope.scale}, "
                                           f"mscale {rope.mscale})")
    if first.n_heads is None:
        return FusedRope(requested, False, "no attention head count")
    return FusedRope(requested, True, f"plain {rope.class_name} over all {head_dim} dims, base {rope.base:g}")


# ---- the plan ------------------------------------------------------------------------------------

def _versions_note(notes: list[str]) -> None:
    from kvdoctor.mlx.mlxlm import installed_version

    for dist, want in (("mlx-lm", MLX_LM_VERSION), ("sglang", SGLANG_VERSION)):
        have = installed_version(dist)
        if have is not None and have != want:
            notes.append(f"{dist} {have} is installed; this profile describes {dist} {want}, "
                         f"and the prediction uses the installed {dist} where it asks a library")


def _cache_label(layout: Layout | None, index: int) -> str | None:
    if layout is None:
        return None
    if index >= layout.num_layers:
        return "none"
    if index in layout.auxiliary:
        return "native"
    return "windowed" if layout.window(index) is not None else "contiguous"


def plan(spec: ModelSpec, deploy: Deploy) -> EnginePlan:
    from kvdoctor.mlx.mlxlm import build_skeleton

    return plan_from(spec, deploy, build_skeleton(mlx_config(spec), expected=geometry_check(spec)))


def plan_from(spec: ModelSpec, deploy: Deploy, skeleton: Any) -> EnginePlan:
    """The plan for an mlx-lm model object already built (or refused) for this spec.

    `plan` builds it from mlx-lm's own class; model code from elsewhere (an out-of-tree subclass)
    comes in here as a Skeleton around its model object.
    """
    from kvdoctor.mlx.mlxlm import installed_version, read_view

    facts = MlxFacts(skeleton=skeleton)
    _versions_note(facts.notes)
    if "model_file" in spec.raw_config:
        facts.notes.append("config.json names a model_file: sglang refuses it unless started with "
                           "--trust-remote-code, and then mlx-lm runs that file's classes, which kvdoctor does not "
                           "run; this prediction is for mlx-lm's built-in class for the model_type")
    if skeleton.model is not None:
        facts.view = read_view(skeleton.model)
    elif skeleton.missing_module and installed_version("mlx-lm") != MLX_LM_VERSION:
        facts.view = table_view(skeleton.module_name, spec)
        if facts.view is not None:
            facts.basis = "table"
            facts.notes.append(f"the installed mlx-lm has no mlx_lm.models.{skeleton.module_name}; the layout is "
                               f"predicted from kvdoctor's table of what mlx-lm {MLX_LM_VERSION} exposes")
    if facts.view is None:
        facts.refusals.append(Refusal("ENG001" if skeleton.missing_module else "ENG002", skeleton.error_class,
                                      skeleton.error_message, "load", evidence={"mlx_lm_module": skeleton.module_name}))
    else:
        view = facts.view
        layout = facts.layout = build_layout(view)
        facts.kv = {i: kv_config(spec, view.layers[i]) for i in layout.attention}
        facts.refusals = startup_refusals(view, layout, facts.kv, skeleton.model)
        settings = deploy.sglang_mlx
        facts.fused = fused_rope_verdict(view, layout, facts.kv, settings.use_custom_rope)
        facts.stock_pool = settings.radix_cache and not layout.sliding and bool(layout.full)
        facts.pool_slots = min(settings.pool_size or PROBE_POOL_SLOTS, PROBE_POOL_SLOTS)

    layers = [LayerPlan(index=l.index, engine_window=facts.layout.window(l.index) if facts.layout else None,
                        cache=_cache_label(facts.layout, l.index)) for l in spec.layers]
    return EnginePlan(engine="sglang-mlx", versions={"sglang": SGLANG_VERSION, "mlx-lm": MLX_LM_VERSION},
                      layers=layers, data={"sglang_mlx": facts, "report": _report(facts)})


def _report(facts: MlxFacts) -> dict[str, Any]:
    """What the JSON `info` and the rich summary show about this engine's view of the model."""
    out: dict[str, Any] = {"engine_notes": list(facts.notes)}
    if facts.refusals:
        first = facts.refusals[0]
        out["engine_notes"].append(f"sglang would refuse this model at {first.stage}: "
                                   f"{first.error_class}: {first.message}")
    if facts.view is None:
        return out
    view, layout = facts.view, facts.layout
    summary: dict[str, Any] = {
        "basis": facts.basis, "mlx_lm_model": view.model_class, "container": view.container_class,
        "container_layer_types": None if view.layer_types is None else len(view.layer_types),
        "container_window": {"attribute": view.window_attr, "value": view.window},
        "layers_built": layout.num_layers, "attention_layers": len(layout.attention),
        "sliding_layers": layout.sliding, "full_layers": layout.full, "auxiliary_layers": layout.auxiliary,
        "attention_pool_index_by_layer": layout.attention_index,
        "full_kv_pool_index_by_layer": layout.full_pool_index,
        "shared_pool": facts.stock_pool,
    }
    if facts.fused is not None:
        summary["fused_rope_pool_scatter"] = {"requested": facts.fused.requested, "eligible": facts.fused.eligible,
                                              "active": facts.fused.active, "why": facts.fused.reason}
    if facts.refusals:
        summary["refused_at"] = facts.refusals[0].stage
    out["sglang_mlx"] = summary
    return out
