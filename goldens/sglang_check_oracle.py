"""SGLang check oracle: an SGLang release's own CUDA-path start-up decisions per config, mutation and setting.

Run with the SGLang oracle venv (see README.md):

    goldens/.venv/sglang/bin/python goldens/sglang_check_oracle.py          # all, rewrites sglang_check.json
    KVDOCTOR_GOLDEN_MODELS=openai__gpt-oss-20b ... sglang_check_oracle.py    # some models, for debugging
    ... sglang_check_oracle.py --configs DIR --out FILE   # the *.json configs of DIR only (a held-out set)
    ... sglang_check_oracle.py --configs 'DIR/sglang_*.json' --out FILE   # the configs a pattern names
    ... sglang_check_oracle.py --configs DIR --out FILE --more-settings   # plus the settings of MORE_SETTINGS
    python sglang_check_oracle.py --merge FILE...   # a held-out set's points into sglang_check.json
    python sglang_check_oracle.py --merge-into GOLDEN FILE...   # a rerun's points into another goldens file

Every decision comes from SGLang's code: `ServerArgs(...).resolve_once()` (backend, page size, Mamba
cache strategy, validation), `ModelConfig.from_server_args` (attention arch, hybrid-SWA allow-list,
SWA / full layer ids, Mamba / GDN / KDA state params), `resolve_sliding_window_size` on a bare instance
of the registered model class, `resolve_layer_indices`, `configure_kv_cache_dtype`, a real
`KVCacheConfigurator` (`_handle_max_mamba_cache`, `config_from_budget`, `resolve_max_num_reqs`; at 0.5.15, which
has none, the same steps on `ModelRunner` through the adapter's `RunnerSizing`) at a
40 GiB budget, and `_init_pools` at tiny sizes on the CPU device for the pool classes, buffer shapes and
layer-id -> buffer maps. The platform is CUDA: `kvdoctor/engines/sglang/shims/cudafake.py` makes
torch report H200s and `fakemods.py` beside it makes CUDA-only extension packages importable; no kernel
runs. What the script
states itself: the 40 GiB budget (SGLang profiles it on the GPU), `attn_tp_size` (no process groups).

Each model runs in a fork of one child process that imported SGLang once (SGLang keeps process-wide state);
its points run in sequence in the fork. `KVDOCTOR_CHECK_GRID=release` runs the per-release grid (each unmutated
config at the default settings, TP 8 and fp8 KV; goldens/releases.py --check sglang==X) in the release's venv,
whose API `kvdoctor/engines/sglang/shims/sglang_api.py` adapts to (the dry run's child adapts through it too).
"""
from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIMS = HERE.parent / "kvdoctor" / "engines" / "sglang" / "shims"
sys.path[:0] = [str(HERE), str(SHIMS)]

import sglang_api as api  # noqa: E402 - shims/: the one adapter to each release's API, the dry run's child uses it too
from common import CONFIGS, only_models  # noqa: E402

REAL = HERE.parent / "fixtures" / "configs" / "real"
BUDGET_GIB = 40.0
TINY_TOKENS, TINY_REQS = 256, 4
SETTINGS_KEYS = ("tp_size", "context_length", "page_size", "kv_cache_dtype", "disable_hybrid_swa_memory",
                 "swa_full_tokens_ratio", "mamba_ssm_dtype")


# ---------------------------------------------------------------- cases (pure, no SGLang)

def text_of(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg


def is_hybrid_state(cfg: dict) -> bool:
    text = text_of(cfg)
    types = text.get("layer_types") or []
    return bool(any(t in ("linear_attention", "mamba", "conv") for t in types) or text.get("hybrid_override_pattern")
                or text.get("linear_attn_config") or text.get("mamba_d_ssm") or text.get("mamba_n_heads"))


def mutations(cfg: dict) -> dict[str, dict | None]:
    """name -> mutated config (None: the mutation does not apply to this config)."""
    out: dict[str, dict | None] = {"none": cfg}
    text = text_of(cfg)
    n = text.get("num_hidden_layers")
    types = text.get("layer_types")

    def edit(fn):
        new = copy.deepcopy(cfg)
        fn(text_of(new))
        return new

    if types:
        out["layer_types_shifted"] = edit(lambda t: t.__setitem__("layer_types", t["layer_types"][1:] + t["layer_types"][:1]))
        out["layer_types_truncated"] = edit(lambda t: t.__setitem__("layer_types", t["layer_types"][:-1]))
        out["layer_types_missing"] = edit(lambda t: t.pop("layer_types"))
        out["mtp_appended"] = edit(lambda t: t.__setitem__("layer_types", t["layer_types"] + [t["layer_types"][-1]]))
        kinds = set(types)
        attn = [k for k in kinds if "attention" in k and k != "linear_attention"]
        out["all_sliding"] = edit(lambda t: t.__setitem__(
            "layer_types", ["sliding_attention" if x in attn else x for x in t["layer_types"]]))
    else:
        out["layer_types_shifted"] = out["layer_types_truncated"] = out["layer_types_missing"] = None
        out["mtp_appended"] = None
        out["all_sliding"] = (edit(lambda t: t.__setitem__("layer_types", ["sliding_attention"] * n))
                              if n and text.get("sliding_window") else None)
    out["sliding_window_null"] = edit(lambda t: t.__setitem__("sliding_window", None)) if "sliding_window" in text else None

    def window_no_types(t):
        t.pop("layer_types", None)
        t["sliding_window"] = t.get("sliding_window") or 4096
    out["window_no_layer_types"] = edit(window_no_types)
    return out


CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")


def model_context(cfg: dict) -> int:
    """The context length the config states, in the key order SGLang reads (utils/hf_transformers/common.py)."""
    text = text_of(cfg)
    return int(next((text[k] for k in CONTEXT_KEYS if text.get(k)), 32768))


# Settings the default grid lacks, for held-out sets (--more-settings): other TP sizes, a page size FA3 takes,
# the other fp8 KV format, a request cap, a smaller chunked prefill, and a context shorter than the model's.
MORE_SETTINGS = {"tp2": {"tp_size": 2}, "tp4": {"tp_size": 4}, "page_size_16": {"page_size": 16},
                 "fp8_e5m2_kv": {"kv_cache_dtype": "fp8_e5m2"}, "max_running_requests_64": {"max_running_requests": 64},
                 "chunked_prefill_4096": {"chunked_prefill_size": 4096}}
MORE = False  # set by --more-settings


def settings_grid(cfg: dict) -> dict[str, dict]:
    text = text_of(cfg)
    limit = model_context(cfg)
    grid = {"default": {}, "disable_hybrid_swa_memory": {"disable_hybrid_swa_memory": True},
            "swa_full_tokens_ratio_0.25": {"swa_full_tokens_ratio": 0.25},
            "context_length_2x": {"context_length": 2 * limit}, "tp8": {"tp_size": 8},
            "fp8_kv": {"kv_cache_dtype": "fp8_e4m3"}, "page_size_64": {"page_size": 64}}
    if is_hybrid_state(cfg):
        current = text.get("mamba_ssm_dtype") or "float32"
        grid["mamba_ssm_dtype"] = {"mamba_ssm_dtype": "bfloat16" if current == "float32" else "float32"}
    if MORE:
        grid.update(MORE_SETTINGS)
        grid["context_length_half"] = {"context_length": limit // 2}
    return grid


# The per-release grid (KVDOCTOR_CHECK_GRID=release, goldens/releases.py --check sglang==X): each unmutated
# config at the default settings, at TP 8 and with fp8 KV.
GRID = os.environ.get("KVDOCTOR_CHECK_GRID", "full")
RELEASE_SETTINGS = {"default": {}, "tp8": {"tp_size": 8}, "fp8_kv": {"kv_cache_dtype": "fp8_e4m3"}}


def cases(cfg: dict) -> list[dict]:
    """Every mutation with default settings, and every setting on the unchanged config (GRID "release": the
    unchanged config under RELEASE_SETTINGS)."""
    if GRID == "release":
        return [{"mutation": "none", "setting": name, "settings": settings, "config": cfg}
                for name, settings in RELEASE_SETTINGS.items()]
    out = []
    for name, mutated in mutations(cfg).items():
        if mutated is not None:
            out.append({"mutation": name, "setting": "default", "settings": {}, "config": mutated})
        else:
            out.append({"mutation": name, "setting": "default", "settings": {}, "config": None})
    for name, settings in settings_grid(cfg).items():
        if name != "default":
            out.append({"mutation": "none", "setting": name, "settings": settings, "config": cfg})
    return out


def corpus(configs: Path | None = None) -> dict[str, Path]:
    if configs is not None:  # a folder's *.json, or a pattern (goldens/heldout-rel/sglang_*.json)
        found = configs.glob("*.json") if configs.is_dir() else configs.parent.glob(configs.name)
        return {p.stem: p for p in sorted(found) if "_check-" not in p.name}  # not a goldens file beside them
    files = {p.stem: p for p in sorted(CONFIGS.glob("*.json"))}
    files.update({p.name: p / "config.json" for p in sorted(CONFIGS.iterdir()) if (p / "config.json").is_file()})
    if REAL.is_dir():
        files.update({p.stem: p for p in sorted(REAL.glob("*.json"))})
    wanted = only_models()
    return {k: v for k, v in files.items() if not wanted or k in wanted}


# ---------------------------------------------------------------- one point (child process, SGLang)

def _dtype(value) -> str:
    return str(value).replace("torch.", "")


def _error(exc: BaseException) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    inner = [f for f in frames if "site-packages/sglang/" in f.filename]
    where = lambda f: f"{f.filename.split('site-packages/')[-1]}:{f.lineno}"  # noqa: E731
    return {"class": type(exc).__name__, "message": str(exc),
            "raised_at_sglang": where(inner[-1]) if inner else None, "raised_at": where(frames[-1]) if frames else None}


@functools.lru_cache(maxsize=None)
def _model_class(arch: str):
    """The registered model class for `arch`, found by a text search of sglang/srt/models (no full registry)."""
    import importlib

    import sglang

    models = Path(sglang.__file__).parent / "srt" / "models"
    needle = f"class {arch}("
    for path in sorted(models.glob("*.py")):
        if needle in path.read_text(errors="ignore"):
            module = importlib.import_module(f"sglang.srt.models.{path.stem}")
            cls = getattr(module, arch, None)
            if cls is not None:
                return cls
    return None


def _bare_model(model_config):
    """An instance of the model class with __init__ not run and only `.config` set: what
    resolve_sliding_window_size reads."""
    arch = model_config.hf_config.architectures[0]
    cls = _model_class(arch)
    if cls is None:
        return None, None
    model = object.__new__(cls)
    object.__setattr__(model, "config", model_config.hf_config)
    text = model_config.hf_text_config
    if text is not model_config.hf_config:
        lm_arch = {"Gemma3ForConditionalGeneration": "Gemma3ForCausalLM"}.get(arch)
        lm_cls = _model_class(lm_arch) if lm_arch else None
        if lm_cls is not None:
            lm = object.__new__(lm_cls)
            object.__setattr__(lm, "config", text)
            object.__setattr__(model, "language_model", lm)
    return model, cls.__name__


def _cache_params(params, tp: int) -> dict:
    shape = params.shape
    out = {"layers": list(params.layers), "mamba_cache_per_req": params.mamba_cache_per_req,
           "dtype": {k: _dtype(getattr(params.dtype, k)) for k in ("conv", "temporal") if hasattr(params.dtype, k)}}
    for name in ("conv", "temporal"):
        value = getattr(shape, name, None)
        if value is not None:
            out[f"{name}_shape"] = [list(v) for v in value] if value and isinstance(value[0], (tuple, list)) else list(value)
    return out


def _runs(tensors) -> list[dict]:
    """Buffers as runs of equal shape and dtype, in order: [{"shape", "dtype", "count"}]."""
    runs: list[dict] = []
    for t in tensors:
        shape, dtype = list(t.shape), _dtype(t.dtype)
        if runs and runs[-1]["shape"] == shape and runs[-1]["dtype"] == dtype:
            runs[-1]["count"] += 1
        else:
            runs.append({"shape": shape, "dtype": dtype, "count": 1})
    return runs


def _buffers(pool) -> dict:
    """Per-layer buffers of a token-to-KV pool: class, shapes, dtypes, and the layer-id maps."""
    import torch

    out: dict = {"class": type(pool).__name__}
    for attr in ("k_buffer", "v_buffer", "kv_buffer"):
        bufs = getattr(pool, attr, None)
        if isinstance(bufs, (list, tuple)) and bufs and isinstance(bufs[0], torch.Tensor):
            out[attr] = _runs(bufs)
            out[f"{attr}_ptrs_distinct"] = len({b.data_ptr() for b in bufs}) == len(bufs)
    for attr in ("start_layer", "layer_num", "size", "page_size", "head_num", "head_dim", "kv_lora_rank",
                 "qk_rope_head_dim", "swa_attention_layer_ids", "full_attention_layer_ids"):
        value = getattr(pool, attr, None)
        if isinstance(value, (int, list)):
            out[attr] = value
    mapping = getattr(pool, "layers_mapping", None)
    if isinstance(mapping, dict):
        out["layers_mapping"] = {str(k): [int(v[0]), bool(v[1])] for k, v in sorted(mapping.items())}
    mapping = getattr(pool, "full_attention_layer_id_mapping", None)
    if isinstance(mapping, dict):
        out["full_attention_layer_id_mapping"] = {str(k): int(v) for k, v in sorted(mapping.items())}
    for attr in ("full_kv_pool", "swa_kv_pool"):
        sub = getattr(pool, attr, None)
        if sub is not None:
            out[attr] = _buffers(sub)
    return out


def _mamba_pool(req_pool) -> dict | None:
    import torch

    pool = getattr(req_pool, "mamba_pool", None)
    if pool is None:
        return None
    out: dict = {"class": type(pool).__name__, "req_pool_class": type(req_pool).__name__}
    cache = getattr(pool, "mamba_cache", None)
    for name in ("conv", "temporal"):
        value = getattr(cache, name, None)
        if isinstance(value, torch.Tensor):
            out[name] = _runs([value])
        elif isinstance(value, (list, tuple)):
            out[name] = _runs(value)
    mapping = getattr(req_pool, "mamba_map", None) or getattr(pool, "mamba_map", None)
    if isinstance(mapping, dict):
        out["mamba_map"] = {str(k): int(v) for k, v in sorted(mapping.items())}
    for attr in ("size", "num_mamba_layers"):
        value = getattr(pool, attr, None)
        if isinstance(value, int):
            out[attr] = value
    return out


def _native_archs() -> set[str]:
    """The architectures SGLang's model registry serves natively (its modules' EntryClass names, as
    tools/sglang_registry.py reads them from this venv into kvdoctor/data/sglang_registry.json)."""
    registry = HERE.parent / "kvdoctor" / "data" / "sglang_registry.json"
    return set(json.loads(registry.read_text())["architectures"])


RESOLVED = ("attention_backend", "prefill_attention_backend", "decode_attention_backend", "page_size",
            "kv_cache_dtype", "context_length", "mamba_radix_cache_strategy", "disable_overlap_schedule",
            "linear_attn_backend", "chunked_prefill_size", "mamba_ssm_dtype", "disable_hybrid_swa_memory",
            "swa_full_tokens_ratio", "tp_size", "disable_radix_cache", "max_running_requests", "device")


def run_point(model_dir: Path, settings: dict) -> dict:
    import cudafake
    import torch

    cudafake.install(devices=max(1, settings.get("tp_size", 1)))
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig, is_hybrid_swa_model
    from sglang.srt.runtime_context import get_context, get_parallel
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    out: dict = {"outcome": "ok", "stages": {}}
    stage = "server_args"
    tp = settings.get("tp_size", 1)
    os.environ.pop("SGLANG_MAMBA_SSM_DTYPE", None)
    try:
        sa = ServerArgs(model_path=str(model_dir), skip_tokenizer_init=True, load_format="dummy", **settings)
        api.resolve(sa)
        resolved = api.resolved(sa)
        out["resolved_server_args"] = {k: resolved.get(k) for k in RESOLVED if k in resolved}
        stage = "model_config"
        get_context().set_server_args(sa)
        api.pin_parallel(get_parallel(), attn_tp_size=tp, attn_dcp_size=1, attn_cp_size=1)
        mc = ModelConfig.from_server_args(sa)
        swa_ids, full_ids = api.layer_ids(mc)
        model, model_class = _bare_model(mc)
        window = api.sliding_window(model, mc)
        text = mc.hf_text_config
        m = {"architectures": list(mc.hf_config.architectures), "model_class": model_class,
             "attention_arch": mc.attention_arch.name, "is_hybrid_swa": bool(mc.is_hybrid_swa),
             "is_hybrid_swa_model": bool(is_hybrid_swa_model(mc.hf_config.architectures, text)),
             "swa_attention_layer_ids": swa_ids, "full_attention_layer_ids": full_ids,
             "sliding_window_size": mc.sliding_window_size, "runner_sliding_window_size": window,
             "attention_chunk_size": mc.attention_chunk_size, "num_hidden_layers": mc.num_hidden_layers,
             "num_attention_layers": getattr(mc, "num_attention_layers", None), "context_len": mc.context_len,
             "dtype": _dtype(mc.dtype), "head_dim": mc.head_dim, "num_attention_heads": mc.num_attention_heads,
             "num_kv_heads_tp1": mc.get_num_kv_heads(1), "num_kv_heads_tp": mc.get_num_kv_heads(tp),
             "kv_lora_rank": getattr(mc, "kv_lora_rank", None), "qk_rope_head_dim": getattr(mc, "qk_rope_head_dim", None),
             "v_head_dim": getattr(mc, "v_head_dim", None), "quantization": mc.quantization,
             "layer_types": getattr(text, "layer_types", None)}
        out["model"] = m
        stage = "model_arch"  # load_model resolves the model class before any pool (model_loader/utils.py:230)
        if not set(mc.hf_config.architectures) & _native_archs():
            from sglang.srt.model_loader.utils import resolve_transformers_arch
            resolve_transformers_arch(mc, list(mc.hf_config.architectures))
        stage = "layer_info"
        layers = api.layer_indices(mc)
        out["layer_info"] = {"start_layer": layers.start_layer, "end_layer": layers.end_layer,
                             "num_effective_layers": layers.num_effective_layers,
                             "swa_attention_layer_ids": getattr(layers, "swa_attention_layer_ids", swa_ids),
                             "full_attention_layer_ids": getattr(layers, "full_attention_layer_ids", full_ids)}
        stage = "configurator"
        kv_str, kv_dtype = api.kv_cache_dtype(sa, mc)
        kvc = api.configurator(
            tp, device="cpu", gpu_id=0, pp_size=1, pp_group=None, model=None, model_config=mc,
            server_args=sa, kv_cache_dtype=kv_dtype, kv_cache_dtype_str=kv_str or api.group("model", sa).kv_cache_dtype,
            model_dtype=mc.dtype, page_size=api.group("schedule", sa).page_size, sliding_window_size=window,
            spec_algorithm=SpeculativeAlgorithm.NONE, is_draft_worker=False, post_capture_kv_active=False,
            is_hybrid_swa=mc.is_hybrid_swa,
            is_hybrid_swa_compress=getattr(mc, "is_hybrid_swa_compress", False),
            use_mla_backend=mc.attention_arch == AttentionArch.MLA, layer_info=layers, forward_stream=None,
            req_to_token_pool=None, token_to_kv_pool_allocator=None, memory_pool_config=None)
        state = {}
        for name in ("mambaish_config", "hybrid_gdn_config", "hybrid_kda_config"):
            if hasattr(kvc, name):  # hybrid_kda_config from 0.5.21
                cfg = getattr(kvc, name)
                state[name] = None if cfg is None else type(cfg).__name__
        if kvc.mambaish_config is not None:
            state["mamba2_cache_params"] = _cache_params(kvc.mambaish_config.mamba2_cache_params, tp)
        out["state"] = state
        out["kv_cache_dtype"] = _dtype(kv_dtype)
    except Exception as exc:  # noqa: BLE001 - every start-up refusal is data here
        out.update(outcome="refused", refused_at=stage, error=_error(exc))
        return out

    try:  # sizing at a fixed budget (stands in for the GPU profile)
        rest = BUDGET_GIB
        sizing: dict = {"budget_gib": BUDGET_GIB}
        if kvc.mambaish_config is not None:
            rest = kvc._handle_max_mamba_cache(rest)
            sizing["max_mamba_cache_size"] = api.group("schedule", sa).max_mamba_cache_size
            sizing["mamba_ratio"] = kvc._calculate_mamba_ratio()
        config = kvc.config_from_budget(int(rest * (1 << 30)))
        configurator = api.pool_configurator(kvc)
        sizing.update(configurator=type(configurator).__name__, available_bytes=int(rest * (1 << 30)),
                      max_total_num_tokens=config.max_total_num_tokens,
                      full_max_total_num_tokens=config.full_max_total_num_tokens,
                      swa_max_total_num_tokens=config.swa_max_total_num_tokens)
        for attr in ("_cell_size", "cell_size"):
            if isinstance(getattr(configurator, attr, None), (int, float)):
                sizing["cell_size"] = getattr(configurator, attr)
        sizing["max_running_requests"] = kvc.resolve_max_num_reqs(config.max_total_num_tokens)
        out["sizing_40GiB"] = sizing
    except Exception as exc:  # noqa: BLE001
        out.update(outcome="sizing_error", error=_error(exc))

    try:  # the real pool classes at tiny sizes on the CPU device
        page = api.group("schedule", sa).page_size
        tokens = max(TINY_TOKENS, 4 * page)
        if kvc.mambaish_config is not None:
            api.override(sa, "oracle.tiny", max_mamba_cache_size=TINY_REQS)
        sizes = api.pool_sizes(max_total_num_tokens=tokens, max_running_requests=TINY_REQS,
                               full_max_total_num_tokens=tokens if mc.is_hybrid_swa else None,
                               swa_max_total_num_tokens=tokens if mc.is_hybrid_swa else None,
                               c4_max_total_num_tokens=0, c128_max_total_num_tokens=0, c4_state_pool_size=0,
                               c128_state_pool_size=0, c4_state_dtype=None, c128_state_dtype=None)
        pools = api.build(kvc._init_pools, sizes=sizes, req_to_token_pool=None, token_to_kv_pool_allocator=None)
        out["pools_tiny"] = {"tokens": tokens, "req_to_token_pool": type(pools.req_to_token_pool).__name__,
                             "allocator": type(pools.token_to_kv_pool_allocator).__name__,
                             "token_to_kv_pool": _buffers(pools.token_to_kv_pool),
                             "mamba_pool": _mamba_pool(pools.req_to_token_pool)}
        out["stages"]["pools_tiny"] = "ok"
    except Exception as exc:  # noqa: BLE001
        out["stages"]["pools_tiny"] = _error(exc)
    del torch
    return out


class _Records:
    """Collects WARNING+ log records of one point (SGLang's own warnings are part of its answer)."""

    def __init__(self):
        import logging

        self.items: list[str] = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda r: self.items.append(f"{r.name}: {r.getMessage()}")
        logging.getLogger().addHandler(handler)

    def take(self) -> list[str]:
        items = [i for i in self.items if "Ignore import error" not in i and "pynvml" not in i
                 and "nvidia-smi" not in i]
        self.items.clear()
        return sorted(set(items))


def child(cases_path: Path) -> None:
    """Each model's cases (`cases_path`: model -> cases) in a fork of this process, which imported SGLang once:
    SGLang keeps process-wide state, so every model starts from the state after the import."""
    import logging
    import warnings

    sys.path.insert(0, str(HERE / "stubs"))
    sys.path.append(str(HERE / ".venv-extra"))  # uvicorn, fastapi, setproctitle: imported by some model modules
    import cudafake
    import fakemods

    cudafake.install()
    fakemods.install()
    warnings.simplefilter("ignore")
    logging.getLogger().setLevel(logging.WARNING)
    import sglang.srt.server_args  # noqa: F401 - imported once, before the forks

    for model, todo in json.loads(cases_path.read_text()).items():
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                model_points(model, todo, _Records())
                code = 0
            except BaseException:  # noqa: BLE001 - the parent marks the missing points as a crash
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                os._exit(code)
        os.waitpid(pid, 0)


def model_points(model: str, todo: list[dict], records: _Records) -> None:
    root = Path(tempfile.mkdtemp(prefix="kvdoctor-sgl-check-"))
    for i, case in enumerate(todo):
        if case["config"] is None:
            result = {"outcome": "not_applicable"}
        else:
            d = root / f"{i}"
            d.mkdir()
            (d / "config.json").write_text(json.dumps(case["config"]))
            started = time.time()
            result = run_point(d, case["settings"])
            result["seconds"] = round(time.time() - started, 2)
            result["warnings"] = records.take()
        print("POINT " + json.dumps({"model": model, "mutation": case["mutation"], "setting": case["setting"],
                                     "settings": case["settings"], "config": case["config"], "result": result}),
              flush=True)


def run_all(configs: Path | None = None, out: Path | None = None) -> None:
    todo = {name: cases(json.loads(path.read_text())) for name, path in corpus(configs).items()}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(todo, f)
    started = time.time()
    got: dict[str, list[dict]] = {name: [] for name in todo}
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--child", f.name], stdout=subprocess.PIPE, stderr=err,
                                text=True)
        for line in proc.stdout or ():
            if line.startswith("POINT "):
                point = json.loads(line[6:])
                got[point["model"]].append(point)
                if len(got[point["model"]]) == len(todo[point["model"]]):
                    print(f"{point['model']}: {len(todo[point['model']])} points, {time.time() - started:.0f}s",
                          flush=True)
        proc.wait()
        err.seek(0)
        tail = err.read()[-2000:]
    points = []
    for name, cases_of in todo.items():
        for case in cases_of[len(got[name]):]:
            got[name].append({"model": name, "mutation": case["mutation"], "setting": case["setting"],
                              "settings": case["settings"], "result": {"outcome": "crash", "stderr_tail": tail}})
        points += got[name]
    version = subprocess.run([sys.executable, "-c", "import sglang; print(sglang.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    doc = {"schema": "kvdoctor.goldens.sglang_check/1", "engine": "sglang", "versions": {"sglang": version},
           "grid": GRID,
           "platform": "cuda (torch.cuda reports NVIDIA H200 sm90; shims/cudafake.py)", "budget_gib": BUDGET_GIB,
           "configs": [os.path.relpath(configs, HERE.parent)] if configs else ["fixtures/models", "fixtures/configs/real"],
           "points": points}
    out = out or HERE / "sglang_check.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out} ({len(points)} points)")


def merge(files: list[Path], golden: Path = HERE / "sglang_check.json") -> None:
    """Take held-out sets' points into sglang_check.json (or `golden`): a model's points replace any it had; the
    file's other points stay as they are."""
    doc = json.loads(golden.read_text())
    for path in files:
        new = json.loads(path.read_text())
        assert new["versions"] == doc["versions"], (path, new["versions"])
        models = {p["model"] for p in new["points"]}
        doc["points"] = [p for p in doc["points"] if p["model"] not in models] + new["points"]
        doc["configs"] = sorted(set(doc["configs"]) | set(new["configs"]))
    golden.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {golden} ({len(doc['points'])} points)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]))
    elif len(sys.argv) > 2 and sys.argv[1] == "--merge":
        merge([Path(a) for a in sys.argv[2:]])
    elif len(sys.argv) > 3 and sys.argv[1] == "--merge-into":
        merge([Path(a) for a in sys.argv[3:]], Path(sys.argv[2]))
    elif len(sys.argv) in (5, 6) and sys.argv[1] == "--configs" and sys.argv[3] == "--out":
        MORE = sys.argv[5:] == ["--more-settings"]
        run_all(Path(sys.argv[2]), Path(sys.argv[4]))
    else:
        run_all()
