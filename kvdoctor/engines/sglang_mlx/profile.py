"""`sglang-mlx`: sglang's MLX backend serving models through mlx-lm (versions in kvdoctor.engines.pins).

The backend loads the mlx-lm model class for the `model_type` and reads the object, never the
config's window keys: a layer is attention when one of its direct children meets the backend's
attention contract, and slides only when the container exposes `layer_types` with that layer
marked exactly "sliding_attention" plus a scalar window. This profile builds the same mlx-lm class
(weightless, from a shrunken config), reads the same attributes, and predicts the layout, the
shared full-attention pool and its index maps, and what the runner refuses at load and start-up.
sglang itself is not needed. Two probes drive real caches (the mask routing and the full-attention
pool) and `--dry-run` runs the installed engine's own code.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import msgspec
from msgspec.structs import replace
from pydantic import BaseModel, Field

from kvdoctor.load.strict import Bool, NonNegative, Positive, Ratio, Size, Tokens
from kvdoctor.engines.deploy import Section
from kvdoctor.engines.base import Cost, DryRun, DryRunner, EngineProfile, LayerPlan, Plan, Probe, Refusal
from kvdoctor.engines.pins import PINS
from kvdoctor.load.loader import layer_tensor
from kvdoctor.model import NO_ATTENTION, SLIDING, ModelSpec, Source

SGLANG_VERSION = PINS["sglang"]
MLX_LM_VERSION = PINS["mlx-lm"]

# Exact texts of sglang 0.5.23 (model_runner.py, kv_cache/model_patching.py) at load and start-up.
NO_ATTENTION_CHILD = "No attention attribute in layer type {layer_type}"
NO_ATTENTION_LAYERS = "MLX model has no supported attention layers"
NO_MAKE_CACHE = "MLX models with auxiliary cache state require model.make_cache()."
AUX_WITH_SWA = ("MLX runner does not support models with both auxiliary cache state and sliding-window "
                "attention layers.")
SLIDING_WITHOUT_MAP = ("Attention layer {layer} declares sliding-window attention but the model exposes no "
                       "per-layer window map (container `layer_types` plus a scalar window), so the MLX KV "
                       "cache cannot bound its sliding-window KV.")
QUANTIZATION_CODES = {"compressed-tensors": "ENG063", "modelopt": "ENG064"}  # mlx-lm's loader refusals, by method
CACHE_COUNT = "model.make_cache() returned {entries} entries for {layers} layers"
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
PROBE_CHUNK = 8192  # the probes' prefill chunk when the deploy file sets none


class SglangMlxSettings(Section):
    """sglang's MLX backend (server defaults)."""

    chunked_prefill_size: Optional[Tokens] = Field(None, description=(
        "None: sglang's default for the machine's working set (2048 below 20 GiB, 4096 below 60 GiB, else 8192); "
        "the probes then prefill in chunks of PROBE_CHUNK"))
    radix_cache: Bool = True
    use_custom_rope: Bool = Field(False, description="SGLANG_MLX_USE_CUSTOM_ROPE=1")
    pool_size: Optional[Positive] = Field(None, description="pool slots; None: sized by the runner")
    full_kv_pool_index_by_layer: Optional[dict[NonNegative, NonNegative]] = Field(
        None, description="a map to check instead of the one the layout derives")
    context_length: Optional[Tokens] = Field(None, description="--context-length (None: the model's)")
    mem_fraction_static: Optional[Ratio] = Field(None, description="--mem-fraction-static (None: sglang's default)")
    max_running_requests: Optional[Positive] = Field(None, description="--max-running-requests")
    working_set: Optional[Size] = Field(None, description=(
        "Metal's recommended working set on the machine, mx.device_info()['max_recommended_working_set_size'] "
        "(follows sysctl iogpu.wired_limit_mb); None: the GPU preset's figure (kvdoctor fit)"))


class Layout(msgspec.Struct, frozen=True):
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


class KvConfig(msgspec.Struct, frozen=True):
    n_kv_heads: int | None
    head_dim: int | None
    dtype: str  # mlx dtype name
    dtype_source: Source

    def shape(self) -> tuple[int, int]:
        """(n_kv_heads, head_dim) of a layer the engine serves (both known: ENG013 otherwise)."""
        assert self.n_kv_heads is not None and self.head_dim is not None
        return self.n_kv_heads, self.head_dim

    def as_engine_text(self) -> str:
        return f"({self.n_kv_heads}, {self.head_dim}, mlx.core.{self.dtype})"

    def key(self) -> tuple:
        return (self.n_kv_heads, self.head_dim, self.dtype)


class FusedRope(msgspec.Struct, frozen=True):
    """Whether the fused RoPE + pool-scatter decode kernel would be on (SGLANG_MLX_USE_CUSTOM_ROPE=1)."""

    requested: bool
    eligible: bool
    reason: str

    @property
    def active(self) -> bool:
        return self.requested and self.eligible


class MlxFacts(msgspec.Struct, frozen=True):
    """What the sglang-mlx rules and probes read: the plan's `facts`."""

    skeleton: Any = None  # kvdoctor.engines.sglang_mlx.mlxlm.Skeleton
    view: Any = None  # kvdoctor.engines.sglang_mlx.mlxlm.ModelView
    layout: Layout | None = None
    kv: Mapping[int, KvConfig] = msgspec.field(default_factory=dict)
    refused: bool = False  # the plan predicts a refusal at load or start-up
    fused: FusedRope | None = None
    pool_slots: int = PROBE_POOL_SLOTS
    stock_pool: bool = False  # sglang's runner allocates the shared pool for this model
    basis: str = "mlx-lm"  # where the layout came from: "mlx-lm" (the real class), "table", "unread" (none)

    @property
    def serves(self) -> bool:
        """The engine loads and starts (no refusal predicted)."""
        return not self.refused and self.layout is not None

    @property
    def basis_note(self) -> str:
        """What a finding adds when the layout comes from kvdoctor's table, not the installed class."""
        if self.basis != "table":
            return ""
        if self.skeleton is not None and self.skeleton.not_installed:
            return " (predicted from kvdoctor's table of mlx-lm's model classes: mlx-lm is not installed)"
        return (f" (predicted from kvdoctor's table of mlx-lm {MLX_LM_VERSION}: the installed mlx-lm lacks this "
                "model class)")


def section(settings: BaseModel) -> SglangMlxSettings:
    """The sglang-mlx deploy section, typed."""
    if not isinstance(settings, SglangMlxSettings):
        raise TypeError(f"expected the sglang_mlx section, got {type(settings).__name__}")
    return settings


def mlx_facts(plan: Plan[object]) -> MlxFacts:
    """The facts of a sglang-mlx plan."""
    if not isinstance(plan.facts, MlxFacts):
        raise TypeError(f"a {plan.engine} plan has no sglang-mlx facts")
    return plan.facts


# ---- building and reading the mlx-lm object ------------------------------------------------------

def mlx_config(spec: ModelSpec) -> dict[str, Any]:
    """The config dict mlx-lm is handed (the whole config.json), with model_type at the top."""
    cfg = dict(spec.raw_config)
    cfg.setdefault("model_type", spec.model_type)
    return cfg


def geometry_check(spec: ModelSpec) -> Callable[[Any], bool]:
    """True when the shrunken build exposes the spec's head counts and head dims on every attention layer."""
    from kvdoctor.engines.sglang_mlx.mlxlm import read_view

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


# What mlx-lm 0.32.2 exposes for the model types whose layout the class alone decides, whatever the
# config (tests/test_sglang_mlx_units.py holds each entry to the real class on every real config of its
# type). Used when mlx-lm is not installed (the base install) or the installed one has no module for
# the type (another version), so the prediction says it comes from this table.
# layer_types: "config" = the config's list (default below when absent), None = not exposed;
# window: the container attribute holding the scalar window; flags: layers whose attention is flagged
# sliding without a layer_types map ("pattern": the sliding_window_pattern); no_attention: the layer
# class, when no child meets the attention contract (fused QKV); auxiliary: which layers' attention
# misses the contract (AUXILIARY), so the backend keeps their caches as auxiliary state; make_cache:
# the model defines make_cache(); flags "layer_types": the layers mlx-lm's own layer_types marks sliding
# (the config's list, else its default of `mlx_pattern` = (config key, default period): P-1 sliding, 1 full);
# flag_attr: the attribute that flags a sliding layer (default `self_attn.is_sliding`); cache_entries
# "attention": make_cache() returns one cache per attention layer. A layer the config gives no attention
# (a Nemotron-NAS no-op block) has no attention child in any class.
FALLBACK_TABLE: dict[str, dict[str, Any]] = {
    "gpt_oss": {"layer_types": "config", "default": "alternating", "window": "window_size"},
    "olmo3": {"layer_types": "config", "default": "three-to-one", "window": "sliding_window"},
    "llama": {"layer_types": "config", "default": "full", "window": "sliding_window"},
    "gemma3_text": {"layer_types": None, "window": "window_size", "flags": "pattern"},
    "gemma2": {"layer_types": None, "window": None},
    "qwen2": {"layer_types": None, "window": None},
    "phi3": {"layer_types": None, "window": None, "no_attention": "mlx_lm.models.phi3.TransformerBlock"},
    "gemma3": {"layer_types": None, "window": "window_size", "flags": "pattern"},
    "exaone4": {"layer_types": None, "window": "window_size", "auxiliary": "global_of_pattern", "make_cache": True},
    "llama4": {"layer_types": None, "window": None, "auxiliary": "every_fourth", "make_cache": True},
    "gemma4": {"layer_types": None, "window": "window_size", "flags": "layer_types",
               "mlx_pattern": ("sliding_window_pattern", 5), "auxiliary": "kv_shared_or_k_eq_v", "make_cache": True},
    "muse_glimmer": {"layer_types": None, "window": None, "flags": "layer_types", "mlx_pattern": (None, 4),
                     "auxiliary": "ropeless", "make_cache": True},
    "mimo": {"layer_types": None, "window": None},
    "starcoder2": {"layer_types": None, "window": None},
    "mimo_v2_flash": {"layer_types": None, "window": None, "flags": "pattern", "flag_attr": "is_sliding_window",
                      "make_cache": True},
    "nemotron-nas": {"layer_types": None, "window": None, "make_cache": True, "cache_entries": "attention"},
    # Layers whose attention child misses the backend's contract (MLA, fused or linear attention).
    **{module: {"layer_types": None, "window": None, "no_attention": f"mlx_lm.models.{layer_class}"} for module, layer_class in (
        ("phi", "phi.PhiDecoderLayer"), ("deepseek_v2", "deepseek_v2.DeepseekV2DecoderLayer"),
        ("deepseek_v3", "deepseek_v3.DeepseekV3DecoderLayer"), ("kimi_k25", "deepseek_v3.DeepseekV3DecoderLayer"),
        ("deepseek_v32", "deepseek_v32.DeepseekV32DecoderLayer"),
        ("glm_moe_dsa", "deepseek_v32.DeepseekV32DecoderLayer"),
        ("glm4_moe_lite", "glm4_moe_lite.Glm4MoeLiteDecoderLayer"), ("kimi_k3", "kimi_k3.KimiK3DecoderLayer"),
        ("kimi_linear", "kimi_linear.KimiDecoderLayer"), ("nemotron_h", "nemotron_h.NemotronHBlock"))},
}


def _global_of_pattern(cfg: dict[str, Any], i: int, n: int, sliding: bool) -> bool:
    pattern = cfg.get("sliding_window_pattern")
    return isinstance(pattern, str) and bool(pattern) and pattern[i % len(pattern)] != "L"


def _kv_shared_or_k_eq_v(cfg: dict[str, Any], i: int, n: int, sliding: bool) -> bool:
    shared = cfg.get("num_kv_shared_layers", 20)
    return i >= n - shared or (bool(cfg.get("attention_k_eq_v", False)) and not sliding)


def _ropeless(cfg: dict[str, Any], i: int, n: int, sliding: bool) -> bool:
    thetas = cfg.get("layer_rope_theta")
    return not thetas[i] if isinstance(thetas, list) and i < len(thetas) else not sliding


# Layers whose attention child misses the backend's contract in mlx-lm 0.32.2 (no rope, or no v_proj):
# llama4.py `use_rope = int((layer_idx + 1) % 4 != 0)`; exaone4.py the "G" entries of a string
# sliding_window_pattern; gemma4_text.py layers past num_hidden_layers - num_kv_shared_layers (default 20:
# no k_proj) and, with attention_k_eq_v, full layers (no v_proj); muse_glimmer.py layers whose
# layer_rope_theta is 0 (by default the full ones).
AUXILIARY: dict[str, Callable[[dict[str, Any], int, int, bool], bool]] = {
    "every_fourth": lambda cfg, i, n, sliding: (i + 1) % 4 == 0,
    "global_of_pattern": _global_of_pattern,
    "kv_shared_or_k_eq_v": _kv_shared_or_k_eq_v,
    "ropeless": _ropeless,
}


def _mlx_sliding(entry: dict[str, Any], cfg: dict[str, Any], spec: ModelSpec) -> list[bool]:
    """Per layer, whether the class marks it sliding: mlx-lm's own layer_types where the entry says so
    (the config's list, else its default pattern), else the spec's kinds."""
    n = spec.num_hidden_layers
    if entry.get("flags") != "layer_types":
        return [layer.kind == SLIDING for layer in spec.layers]
    listed = cfg.get("layer_types")
    if isinstance(listed, list) and len(listed) >= n:
        return [kind == "sliding_attention" for kind in listed[:n]]
    key, default = entry["mlx_pattern"]
    period = cfg.get(key, default) if key else default
    return [(i + 1) % period != 0 for i in range(n)]


def table_view(module_name: str, spec: ModelSpec) -> Any:
    """A ModelView from FALLBACK_TABLE and the config, or None when the table lacks the type."""
    from kvdoctor.engines.sglang_mlx.mlxlm import LayerView, ModelView

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
    sliding = _mlx_sliding(entry, cfg, spec)
    layers = []
    for spec_layer in spec.layers:
        view = LayerView(index=spec_layer.index, layer_class=entry.get("no_attention", f"{module_name} layer"))
        slides = sliding[spec_layer.index]
        auxiliary = "auxiliary" in entry and AUXILIARY[entry["auxiliary"]](cfg, spec_layer.index, n, slides)
        if "no_attention" not in entry and not auxiliary and spec_layer.kind != NO_ATTENTION:
            view.attention_attr, view.contract_children = "self_attn", ["self_attn"]
            view.n_heads, view.n_kv_heads = spec_layer.n_heads, spec_layer.n_kv_heads
            view.head_dim = spec_layer.head_dim
            if entry.get("flags") in ("pattern", "layer_types") and slides:
                view.sliding_flag = entry.get("flag_attr", "self_attn.is_sliding")
        layers.append(view)
    return ModelView(model_class=f"mlx_lm.models.{module_name}.Model", container_class=f"{module_name} container",
                     layer_types=layer_types, window=window, window_attr=window_attr, layers=layers,
                     has_make_cache=entry.get("make_cache", False), source="table",
                     cache_entries=sum(layer.attention_attr is not None for layer in layers)
                     if entry.get("cache_entries") == "attention" else None)


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
    """The runner's start-up checks, in its order, then the first request's (its cache list); each kind
    reported once, at its first layer."""
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
    entries = None
    if layout.auxiliary and view.has_make_cache:
        entries = _make_cache_entries(model) if model is not None else view.cache_entries
    if entries is not None and entries != layout.num_layers:
        out.append(Refusal("SGL120", "RuntimeError", CACHE_COUNT.format(entries=entries, layers=layout.num_layers),
                           "prefill", evidence={"make_cache_entries": entries, "layers": layout.num_layers,
                                     "auxiliary_layers": layout.auxiliary}))
    return out


def _make_cache_entries(model: Any) -> int | None:
    """How many caches the model's make_cache() returns: the runner builds its first request's cache
    list from it when some layers keep their own state, and wants one entry per layer. None where it
    cannot be told without weights (no model object, or make_cache fails on the weightless one)."""
    if model is None:
        return None
    try:
        return len(model.make_cache())
    except Exception:  # noqa: BLE001 - the runner would meet it later; the plan does not guess
        return None


def _layer_type_text(view: Any, model: Any) -> str:
    """How Python prints the first layer's type: "<class 'mlx_lm.models.phi3.TransformerBlock'>"."""
    if model is not None:
        from kvdoctor.engines.sglang_mlx.mlxlm import layer_list

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
        return FusedRope(requested, False, "RoPE not read (kvdoctor's table stands in for mlx-lm's model class)")
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
    from kvdoctor.engines.sglang_mlx.mlxlm import installed_version

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


def _lacking(skeleton: Any) -> str:
    """Why the installed mlx-lm's class was not read, as a note says it."""
    if skeleton.unreadable:
        return skeleton.unreadable
    if skeleton.not_installed:
        return "mlx-lm is not installed"
    return f"the installed mlx-lm has no mlx_lm.models.{skeleton.module_name}"


def plan_from(spec: ModelSpec, settings: SglangMlxSettings, skeleton: Any) -> Plan[MlxFacts]:
    """The plan for an mlx-lm model object already built (or refused) for this spec.

    `SglangMlxProfile.plan` builds it from mlx-lm's own class; model code from elsewhere (an
    out-of-tree subclass) comes in here as a Skeleton around its model object.
    """
    from kvdoctor.engines.sglang_mlx.mlxlm import installed_version, quantization_refusal, read_view

    notes: list[str] = []
    _versions_note(notes)
    if "model_file" in spec.raw_config:
        notes.append("config.json names a model_file: sglang refuses it unless started with "
                     "--trust-remote-code, and then mlx-lm runs that file's classes, which kvdoctor does not "
                     "run; this prediction is for mlx-lm's built-in class for the model_type")
    view, basis = None, "mlx-lm"
    if skeleton.model is not None:
        view = read_view(skeleton.model)
    elif skeleton.error_class is not None:
        pass
    elif skeleton.not_installed or (skeleton.missing_module and installed_version("mlx-lm") != MLX_LM_VERSION):
        view = table_view(skeleton.module_name, spec)
        if view is not None:
            basis = "table"
            notes.append(f"{_lacking(skeleton)}; the layout is predicted from kvdoctor's table of what mlx-lm's "
                         f"{skeleton.module_name} class exposes")
    quantization = quantization_refusal(spec.raw_config)
    quantization_refusals = [] if quantization is None else [
        Refusal(QUANTIZATION_CODES[quantization[0]], "ValueError", quantization[1], "load", key="quantization_config")]
    if view is None and skeleton.error_class is None and (skeleton.not_installed or skeleton.unreadable):
        # The pinned mlx-lm has this model class, but only the class itself tells the layout.
        notes.append(f"{_lacking(skeleton)}, so its {skeleton.module_name} class was not read: the layout, and what "
                     "sglang's MLX backend refuses at start-up, need kvdoctor's mlx extra (mlx and mlx-lm)")
        facts = MlxFacts(skeleton=skeleton, refused=bool(quantization_refusals), basis="unread")
        refusals = quantization_refusals
    elif view is None:
        facts = MlxFacts(skeleton=skeleton, refused=True, basis=basis)
        refusals = [Refusal("ENG001" if skeleton.missing_module else "ENG002", skeleton.error_class,
                            skeleton.error_message, "load", evidence={"mlx_lm_module": skeleton.module_name})]
    else:
        layout = build_layout(view)
        kv = {i: kv_config(spec, view.layers[i]) for i in layout.attention}
        # mlx-lm's loader refuses a quantization first; the start-up refusals wait behind it
        refusals = quantization_refusals + startup_refusals(view, layout, kv, skeleton.model)
        facts = MlxFacts(skeleton=skeleton, view=view, layout=layout, kv=kv, refused=bool(refusals), basis=basis,
                         fused=fused_rope_verdict(view, layout, kv, settings.use_custom_rope),
                         stock_pool=settings.radix_cache and not layout.sliding and bool(layout.full),
                         pool_slots=min(settings.pool_size or PROBE_POOL_SLOTS, PROBE_POOL_SLOTS))
    refusals = [explained(r, facts, spec) for r in refusals]
    layers = tuple(LayerPlan(index=l.index, engine_window=facts.layout.window(l.index) if facts.layout else None,
                             cache="unknown" if facts.basis == "unread" else _cache_label(facts.layout, l.index))
                   for l in spec.layers)
    return Plan(engine=SglangMlxProfile.name, versions=dict(SglangMlxProfile.pins), layers=layers,
                refusals=tuple(refusals), facts=facts, notes=tuple(notes))


# ---- refusals in kvdoctor's words ----------------------------------------------------------------

def explained(refusal: Refusal, facts: MlxFacts, spec: ModelSpec) -> Refusal:
    message, where = _explain(refusal, facts, spec)
    return replace(refusal, explanation=message + facts.basis_note, where=where)


def _explain(refusal: Refusal, facts: MlxFacts, spec: ModelSpec) -> tuple[str, Source]:
    view = facts.view
    module = facts.skeleton.module_name if facts.skeleton else spec.model_type
    if refusal.code == "ENG001":
        return (f"mlx-lm has no model class for model_type {spec.model_type!r} (no module mlx_lm.models.{module}); "
                "sglang's MLX backend loads every model through mlx-lm, so it cannot load this one"), \
            spec.key_source("model_type")
    if refusal.code == "ENG002":
        key = "layer_types" if "layer_types" in spec.config else "model_type"
        return (f"mlx-lm's {module} model class cannot be built from this config: "
                f"{refusal.error_class}: {refusal.message}"), spec.key_source(key)
    if refusal.code == "ENG003":
        near = view.layers[0].near_miss
        lacks = f"; its closest child, {near[0]}, lacks {', '.join(near[1])}" if near else ""
        return (f"no layer of {view.layers[0].layer_class} has a direct child the backend counts as attention "
                f"(q_proj, k_proj, v_proj, o_proj, rope, a scale and head counts){lacks}: the backend "
                "refuses the model"), spec.key_source("model_type")
    if refusal.code == "ENG004":
        flagged = refusal.evidence["flagged_layers"]
        key = "sliding_window_pattern" if "sliding_window_pattern" in spec.config else "sliding_window"
        lacks = ("no layer_types list" if not view.layer_types else
                 f"layer_types but no window ({view.window_attr or 'sliding_window'} is null)")
        return (f"{len(flagged)} attention layers are flagged sliding by mlx-lm "
                f"({view.layers[flagged[0]].sliding_flag} on layer {flagged[0]}), but {view.container_class} "
                f"exposes {lacks}, so the backend has no window for them and refuses to start"), spec.key_source(key)
    if refusal.code == "ENG005":
        ev = refusal.evidence
        same_shape = ev["first_config"][:2] == ev["config"][:2]
        assert refusal.layer is not None
        return (f"attention layers {ev['first']} and {refusal.layer} need KV of different shapes or dtypes "
                f"({tuple(ev['first_config'])} vs {tuple(ev['config'])}); the backend's shared pool and decode "
                "kernels need one (n_kv_heads, head_dim, dtype) for every attention layer"), \
            facts.kv[refusal.layer].dtype_source if same_shape else spec.key_source("head_dim")
    if refusal.code == "ENG006":
        return (f"layers {short_list(refusal.evidence['auxiliary_layers'])} keep recurrent (auxiliary) state and "
                f"layers {short_list(refusal.evidence['sliding_layers'])} slide; the backend serves one or the "
                "other, not both"), spec.key_source("layer_types")
    if refusal.code == "ENG008":
        return (f"layers {short_list(refusal.evidence['auxiliary_layers'])} keep auxiliary state but the mlx-lm "
                "model has no make_cache() to create it"), spec.key_source("model_type")
    if refusal.code in ("ENG063", "ENG064"):
        return (f"mlx-lm's loader, which sglang's MLX backend loads every model through, cannot read this "
                f"checkpoint's quantization ({refusal.message}): it stops once the model is built, before a "
                "weight is loaded"), spec.key_source("quantization_config")
    if refusal.code == "SGL120":
        ev = refusal.evidence
        key = "block_configs" if "block_configs" in spec.config else "model_type"
        return (f"layers {short_list(ev['auxiliary_layers'])} have no attention the backend recognises, so it "
                f"takes their caches from mlx-lm's make_cache(), which returns {ev['make_cache_entries']} caches "
                f"for the model's {ev['layers']} layers (one per layer with attention); the "
                "backend needs one per layer and stops at the first request"), spec.key_source(key)
    return refusal.message, spec.key_source("model_type")


def short_list(layers: list[int], limit: int = 8) -> str:
    text = ", ".join(map(str, layers[:limit]))
    return text + (f" ... ({len(layers)} layers)" if len(layers) > limit else "")


# ---- probes --------------------------------------------------------------------------------------

def routing_source(spec: ModelSpec) -> Source:
    """The config key a mask-routing problem points at."""
    for key in ("layer_types", "sliding_window", "model_type"):
        if key in spec.config:
            return spec.key_source(key)
    return spec.key_source("model_type")


class MaskRouting(msgspec.Struct, frozen=True):
    """What the mask-routing probe saw (kvdoctor.engines.sglang_mlx.probes.ProbeReport), or why it did not run."""

    layers: tuple[Any, ...] = ()  # kvdoctor.engines.sglang_mlx.probes.ProbeLayer, as built
    report: Any = None  # kvdoctor.engines.sglang_mlx.probes.ProbeReport; None: not run
    skipped: str | None = None  # a note for the report when the probe had nothing to drive


class MaskRoutingProbe(Probe):
    """Builds the caches the backend would build and drives them through the model's own mask routing."""

    name = "mask_routing"

    def _layers(self, plan: Plan[object]) -> list[Any]:
        from kvdoctor.engines.sglang_mlx.probes import ProbeLayer, within_budget

        facts = mlx_facts(plan)
        layout = facts.layout
        assert layout is not None
        return within_budget([ProbeLayer(i, facts.view.layers[i].attention_attr, layout.window(i),
                                         *facts.kv[i].shape(), facts.kv[i].dtype)
                              for i in layout.attention])

    @staticmethod
    def _drivable(facts: MlxFacts) -> bool:
        return facts.serves and facts.skeleton is not None and facts.skeleton.model is not None

    def costs(self, spec: ModelSpec, plan: Plan[object], settings: BaseModel) -> Sequence[Cost]:
        from kvdoctor.engines.sglang_mlx.probes import probe_bytes

        if not self._drivable(mlx_facts(plan)):
            return ()
        layers = self._layers(plan)
        return (Cost(f"sglang-mlx probe caches for {len(layers)} attention layers",
                     probe_bytes(layers, section(settings).chunked_prefill_size or PROBE_CHUNK), routing_source(spec)),)

    def run(self, spec: ModelSpec, plan: Plan[object], settings: BaseModel, fits: int) -> MaskRouting:
        from kvdoctor.engines.sglang_mlx.probes import run_probes

        facts = mlx_facts(plan)
        if not facts.serves:
            return MaskRouting()
        if not self._drivable(facts):
            return MaskRouting(skipped="mask-routing probes skipped: no mlx-lm model object to drive")
        if fits < 1:
            return MaskRouting()
        layout = facts.layout
        assert layout is not None
        layers = self._layers(plan)
        report = run_probes(facts.skeleton.model, layers, layout.num_layers, layout.auxiliary,
                            chunk=section(settings).chunked_prefill_size or PROBE_CHUNK)
        return MaskRouting(layers=tuple(layers), report=report)


def probe_summary(run: MaskRouting) -> dict[str, Any]:
    """Per step, how many keys the last query of sliding and of full layers attended."""
    report = run.report
    kinds = {layer.index: ("sliding" if layer.window is not None else "full") for layer in run.layers}
    steps = {}
    for step, counts in report.attended.items():
        by_kind: dict[str, set[int]] = {}
        for layer, count in counts.items():
            by_kind.setdefault(kinds[layer], set()).add(count)
        steps[step] = {kind: sorted(values) for kind, values in by_kind.items()}
    return {"steps": report.steps, "verified": report.checked, "via_sdpa_kernel": report.kernel_checked,
            "true_kv_shape_layers": [layer.index for layer in run.layers if layer.true_shape],
            "cache_bytes": report.bytes_written, "last_query_keys": steps}


POOL_MAP_SETTING = "sglang_mlx.full_kv_pool_index_by_layer"


class PoolRun(msgspec.Struct, frozen=True):
    """The emulated fused RoPE + pool-scatter kernel's readback under one index map, or why it did not run."""

    map: str | None = None  # "derived" (from the layout), "fallback" (no map: the cache index), "deploy"
    index_map: Mapping[int, int] = msgspec.field(default_factory=dict)
    readback: Any = None  # kvdoctor.engines.sglang_mlx.pool's readback; None: not run
    note: str | None = None


class PoolProbe(Probe):
    """Builds the shared full-attention pool with real shapes and runs the emulated scatter kernel."""

    name = "pool"

    @staticmethod
    def _applies(facts: MlxFacts, settings: SglangMlxSettings) -> bool:
        return facts.serves and bool(facts.layout and facts.layout.full) and settings.radix_cache

    def costs(self, spec: ModelSpec, plan: Plan[object], settings: BaseModel) -> Sequence[Cost]:
        from kvdoctor.engines.sglang_mlx.pool import pool_bytes

        facts = mlx_facts(plan)
        if not self._applies(facts, section(settings)) or facts.fused is None or not facts.fused.active:
            return ()
        layout = facts.layout
        assert layout is not None
        kv = facts.kv[layout.full[0]]
        size = pool_bytes(len(layout.full), facts.pool_slots, *kv.shape(), _itemsize(kv.dtype))
        return (Cost(f"sglang-mlx pool for {len(layout.full)} full-attention layers", size,
                     setting="sglang_mlx.pool_size"),)

    def run(self, spec: ModelSpec, plan: Plan[object], settings: BaseModel, fits: int) -> PoolRun:
        from kvdoctor.engines.sglang_mlx.pool import probe_pool

        facts, settings = mlx_facts(plan), section(settings)
        if not self._applies(facts, settings):
            return PoolRun()
        layout, fused = facts.layout, facts.fused
        assert layout is not None and fused is not None
        supplied = settings.full_kv_pool_index_by_layer
        if not fused.active:
            note = None
            if supplied is not None:
                off = "SGLANG_MLX_USE_CUSTOM_ROPE is not set" if not fused.requested else fused.reason
                note = f"{POOL_MAP_SETTING} is not used: the fused RoPE + pool-scatter kernel is off ({off})"
            return PoolRun(note=note)
        if fits < 1:
            return PoolRun()
        kv = facts.kv[layout.full[0]]
        rope = facts.view.layers[layout.attention[0]].rope
        if supplied is None:
            kind, index_map = "derived", layout.full_pool_index
        elif not supplied:
            kind, index_map = "fallback", {layer: layout.attention_index[layer] for layer in layout.full}
        else:
            kind, index_map = "deploy", dict(supplied)
        readback = probe_pool(layout.full, index_map, *kv.shape(), kv.dtype, rope.dims, rope.base, facts.pool_slots)
        return PoolRun(map=kind, index_map=index_map, readback=readback)


POOL_MAP_LABELS = {"derived": "derived from the layout", "fallback": "none (the cache index as a fallback)",
                   "deploy": "from the deploy file"}


def _itemsize(dtype: str) -> int:
    import mlx.core as mx

    size: int = getattr(mx, dtype).size
    return size


class SglangMlxDryRun(DryRunner):
    def run(self, spec: ModelSpec, settings: BaseModel, plan: Plan[object], options: Mapping[str, Any]) -> DryRun:
        from kvdoctor.engines.sglang_mlx.dryrun import observe
        from kvdoctor.engines.sglang_mlx.dryrun.record import record

        return record(observe(spec, settings, options))


# ---- the profile ---------------------------------------------------------------------------------

class SglangMlxProfile(EngineProfile):
    name = "sglang-mlx"
    probe_extra = ("mlx", "its probes build MLX caches")
    dry_run_extra = "sglang"  # the vLLM and SGLang-CUDA dry runs run in the engine's own Python
    pins = {"sglang": PINS["sglang"], "mlx-lm": PINS["mlx-lm"]}
    Settings = SglangMlxSettings
    refusal_codes = ("ENG001", "ENG002", "ENG003", "ENG004", "ENG005", "ENG006", "ENG007", "ENG008", "ENG013",
                     "ENG063", "ENG064", "SGL120")

    def plan(self, spec: ModelSpec, settings: BaseModel) -> Plan[MlxFacts]:
        from kvdoctor.engines.sglang_mlx.mlxlm import build_skeleton

        return plan_from(spec, section(settings), build_skeleton(mlx_config(spec), expected=geometry_check(spec)))

    def probes(self) -> Sequence[Probe]:
        return (MaskRoutingProbe(), PoolProbe())

    def dry_run(self) -> DryRunner | None:
        return SglangMlxDryRun()

    def budget_facts(self, spec: ModelSpec) -> Any:
        """The config's layers, each kind the budgets do not price named for what it is: the runner reads its
        layout off mlx-lm's object (the plan, which also carries what the engine refuses), and the fit reads these
        facts only for the context length, the dtypes and the gated-DeltaNet / KDA state."""
        from kvdoctor.engines.budget.facts import facts_from_spec
        from kvdoctor.model import ATTN_MAMBA, CHUNKED, COMPRESSED, CONV, LINEAR, MAMBA, SPARSE_MLA

        return facts_from_spec(spec, extra_kinds={CHUNKED: "full", COMPRESSED: "full", SPARSE_MLA: "mla",
                                                  MAMBA: "state", CONV: "state", LINEAR: "state", ATTN_MAMBA: "state"})

    def fit(self, spec: ModelSpec, facts: Any, gpu: Any, layout: Mapping[str, Any], request: Any,
            settings: Mapping[str, Any]) -> Any:
        from kvdoctor.engines.sglang_mlx import fit as fit_mlx

        known = {k: v for k, v in settings.items() if k in SglangMlxSettings.model_fields}
        return fit_mlx.fit(spec, facts, gpu, self.plan(spec, SglangMlxSettings(**known)), request, dict(settings))

    def fit_layouts(self, facts: Any, config: Mapping[str, Any], gpus: int) -> list[dict[str, Any]]:
        """The MLX backend serves a model on one machine's GPU: one layout of one, none of more."""
        return [{"tp": 1}] if gpus == 1 else []

    def report(self, plan: Plan[object], observations: Mapping[str, object]) -> dict[str, Any]:
        """What the JSON `info` and the rich summary show about this engine's view of the model."""
        facts = mlx_facts(plan)
        out: dict[str, Any] = {"engine_notes": list(plan.notes)}
        notes = out["engine_notes"]
        if plan.refusals:
            first = plan.refusals[0]
            notes.append(f"sglang would refuse this model at {first.stage}: {first.error_class}: {first.message}")
        routing, pool = observations.get(MaskRoutingProbe.name), observations.get(PoolProbe.name)
        if isinstance(routing, MaskRouting) and routing.skipped:
            notes.append(routing.skipped)
        if isinstance(routing, MaskRouting) and routing.report is not None and routing.report.aborted:
            notes.append(f"mask-routing probe stopped early: {routing.report.aborted}")
        if isinstance(pool, PoolRun) and pool.note:
            notes.append(pool.note)
        if facts.view is None:
            return out
        view, layout = facts.view, facts.layout
        assert layout is not None
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
        if plan.refusals:
            summary["refused_at"] = plan.refusals[0].stage
        if isinstance(routing, MaskRouting) and routing.report is not None:
            summary["probe"] = probe_summary(routing)
        if isinstance(pool, PoolRun) and pool.readback is not None and pool.map is not None:
            summary["pool_probe"] = {"map": POOL_MAP_LABELS[pool.map], "clean": pool.readback.clean,
                                     "slots": pool.readback.slots}
        out["sglang_mlx"] = summary
        return out
