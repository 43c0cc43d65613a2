"""Per-layer meaning of a config, family by family, in Hugging Face semantics.

Each family lists the defaults its transformers configuration class applies when a key is absent
(tests compare them with the installed transformers classes) and a rule that turns the config
into one layer kind per hidden layer. Every value records where it came from.
"""
from __future__ import annotations

from typing import Any, Callable

import msgspec

from kvdoctor.model import (ATTN_MAMBA, CHUNKED, COMPRESSED, CONV, FULL, GDN, KDA, LINEAR, MAMBA, MLA,
                            NO_ATTENTION,
                            SLIDING, SPARSE_MLA, UNKNOWN, LayerSpec, Source)

# Layer-type strings as written in configs -> our kinds. Family-specific meanings of
# "linear_attention" are resolved by the family (KDA for Kimi, gated DeltaNet for Qwen3-Next, Mamba-2
# for the Mamba hybrids, whose "mamba" entries transformers 5 renames to "linear_attention").
TYPE_STRINGS = {
    "full_attention": FULL,
    "sliding_attention": SLIDING,
    "chunked_attention": CHUNKED,
    "attention": FULL,
    "mamba": MAMBA,
    "mamba2": MAMBA,
    "conv": CONV,
    "hybrid": ATTN_MAMBA,
    "mlp": NO_ATTENTION,
    "moe": NO_ATTENTION,
    "indexed_attention": SPARSE_MLA,
    "deepseek_sparse_attention": SPARSE_MLA,
    "compressed_sparse_attention": COMPRESSED,
    "heavily_compressed_attention": COMPRESSED,
}
LINEAR_TYPE = "linear_attention"
# The `layer_types` strings transformers 5.24's configuration classes accept (ALLOWED_ATTN_LAYER_TYPES
# and the legacy names they rename); tests compare this with the installed transformers.
TRANSFORMERS_LAYER_TYPES = frozenset({
    "full_attention", "sliding_attention", "chunked_attention", "window_attention", "indexed_attention",
    "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse", "conv", "moe", "hybrid",
    "hybrid_sliding", "reference_sliding_attention", "linear_attention",
    "mamba", "attention", "deepseek_sparse_attention", "qwen_sparse_attention"})


class Lookup:
    """Reads text-config keys, falling back to the family default and recording which it was."""

    def __init__(self, cfg: dict[str, Any], defaults: dict[str, Any], source_of: Callable[[str], Source],
                 aliases: dict[str, str] | None = None):
        self.cfg = cfg
        self.defaults = defaults
        self.source_of = source_of
        self.aliases = aliases or {}  # common key -> the key this family's config class spells it with
        self.used_defaults: dict[str, Any] = {}

    def get(self, key: str, fallback: Any = None) -> Any:
        if key in self.cfg:
            return self.cfg[key]
        if self.aliases.get(key) in self.cfg:
            return self.cfg[self.aliases[key]]
        if key in self.defaults:
            self.used_defaults[key] = self.defaults[key]
            return self.defaults[key]
        return fallback

    def source(self, key: str) -> Source:
        if key in self.cfg:
            return self.source_of(key)
        if self.aliases.get(key) in self.cfg:
            return self.source_of(self.aliases[key])
        return Source("default", key)


class ResolvedLookup(Lookup):
    """Reads values as transformers' configuration class resolved them (its defaults, derived
    `layer_types`, adjusted windows), and says so in each value's source."""

    def __init__(self, cfg: dict[str, Any], view: Any, source_of: Callable[[str], Source]):
        super().__init__(cfg, {}, source_of)
        self.view = view

    def get(self, key: str, fallback: Any = None) -> Any:
        resolved = self.view.resolved
        if key not in resolved:
            return super().get(key, fallback)
        if key not in self.cfg and resolved[key] is not None:
            self.used_defaults[key] = resolved[key]
        return resolved[key] if resolved[key] is not None or key in self.cfg else fallback

    def source(self, key: str) -> Source:
        resolved = self.view.resolved
        if key in resolved and (key not in self.cfg or self.cfg[key] != resolved[key]):
            at = self.source_of(key) if key in self.cfg else None
            how = "default" if key not in self.cfg else "adjusted"
            return Source("transformers", f"{self.view.class_name}.{key} ({how}, transformers {self.view.version})",
                          at.file if at else None, at.line if at else None)
        return super().source(key)


class Family(msgspec.Struct):
    name: str
    model_types: tuple[str, ...]
    defaults: dict[str, Any] = msgspec.field(default_factory=dict)
    # Builds (kind, window, source-of-kind) per layer when `layer_types` is absent.
    rule: Callable[[Lookup, int], list[tuple[str, Source]]] | None = None
    linear_kind: str = GDN
    uses_layer_types: bool = True
    mla: bool = False  # full-attention layers are multi-head latent attention (kv_lora_rank + rope key)
    semantics: str = "table"  # "table": kvdoctor's own; "transformers": its configuration class; "guess"
    # the config's own spelling of the common keys (its class's attribute_map), from the config itself
    aliases: Callable[[dict[str, Any]], dict[str, str]] | None = None
    # (window, source) of the sliding layers where the class derives it; `sliding_window` otherwise
    window: Callable[[Lookup], tuple[Any, Source]] | None = None

    def key_aliases(self, cfg: dict[str, Any]) -> dict[str, str]:
        """Common key -> the key this config spells it with ({} for the families that use the common ones)."""
        return self.aliases(cfg) if self.aliases else {}


def _all(kind: str, n: int, src: Source) -> list[tuple[str, Source]]:
    return [(kind, src)] * n


def every_nth_full(pattern_key: str):
    """Sliding unless (i + 1) % pattern == 0: Gemma 3, Cohere 2, Exaone 4, Olmo 3 style."""

    def rule(look: Lookup, n: int) -> list[tuple[str, Source]]:
        pattern = look.get(pattern_key)
        src = look.source(pattern_key)
        if isinstance(pattern, str):  # Exaone 4 "LLLG": L local, G global
            if not pattern:
                return _all(FULL, n, src)
            return [((SLIDING if pattern[i % len(pattern)] == "L" else FULL), src) for i in range(n)]
        if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern <= 0:
            return _all(FULL, n, src)
        return [((SLIDING if (i + 1) % pattern else FULL), src) for i in range(n)]

    return rule


def _olmo3(look: Lookup, n: int) -> list[tuple[str, Source]]:
    src = Source("default", "layer_types (3 sliding : 1 full)")
    return [((SLIDING if (i + 1) % 4 else FULL), src) for i in range(n)]


def _alternating(look: Lookup, n: int) -> list[tuple[str, Source]]:
    src = Source("default", "layer_types (sliding, full alternating)")
    return [((SLIDING if (i + 1) % 2 else FULL), src) for i in range(n)]


def _window_everywhere(look: Lookup, n: int) -> list[tuple[str, Source]]:
    """Mistral and Phi-3: a non-null `sliding_window` applies to every layer in transformers."""
    window = look.get("sliding_window")
    return _all(SLIDING if window is not None else FULL, n, look.source("sliding_window"))


def _qwen(look: Lookup, n: int) -> list[tuple[str, Source]]:
    on = bool(look.get("use_sliding_window")) and look.get("sliding_window") is not None
    first = look.get("max_window_layers")
    src = look.source("use_sliding_window")
    if not on or not isinstance(first, int):
        return _all(FULL, n, src)
    return [((SLIDING if i >= first else FULL), look.source("max_window_layers")) for i in range(n)]


def _qwen3_next(look: Lookup, n: int) -> list[tuple[str, Source]]:
    interval = look.get("full_attention_interval")
    src = look.source("full_attention_interval")
    if not isinstance(interval, int) or interval <= 0:
        return _all(GDN, n, src)
    return [((GDN if (i + 1) % interval else FULL), src) for i in range(n)]


def _jamba(look: Lookup, n: int) -> list[tuple[str, Source]]:
    period, offset = look.get("attn_layer_period"), look.get("attn_layer_offset")
    src = look.source("attn_layer_period")
    if not isinstance(period, int) or period <= 0 or not isinstance(offset, int):
        return _all(MAMBA, n, src)
    return [((FULL if i % period == offset else MAMBA), src) for i in range(n)]


def _nemotron_h(look: Lookup, n: int) -> list[tuple[str, Source]]:
    """`hybrid_override_pattern`: M = Mamba-2, * = attention, - = MLP, E = MoE (no KV state)."""
    pattern = look.get("hybrid_override_pattern")
    src = look.source("hybrid_override_pattern")
    if isinstance(pattern, (str, list)) and pattern:  # transformers maps a list of characters the same way
        table = {"M": MAMBA, "*": FULL, "-": NO_ATTENTION, "E": NO_ATTENTION}
        chars = [c if isinstance(c, str) else "" for c in pattern]
        return [(table.get(chars[i], UNKNOWN) if i < len(chars) else UNKNOWN, src) for i in range(n)]
    blocks = look.get("layers_block_type")
    if isinstance(blocks, list):
        table = {"mamba": MAMBA, "attention": FULL, "full_attention": FULL, "linear_attention": MAMBA,
                 "mlp": NO_ATTENTION, "moe": NO_ATTENTION}
        src = look.source("layers_block_type")
        return [(table.get(str(blocks[i]), UNKNOWN) if i < len(blocks) else UNKNOWN, src) for i in range(n)]
    return _all(UNKNOWN, n, src)


def _falcon_h1(look: Lookup, n: int) -> list[tuple[str, Source]]:
    return _all(ATTN_MAMBA, n, Source("default", "every Falcon-H1 layer has attention and a Mamba-2 mixer"))


def _llama(look: Lookup, n: int) -> list[tuple[str, Source]]:
    return _all(FULL, n, Source("default", "all layers full attention"))


def _llama4(look: Lookup, n: int) -> list[tuple[str, Source]]:
    """Llama 4: chunked local attention on RoPE layers, full on the NoPE ones (`no_rope_layers` 0).

    transformers derives `layer_types` this way: `no_rope_layers[i]` is 1 for a RoPE (chunked)
    layer; absent, every `no_rope_layer_interval`-th layer (default 4) is NoPE."""
    flags, src = look.get("no_rope_layers"), look.source("no_rope_layers")
    if not isinstance(flags, list) or len(flags) != n:
        interval = look.get("no_rope_layer_interval")
        src = look.source("no_rope_layer_interval")
        if not isinstance(interval, int) or isinstance(interval, bool) or interval <= 0:
            return _all(FULL, n, src)
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    if look.get("attention_chunk_size") is None:
        return _all(FULL, n, look.source("attention_chunk_size"))
    return [((CHUNKED if flag else FULL), src) for flag in flags]


def _lfm2(look: Lookup, n: int) -> list[tuple[str, Source]]:
    """LFM2 without `layer_types`: attention at `full_attn_idxs`, short convolutions elsewhere."""
    idxs, src = look.get("full_attn_idxs"), look.source("full_attn_idxs")
    if not isinstance(idxs, list):
        return _all(FULL, n, src)
    return [((FULL if i in idxs else CONV), src) for i in range(n)]


def _mla_everywhere(look: Lookup, n: int) -> list[tuple[str, Source]]:
    return _all(MLA, n, Source("default", "every layer multi-head latent attention"))


def _sparse_mla_everywhere(look: Lookup, n: int) -> list[tuple[str, Source]]:
    return _all(SPARSE_MLA, n, Source("default", "every layer MLA with a DSA indexer"))


# DeepSeek-V4's legacy per-layer `compress_ratios` -> kinds, as DeepseekV4Config maps them (0: sliding
# window only; 4: compressed sparse; 128: heavily compressed).
V4_RATIOS = {0: SLIDING, 4: COMPRESSED, 128: COMPRESSED}


def _deepseek_v4(look: Lookup, n: int) -> list[tuple[str, Source]]:
    """DeepSeek-V4 without `layer_types`: its `compress_ratios`; absent, every layer compressed (the
    class's default alternates heavily compressed and compressed sparse, both compressed kinds)."""
    ratios, src = look.get("compress_ratios"), look.source("compress_ratios")
    if not isinstance(ratios, list):
        return _all(COMPRESSED, n, Source("default", "layer_types (every layer compressed)"))
    return [(V4_RATIOS.get(ratios[i], UNKNOWN) if i < len(ratios) else UNKNOWN, src) for i in range(n)]


def _mimo_v2(look: Lookup, n: int) -> list[tuple[str, Source]]:
    """MiMo-V2-Flash: full attention at layer 0 and every sixth layer, sliding elsewhere. The class
    derives this whatever `hybrid_layer_pattern` says (the real config's pattern agrees)."""
    src = Source("default", "layer_types (full at layer 0 and every sixth layer)")
    return [((FULL if i == 0 or (i + 1) % 6 == 0 else SLIDING), src) for i in range(n)]


def _mimo_v2_window(look: Lookup) -> tuple[Any, Source]:
    """MiMoV2FlashConfig takes `sliding_window_size` + 1 (keys before the query plus its own) over
    `sliding_window` when the config sets it."""
    size = look.get("sliding_window_size")
    if isinstance(size, int) and not isinstance(size, bool):
        at = look.source("sliding_window_size")
        return size + 1, Source("derived", "sliding_window_size + 1", at.file, at.line)
    return look.get("sliding_window"), look.source("sliding_window")


def _chatglm_keys(cfg: dict[str, Any]) -> dict[str, str]:
    """ChatGLM2/3 (vLLM's own ChatGLMConfig, transformers_utils/configs/chatglm.py; transformers has none):
    num_layers, kv_channels and seq_length; KV heads are multi_query_group_num only with multi-query
    attention, the query heads otherwise (model_executor/models/chatglm.py)."""
    return {"num_hidden_layers": "num_layers", "head_dim": "kv_channels", "max_position_embeddings": "seq_length",
            "num_key_value_heads": "multi_query_group_num" if cfg.get("multi_query_attention") else
            "num_attention_heads"}


def _decilm(look: Lookup, n: int) -> list[tuple[str, Source]]:
    """Nemotron NAS (DeciLM): `block_configs[i].attention` is no-op, a linear layer, or attention."""
    blocks, src = look.get("block_configs"), look.source("block_configs")
    kinds = []
    for i in range(n):
        attn = blocks[i].get("attention") if isinstance(blocks, list) and i < len(blocks) and \
            isinstance(blocks[i], dict) else None
        if not isinstance(attn, dict):
            kinds.append((UNKNOWN, src))
        elif attn.get("no_op") or attn.get("replace_with_linear"):
            kinds.append((NO_ATTENTION, src))
        else:
            kinds.append((SLIDING if attn.get("window_length") else FULL, src))
    return kinds


FAMILIES = [
    Family("llama", ("llama",), {"num_hidden_layers": 32, "num_attention_heads": 32}, _llama),
    Family("mistral", ("mistral",), {"sliding_window": 4096}, _window_everywhere),
    Family("phi3", ("phi3",), {"sliding_window": None}, _window_everywhere),
    Family("qwen2", ("qwen2", "qwen3"), {"use_sliding_window": False, "sliding_window": 4096,
                                         "max_window_layers": 28}, _qwen),
    # Gemma's short published configs (gemma-3-4b-it's text_config) leave the head counts to the class
    Family("gemma2", ("gemma2", "vaultgemma"), {"sliding_window": 4096, "head_dim": 256, "num_attention_heads": 8,
                                                "num_key_value_heads": 4}, _alternating),
    Family("gemma3", ("gemma3", "gemma3_text"), {"sliding_window": 4096, "sliding_window_pattern": 6,
                                                 "head_dim": 256, "num_attention_heads": 8, "num_key_value_heads": 4},
           every_nth_full("sliding_window_pattern")),
    Family("gpt_oss", ("gpt_oss",), {"sliding_window": 128, "head_dim": 64}, _alternating),
    Family("olmo3", ("olmo3",), {"sliding_window": 4096}, _olmo3),
    # exaone4_5_text: EXAONE 4.5's first text model type, which Exaone4_5_Config renames to exaone4
    # (transformers configuration_exaone4_5.py, 5.20): the same class reads it
    Family("exaone4", ("exaone4", "exaone4_5_text"), {"sliding_window": 4096, "sliding_window_pattern": 4},
           every_nth_full("sliding_window_pattern")),
    Family("cohere2", ("cohere2",), {"sliding_window": 4096, "sliding_window_pattern": 4},
           every_nth_full("sliding_window_pattern")),
    Family("kimi_linear", ("kimi_linear",), {}, None, linear_kind=KDA, mla=True),
    Family("qwen3_next", ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"),
           {"full_attention_interval": 4, "head_dim": 256}, _qwen3_next),
    Family("nemotron_h", ("nemotron_h",), {}, _nemotron_h, linear_kind=MAMBA),
    Family("jamba", ("jamba",), {"attn_layer_period": 8, "attn_layer_offset": 4}, _jamba, linear_kind=MAMBA),
    Family("falcon_h1", ("falcon_h1",), {}, _falcon_h1, linear_kind=MAMBA, uses_layer_types=False),
    # Kimi K2 ships model_type "kimi_k2" with DeepSeek-V3's code (auto_map); transformers has no class for it.
    Family("deepseek_v3", ("deepseek_v2", "deepseek_v3", "kimi_k2"), {}, _mla_everywhere, mla=True),
    Family("deepseek_v32", ("deepseek_v32", "glm_moe_dsa"), {}, _sparse_mla_everywhere, mla=True),
    Family("deepseek_v4", ("deepseek_v4",), {"sliding_window": 128, "head_dim": 512, "num_attention_heads": 64,
                                             "num_key_value_heads": 1}, _deepseek_v4),
    Family("mimo_v2_flash", ("mimo_v2_flash",), {"sliding_window": 129, "head_dim": 192, "v_head_dim": 128,
                                                 "num_attention_heads": 64, "num_key_value_heads": 4},
           _mimo_v2, window=_mimo_v2_window),
    Family("llama4", ("llama4_text",), {"attention_chunk_size": 8192, "no_rope_layer_interval": 4}, _llama4),
    Family("lfm2", ("lfm2", "lfm2_moe"), {"conv_L_cache": 3}, _lfm2),
    Family("nemotron_nas", ("nemotron-nas",), {}, _decilm, uses_layer_types=False),
    Family("chatglm", ("chatglm",), {}, _llama, uses_layer_types=False, aliases=_chatglm_keys),
]
BY_MODEL_TYPE = {mt: fam for fam in FAMILIES for mt in fam.model_types}
UNKNOWN_FAMILY = Family("unknown", (), {}, _window_everywhere, semantics="guess")
# What "linear_attention" means in families kvdoctor knows only through transformers.
LINEAR_KINDS = {"qwen3_5_text": GDN, "qwen3_5_moe_text": GDN, "olmo_hybrid": GDN, "granitemoehybrid": MAMBA,
                "bamba": MAMBA, "zamba": MAMBA, "zamba2": MAMBA, "falcon_mamba": MAMBA, "mamba2": MAMBA}


def transformers_family(view: Any) -> Family:
    """A family for a model type only transformers knows: kinds from its resolved `layer_types`. Without them a
    latent-attention class (one with `kv_lora_rank`) masks no window, whatever `sliding_window` says: its
    attention reads none (transformers' glm4_moe_lite builds a causal mask "no sliding"), so every layer is MLA."""
    mla = view.resolved.get("kv_lora_rank") is not None
    return Family(view.model_type, (view.model_type,), {}, _mla_everywhere if mla else _window_everywhere,
                  linear_kind=LINEAR_KINDS.get(view.model_type, LINEAR), mla=mla, semantics="transformers")


def family_for(model_type: str) -> Family | None:
    return BY_MODEL_TYPE.get(model_type)


def kind_of_string(value: Any, family: Family) -> str:
    if value == LINEAR_TYPE:
        return family.linear_kind
    return TYPE_STRINGS.get(value, UNKNOWN) if isinstance(value, str) else UNKNOWN


def _kimi_kinds(look: Lookup, n: int) -> list[tuple[str, Source]]:
    """Kimi Linear: `linear_attn_config.kda_layers` / `full_attn_layers`, 1-indexed; full layers are MLA."""
    lac = look.get("linear_attn_config")
    if not isinstance(lac, dict):
        return _all(MLA, n, Source("default", "no linear_attn_config: every layer full (MLA)"))
    kinds: list[tuple[str, Source]] = [(UNKNOWN, look.source("linear_attn_config"))] * n
    for key, kind in (("full_attn_layers", MLA), ("kda_layers", KDA)):
        for one_based in lac.get(key) or []:
            if isinstance(one_based, int) and 1 <= one_based <= n:
                kinds[one_based - 1] = (kind, look.source(f"linear_attn_config.{key}"))
    return kinds


def _latent(kind: str, family: Family, no_latent: bool = False) -> str:
    """In an MLA family the attention layers are latent: full -> MLA, unless the config says it has none
    (`use_mla: false` and no kv_lora_rank, DeepSeek-VL2-Tiny's language_config: vLLM's DeepseekVLV2Config serves it
    as DeepseekForCausalLM, SGLang with MHA); an indexer needs MLA under it. A layer typed sliding is MLA too: latent
    attention masks no window (held-out set 15, GLM-4.7-Flash typed all sliding: vLLM 0.34.0 builds MLAAttentionSpec
    with no window, SGLang 0.5.23 attention_arch MLA and no hybrid SWA)."""
    if no_latent:
        return FULL if kind == MLA else kind
    if family.mla and kind in (FULL, SLIDING):
        return MLA
    if not family.mla and kind == SPARSE_MLA:
        return UNKNOWN
    return kind


def build_layers(family: Family, look: Lookup, n: int) -> list[LayerSpec]:
    """One LayerSpec per hidden layer with kind, window, heads and head dims and their sources."""
    layer_types = look.get("layer_types") if family.semantics == "transformers" else look.cfg.get("layer_types")
    if family.name == "kimi_linear" and not isinstance(layer_types, list):
        kinds = _kimi_kinds(look, n)
    elif family.uses_layer_types and isinstance(layer_types, list):
        src = look.source("layer_types")
        kinds = [(kind_of_string(layer_types[i], family) if i < len(layer_types) else UNKNOWN, src)
                 for i in range(n)]
    else:
        kinds = (family.rule or _window_everywhere)(look, n)
    no_latent = look.cfg.get("use_mla") is False and look.cfg.get("kv_lora_rank") is None
    kinds = [(_latent(kind, family, no_latent), src) for kind, src in kinds]

    n_heads = look.get("num_attention_heads")
    n_kv = look.get("num_key_value_heads") if look.get("num_key_value_heads") is not None else n_heads
    kv_src = look.source("num_key_value_heads") if look.get("num_key_value_heads") is not None else look.source("num_attention_heads")
    hidden = look.get("hidden_size")
    head_dim = look.get("head_dim")
    hd_src = look.source("head_dim")
    if head_dim is None and isinstance(hidden, int) and isinstance(n_heads, int) and n_heads > 0:
        head_dim, hd_src = hidden // n_heads, Source("derived", "hidden_size // num_attention_heads")
    window, window_src = family.window(look) if family.window else (look.get("sliding_window"),
                                                                      look.source("sliding_window"))
    if window is None and family.name == "unknown":
        window = look.get("window_size")
    if window == 0 and family.semantics == "transformers" and look.get("use_sliding_window") is False:
        # the class's own spelling of "no window" (Qwen2MoeConfig: `sliding_window if use_sliding_window else 0`):
        # no window is given, as with `sliding_window: null`
        window = None
    chunk = look.get("attention_chunk_size")
    blocks = look.get("block_configs") if family.name == "nemotron_nas" else None

    layers = []
    for i, (kind, kind_src) in enumerate(kinds):
        layer = LayerSpec(index=i, kind=kind, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
                          v_head_dim=head_dim,
                          sources={"kind": kind_src, "n_heads": look.source("num_attention_heads"),
                                   "n_kv_heads": kv_src, "head_dim": hd_src})
        if kind == SLIDING:
            layer.window = window
            layer.sources["window"] = window_src
        elif kind == CHUNKED:
            layer.window = chunk
            layer.sources["window"] = look.source("attention_chunk_size")
        elif kind == KDA:
            _kda_dims(layer, look)
        elif kind == GDN:
            _gdn_dims(layer, look)
        elif kind in (MLA, SPARSE_MLA):
            _mla_dims(layer, look, sparse=kind == SPARSE_MLA)
        elif kind == CONV:
            _conv_dims(layer, look)
        elif kind == NO_ATTENTION:
            layer.n_heads = layer.n_kv_heads = layer.head_dim = layer.v_head_dim = None
        if isinstance(blocks, list) and i < len(blocks) and kind in (FULL, SLIDING):
            _decilm_block(layer, blocks[i], look)
        if kind in (FULL, SLIDING, CHUNKED):
            _attention_geometry(layer, look)
        layers.append(layer)
    return layers


# A sliding layer's own geometry where the config states one for sliding layers (MiMo-V2 spells it so).
SWA_GEOMETRY = (("n_kv_heads", "swa_num_key_value_heads"), ("head_dim", "swa_head_dim"),
                ("v_head_dim", "swa_v_head_dim"))


def _attention_geometry(layer: LayerSpec, look: Lookup) -> None:
    """Per-layer key/value geometry beyond the global keys: a value width of its own (`v_head_dim`), the
    configuration class's per-layer table (`per_layer_config`), and the `swa_*` keys for sliding layers."""
    v = look.get("v_head_dim")
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:  # 0: unused (a latent size, kv_lora_rank null)
        layer.v_head_dim = v
        layer.sources["v_head_dim"] = look.source("v_head_dim")
    view = getattr(look, "view", None)
    row = view.per_layer.get(layer.index, {}) if view is not None else {}
    for name, attr in (("head_dim", "head_dim"), ("n_kv_heads", "num_key_value_heads")):
        if view is not None and attr in row and row[attr] != getattr(layer, name):
            setattr(layer, name, row[attr])
            layer.sources[name] = Source("transformers", f"{view.class_name}.per_layer_config[{layer.index}].{attr} "
                                         f"(transformers {view.version})")
            if name == "head_dim" and not isinstance(v, int):
                layer.v_head_dim = row[attr]
                layer.sources["v_head_dim"] = layer.sources[name]
    if layer.kind != SLIDING:
        return
    for name, key in SWA_GEOMETRY:
        value = look.cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(layer, name, value)
            layer.sources[name] = look.source(key)


def _decilm_block(layer: LayerSpec, block: Any, look: Lookup) -> None:
    """A Nemotron NAS attention block: kv heads = heads / n_heads_in_group, its own window."""
    attn = block.get("attention") if isinstance(block, dict) else None
    if not isinstance(attn, dict):
        return
    group = attn.get("n_heads_in_group")
    src = look.source("block_configs")
    if isinstance(group, int) and not isinstance(group, bool) and group > 0 and isinstance(layer.n_heads, int):
        layer.n_kv_heads = layer.n_heads // group
        layer.sources["n_kv_heads"] = Source("derived", f"num_attention_heads // block_configs[{layer.index}]"
                                             ".attention.n_heads_in_group", src.file, src.line)
    if attn.get("window_length"):
        layer.window = attn["window_length"]
        layer.sources["window"] = Source("key", f"block_configs[{layer.index}].attention.window_length",
                                         src.file, src.line)


def _kda_dims(layer: LayerSpec, look: Lookup) -> None:
    lac = look.get("linear_attn_config") or {}
    if isinstance(lac, dict):
        layer.n_heads = layer.n_kv_heads = lac.get("num_heads")
        layer.head_dim = layer.v_head_dim = lac.get("head_dim")
        for name, key in (("n_heads", "num_heads"), ("n_kv_heads", "num_heads"), ("head_dim", "head_dim"),
                          ("v_head_dim", "head_dim")):
            layer.sources[name] = look.source(f"linear_attn_config.{key}")


def _gdn_dims(layer: LayerSpec, look: Lookup) -> None:
    layer.n_heads = look.get("linear_num_key_heads")
    layer.n_kv_heads = look.get("linear_num_value_heads")
    layer.head_dim = look.get("linear_key_head_dim")
    layer.v_head_dim = look.get("linear_value_head_dim")
    for name, key in (("n_heads", "linear_num_key_heads"), ("n_kv_heads", "linear_num_value_heads"),
                      ("head_dim", "linear_key_head_dim"), ("v_head_dim", "linear_value_head_dim")):
        layer.sources[name] = look.source(key)


def _mla_dims(layer: LayerSpec, look: Lookup, sparse: bool = False) -> None:
    """MLA caches one latent (kv_lora_rank) and one rope key (qk_rope_head_dim) per token; the
    per-head query/key width is qk_nope_head_dim + qk_rope_head_dim. DSA adds an indexer key."""
    nope, rope = look.get("qk_nope_head_dim"), look.get("qk_rope_head_dim")
    if isinstance(nope, int) and isinstance(rope, int):
        layer.head_dim = nope + rope
        layer.sources["head_dim"] = Source("derived", "qk_nope_head_dim + qk_rope_head_dim")
    if isinstance(look.get("v_head_dim"), int):
        layer.v_head_dim = look.get("v_head_dim")
        layer.sources["v_head_dim"] = look.source("v_head_dim")
    names = [("kv_lora_rank", "kv_lora_rank"), ("qk_rope_head_dim", "qk_rope_head_dim")]
    if sparse:
        names += [("index_head_dim", "index_head_dim"), ("index_topk", "index_topk")]
    for name, key in names:
        value = look.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(layer, name, value)
            layer.sources[name] = look.source(key)


CONV_KERNEL_KEYS = ("conv_L_cache", "conv_kernel", "short_conv_kernel_size")


def _conv_dims(layer: LayerSpec, look: Lookup) -> None:
    """A short-convolution layer keeps kernel - 1 past inputs of width hidden_size; no KV cache."""
    layer.n_heads = layer.n_kv_heads = layer.head_dim = layer.v_head_dim = None
    for key in CONV_KERNEL_KEYS:
        value = look.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            layer.conv_kernel = value
            layer.sources["conv_kernel"] = look.source(key)
            return
