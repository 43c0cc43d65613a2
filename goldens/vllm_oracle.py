"""vLLM oracle: run a vLLM release's own KV-cache planner on every config over a grid of settings.

Run in goldens/.venv/vllm (see README.md) with VLLM_TARGET_DEVICE=cpu. What comes from vLLM's
code: the model facts (`create_engine_config`: dtype, head size, KV heads per rank, layer types,
window, MLA), the hybrid block alignment (`Platform._align_hybrid_block_size` with the model's
own `get_mamba_state_shape_from_config`), the grouping, pool and admission check
(`get_global_kv_cache_groups`, `get_kv_cache_configs`) and the capacity (`get_kv_cache_capacity`).
What the script supplies: the per-layer specs, built as `Attention.get_kv_cache_spec` and
`MambaBase.get_kv_cache_spec` build them (the layers need a GPU model to instantiate), and the
H200 server defaults the CPU platform would otherwise replace.
"""
from __future__ import annotations

import copy
import inspect
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GiB, contexts, load_startup, max_position, model_dirs, only_models, write  # noqa: E402

BUDGETS_GIB = (4, 20, 40, 120)
H200_SERVER = {"max_num_batched_tokens": 8192, "async_scheduling": True, "max_num_seqs": 1024}


def grid(limit: int, hybrid_mamba: bool, sliding: bool) -> list[dict]:
    """Settings points: a context x budget sweep at server defaults, then one knob at a time."""
    base = {"kv_cache_dtype": "auto", "tp": 1, "hma": True, "prefix_caching": True,
            "num_speculative_tokens": 0, **H200_SERVER}
    points = []
    for length in contexts(limit):
        for gib in BUDGETS_GIB:
            points.append({**base, "max_model_len": length, "kv_budget_bytes": gib * GiB})
            if hybrid_mamba:
                points.append({**points[-1], "prefix_caching": False})
    length = min(131072, limit)
    anchor = {**base, "max_model_len": length, "kv_budget_bytes": 40 * GiB}
    variations = [
        {"kv_cache_dtype": "fp8"}, {"tp": 2}, {"tp": 4}, {"tp": 8}, {"hma": False},
        {"hma": False, "kv_cache_dtype": "fp8"}, {"tp": 2, "hma": False},
        {"num_speculative_tokens": 3},
        {"max_num_batched_tokens": 2048, "async_scheduling": False},
        {"max_num_batched_tokens": 16384}, {"kv_budget_bytes": 1 * GiB}, {"kv_budget_bytes": 256 << 20},
    ]
    if hybrid_mamba:
        variations += [{"prefix_caching": False, "tp": 2}, {"prefix_caching": False, "num_speculative_tokens": 3},
                       {"prefix_caching": False, "kv_cache_dtype": "fp8"}, {"prefix_caching": False, "hma": False}]
    if sliding:
        variations += [{"hma": False, "kv_budget_bytes": 4 * GiB}, {"hma": False, "kv_budget_bytes": 120 * GiB},
                       {"max_num_batched_tokens": 2048, "async_scheduling": False, "kv_budget_bytes": 4 * GiB}]
    points += [{**anchor, **v} for v in variations]
    return points


def engine_config(model_dir: Path, prefix_caching: bool, spec_tokens: int):
    from vllm.engine.arg_utils import EngineArgs

    kwargs = dict(model=str(model_dir), skip_tokenizer_init=True, load_format="dummy",
                  max_model_len=max_position(model_dir), enable_prefix_caching=prefix_caching)
    if spec_tokens:
        kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": spec_tokens,
                                        "prompt_lookup_max": spec_tokens}
    return EngineArgs(**kwargs).create_engine_config()


def backend_for(cfg):
    """The attention backend an H200 picks for this model: FlashAttention for MHA. For MLA it is
    FlashAttention-MLA, which imports only with CUDA kernels; TritonMLA declares the same kernel
    block sizes (MultipleOf(16)), so the block alignment is the same."""
    if cfg.model_config.use_mla:
        from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend
        return TritonMLABackend
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    return FlashAttentionBackend


def apply(cfg, point: dict) -> None:
    """Set the point's knobs on a fresh copy of the engine config, as the GPU server would have them."""
    mc, cc, sc = cfg.model_config, cfg.cache_config, cfg.scheduler_config
    mc.max_model_len = point["max_model_len"]
    cfg.parallel_config.tensor_parallel_size = point["tp"]
    cc.cache_dtype = point["kv_cache_dtype"]
    cc.kv_cache_layout = "LBNHC"  # FlashAttention's default layout: layer-outermost, no page packing
    # FlashAttention / FlashAttention-MLA on SM90 take any multiple of 16, so the release's default stands: 16 up to
    # 0.33, 64 from 0.34 (vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE at each tag)
    cc.block_size = type(cc).DEFAULT_BLOCK_SIZE
    cc.mamba_ssm_cache_dtype = "auto"  # the CPU platform forces float32; CUDA keeps the model dtype
    cc.mamba_page_size_padded = None
    cc.mamba_block_size = cc.block_size if cc.mamba_cache_mode == "align" else point["max_model_len"]
    sc.max_num_batched_tokens = point["max_num_batched_tokens"]
    sc.async_scheduling = point["async_scheduling"]
    sc.max_num_seqs = point["max_num_seqs"]
    sc.disable_hybrid_kv_cache_manager = not point["hma"]


def layer_specs(cfg) -> dict:
    from vllm.model_executor.layers.attention.attention import _largest_kernel_block_within
    from vllm.model_executor.models import ModelRegistry
    from vllm.utils.torch_utils import get_kv_cache_torch_dtype
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, MambaSpec, MLAAttentionSpec,
                                            SlidingWindowSpec, get_kv_quant_mode)

    mc, cc = cfg.model_config, cfg.cache_config
    text = mc.hf_text_config
    dtype = get_kv_cache_torch_dtype(cc.cache_dtype, mc.dtype)
    quant = get_kv_quant_mode(cc.cache_dtype)
    heads = mc.get_num_kv_heads(cfg.parallel_config)
    head = mc.get_head_size()
    backend = backend_for(cfg)
    layer_types = getattr(text, "layer_types", None)
    model_window = mc.get_sliding_window()
    specs = {}
    mamba = None
    kda_layer = getattr(text, "is_kda_layer", None)  # Kimi-Linear's vLLM config has no layer_types
    for i in range(mc.get_num_layers(cfg.parallel_config)):
        if kda_layer is not None:
            kind = "linear_attention" if kda_layer(i) else "full_attention"
        else:
            kind = layer_types[i] if layer_types else ("sliding_attention" if model_window else "full_attention")
        name = f"model.layers.{i}"
        if kind == "linear_attention":
            if mamba is None:
                model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
                mamba = MambaSpec(shapes=tuple(model_cls.get_mamba_state_shape_from_config(cfg)),
                                  dtypes=model_cls.get_mamba_state_dtype_from_config(cfg),
                                  block_size=cc.mamba_block_size, page_size_padded=cc.mamba_page_size_padded,
                                  mamba_cache_mode=cc.mamba_cache_mode,
                                  num_speculative_blocks=cfg.num_speculative_tokens)
            specs[f"{name}.linear_attn"] = mamba
        elif mc.use_mla:
            specs[f"{name}.self_attn.attn"] = MLAAttentionSpec(
                block_size=cc.block_size, num_kv_heads=heads, head_size=head, dtype=dtype,
                kv_quant_mode=quant, cache_dtype_str=cc.cache_dtype)
        elif kind == "sliding_attention":
            window = getattr(text, "sliding_window", None) or model_window
            probe = SlidingWindowSpec(block_size=1, num_kv_heads=heads, head_size=head, dtype=dtype,
                                      kv_quant_mode=quant, sliding_window=window)
            per_token = probe.real_page_size_bytes
            # the spec to probe became a fifth argument after 0.30.0
            extra = (probe,) if len(inspect.signature(_largest_kernel_block_within).parameters) == 5 else ()
            block = _largest_kernel_block_within(backend, per_token, per_token * cc.block_size,
                                                 cc.block_size, *extra)
            specs[f"{name}.self_attn.attn"] = SlidingWindowSpec(
                block_size=block, num_kv_heads=heads, head_size=head, dtype=dtype, kv_quant_mode=quant,
                sliding_window=window)
        else:
            specs[f"{name}.self_attn.attn"] = FullAttentionSpec(
                block_size=cc.block_size, num_kv_heads=heads, head_size=head, dtype=dtype, kv_quant_mode=quant)
    return specs


def group_row(cfg, group) -> dict:
    from vllm.utils.math_utils import cdiv
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    spec = group.kv_cache_spec
    first = next(iter(spec.kv_cache_specs.values())) if isinstance(spec, UniformTypeKVCacheSpecs) else spec
    return {
        "spec": type(first).__name__,
        "layers": len(group.layer_names),
        "first_layer": int(group.layer_names[0].split(".")[2]),
        "block_size": spec.block_size,
        "page_bytes": first.page_size_bytes,
        "window": getattr(first, "sliding_window", None),
        "blocks_per_request": cdiv(spec.max_memory_usage_bytes(cfg), spec.page_size_bytes),
    }


def groups_and_config(cfg, specs: dict, budget: int):
    """The KV cache groups and the worker's KV cache config, through the release's own API: from 0.33.0
    `get_global_kv_cache_groups` then `get_kv_cache_configs(..., groups)` in kv_cache_planning.py; before, in
    kv_cache_utils.py, `get_kv_cache_groups` per worker and `get_kv_cache_configs`, which groups again itself.
    Each call gets its own copy of the specs (the HMA-off promotion rewrites them in place)."""
    try:
        from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    except ImportError:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs, get_kv_cache_groups

        return get_kv_cache_groups(cfg, dict(specs)), get_kv_cache_configs(cfg, [dict(specs)], [budget])[0]
    groups = get_global_kv_cache_groups(cfg, [dict(specs)])
    return groups, get_kv_cache_configs(cfg, [dict(specs)], [budget], groups)[0]


def pool_bytes_per_block(cfg, groups) -> int:
    """`_pool_bytes_per_block`: (vllm_config, groups) in most releases, (groups) in 0.29-0.31."""
    try:
        from vllm.v1.core.kv_cache_planning import _pool_bytes_per_block
    except ImportError:
        from vllm.v1.core.kv_cache_utils import _pool_bytes_per_block
    if len(inspect.signature(_pool_bytes_per_block).parameters) == 1:
        return _pool_bytes_per_block(groups)
    return _pool_bytes_per_block(cfg, groups)


def plan(base_cfg, point: dict) -> dict:
    from vllm.platforms import current_platform
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

    cfg = copy.deepcopy(base_cfg)
    apply(cfg, point)
    out: dict = {"dtype": str(cfg.model_config.dtype).replace("torch.", ""),
                 "head_size": cfg.model_config.get_head_size(),
                 "kv_heads_per_rank": cfg.model_config.get_num_kv_heads(cfg.parallel_config),
                 "mamba_cache_mode": cfg.cache_config.mamba_cache_mode}
    try:
        cfg.model_config.verify_with_parallel_config(cfg.parallel_config)
        if cfg.model_config.is_hybrid:
            current_platform._align_hybrid_block_size(cfg, backend_for(cfg))
        out["block_size"] = cfg.cache_config.block_size
        out["mamba_page_size_padded"] = cfg.cache_config.mamba_page_size_padded
        specs = layer_specs(cfg)
        out["layer_pages"] = sorted({(type(s).__name__, s.page_size_bytes) for s in specs.values()})
        groups, config = groups_and_config(cfg, specs, point["kv_budget_bytes"])
        out["groups"] = [group_row(cfg, g) for g in groups]
        tokens, concurrency = get_kv_cache_capacity(cfg, config)
        out.update(num_blocks=config.num_blocks, max_concurrency=concurrency, tokens=tokens)
        out["bytes_per_block"] = pool_bytes_per_block(cfg, config.kv_cache_groups)
    except (ValueError, NotImplementedError, AssertionError) as exc:
        out["error"] = {"class": type(exc).__name__, "message": str(exc)}
    return out


def main() -> None:
    logging.disable(logging.WARNING)
    startup = load_startup()
    startup.cpu_platform()  # 0.26.0 resolves CpuPlatform only for a CPU build (startup.cpu_platform)
    startup.triton_check_passes()  # 0.34.0's CpuPlatform wants triton-cpu; no kernel runs here
    import transformers  # recorded: what the release's venv resolved (goldens/releases.py)
    import vllm

    wanted = only_models()
    points = []
    skipped = {}
    for name, model_dir in model_dirs().items():
        if wanted and name not in wanted:
            continue
        configs = {}
        try:
            probe = engine_config(model_dir, True, 0)
        except ValueError as exc:
            # CpuPlatform (0.30.0 and 0.34.0 at least) turns prefix caching off for an MLA hybrid (Kimi-Linear) after the Mamba block
            # was aligned for it, and its own validator then refuses the config: a CPU-only stop, recorded
            skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[1].strip() if chr(10) in str(exc) else exc}"
            print(name, "skipped:", skipped[name], flush=True)
            continue
        text = probe.model_config.hf_text_config
        kinds = set(getattr(text, "layer_types", None) or [])
        hybrid_mamba = "linear_attention" in kinds or hasattr(text, "is_kda_layer")
        sliding = "sliding_attention" in kinds or (not kinds and probe.model_config.get_sliding_window())
        for point in grid(probe.model_config.max_model_len, hybrid_mamba, bool(sliding)):
            key = (point["prefix_caching"], point["num_speculative_tokens"])
            if key not in configs:
                configs[key] = probe if key == (True, 0) else engine_config(model_dir, *key)
            points.append({"model": name, "settings": point, "result": plan(configs[key], point)})
        print(name, len(points), flush=True)
    write("vllm", "vllm", {"vllm": vllm.__version__, "transformers": transformers.__version__}, points, skipped)


if __name__ == "__main__":
    main()
