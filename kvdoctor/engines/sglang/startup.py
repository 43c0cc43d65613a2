"""An SGLang release's own CUDA start-up up to the KV pools, for one config.json and one set of server args.

The child of `kvdoctor check --engine sglang --dry-run` (`python startup.py REQUEST.json RESULT.json`),
run by an interpreter that has a profiled SGLang release (0.5.17 to 0.5.23); it imports nothing from kvdoctor
but the shims beside it, among them `shims/sglang_api.py`, the one adapter to each release's API that the
golden oracles use too. goldens/sglang_check_oracle.py loads this file and calls the same stage functions for the
goldens (one implementation). In the order the launcher and the model runner run them, all SGLang's own code:

1. `ServerArgs(model_path=DIR, skip_tokenizer_init=True, load_format="dummy", **args)`, resolved as the release
   resolves it (`resolve_once()` and `handle_environment_variables`; up to 0.5.17 its constructor does both:
   backend, page size, Mamba cache strategy, validation);
2. `ModelConfig.from_server_args` (attention arch, hybrid-SWA allow-list, SWA / full layer ids, state
   configs), load_model's `resolve_transformers_arch` for an architecture SGLang has no class for, then
   `resolve_sliding_window_size` on a bare instance of the registered model class
   (`__init__` not run, `.config` set: the model class's `get_attention_sliding_window_size`);
3. `resolve_layer_indices`, `configure_kv_cache_dtype` and a `KVCacheConfigurator` sized for the KV
   budget (`_handle_max_mamba_cache`, `config_from_budget`, `resolve_max_num_reqs`): the GPU profile is
   replaced by the budget the request gives;
4. the pool classes (`_init_pools`) built tiny on the CPU device, every buffer's shape and dtype and the
   layer-id -> buffer maps;
5. window reads: SGLang's `TorchNativeAttnBackend` (the one attention backend that runs on a CPU) over
   those pools, for the first sliding and the first full layer, on one request longer than the window;
   which keys each query read is recovered from the output (zero queries weigh the keys read equally;
   one-hot values name them).

The platform is CUDA: `shims/cudafake.py` makes torch report H200s and `shims/fakemods.py` makes the
CUDA-only extension packages importable (no kernel runs). Stated here, not SGLang's: the KV budget and
`attn_tp_size` (no process groups exist).
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import time
import traceback
import types
from pathlib import Path

# Run as a script (or imported by probe_child.py beside it), this folder is first on sys.path, where
# kvdoctor's own profile.py would stand in for the standard library's `profile` that cProfile imports.
HERE = os.path.dirname(os.path.abspath(__file__))
SHIMS = os.path.join(HERE, "shims")
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
if SHIMS not in sys.path:
    sys.path.insert(0, SHIMS)

import sglang_api as api  # type: ignore[import-not-found]  # noqa: E402 - shims/, put on sys.path just above

TINY_TOKENS, TINY_REQS = 256, 4
PAST_WINDOW = 64  # the window-read request is this many tokens longer than the window
WINDOW_READ_BYTES = 1 << 30  # skip the window reads when SDPA's score matrix would pass this
RESOLVED = ("attention_backend", "prefill_attention_backend", "decode_attention_backend", "page_size",
            "kv_cache_dtype", "context_length", "mamba_radix_cache_strategy", "disable_overlap_schedule",
            "linear_attn_backend", "chunked_prefill_size", "mamba_ssm_dtype", "disable_hybrid_swa_memory",
            "swa_full_tokens_ratio", "tp_size", "disable_radix_cache", "max_running_requests", "device")


class Refused(Exception):
    """SGLang raised during `step`; carries the row the parent reports."""

    def __init__(self, step: str, exc: BaseException):
        super().__init__(step)
        self.row = error_row(exc, step)


def raised_at(exc: BaseException) -> tuple:
    """(the innermost frame in SGLang's own code, the innermost frame), each None where there is none."""
    frames = traceback.extract_tb(exc.__traceback__)
    inner = [f for f in frames if "site-packages/sglang/" in f.filename]
    return (inner[-1] if inner else None), (frames[-1] if frames else None)


def error_row(exc: BaseException, step: str) -> dict:
    def where(f):
        return f"{f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name}" if f else None

    sglang_frame, last = raised_at(exc)
    return {"step": step, "class": type(exc).__name__, "message": str(exc),
            "raised_at_sglang": where(sglang_frame), "raised_at": where(last)}


def _dtype(value) -> str:
    return str(value).replace("torch.", "")


@functools.lru_cache(maxsize=None)
def model_class(arch: str):
    """The registered model class named `arch`, from the one sglang.srt.models module that defines it."""
    import sglang

    needle = f"class {arch}("
    for path in sorted((Path(sglang.__file__).parent / "srt" / "models").glob("*.py")):
        if needle in path.read_text(errors="ignore"):
            cls = getattr(importlib.import_module(f"sglang.srt.models.{path.stem}"), arch, None)
            if cls is not None:
                return cls
    return None


LANGUAGE_MODELS = {"Gemma3ForConditionalGeneration": "Gemma3ForCausalLM"}  # the multimodal wrapper asks its LM


def bare_model(mc):
    """What resolve_sliding_window_size reads: the model class without __init__, `.config` set."""
    arch = mc.hf_config.architectures[0]
    cls = model_class(arch)
    if cls is None:
        return None, None
    model = object.__new__(cls)
    object.__setattr__(model, "config", mc.hf_config)
    lm_cls = model_class(LANGUAGE_MODELS[arch]) if arch in LANGUAGE_MODELS else None
    if lm_cls is not None and mc.hf_text_config is not mc.hf_config:
        lm = object.__new__(lm_cls)
        object.__setattr__(lm, "config", mc.hf_text_config)
        object.__setattr__(model, "language_model", lm)
    return model, cls.__name__


def window_source(model, mc) -> str | None:
    """Which of resolve_sliding_window_size's three sources gave the runner window
    (model_runner_components/load_model_utils.py:144, in its order)."""
    if hasattr(model, "get_attention_sliding_window_size"):
        return "model_class"
    if mc.is_hybrid_swa and mc.sliding_window_size is not None:
        return "sliding_window_size"
    return "attention_chunk_size" if mc.attention_chunk_size is not None else None


def _runs(tensors) -> list[dict]:
    """Buffers as runs of equal shape and dtype, in order."""
    runs: list[dict] = []
    for t in tensors:
        shape, dtype = list(t.shape), _dtype(t.dtype)
        if runs and runs[-1]["shape"] == shape and runs[-1]["dtype"] == dtype:
            runs[-1]["count"] += 1
        else:
            runs.append({"shape": shape, "dtype": dtype, "count": 1})
    return runs


def kv_pool_row(pool) -> dict:
    """A token-to-KV pool: class, per-layer buffers (runs of shape and dtype, and whether each has its own
    storage), its sizes and head geometry, the layer-id maps, and its sub-pools the same way."""
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
        if getattr(pool, attr, None) is not None:
            out[attr] = kv_pool_row(getattr(pool, attr))
    return out


def mamba_pool_row(req_pool) -> dict | None:
    """The request pool's Mamba state pool: class, conv / SSM buffers, the layer-id map and its sizes."""
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
        if isinstance(getattr(pool, attr, None), int):
            out[attr] = getattr(pool, attr)
    return out


def placements(pools: dict) -> dict[str, list]:
    """Layer id -> [pool label, buffer index], read off SGLang's own pool objects' maps."""
    kv = pools["token_to_kv_pool"]
    attn = "mla" if (kv.get("full_kv_pool") or kv)["class"].startswith("MLA") else "full"
    if "layers_mapping" in kv:
        return {k: ["swa" if is_swa else "full", i] for k, (i, is_swa) in kv["layers_mapping"].items()}
    if "full_attention_layer_id_mapping" in kv:
        out = {k: [attn, i] for k, i in kv["full_attention_layer_id_mapping"].items()}
        out.update({k: ["mamba", i] for k, i in ((pools.get("mamba_pool") or {}).get("mamba_map") or {}).items()})
        return out
    return {str(kv.get("start_layer", 0) + i): [attn, i] for i in range(kv.get("layer_num", 0))}


# ---- the stages --------------------------------------------------------------------------------
# Each is SGLang's own code for one step; `start` runs them in the launcher's order for the dry run, and
# goldens/sglang_check_oracle.py calls the same functions for the goldens.

def server_args(model_dir: Path, args: dict):
    """`ServerArgs` resolved as the release resolves it: (server args, the resolved values of RESOLVED)."""
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path=str(model_dir), skip_tokenizer_init=True, load_format="dummy", **args)
    api.resolve(sa)
    resolved = api.resolved(sa)
    return sa, {k: resolved.get(k) for k in RESOLVED if k in resolved}


def model_config(sa):
    """`ModelConfig.from_server_args`, with the runtime context set and the attention TP size pinned."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.runtime_context import get_context, get_parallel

    get_context().set_server_args(sa)
    api.pin_parallel(get_parallel(), attn_tp_size=sa.tp_size or 1, attn_dcp_size=1, attn_cp_size=1)
    return ModelConfig.from_server_args(sa)


def model_arch(mc, native) -> None:
    """load_model's `resolve_transformers_arch` for an architecture not among `native` (the ones SGLang's
    registry serves): it raises where SGLang's Transformers backend cannot serve the model."""
    if not set(mc.hf_config.architectures) & set(native):
        from sglang.srt.model_loader.utils import resolve_transformers_arch
        resolve_transformers_arch(mc, list(mc.hf_config.architectures))


def model_window(mc, tp: int) -> tuple[dict, int | None]:
    """`resolve_sliding_window_size` on a bare instance of the model class, and the model decisions at TP size
    `tp`: (row, the runner's window)."""
    from sglang.srt.configs.model_config import is_hybrid_swa_model

    swa_ids, full_ids = api.layer_ids(mc)
    model, class_name = bare_model(mc)
    window = api.sliding_window(model, mc)
    text = mc.hf_text_config
    row = {"architectures": list(mc.hf_config.architectures), "architecture": mc.hf_config.architectures[0],
           "model_class": class_name, "attention_arch": mc.attention_arch.name, "is_hybrid_swa": bool(mc.is_hybrid_swa),
           "is_hybrid_swa_model": bool(is_hybrid_swa_model(mc.hf_config.architectures, text)),
           "swa_attention_layer_ids": swa_ids, "full_attention_layer_ids": full_ids,
           "sliding_window_size": mc.sliding_window_size, "runner_sliding_window_size": window,
           "runner_window_from": window_source(model, mc), "attention_chunk_size": mc.attention_chunk_size,
           "num_hidden_layers": mc.num_hidden_layers, "num_attention_layers": getattr(mc, "num_attention_layers", None),
           "context_len": mc.context_len, "dtype": _dtype(mc.dtype), "head_dim": mc.head_dim,
           "num_attention_heads": mc.num_attention_heads, "num_kv_heads_tp1": mc.get_num_kv_heads(1),
           "num_kv_heads_tp": mc.get_num_kv_heads(tp), "kv_lora_rank": getattr(mc, "kv_lora_rank", None),
           "qk_rope_head_dim": getattr(mc, "qk_rope_head_dim", None), "v_head_dim": getattr(mc, "v_head_dim", None),
           "quantization": mc.quantization, "layer_types": getattr(text, "layer_types", None)}
    return row, window


def layer_indices(mc):
    """`resolve_layer_indices`: the layer range this rank serves (no model, no pipeline stages; the release's own
    answer through the adapter)."""
    return api.layer_indices(mc)


def layer_row(layers, mc) -> dict:
    swa_ids, full_ids = api.layer_ids(mc)
    return {"start_layer": layers.start_layer, "end_layer": layers.end_layer,
            "num_effective_layers": layers.num_effective_layers,
            "swa_attention_layer_ids": getattr(layers, "swa_attention_layer_ids", swa_ids),
            "full_attention_layer_ids": getattr(layers, "full_attention_layer_ids", full_ids)}


def start(model_dir: Path, args: dict, budget: int, out: dict, native: list[str] | None = None):
    """Stages 1-3: returns (model config, configurator); raises Refused with SGLang's exception. `native`:
    the architectures SGLang's registry serves (from the parent); for any other, load_model's
    `resolve_transformers_arch` runs first, as it does before any pool is built."""
    step = "server_args"
    try:
        sa, out["server_args"] = server_args(model_dir, args)
        step = "model_config"
        mc = model_config(sa)
        if native is not None:
            step = "model_arch"
            model_arch(mc, native)
        step = "model_window"
        out["model"], window = model_window(mc, sa.tp_size or 1)
        step = "configurator"
        kvc, kv_dtype = configurator(sa, mc, window)
        out["kv_cache_dtype"] = _dtype(kv_dtype)
        out["state"] = state_row(kvc)
        step = "sizing"
        out["sizing"] = sizing(kvc, budget)
    except Exception as exc:  # noqa: BLE001 - SGLang's refusal is the answer
        raise Refused(step, exc) from exc
    return mc, kvc


def configurator(sa, mc, window: int | None, layers=None):
    """SGLang's KVCacheConfigurator as the model runner builds it (no model, CPU device), for the server
    args and model config already resolved, and the KV dtype it resolved: (configurator, dtype). Each call
    passes what the release's own function declares (sglang_api.build). `layers`: `layer_indices(mc)`."""
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    layers = layers if layers is not None else layer_indices(mc)
    kv_str, kv_dtype = api.kv_cache_dtype(sa, mc)
    kvc = api.configurator(
        sa.tp_size or 1, device="cpu", gpu_id=0, pp_size=1, pp_group=None, model=None, model_config=mc,
        server_args=sa, kv_cache_dtype=kv_dtype, kv_cache_dtype_str=kv_str or api.group("model", sa).kv_cache_dtype,
        model_dtype=mc.dtype, page_size=api.group("schedule", sa).page_size, sliding_window_size=window,
        spec_algorithm=SpeculativeAlgorithm.NONE, is_draft_worker=False, post_capture_kv_active=False,
        is_hybrid_swa=mc.is_hybrid_swa,
        is_hybrid_swa_compress=getattr(mc, "is_hybrid_swa_compress", False),
        use_mla_backend=mc.attention_arch == AttentionArch.MLA, layer_info=layers, forward_stream=None,
        req_to_token_pool=None, token_to_kv_pool_allocator=None, memory_pool_config=None)
    return kvc, kv_dtype


def cache_params_row(params) -> dict:
    """The Mamba / GDN / KDA state params: the state layers, one request's bytes, dtypes and shapes."""
    shape = params.shape
    row: dict = {"layers": list(params.layers), "mamba_cache_per_req": params.mamba_cache_per_req,
                 "dtype": {k: _dtype(getattr(params.dtype, k)) for k in ("conv", "temporal")
                           if hasattr(params.dtype, k)}}
    for name in ("conv", "temporal"):
        value = getattr(shape, name, None)
        if value is not None:
            row[f"{name}_shape"] = ([list(v) for v in value] if value and isinstance(value[0], (tuple, list))
                                    else list(value))
    return row


def state_row(kvc) -> dict | None:
    if kvc.mambaish_config is None:
        return None
    return {"config_class": type(kvc.mambaish_config).__name__,
            **cache_params_row(kvc.mambaish_config.mamba2_cache_params)}


def sizing(kvc, budget: int) -> dict:
    """The pool sizes and request cap SGLang derives from a KV budget of `budget` bytes, the pool configurator
    that sized them and its bytes per token."""
    row: dict = {"budget_bytes": budget}
    rest_gib = budget / (1 << 30)
    if kvc.mambaish_config is not None:
        rest_gib = kvc._handle_max_mamba_cache(rest_gib)
        row["max_mamba_cache_size"] = api.group("schedule", kvc.server_args).max_mamba_cache_size
        row["mamba_ratio"] = kvc._calculate_mamba_ratio()
    available = int(rest_gib * (1 << 30))
    config = kvc.config_from_budget(available)
    sized_by = api.pool_configurator(kvc)
    row.update(configurator=type(sized_by).__name__, available_bytes=available,
               max_total_num_tokens=config.max_total_num_tokens,
               full_max_total_num_tokens=config.full_max_total_num_tokens,
               swa_max_total_num_tokens=config.swa_max_total_num_tokens)
    for attr in ("_cell_size", "cell_size"):
        if isinstance(getattr(sized_by, attr, None), (int, float)):
            row["cell_size"] = getattr(sized_by, attr)
    row["max_running_requests"] = kvc.resolve_max_num_reqs(config.max_total_num_tokens)
    return row


def build_pools(mc, kvc, tokens: int, swa_tokens: int | None = None):
    """Stage 4: SGLang's own pool classes, `tokens` rows (`swa_tokens` in the SWA pool) and TINY_REQS
    requests, on the CPU device."""
    page = api.group("schedule", kvc.server_args).page_size
    tokens = max(tokens, 4 * page)
    swa_tokens = max(swa_tokens or tokens, 4 * page)
    if kvc.mambaish_config is not None:
        api.override(kvc.server_args, "kvdoctor.dryrun", max_mamba_cache_size=TINY_REQS)
    sizes = api.pool_sizes(max_total_num_tokens=tokens, max_running_requests=TINY_REQS,
                           full_max_total_num_tokens=tokens if mc.is_hybrid_swa else None,
                           swa_max_total_num_tokens=swa_tokens if mc.is_hybrid_swa else None,
                           c4_max_total_num_tokens=0, c128_max_total_num_tokens=0, c4_state_pool_size=0,
                           c128_state_pool_size=0, c4_state_dtype=None, c128_state_dtype=None)
    pools = api.build(kvc._init_pools, sizes=sizes, req_to_token_pool=None, token_to_kv_pool_allocator=None)
    row = {"tokens": tokens, "req_to_token_pool": type(pools.req_to_token_pool).__name__,
           "allocator": type(pools.token_to_kv_pool_allocator).__name__,
           "token_to_kv_pool": kv_pool_row(pools.token_to_kv_pool),
           "mamba_pool": mamba_pool_row(pools.req_to_token_pool)}
    row["placements"] = placements(row)
    return pools, row


# ---- stage 5: which keys a layer's attention reads ---------------------------------------------

def sliding_ids(mc, planned: list[int]) -> list[int]:
    """SGLang's SWA layer ids; with hybrid-SWA memory off ModelConfig lists none (the model class still
    masks), so the layers the static plan gives a window stand in (each read row says which)."""
    return list(api.layer_ids(mc)[0] or []) or list(planned)


def window_layers(mc, window: int | None, planned: list[int]) -> list[tuple[int, int]]:
    """(layer id, window_left) for the first sliding and the first full attention layer."""
    left = window if window is not None and window >= 0 else -1
    swa = sliding_ids(mc, planned) if left >= 0 else []
    full = [i for i in (api.layer_ids(mc)[1] or range(mc.num_hidden_layers)) if i not in swa]
    out = [(swa[0], left)] if swa else []
    return out + ([(full[0], -1)] if full else [])


def read_sets(pools, mc, layer_id: int, window_left: int, length: int, after_release: bool) -> dict:
    """Run TorchNativeAttnBackend's extend over `length` tokens, then one decode step, on layer
    `layer_id` of the real pools; returns, per query position, the key positions it read.
    `after_release`: an earlier request's out-of-window SWA slots were released first (as a running
    server does), so that this request's SWA slots differ from its full-pool slots; otherwise both pools
    hand out the same slot numbers and only the window mask is exercised."""
    import torch
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.layers.radix_attention import RadixAttention

    kv, req, alloc = pools.token_to_kv_pool, pools.req_to_token_pool, pools.token_to_kv_pool_allocator
    k_buf = kv.get_key_buffer(layer_id)
    kv_heads, head_dim = int(k_buf.shape[1]), int(k_buf.shape[2])
    v_dim = int(kv.get_value_buffer(layer_id).shape[2])
    q_heads = kv_heads  # one query head per KV head: what a query reads does not depend on the group size
    layer = RadixAttention(num_heads=q_heads, head_dim=head_dim, scaling=1.0, num_kv_heads=kv_heads,
                           layer_id=layer_id, v_head_dim=v_dim, sliding_window_size=window_left)
    backend = TorchNativeAttnBackend(types.SimpleNamespace(device="cpu", req_to_token_pool=req,
                                                           token_to_kv_pool=kv))
    alloc.clear()
    if after_release:
        alloc.free_swa(alloc.alloc(PAST_WINDOW))
    locs = alloc.alloc(length + 1)
    if locs is None:
        raise RuntimeError(f"kvdoctor: the tiny pools have no room for a {length + 1}-token request")
    req.req_to_token[0, :length + 1] = locs.to(req.req_to_token.dtype)
    dtype = k_buf.dtype if k_buf.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16
    capacity = kv_heads * v_dim
    seen: dict[int, set[int]] = {q: set() for q in range(length + 1)}
    for base in range(0, length + 1, capacity):
        values = torch.zeros(length + 1, kv_heads, v_dim, dtype=dtype)
        for j in range(base, min(base + capacity, length + 1)):
            values[j].view(-1)[j - base] = 1
        keys = torch.zeros(length + 1, kv_heads, head_dim, dtype=dtype)
        zeros = torch.zeros(length + 1, q_heads * head_dim, dtype=dtype)
        extend = types.SimpleNamespace(
            out_cache_loc=locs[:length], req_pool_indices=torch.tensor([0]), seq_lens=torch.tensor([length]),
            extend_prefix_lens=torch.tensor([0]), extend_seq_lens=torch.tensor([length]), encoder_lens=None)
        backend.init_forward_metadata(extend)
        out = backend.forward_extend(zeros[:length], keys[:length], values[:length], layer, extend)
        decode = types.SimpleNamespace(
            out_cache_loc=locs[length:], req_pool_indices=torch.tensor([0]), seq_lens=torch.tensor([length + 1]),
            encoder_lens=None)
        backend.init_forward_metadata(decode)
        last = backend.forward_decode(zeros[length:], keys[length:], values[length:], layer, decode)
        both = torch.cat([out.view(length, -1), last.view(1, -1)]).float()
        for q, j in torch.nonzero(both).tolist():
            seen[q].add(base + j)
    reads = {}
    for q, keys_read in seen.items():
        if not keys_read:
            reads[q] = {"count": 0, "first": None, "last": None, "contiguous": False}
            continue
        lo, hi = min(keys_read), max(keys_read)
        reads[q] = {"count": len(keys_read), "first": lo, "last": hi, "contiguous": len(keys_read) == hi - lo + 1}
    translate = getattr(kv, "translate_loc_from_full_to_swa", None)
    diverged = bool(translate is not None and not torch.equal(translate(locs), locs))
    return {"layer": layer_id, "window_left": window_left, "kv_heads": kv_heads, "length": length,
            "backend": "TorchNativeAttnBackend", "swa_slots_differ": diverged, "reads": reads}


def summarize(run: dict) -> dict:
    """The read sets as the parent compares them: what each query read, against the window's rule."""
    window = run["window_left"] + 1 if run["window_left"] >= 0 else None
    off = []
    for q, r in run["reads"].items():
        want = min(q + 1, window) if window else q + 1
        if not (r["contiguous"] and r["last"] == q and r["count"] == want):
            off.append({"query": q, **r})
    return {k: run[k] for k in ("layer", "window_left", "kv_heads", "length", "backend", "swa_slots_differ")} | {
        "keys_read_max": max(r["count"] for r in run["reads"].values()),
        "queries": len(run["reads"]), "off_window": off[:10], "off_window_count": len(off)}


def window_reads(pools, mc, window: int | None, length: int, planned: list[int]) -> list[dict]:
    out = []
    released = hasattr(pools.token_to_kv_pool_allocator, "free_swa")
    from_plan = not api.layer_ids(mc)[0]
    for layer_id, left in window_layers(mc, window, planned):
        for after_release in (False, True) if released and left >= 0 else (False,):
            try:
                row = summarize(read_sets(pools, mc, layer_id, left, length, after_release))
            except Exception as exc:  # noqa: BLE001 - SGLang's backend failing on its own pools is the answer
                row = {"layer": layer_id, "window_left": left, "backend": "TorchNativeAttnBackend",
                       "error": error_row(exc, "window_reads")}
            out.append({**row, "after_swa_release": after_release,
                        "sliding_from": ("plan" if from_plan else "sglang") if left >= 0 else None})
    return out


def window_request(mc, window: int | None, planned: list[int], source: str | None
                   ) -> tuple[int | None, str | None]:
    """(tokens of the request that crosses the window, or None with the reason the reads are not run)."""
    if source == "attention_chunk_size":
        return None, ("chunked attention: SGLang passes the chunk size as the window, and the torch-native "
                      "backend's sliding mask is not the chunked one")
    if window is None or window < 0 or not sliding_ids(mc, planned):
        return PAST_WINDOW * 2, None  # no sliding layer: a full layer's reads are still checked
    length = window + 1 + PAST_WINDOW
    if 4 * max(1, mc.get_num_kv_heads(1)) * (length + 1) ** 2 > WINDOW_READ_BYTES:
        return None, (f"the window ({window + 1} keys) is too long for the dry run's attention "
                      f"(over {WINDOW_READ_BYTES >> 20} MiB of scores)")
    return length, None


# ---- the point ---------------------------------------------------------------------------------

def run(model_dir: Path, args: dict, budget: int, planned: list[int], native: list[str] | None = None) -> dict:
    out: dict = {"stages": []}
    started = time.monotonic()
    try:
        mc, kvc = start(model_dir, args, budget, out, native)
    except Refused as refused:
        out["outcome"] = {"start": False, **refused.row}
        return out
    out["stages"] += ["server_args", "model_config", "model_arch", "model_window", "configurator", "sizing"]
    out["outcome"] = {"start": True}
    window = out["model"]["runner_sliding_window_size"]
    length, why_not = window_request(mc, window, planned, out["model"]["runner_window_from"])
    try:
        # full pool: the request and the earlier one; SWA pool: the request only, so that its SWA slots
        # reuse the earlier request's released ones
        pools, out["pools"] = build_pools(mc, kvc, max(TINY_TOKENS, (length or 0) + 2 + PAST_WINDOW),
                                          length + 2 if mc.is_hybrid_swa and length else None)
        out["stages"].append("pools")
    except Exception as exc:  # noqa: BLE001 - the tiny pools are kvdoctor's size, not the server's
        out["pools_error"] = error_row(exc, "pools")
        return out
    if out["pools"]["mamba_pool"] is not None:
        why_not = "a hybrid state model: its attention layers run inside HybridLinearAttnBackend"
    elif (out["server_args"].get("page_size") or 1) > 1:
        why_not = "page size above 1: the dry run's request takes its slots token by token"
    if why_not or length is None:
        out["window_reads_skipped"] = why_not
    else:
        out["window_reads"] = window_reads(pools, mc, window, length, planned)
        out["stages"].append("window_reads")
    out["seconds_in_sglang"] = round(time.monotonic() - started, 2)
    return out


def install_shims(tp: int) -> None:
    import cudafake  # type: ignore[import-not-found]  # shims/, on sys.path since this module was imported
    import fakemods  # type: ignore[import-not-found]

    cudafake.install(devices=tp)
    fakemods.install(extra=("torchvision",))


def prepare(tp: int) -> None:
    """What the child sets up before it imports SGLang: the same for every model of one tp size."""
    import logging
    import warnings

    os.environ.pop("SGLANG_MAMBA_SSM_DTYPE", None)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    install_shims(tp)


# The SGLang modules `run` imports, for every model (the model's own module is imported per model); a release
# without one does not import it either (serving_hook arrives with resolve_once, after 0.5.17).
PRELOAD = ("sglang.srt.arg_groups.serving_hook", "sglang.srt.configs.model_config",
           "sglang.srt.model_executor.model_runner_components.load_model_utils", "sglang.srt.runtime_context",
           "sglang.srt.server_args", "sglang.srt.mem_cache.kv_cache_dtype",
           "sglang.srt.mem_cache.kv_cache_configurator", "sglang.srt.model_executor.pool_configurator",
           "sglang.srt.model_executor.model_runner_components.layer_setup",
           "sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state",
           "sglang.srt.speculative.spec_info", "sglang.srt.layers.attention.torch_native_backend",
           "sglang.srt.layers.radix_attention")


def preload(key: dict) -> None:
    """A warm child's imports (kvdoctor/engines/warm_server.py: it forks per model after these): the
    set-up for key's tp size and the modules every model's run imports. No model is touched."""
    prepare(int(key.get("tp_size") or 1))
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not exc.name or not (name + ".").startswith(exc.name + "."):  # not SGLang's own: the run says so
                raise


def main() -> None:
    """REQUEST.json {"model_dir", "server_args", "kv_budget_bytes", "planned_sliding_layers",
    "native_architectures"} -> RESULT.json."""
    request = json.loads(Path(sys.argv[1]).read_text())
    result_path = Path(sys.argv[2])
    args = request.get("server_args") or {}
    prepare(args.get("tp_size") or 1)
    import sglang
    import torch

    result: dict = {"versions": {"sglang": sglang.__version__, "torch": torch.__version__}}
    result_path.write_text(json.dumps(result))  # how far it got, if SGLang kills the process
    result.update(run(Path(request["model_dir"]), args, int(request["kv_budget_bytes"]),
                      request.get("planned_sliding_layers") or [], request.get("native_architectures")))
    result_path.write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
