"""Which SGLang 0.5.23 pool each layer lives in, its buffer index there, and the per-rank buffer shapes.

The pool classes and maps are the ones `KVCacheConfigurator._init_pools` builds on CUDA
(mem_cache/kv_cache_configurator.py): `MHATokenToKVPool` / `MLATokenToKVPool` indexed by layer id;
`SWAKVPool` whose `layers_mapping` gives each layer (index in its sub-pool, is_swa); `HybridLinearKVPool`
whose `full_attention_layer_id_mapping` numbers the attention layers of a Mamba / GDN / KDA hybrid, with
the state layers in a `MambaPool` numbered by `mamba_map`.
"""
from __future__ import annotations

from typing import Any, Mapping

import msgspec

from kvdoctor.engines.pins import PINS
from kvdoctor.engines.releases import key
from kvdoctor.engines.sglang import archs
from kvdoctor.engines.sglang.releases import MINIMAX_PAGE_128_SINCE
from kvdoctor.engines.sglang.settings import SglangSettings
from kvdoctor.engines.sglang.swa import SwaDecision
from kvdoctor.load import hf_config
from kvdoctor.model import CHUNKED, CONV, FULL, GDN, KDA, MAMBA, MLA, NO_ATTENTION, SLIDING, SPARSE_MLA, ModelSpec

ATTENTION = (FULL, SLIDING, CHUNKED, MLA, SPARSE_MLA)
STATE = (GDN, KDA, MAMBA, CONV)
KV_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "mxfp8": "float8_e4m3fn",
             "bf16": "bfloat16", "bfloat16": "bfloat16"}
# ModelConfig's `_get_and_verify_dtype` (configs/model_config.py#L2284) reads the text config's dtype by these
# names; with `--dtype auto` a float32 or missing one serves as float16, or bfloat16 for gemma* model types.
CONFIG_DTYPES = {"half": "float16", "float16": "float16", "float": "float32", "float32": "float32",
                 "bfloat16": "bfloat16"}
TP_SIZES = (1, 2, 4, 8)


class Placement(msgspec.Struct, frozen=True):
    layer: int
    pool: str  # full | swa | mla | mamba
    index: int


def model_dtype(spec: ModelSpec) -> str:
    arch = archs.serving_arch(spec.raw_config)
    quant = spec.raw_config.get("quantization_config")
    if arch in archs.BF16_ARCHS or (arch in archs.BF16_WITH_MXFP4_ARCHS and isinstance(quant, dict)
                                    and quant.get("quant_method") == "mxfp4"):
        return "bfloat16"
    configured = CONFIG_DTYPES.get(spec.dtype or "", "float32")
    if configured != "float32":
        return configured
    model_type = spec.config.get("model_type") or spec.model_type or ""
    return "bfloat16" if str(model_type).startswith("gemma") else "float16"


def kv_dtype(spec: ModelSpec, settings: SglangSettings) -> str:
    """--kv-cache-dtype; `auto` is the model dtype, but fp8_e4m3 for DeepSeek-V4 on CUDA
    (arg_groups/overrides.py:891 `_deepseek_v4_kv_cache_dtype`)."""
    chosen = settings.kv_cache_dtype
    if chosen == "auto" and archs.serving_arch(spec.raw_config) == "DeepseekV4ForCausalLM":
        chosen = "fp8_e4m3"
    return model_dtype(spec) if chosen == "auto" else KV_DTYPES.get(chosen, chosen)


def store_dtype(dtype: str) -> str:
    """fp8 KV is stored as uint8 (`KVCache.__init__`, mem_cache/memory_pool.py:2029): index_put has no fp8."""
    return "uint8" if dtype.startswith("float8") else dtype


def as_served(spec: ModelSpec) -> ModelSpec:
    """The spec SGLang serves: for a composite config with its text geometry at the top level (SGL251), the
    class's default text config's layer count, KV heads and head dim (layers past the stated count cannot be
    read, so a larger default keeps the stated ones)."""
    found = archs.default_text_config(spec.raw_config)
    if found is None:
        return spec
    served = found[0]
    count = served.get("num_hidden_layers") or len(spec.layers)
    heads, head_dim = served.get("num_key_value_heads"), served.get("head_dim")
    return msgspec.structs.replace(spec, layers=[
        msgspec.structs.replace(l, n_kv_heads=heads or l.n_kv_heads, head_dim=head_dim or l.head_dim,
                                v_head_dim=head_dim or l.v_head_dim) if l.kind in ATTENTION else l
        for l in spec.layers if l.index < count])


def as_dsa_served(spec: ModelSpec) -> ModelSpec:
    """A DSA model (`archs.DSA_ARCHS` with an `index_topk`) as SGLang serves it: every attention layer sparse MLA
    with no window, whatever its `layer_types` entry says (GLM-5.2 with every layer typed sliding: SGLang keeps
    MLA with its indexer, goldens/measured/sglang_check-set12.json.gz). Other specs are returned as they are."""
    cfg = spec.config
    if archs.serving_arch(spec.raw_config) not in archs.DSA_ARCHS or cfg.get("index_topk") is None:
        return spec
    if all(l.kind == SPARSE_MLA for l in spec.layers if l.kind in ATTENTION):
        return spec
    dims = {name: cfg.get(name) for name in ("kv_lora_rank", "qk_rope_head_dim", "index_head_dim", "index_topk")}
    return msgspec.structs.replace(spec, layers=[
        msgspec.structs.replace(l, kind=SPARSE_MLA, window=None, **{k: v for k, v in dims.items() if isinstance(v, int)})
        if l.kind in ATTENTION and l.kind != SPARSE_MLA else l for l in spec.layers])


def as_sglang_builds(spec: ModelSpec) -> ModelSpec:
    """The spec with each layer's kind replaced by the kind SGLang builds there, and attention layers whose
    geometry the config does not state given ModelConfig's (the configuration class's defaults)."""
    spec = as_served(spec)
    kinds = sglang_kinds(spec)
    unsized = [l for l in spec.layers if l.kind in (FULL, SLIDING, CHUNKED) and not (l.n_kv_heads and l.head_dim)]
    if all(kinds[l.index] == l.kind for l in spec.layers) and not unsized:
        return spec
    heads, key, value = config_geometry(spec)
    return msgspec.structs.replace(spec, layers=[
        _rebuilt(spec, l, kinds[l.index]) if kinds[l.index] != l.kind
        else msgspec.structs.replace(l, n_kv_heads=l.n_kv_heads or heads, head_dim=l.head_dim or key,
                                     v_head_dim=l.v_head_dim or value) if l in unsized
        else l for l in spec.layers])


def _rebuilt(spec: ModelSpec, layer, kind: str):
    """A layer SGLang builds as another kind: the attention geometry comes from the config's own keys."""
    cfg = spec.config
    if kind not in ATTENTION:
        return msgspec.structs.replace(layer, kind=kind)
    heads, head_dim, _ = config_geometry(spec)
    return msgspec.structs.replace(layer, kind=kind, window=None, n_kv_heads=heads, head_dim=head_dim,
                               v_head_dim=head_dim, n_heads=cfg.get("num_attention_heads"))


GEOMETRY_KEYS = ("num_key_value_heads", "num_attention_heads", "head_dim", "hidden_size")


def _class_defaults(spec: ModelSpec) -> dict[str, Any]:
    """The geometry transformers' configuration class gives the text config (its defaults for keys the config
    leaves out, as llava-1.5's text_config does), where the installed transformers has the class."""
    model_type = spec.config.get("model_type") or spec.model_type
    try:
        view = hf_config.read(model_type, spec.config, GEOMETRY_KEYS) if isinstance(model_type, str) else None
    except hf_config.Rejected:
        return {}
    return {k: v for k, v in (view.resolved if view else {}).items() if isinstance(v, int) and v > 0}


def config_geometry(spec: ModelSpec) -> tuple[int, int, int]:
    """(kv heads, key width, value width) from the config's own, non-sliding keys, as ModelConfig reads them;
    where a family spells them otherwise (GPT-J's n_head / n_embd), what kvdoctor read for its first attention
    layer, which is what transformers' attribute map gives ModelConfig too."""
    cfg = {**_class_defaults(spec), **{k: v for k, v in spec.config.items() if v is not None}}
    first = next((l for l in spec.layers if l.kind in ATTENTION and l.n_kv_heads and l.head_dim), None)
    heads = cfg.get("num_key_value_heads") or cfg.get("num_attention_heads") or (first.n_kv_heads if first else None) or 1
    if cfg.get("head_dim"):
        key = cfg["head_dim"]
    elif cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        key = cfg["hidden_size"] // cfg["num_attention_heads"]
    else:
        key = first.head_dim if first and first.head_dim else 0
    value = cfg.get("v_head_dim")
    return heads, key, value if isinstance(value, int) and value else key


def resolved_page_size(spec: ModelSpec, requested: int | None = None, backend: str | None = None,
                       release: str = PINS["sglang"]) -> int:
    """SGLang's page size on an H200: --page-size, else the backend's default; a DSA model always gets its
    own (the DeepSeek-DSA override at arg_groups/model_overrides/deepseek_v2.py:171 sets it whatever was given)."""
    sparse_mla = SPARSE_MLA in spec.kinds()
    if requested and not sparse_mla:
        return requested
    arch = archs.serving_arch(spec.raw_config)
    return default_page_size(sparse_mla, spec.config, minimax_page(arch, backend, release))


def minimax_page(arch: str | None, backend: str | None, release: str) -> bool:
    """MiniMax-M3's Hopper override (arg_groups/model_overrides/minimax_m3.py:178 at 0.5.23): FlashAttention-3,
    unless another backend is given, and then a page of 128 where --page-size is not given."""
    return (arch in archs.MINIMAX_SPARSE_ARCHS and backend in (None, "fa3")
            and key(release) >= key(MINIMAX_PAGE_128_SINCE))


def default_page_size(sparse_mla: bool, config: Mapping[str, Any], minimax: bool = False) -> int:
    """64 per pooled index group for DSA (arg_groups/model_overrides/deepseek_v2.py:171), 128 for MiniMax-M3 on
    Hopper (`minimax_page`), else 1 (FlashAttention-3)."""
    if sparse_mla:
        kpool = config.get("index_kpool")
        return 64 * (kpool if isinstance(kpool, int) and kpool > 0 else 1)
    return MINIMAX_PAGE if minimax else 1


MINIMAX_PAGE = 128


def minimax_index(raw_config: dict[str, Any], layers: int) -> tuple[int, int] | None:
    """MiniMax-M3's index pool per token (mem_cache/memory_pool.py:5847 `MiniMaxSparseKVPool`): (rows, head dim).
    Each sparse layer (`sparse_attention_freq` not 0) of the first `layers` keeps a one-head index key and, unless
    `sparse_disable_index_value` flags it, an index value; read from the text config's `sparse_attention_config`,
    else the top level's (configs/model_config.py:446). None for another architecture or without the keys."""
    if archs.serving_arch(raw_config) not in archs.MINIMAX_SPARSE_ARCHS:
        return None
    text = raw_config.get("text_config")
    cfg = (text.get("sparse_attention_config") if isinstance(text, dict) else None) \
        or raw_config.get("sparse_attention_config")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("sparse_attention_freq"), list) \
            or not isinstance(cfg.get("sparse_index_dim"), int):
        return None
    sparse = [i for i, f in enumerate(cfg["sparse_attention_freq"]) if f != 0 and i < layers]
    flags = cfg.get("sparse_disable_index_value") or []
    key_only = sum(1 for i in sparse if i < len(flags) and flags[i] != 0)
    return 2 * (len(sparse) - key_only) + key_only, cfg["sparse_index_dim"]


def pool_classes(spec: ModelSpec, swa: SwaDecision) -> dict[str, str]:
    if swa.on and archs.serving_arch(spec.raw_config) in archs.DEEPSEEK_V4_ARCHS:
        return {"token_to_kv_pool": "DeepSeekV4TokenToKVPool", "swa_kv_pool": "DeepSeekV4SingleKVPool",
                "req_to_token_pool": "ReqToTokenPool", "allocator": "SWATokenToKVPoolAllocator"}
    kinds = set(sglang_kinds(spec).values())
    mla = bool(kinds & {MLA, SPARSE_MLA})
    if not swa.on and not mla and archs.serving_arch(spec.raw_config) in archs.MINIMAX_SPARSE_ARCHS:
        return {"token_to_kv_pool": "MiniMaxSparseKVPool", "req_to_token_pool": "ReqToTokenPool"}
    attention = "DSATokenToKVPool" if SPARSE_MLA in kinds else "MLATokenToKVPool" if mla else "MHATokenToKVPool"
    if kinds & set(STATE):
        return {"token_to_kv_pool": "HybridLinearKVPool", "full_kv_pool": attention,
                "req_to_token_pool": "HybridReqToTokenPool", "state_pool": "MambaPool"}
    if swa.on:
        return {"token_to_kv_pool": "SWAKVPool", "full_kv_pool": attention, "swa_kv_pool": attention,
                "req_to_token_pool": "ReqToTokenPool", "allocator": "SWATokenToKVPoolAllocator"}
    return {"token_to_kv_pool": attention, "req_to_token_pool": "ReqToTokenPool"}


def sglang_kinds(spec: ModelSpec) -> dict[int, str]:
    """Layer id -> the kind SGLang builds there: the model's own, except for the families whose SGLang
    config class derives the layout itself (`archs.INTERVAL_ARCHS`) or keeps only some layer types
    (`archs.TYPED_CONV_ARCHS`)."""
    kinds = {layer.index: layer.kind for layer in spec.layers}
    arch = archs.serving_arch(spec.raw_config)
    if arch in archs.INTERVAL_ARCHS:
        interval = spec.config.get("full_attention_interval") or 4
        kinds = {i: (FULL if (i + 1) % interval == 0 else GDN) for i in kinds}
    if arch in archs.TYPED_CONV_ARCHS:
        kinds = {i: (k if k in (FULL, CONV) else NO_ATTENTION) for i, k in kinds.items()}
    return kinds


def placements(spec: ModelSpec, swa: SwaDecision) -> dict[int, Placement]:
    if swa.on and archs.serving_arch(spec.raw_config) in archs.DEEPSEEK_V4_ARCHS:
        # DeepSeekV4TokenToKVPool: every layer, compressed or not, has its window's KV in the SWA sub-pool
        return {l.index: Placement(l.index, "swa", l.index) for l in spec.layers}
    spec = as_served(spec)
    by_layer = sglang_kinds(spec)
    kinds = set(by_layer.values())
    hybrid_state = bool(kinds & set(STATE))
    attn_label = "mla" if kinds & {MLA, SPARSE_MLA} else "full"
    out: dict[int, Placement] = {}
    counters = {"full": 0, "swa": 0, "mamba": 0}
    swa_ids = set(swa.swa_layer_ids or ()) if swa.on else set()
    for index, kind in sorted(by_layer.items()):
        layer = spec.layers[index]
        if kind in STATE:
            out[layer.index] = Placement(layer.index, "mamba", counters["mamba"])
            counters["mamba"] += 1
        elif kind in ATTENTION:
            if hybrid_state:
                out[layer.index] = Placement(layer.index, attn_label, counters["full"])
                counters["full"] += 1
            elif swa.on:
                pool = "swa" if layer.index in swa_ids else "full"
                out[layer.index] = Placement(layer.index, pool, counters[pool])
                counters[pool] += 1
            else:
                out[layer.index] = Placement(layer.index, attn_label, layer.index)
    return out


def pool_geometry(spec: ModelSpec, pool: str) -> tuple[int, int, int]:
    """(kv heads, key width, value width) of every layer of an MHA pool. SGLang sizes a pool with one shape
    (ModelConfig: `head_dim` / `num_key_value_heads` / `v_head_dim` for the full pool, their `swa_*` values
    for the SWA pool; utils/hf_transformers/config.py:116 flattens Gemma-4's per-layer table so), which is
    the full-attention layers' shape, and the sliding layers' for the SWA pool."""
    layers = as_sglang_builds(spec).layers
    full = next((l for l in layers if l.kind == FULL), None)
    shape: tuple[int, int, int]
    if full is not None and full.n_kv_heads and full.head_dim:
        shape = (full.n_kv_heads, full.head_dim, full.v_head_dim or full.head_dim)
    else:  # no layer typed full: the config's own (non-sliding) keys
        shape = config_geometry(spec)
    if pool != "swa":
        return shape
    for layer in layers:
        if layer.kind == SLIDING and layer.n_kv_heads and layer.head_dim:
            return layer.n_kv_heads, layer.head_dim, layer.v_head_dim or layer.head_dim
    return shape


def attention_buffers(spec: ModelSpec, settings: SglangSettings, tp: int, pool_layers: set[int] | None = None,
                      pool: str = "full") -> dict[str, Any] | None:
    """Per-token buffer shape of one layer of a pool on one rank (rows are tokens, plus page padding); None
    when the pool has no attention layer."""
    layer = next((l for l in as_sglang_builds(spec).layers if l.kind in ATTENTION
                  and (pool_layers is None or l.index in pool_layers)), None)
    if layer is None:
        return None
    dtype = store_dtype(kv_dtype(spec, settings))
    if layer.kind in (MLA, SPARSE_MLA):
        rank = layer.kv_lora_rank or spec.config.get("kv_lora_rank") or 0
        rope = layer.qk_rope_head_dim or spec.config.get("qk_rope_head_dim") or 0
        width = rank + rope
        if layer.kind == SPARSE_MLA and dtype == "uint8":  # DSA's scaled fp8 row: block scales, bf16 rope
            width = rank + rank // 128 * 4 + rope * 2
        return {"kv_buffer": [1, width], "dtype": dtype}
    heads, head_dim, v_dim = pool_geometry(spec, pool)
    return {"k_buffer": [max(1, heads // tp), head_dim], "v_buffer": [max(1, heads // tp), v_dim], "dtype": dtype}


DSV4_PAGE, DSV4_PAGE_ALIGN, DSV4_SCALE_TILE = 256, 576, 64  # kernels/ops/attention/dsv4/kv_layout.py (layout V4)


def dsv4_swa_page(spec: ModelSpec) -> dict[str, Any]:
    """One layer's SWA buffer row of DeepSeek-V4 on CUDA: one 256-token page (its page size whatever
    --page-size says) of fp8 nope, bf16 rope and one fp8 scale per 64 nope values plus a pad byte per token,
    padded to 576 bytes (`DeepSeekV4SingleKVPool.get_bytes_per_token`, `KVLayout.page_bytes`)."""
    rope = spec.config.get("qk_rope_head_dim") or 0
    nope = (spec.config.get("head_dim") or 0) - rope
    raw = DSV4_PAGE * (nope + 2 * rope + nope // DSV4_SCALE_TILE + 1)
    return {"kv_buffer": [-(-raw // DSV4_PAGE_ALIGN) * DSV4_PAGE_ALIGN], "dtype": "uint8"}


def ssm_dtype(spec: ModelSpec, settings: SglangSettings) -> str:
    """--mamba-ssm-dtype, else the GDN config's mamba_ssm_dtype, else float32 (configs/mamba_utils.py)."""
    if settings.mamba_ssm_dtype:
        return settings.mamba_ssm_dtype
    configured = spec.config.get("mamba_ssm_dtype")
    if GDN in spec.kinds() and configured in ("float32", "bfloat16", "float16"):
        return configured
    return "float32"


def gdn_state(spec: ModelSpec, settings: SglangSettings, tp: int) -> dict[str, Any]:
    """One GDN layer's state on one rank: conv (channels, kernel - 1) in the model dtype, SSM (heads, v, k)."""
    cfg = spec.config
    key_heads, value_heads = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    key_dim, value_dim = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    groups = key_heads + (tp - key_heads if key_heads % tp else 0)  # groups are replicated up to the TP size
    conv = [(value_dim * value_heads + 2 * groups * key_dim) // tp, cfg["linear_conv_kernel_dim"] - 1]
    ssm = [value_heads // tp, value_dim, key_dim]
    return {"conv": {"shape": conv, "dtype": model_dtype(spec)}, "temporal": {"shape": ssm,
                                                                             "dtype": ssm_dtype(spec, settings)}}


MAMBA2_KEYS = {  # Nemotron-H spelling, Falcon-H1 spelling, Mamba2ForCausalLM's (configs/mamba2.py)
    "heads": ("mamba_num_heads", "mamba_n_heads", "num_heads"), "head_dim": ("mamba_head_dim", "mamba_d_head", "head_dim"),
    "state": ("ssm_state_size", "mamba_d_state", "state_size"), "groups": ("n_groups", "mamba_n_groups"),
    "kernel": ("conv_kernel", "mamba_d_conv"),
}


def _first(cfg: dict, keys: tuple[str, ...]) -> int | None:
    return next((cfg[k] for k in keys if isinstance(cfg.get(k), int)), None)


def mamba1_dims(spec: ModelSpec) -> tuple[int, int, int] | None:
    """(intermediate, state, kernel) of the pure Mamba-1 models SGLang serves (`archs.PURE_MAMBA1_ARCHS`)."""
    if archs.serving_arch(spec.raw_config) not in archs.PURE_MAMBA1_ARCHS:
        return None
    dims = tuple(_first(spec.config, (key,)) for key in ("intermediate_size", "state_size", "conv_kernel"))
    return None if None in dims else dims  # type: ignore[return-value]


def mamba1_state(spec: ModelSpec, settings: SglangSettings, tp: int) -> dict[str, Any]:
    """One Mamba-1 layer's state on one rank (configs/mamba_utils.py `create_full_rank`): conv over the
    intermediate channels only (intermediate / tp, kernel - 1), a full-rank SSM state (intermediate / tp, 1, state)."""
    dims = mamba1_dims(spec)
    assert dims is not None  # state_by_tp asks only where the dims are there
    inter, state, kernel = dims
    return {"conv": {"shape": [inter // tp, kernel - 1], "dtype": model_dtype(spec)},
            "temporal": {"shape": [inter // tp, 1, state], "dtype": ssm_dtype(spec, settings)}}


def mamba2_dims(spec: ModelSpec) -> tuple[int, int, int, int, int] | None:
    """(heads, head_dim, state, groups, kernel) in the spellings SGLang's Mamba2 configs use; None for a
    Mamba layer without them (Mamba-1 state), or a pure Mamba-1 model (`mamba1_dims`)."""
    if mamba1_dims(spec) is not None:
        return None
    dims = tuple(_first(spec.config, MAMBA2_KEYS[k]) for k in ("heads", "head_dim", "state", "groups", "kernel"))
    return None if None in dims else dims  # type: ignore[return-value]


def mamba2_state(spec: ModelSpec, settings: SglangSettings, tp: int) -> dict[str, Any]:
    """One Mamba2 layer's state on one rank (configs/mamba_utils.py Mamba2StateShape): conv
    (intermediate + 2 * groups * state, kernel - 1), SSM (heads, head_dim, state)."""
    dims = mamba2_dims(spec)
    assert dims is not None  # state_by_tp asks only where the dims are there
    heads, head_dim, state, groups, kernel = dims
    groups = groups + (tp - groups if groups % tp else 0)
    conv = [(heads * head_dim + 2 * groups * state) // tp, kernel - 1]
    return {"conv": {"shape": conv, "dtype": model_dtype(spec)},
            "temporal": {"shape": [heads // tp, head_dim, state], "dtype": ssm_dtype(spec, settings)}}


def conv_dims(spec: ModelSpec) -> tuple[int, int] | None:
    """(channels, kernel) of LFM2's short-convolution state as SGLang's Lfm2Config sizes it: hidden_size
    channels (not conv_dim) and conv_L_cache; None where the config lacks either."""
    hidden, kernel = spec.config.get("hidden_size"), spec.config.get("conv_L_cache")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (hidden, kernel))
    return (hidden, kernel) if ok else None  # type: ignore[return-value]


def conv_state(spec: ModelSpec, settings: SglangSettings, tp: int) -> dict[str, Any]:
    """One LFM2 conv layer's state on one rank. configs/lfm2.py builds a Mamba2StateShape with hidden_size
    channels, one group, as many heads as TP ranks and no SSM state: conv (hidden / tp, kernel - 1) in the model
    dtype, an empty temporal state (1, hidden, 0) in the SSM dtype."""
    dims = conv_dims(spec)
    assert dims is not None  # state_by_tp asks only where the dims are there
    hidden, kernel = dims
    return {"conv": {"shape": [hidden // tp, kernel - 1], "dtype": model_dtype(spec)},
            "temporal": {"shape": [1, hidden, 0], "dtype": ssm_dtype(spec, settings)}}


def state_by_tp(spec: ModelSpec, settings: SglangSettings) -> dict[str, Any] | None:
    kinds = spec.kinds()
    build = (gdn_state if GDN in kinds else mamba2_state if MAMBA in kinds and mamba2_dims(spec)
             else mamba1_state if MAMBA in kinds and mamba1_dims(spec)
             else conv_state if CONV in kinds and conv_dims(spec) else None)
    if build is None:
        return None
    tps = (settings.tp_size,) if settings.tp_size else TP_SIZES
    return {str(tp): build(spec, settings, tp) for tp in tps}
