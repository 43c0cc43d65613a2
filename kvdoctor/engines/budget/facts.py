"""The engine-neutral facts a budget needs, read once from a ModelSpec.

Every engine calculator works from these: layer kinds with heads, head dims and windows, the
linear-attention state dimensions, the MLA latent width and the dtypes. Nothing here imports an
engine; the facts are the model's (Hugging Face) meaning, and each engine module applies its own
rules on top.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec

from kvdoctor.errors import InputError
from kvdoctor.limits import DTYPE_BYTES
from kvdoctor.model import FULL, GDN, KDA, MLA, NO_ATTENTION, SLIDING, ModelSpec

# The element types a budget prices (widths from kvdoctor.limits.DTYPE_BYTES).
BUDGET_DTYPES = ("float32", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "float8_e4m3fn", "float8_e5m2",
                 "uint8", "int8")
# Keys an engine derives the longest context from, in the order vLLM tries them.
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_sequence_length")
KIND_NAMES = {FULL: "full", SLIDING: "sliding", MLA: "mla", GDN: "gdn", KDA: "kda"}


class Layer(msgspec.Struct, frozen=True):
    index: int
    kind: str  # full | sliding | mla | gdn | kda | mamba | short_conv (the last two for the engines that ask)
    window: int | None = None
    # This layer's own key/value geometry where it differs from the model's first attention layer (Gemma-4's
    # global layers, MiMo-V2's sliding ones); None: the model-wide kv_heads / head_dim.
    kv_heads: int | None = None
    head_dim: int | None = None
    v_head_dim: int | None = None


class GdnDims(msgspec.Struct, frozen=True):
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int


class Mamba2Dims(msgspec.Struct, frozen=True):
    """A Mamba-2 mixer's state (Nemotron-H): heads x head_dim x state_size, n_groups B/C groups."""

    heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int
    # the SSM state's dtype where the model fixes it (vLLM's Nemotron-H: the config's mamba_ssm_cache_dtype,
    # else float32); None where the engine decides (SGLang's mamba_ssm_dtype)
    ssm_dtype: str | None = None


class Mamba1Dims(msgspec.Struct, frozen=True):
    """A Mamba-1 mixer's state (Jamba): intermediate channels x state_size, a conv_kernel - 1 convolution window."""

    intermediate: int
    state_size: int
    conv_kernel: int


class ShortConvDims(msgspec.Struct, frozen=True):
    """LFM2's short-convolution state: the last conv_kernel - 1 inputs of conv_dim channels."""

    conv_dim: int
    conv_kernel: int


class KdaDims(msgspec.Struct, frozen=True):
    heads: int
    head_dim: int
    conv_kernel: int


# Mamba2 keys in their Nemotron-H and Falcon-H1 spellings, in Mamba2Dims' order.
MAMBA2_KEYS = (("mamba_num_heads", "mamba_n_heads"), ("mamba_head_dim", "mamba_d_head"),
               ("n_groups", "mamba_n_groups"), ("ssm_state_size", "mamba_d_state"), ("conv_kernel", "mamba_d_conv"))


class ModelFacts(msgspec.Struct):
    name: str
    model_type: str
    architectures: list[str]
    layers: list[Layer]
    attention_heads: int
    kv_heads: int
    head_dim: int
    config_dtype: str | None  # torch_dtype / dtype in config.json
    weight_dtype: str | None  # the checkpoint's attention weight dtype, when headers were read
    max_position: int | None
    mla_latent: tuple[int, int] | None = None  # (kv_lora_rank, qk_rope_head_dim)
    gdn: GdnDims | None = None
    kda: KdaDims | None = None
    mamba: Mamba2Dims | None = None  # for the engines that price Mamba-2 state (SGLang; vLLM's Nemotron-H plan)
    short_conv: ShortConvDims | None = None  # set by the vLLM profile only (its plan for LFM2)
    mamba1: Mamba1Dims | None = None  # set by the vLLM profile only (its plan for Jamba)
    dsa_index_head_dim: int | None = None  # a DSA (sparse MLA) indexer key per token, for the engines that price it
    dsa_index_skips: tuple[int, ...] = ()  # DSA layers reusing another layer's top-k, with no indexer key (SGLang)
    config_ssm_dtype: str | None = None  # mamba_ssm_dtype in config.json
    # MiniMax-M3's sparse index pool per token (index rows, index head dim), for the engines that price it (SGLang)
    minimax_index: tuple[int, int] | None = None
    # DeepSeek-V4: the config its compressed caches are sized from, for the engines that price them
    # (kvdoctor.engines.vllm.dsv4, kvdoctor.engines.sglang.dsv4); its layers are "compressed" or "sliding"
    dsv4: dict[str, Any] | None = None
    mlx_lm_module: str | None = None  # set by the mlx-lm profile: the mlx_lm.models module its loader picks
    # set by the SGLang profile: config.json as written, whose architecture and vision tower its memory defaults read
    # (kvdoctor.engines.sglang.reserve)
    raw_config: dict[str, Any] | None = None
    weights_bytes: int | None = None
    dtype: str | None = None  # the engine's --dtype where the deployer sets it (fit's settings)
    sources: dict[str, Any] = msgspec.field(default_factory=dict)

    def count(self, kind: str) -> int:
        return sum(1 for layer in self.layers if layer.kind == kind)

    def kinds(self) -> Counter:
        return Counter(layer.kind for layer in self.layers)

    @property
    def state_kind(self) -> str | None:
        if self.gdn or self.kda:
            return "gdn" if self.gdn else "kda"
        return "mamba" if self.mamba or self.mamba1 else "short_conv" if self.short_conv else None

    @property
    def windows(self) -> set[int]:
        return {layer.window for layer in self.layers if layer.kind == "sliding" and layer.window}

    @property
    def serving_dtype(self) -> str:
        """The dtype vLLM and SGLang serve with: the deployer's --dtype where set (float32 included), else,
        under dtype=auto, the config's 16-bit dtype, and bfloat16 when the config says float32 or nothing
        (both engines downcast)."""
        if self.dtype:
            return self.dtype
        if self.config_dtype in ("bfloat16", "float16"):
            return self.config_dtype
        return "bfloat16"

    @property
    def activation_dtype(self) -> str:
        """The dtype mlx-lm's caches take: that of the activations, i.e. of the stored weights."""
        return self.weight_dtype or self.config_dtype or "bfloat16"


def dtype_bytes(name: str) -> int:
    if name not in BUDGET_DTYPES:
        raise InputError(f"unknown dtype {name!r}; expected one of {', '.join(sorted(BUDGET_DTYPES))}")
    return DTYPE_BYTES[name]


def _positive(cfg: dict[str, Any], key: str, where: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{where}: {key} must be a positive integer for a budget, got {value!r}")
    return value


def facts_from_spec(spec: ModelSpec, extra_kinds: dict[str, str] | None = None) -> ModelFacts:
    """The facts of one loaded model; layer kinds a budget cannot price yet are refused clearly.

    `extra_kinds` adds kinds one engine's calculator prices (SGLang: Mamba2 state layers)."""
    spec.require_layers()
    cfg = spec.config
    where = f"{spec.model_dir / 'config.json'}"
    names = {**KIND_NAMES, **(extra_kinds or {})}
    attn = next((l for l in spec.layers if l.kind in (FULL, SLIDING)), None)
    layers = []
    for layer in spec.layers:
        if layer.kind == NO_ATTENTION:
            continue  # a block without a token mixer caches nothing: engines give it no KV spec
        kind = names.get(layer.kind)
        if kind is None:
            raise InputError(f"{where}: layer {layer.index} is {layer.kind!r}, whose KV sizing in the engines "
                             "kvdoctor budget does not know; it prices full, sliding, MLA, gated DeltaNet and "
                             "KDA layers and refuses the rest rather than price them as full attention")
        own = attn is not None and layer.kind in (FULL, SLIDING) and (
            (layer.n_kv_heads, layer.head_dim, layer.v_head_dim or layer.head_dim) != (attn.n_kv_heads, attn.head_dim,
                                                                                      attn.head_dim))
        layers.append(Layer(layer.index, kind, layer.window if kind == "sliding" else None,
                            *((layer.n_kv_heads, layer.head_dim, layer.v_head_dim) if own else (None, None, None))))
    shapes = {(l.n_kv_heads, l.head_dim) for l in spec.layers if l.kind in (FULL, SLIDING)}
    if len(shapes) > 1 and "block_configs" in cfg:  # NAS-style blocks with their own kv-head counts
        raise InputError(f"{where}: attention layers have different (kv heads, head dim): {sorted(shapes)}; "
                         "kvdoctor budget prices one attention shape per model")
    heads = cfg.get("num_attention_heads")
    facts = ModelFacts(
        name=spec.hf_id or spec.model_dir.name, model_type=spec.model_type,
        architectures=list(spec.raw_config.get("architectures") or []), layers=layers,
        attention_heads=heads if isinstance(heads, int) else 0,
        kv_heads=attn.n_kv_heads if attn and attn.n_kv_heads else (cfg.get("num_key_value_heads") or heads or 0),
        head_dim=attn.head_dim if attn and attn.head_dim else (cfg.get("head_dim") or 0),
        config_dtype=spec.dtype, weight_dtype=_weight_dtype(spec),
        max_position=next((cfg[k] for k in POSITION_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 0), None)
        or _class_position(cfg),
        config_ssm_dtype=cfg.get("mamba_ssm_dtype"),
        weights_bytes=spec.checkpoint.total_bytes if spec.checkpoint and spec.checkpoint.total_bytes else None,
    )
    kinds = facts.kinds()
    if kinds["compressed"]:
        facts.dsv4 = dict(cfg)
    if kinds["dsa"]:
        facts.dsa_index_head_dim = _positive(cfg, "index_head_dim", where)
    if kinds["mla"] or kinds["dsa"]:
        facts.mla_latent = (_positive(cfg, "kv_lora_rank", where), _positive(cfg, "qk_rope_head_dim", where))
    if kinds["gdn"]:
        facts.gdn = GdnDims(*(_positive(cfg, key, where) for key in (
            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim")))
    if kinds["mamba"]:
        heads, head_dim, groups, state, kernel = (_positive(cfg, next((k for k in keys if k in cfg), keys[0]), where)
                                                  for keys in MAMBA2_KEYS)
        facts.mamba = Mamba2Dims(heads, head_dim, groups, state, kernel)
    if kinds["kda"]:
        lac = cfg.get("linear_attn_config") or {}
        facts.kda = KdaDims(_positive(lac, "num_heads", where + " linear_attn_config"),
                            _positive(lac, "head_dim", where + " linear_attn_config"),
                            _positive(lac, "short_conv_kernel_size", where + " linear_attn_config"))
    if kinds["full"] + kinds["sliding"] and (facts.kv_heads <= 0 or facts.head_dim <= 0):
        raise InputError(f"{where}: attention layers need num_key_value_heads and head_dim (or hidden_size)")
    return facts


def _class_position(cfg: dict[str, Any]) -> int | None:
    """The context the model's transformers configuration class gives a config that states none (Gemma-3's
    text_config: 131072), which the engines read through that class; None without transformers or the class."""
    from kvdoctor.load import hf_config

    if not hf_config.installed() or not isinstance(cfg.get("model_type"), str):
        return None
    try:
        view = hf_config.read(cfg["model_type"], cfg, attrs=("max_position_embeddings",))
    except hf_config.Rejected:
        return None
    value = view.resolved.get("max_position_embeddings") if view else None
    return value if isinstance(value, int) and value > 0 else None


SAFETENSORS_FLOATS = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def _weight_dtype(spec: ModelSpec) -> str | None:
    """The first attention layer's key-projection dtype, when the loader read it from a header."""
    for layer in spec.layers:
        src = layer.sources.get("dtype")
        if src is not None and src.kind == "tensor":
            return SAFETENSORS_FLOATS.get(str(layer.dtype))
    return None
