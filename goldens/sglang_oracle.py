"""SGLang oracle: run an SGLang release's own pool sizing on every config over a grid of settings
(0.5.23's in goldens/.venv/sglang; goldens/releases.py runs it in each release's venv, and
kvdoctor/engines/sglang/shims/sglang_api.py adapts it to the release's API).

Run in goldens/.venv/sglang (see README.md). The platform is CUDA: `kvdoctor/engines/sglang/shims/
cudafake.py` makes torch report an H200 and `fakemods.py` beside it makes CUDA-only extension packages
importable (no kernel runs), so SGLang resolves what it resolves on a CUDA server: the Mamba radix-cache
strategy (`extra_buffer`, 5 state slots per request with the overlap scheduler), the chunked-prefill
size, the CUDA quantization registry. What comes from SGLang's code: the server-argument resolution
(`ServerArgs.resolve_once`), the model facts and the hybrid-SWA
allow-list (`ModelConfig.from_server_args`), the window the model class reports
(`get_attention_sliding_window_size`), and the sizing itself on a real `KVCacheConfigurator`:
`_handle_max_mamba_cache` (state slots), `config_from_budget` (pool configurators, token cap,
page alignment) and `resolve_max_num_reqs` (at 0.5.15 `ModelRunner`'s own, through the adapter's
`RunnerSizing`). What the script supplies: the memory left after
weights (the engine profiles it on the GPU) and the page size the attention backend would pick.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "kvdoctor" / "engines" / "sglang" / "shims"), str(HERE / "stubs")]

import sglang_api as api  # noqa: E402
from common import GiB, contexts, max_position, model_dirs, only_models, write  # noqa: E402

BUDGETS_GIB = (4, 20, 40, 120)
MiB = 1 << 20


def grid(limit: int, hybrid_swa: bool, mamba: bool, sliding: bool) -> list[dict]:
    base = {"page_size": 1, "swa_full_tokens_ratio": 0.8, "kv_cache_dtype": "auto", "tp": 1,
            "max_mamba_cache_size": None, "mamba_full_memory_ratio": 0.9, "mamba_ssm_dtype": None,
            "radix_cache": True, "max_running_requests": None, "max_total_tokens": None,
            "disable_hybrid_swa_memory": False}
    points = [{**base, "context_length": length, "kv_budget_bytes": gib * GiB}
              for length in contexts(limit) for gib in BUDGETS_GIB]
    anchor = {**base, "context_length": min(131072, limit), "kv_budget_bytes": 40 * GiB}
    variations = [{"page_size": 16}, {"page_size": 64}, {"kv_cache_dtype": "fp8_e4m3"}, {"tp": 2}, {"tp": 4},
                  {"max_running_requests": 256}, {"max_total_tokens": 100000}, {"kv_budget_bytes": 1 * GiB},
                  {"kv_budget_bytes": 256 * MiB}, {"kv_budget_bytes": 1 * MiB}]
    if hybrid_swa:
        variations += [{"swa_full_tokens_ratio": r} for r in (0.1, 0.2, 0.5, 1.0)]
        variations += [{"swa_full_tokens_ratio": 0.2, "page_size": 64},
                       {"swa_full_tokens_ratio": 0.1, "kv_budget_bytes": 32 * MiB},
                       {"swa_full_tokens_ratio": 0.5, "page_size": 64, "kv_budget_bytes": 16 * MiB},
                       {"disable_hybrid_swa_memory": True},
                       {"radix_cache": False, "max_running_requests": 64},
                       {"radix_cache": False, "max_running_requests": 2048, "kv_budget_bytes": 1 * GiB},
                       {"max_total_tokens": 1000, "swa_full_tokens_ratio": 0.1}]
    if sliding and not hybrid_swa:
        variations += [{"swa_full_tokens_ratio": 0.1}]  # ignored: no separate SWA pool
    if mamba:
        variations += [{"max_mamba_cache_size": 64}, {"max_mamba_cache_size": 64, "kv_budget_bytes": 4 * GiB},
                       {"radix_cache": False}, {"radix_cache": False, "max_running_requests": 48},
                       {"mamba_ssm_dtype": "bfloat16"}, {"mamba_full_memory_ratio": 0.5},
                       {"mamba_full_memory_ratio": 2.0, "kv_budget_bytes": 4 * GiB},
                       {"kv_budget_bytes": 64 * MiB}, {"max_running_requests": 8, "kv_budget_bytes": 4 * GiB}]
    points += [{**anchor, **v} for v in variations]
    return points


def server_args(model_dir: Path, point: dict):
    from sglang.srt.server_args import ServerArgs

    kwargs = dict(model_path=str(model_dir), skip_tokenizer_init=True, load_format="dummy", tp_size=point["tp"],
                  page_size=point["page_size"], context_length=point["context_length"],
                  swa_full_tokens_ratio=point["swa_full_tokens_ratio"],
                  mamba_full_memory_ratio=point["mamba_full_memory_ratio"],
                  disable_radix_cache=not point["radix_cache"], kv_cache_dtype=point["kv_cache_dtype"],
                  disable_hybrid_swa_memory=point["disable_hybrid_swa_memory"])
    for key in ("max_mamba_cache_size", "max_running_requests", "max_total_tokens", "mamba_ssm_dtype"):
        if point[key] is not None:
            kwargs[key] = point[key]
    return ServerArgs(**kwargs)


def window_the_model_reports(model_config):
    """`resolve_sliding_window_size` without instantiating the model: the model class's own
    `get_attention_sliding_window_size` (gpt-oss reports window - 1), else the config's rule."""
    for arch in model_config.hf_config.architectures:
        try:
            module = importlib.import_module(f"sglang.srt.models.{model_config.hf_config.model_type}")
        except ImportError:
            break
        method = getattr(getattr(module, arch, None), "get_attention_sliding_window_size", None)
        if method is not None:
            return method(types.SimpleNamespace(config=model_config.hf_text_config))
    if model_config.is_hybrid_swa and model_config.sliding_window_size is not None:
        return model_config.sliding_window_size
    return model_config.attention_chunk_size


def plan(model_dir: Path, point: dict) -> dict:
    import cudafake
    import torch
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.runtime_context import get_context, get_parallel
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    out: dict = {}
    try:
        os.environ.pop("SGLANG_MAMBA_SSM_DTYPE", None)
        cudafake.install(devices=point["tp"])
        sa = server_args(model_dir, point)
        api.resolve(sa)  # what the launcher does: backend, Mamba cache strategy, chunk size, validation, env
        get_context().set_server_args(sa)
        api.pin_parallel(get_parallel(), attn_tp_size=point["tp"], attn_dcp_size=1, attn_cp_size=1)
        mc = ModelConfig.from_server_args(sa)
        kv_dtype = mc.dtype if point["kv_cache_dtype"] == "auto" else torch.float8_e4m3fn
        resolved = api.resolved(sa)
        n = mc.num_hidden_layers
        swa_ids, full_ids = api.layer_ids(mc)
        layers = api.layers(start_layer=0, end_layer=n, num_effective_layers=n, swa_attention_layer_ids=swa_ids,
                            full_attention_layer_ids=full_ids)
        kvc = api.configurator(
            point["tp"], device="cpu", gpu_id=0, pp_size=1, pp_group=None, model=None, model_config=mc,
            server_args=sa, kv_cache_dtype=kv_dtype, kv_cache_dtype_str=point["kv_cache_dtype"],
            model_dtype=mc.dtype, page_size=point["page_size"], sliding_window_size=window_the_model_reports(mc),
            spec_algorithm=SpeculativeAlgorithm.NONE, is_draft_worker=False, post_capture_kv_active=False,
            is_hybrid_swa=mc.is_hybrid_swa,
            is_hybrid_swa_compress=False, use_mla_backend=mc.attention_arch == AttentionArch.MLA,
            layer_info=layers, forward_stream=None, req_to_token_pool=None, token_to_kv_pool_allocator=None,
            memory_pool_config=None)
        schedule = api.group("schedule", sa)
        out.update(is_hybrid_swa=bool(mc.is_hybrid_swa), sliding_window_size=kvc.sliding_window_size,
                   overlap_schedule=not schedule.disable_overlap_schedule,
                   chunked_prefill_size=resolved.get("chunked_prefill_size"),
                   mamba_radix_cache_strategy=resolved.get("mamba_radix_cache_strategy"),
                   dtype=str(mc.dtype).replace("torch.", ""))
        rest = point["kv_budget_bytes"] / (1 << 30)
        if kvc.mambaish_config is not None:
            params = kvc.mambaish_config.mamba2_cache_params
            out["mamba_cache_per_req"] = params.mamba_cache_per_req
            out["ssm_dtype"] = str(params.dtype.temporal).replace("torch.", "")
            rest = kvc._handle_max_mamba_cache(rest)
            out["mamba_ratio"] = kvc._calculate_mamba_ratio()
            out["max_mamba_cache_size"] = schedule.max_mamba_cache_size
        available = int(rest * (1 << 30))
        config = kvc.config_from_budget(available)
        out.update(max_total_num_tokens=config.max_total_num_tokens,
                   full_max_total_num_tokens=config.full_max_total_num_tokens,
                   swa_max_total_num_tokens=config.swa_max_total_num_tokens)
        out["max_running_requests"] = kvc.resolve_max_num_reqs(config.max_total_num_tokens)
    except (ValueError, RuntimeError, AssertionError) as exc:
        out["error"] = {"class": type(exc).__name__, "message": str(exc)}
    return out


def main() -> None:
    logging.disable(logging.WARNING)
    import cudafake
    import fakemods

    cudafake.install()
    fakemods.install()
    import sglang

    wanted = only_models()
    points = []
    for name, model_dir in model_dirs().items():
        if wanted and name not in wanted:
            continue
        probe = plan(model_dir, grid(max_position(model_dir), False, False, False)[0])
        text = json.loads((model_dir / "config.json").read_text())
        text = text.get("text_config") or text
        mamba = "mamba_cache_per_req" in probe
        sliding = bool(text.get("sliding_window")) and text.get("use_sliding_window", True) is not False
        for point in grid(max_position(model_dir), probe.get("is_hybrid_swa", False), mamba, sliding):
            points.append({"model": name, "settings": point, "result": plan(model_dir, point)})
        print(name, len(points), flush=True)
    write("sglang", "sglang", {"sglang": sglang.__version__}, points)


if __name__ == "__main__":
    main()
