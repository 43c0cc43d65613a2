"""Child process of the SGLang pool probe: SGLang 0.5.23's own pool classes, built tiny on the CPU device.

Run with an interpreter that can import SGLang and its dependencies:

    python kvdoctor/engines/sglang/probe_child.py MODEL_DIR '{"tp_size": 1}'

It reaches SGLang's CUDA platform path through `shims/` (torch reports an H200; CUDA-only extension
packages import as placeholders; no kernel runs), resolves the server arguments and the model config with
SGLang's own code, builds the pools with `KVCacheConfigurator._init_pools` at 64 tokens (or 4 pages) and
4 requests, and writes one canary per layer through SGLang's own accessors (`get_key_buffer`,
`mamba2_layer_cache`). It prints one JSON object: where each canary landed. It imports nothing from
kvdoctor but the shims and its sibling `startup.py` (the dry run's child, which builds SGLang's pool
configurator the same way), both beside it, so it runs in any interpreter that has SGLang.
"""
from __future__ import annotations

import json
import os
import sys

from startup import api, configurator, install_shims  # type: ignore[import-not-found]  # beside this script

TOKENS, REQS = 64, 4


def build(model_dir: str, settings: dict):
    """SGLang's own start-up as far as the pools: returns (model_config, configurator, pools)."""
    import logging

    logging.disable(logging.WARNING)
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.kv_cache_configurator import _PoolSizes
    from sglang.srt.runtime_context import get_context, get_parallel, get_schedule
    from sglang.srt.server_args import ServerArgs

    tp = settings.get("tp_size") or 1
    sa = ServerArgs(model_path=model_dir, skip_tokenizer_init=True, load_format="dummy", **settings)
    api.resolve(sa)
    get_context().set_server_args(sa)
    api.pin_parallel(get_parallel(), attn_tp_size=tp, attn_dcp_size=1, attn_cp_size=1)
    mc = ModelConfig.from_server_args(sa)
    kvc, _ = configurator(sa, mc, window=None)
    # The pool configurator start-up picks (its constructor holds SGLang's own checks, e.g. that a hybrid-SWA
    # model has an SWA layer); its sizing needs the GPU profile and is not run.
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

    create_memory_pool_configurator(kvc)
    if kvc.mambaish_config is not None:
        get_context().override("kvdoctor.probe", max_mamba_cache_size=REQS)
    tokens = max(TOKENS, 4 * get_schedule().page_size)
    sizes = api.build(_PoolSizes, max_total_num_tokens=tokens, max_running_requests=REQS,
                      full_max_total_num_tokens=tokens if mc.is_hybrid_swa else None,
                      swa_max_total_num_tokens=tokens if mc.is_hybrid_swa else None,
                      c4_max_total_num_tokens=0, c128_max_total_num_tokens=0, c4_state_pool_size=0,
                      c128_state_pool_size=0, c4_state_dtype=None, c128_state_dtype=None)
    return mc, kvc, api.build(kvc._init_pools, sizes=sizes, req_to_token_pool=None, token_to_kv_pool_allocator=None)


def _buffers(kv) -> dict[str, list]:
    """The pool's own per-layer key buffers, by kvdoctor's pool label."""
    def keys(pool):
        return list(getattr(pool, "k_buffer", None) or getattr(pool, "kv_buffer", None) or [])

    label = "mla" if type(getattr(kv, "full_kv_pool", kv)).__name__.startswith("MLA") else "full"
    if hasattr(kv, "swa_kv_pool"):
        return {"full": keys(kv.full_kv_pool), "swa": keys(kv.swa_kv_pool)}
    return {label: keys(getattr(kv, "full_kv_pool", kv))}


def canaries(mc, pools) -> dict:
    """Write a distinct value through each layer's own accessor and find the buffer that holds it."""
    import torch

    kv, req = pools.token_to_kv_pool, pools.req_to_token_pool
    buffers = _buffers(kv)
    landed: dict[str, dict] = {}
    for layer_id in range(mc.num_hidden_layers):
        try:
            view = kv.get_key_buffer(layer_id)
        except (KeyError, IndexError, AssertionError, ValueError):
            continue
        for group in buffers.values():
            for b in group:
                b.zero_()
        view.view(view.shape[0], -1)[1, 0] = 1  # row 1: row 0 is SGLang's padding slot
        hits = [(pool, i) for pool, group in buffers.items() for i, b in enumerate(group)
                if bool((b.view(b.shape[0], -1)[1, 0] != 0).item())]
        landed[str(layer_id)] = {"hits": [list(h) for h in hits], "ptr": view.data_ptr()}
    mamba = getattr(req, "mamba_pool", None)
    if mamba is not None:
        conv = mamba.mamba_cache.conv
        conv = conv[0] if isinstance(conv, (list, tuple)) else conv
        for layer_id in range(mc.num_hidden_layers):
            try:
                cache = req.mamba2_layer_cache(layer_id)
            except (KeyError, IndexError, AssertionError, ValueError):
                continue
            conv.zero_()
            layer_conv = cache.conv[0] if isinstance(cache.conv, (list, tuple)) else cache.conv
            layer_conv.view(layer_conv.shape[0], -1)[1, 0] = 1
            flat = conv.view(conv.shape[0], conv.shape[1], -1)[:, 1, 0]
            hits = [("mamba", int(i)) for i in torch.nonzero(flat).flatten().tolist()]
            landed[str(layer_id)] = {"hits": [list(h) for h in hits], "ptr": layer_conv.data_ptr()}
    return {"token_to_kv_pool": type(kv).__name__, "req_to_token_pool": type(req).__name__,
            "pool_rows": {pool: [int(b.shape[0]) for b in group] for pool, group in buffers.items()},
            "layers": landed}


def main() -> None:
    model_dir, settings = sys.argv[1], json.loads(sys.argv[2])
    os.environ.pop("SGLANG_MAMBA_SSM_DTYPE", None)
    install_shims(settings.get("tp_size") or 1)
    try:
        mc, _, pools = build(model_dir, settings)
        out = {"ok": True, **canaries(mc, pools)}
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data, exactly
        out = {"ok": False, "error": {"class": type(exc).__name__, "message": str(exc)}}
    print("KVDOCTOR-PROBE " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
