"""What differs in SGLang's own API between the profiled releases (0.5.15 to 0.5.23): the one adapter, used by the
dry run's child (startup.py, and probe_child.py through it) and by the two golden oracles (goldens/sglang_oracle.py,
goldens/sglang_check_oracle.py), so that each runs on the release it finds. It imports nothing but the standard
library until it is called (then SGLang), and is imported as a top-level module from this folder.

Each adaptation asks the release for what it has rather than naming versions:
- `KVCacheConfigurator` takes a `ParallelState` (`ps`) up to 0.5.19 and the attention-DP size (`attn_dp_size`)
  after; its other fields come and go (`is_hybrid_swa_compress`, `memory_pool_config`, ...): `build` passes the
  fields the release's dataclass declares.
- `ModelLayerInfo` carries the SWA / full layer ids from 0.5.21; `resolve_layer_indices` wants the speculative
  algorithm up to 0.5.19: both get the arguments their release declares.
- `ModelConfig` has `swa_attention_layer_ids` only for hybrid-SWA models before 0.5.21 (`layer_ids`).
- `ServerArgs` resolves itself in `__post_init__` up to 0.5.17 (environment variables included) and in
  `resolve_once` after; `resolved_dict` arrives with `resolve_once` (`resolve`, `resolved`).
- The attention widths are pinned with `override_permanently` from 0.5.21, with the `override` context
  before, held open for the rest of the process (`pin_parallel`).
- The resolved settings groups (`get_schedule()`, `get_model()`) arrive in 0.5.17; 0.5.16's configurator reads the
  same fields from the server arguments (`group`), and a setting is changed for the rest of the run with the
  context's `override` from 0.5.17 and `ServerArgs.override` before (`override`).
- 0.5.15 (and 0.5.15.post1) have no `KVCacheConfigurator` (mem_cache/kv_cache_configurator.py arrives in 0.5.16):
  `ModelRunner` sizes and builds the pools itself (its mixin, model_executor/model_runner_kv_cache_mixin.py), and
  works out the layer range, the window and the KV dtype inline (`initialize`, `load_model`,
  `configure_kv_cache_dtype`) where 0.5.16 has functions (`resolve_layer_indices`, `resolve_sliding_window_size`,
  `mem_cache/kv_cache_dtype.py`). `configurator` then returns a `RunnerSizing`: a `ModelRunner` whose `__init__`
  is not run, holding what those steps set, behind the configurator's method names; `layer_indices`,
  `sliding_window`, `kv_cache_dtype`, `pool_sizes` and `pool_configurator` give either release's answer.
"""
from __future__ import annotations

import importlib.util
import inspect
import types


def accepted(fn, kwargs: dict) -> dict:
    """The keyword arguments among `kwargs` that `fn` (a function, a dataclass or a msgspec Struct) declares."""
    fields = getattr(fn, "__struct_fields__", None)
    if fields is None and hasattr(fn, "__dataclass_fields__"):  # SGLang's dataclasses: the fields __init__ takes
        fields = [name for name, f in fn.__dataclass_fields__.items() if f.init]
    if fields is None:
        params = inspect.signature(fn).parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return dict(kwargs)
        fields = list(params)
    return {k: v for k, v in kwargs.items() if k in fields}


def build(fn, **kwargs):
    """`fn(**kwargs)` with only the arguments this release's `fn` declares."""
    return fn(**accepted(fn, kwargs))


def has_configurator() -> bool:
    """Whether the release sizes its pools in a `KVCacheConfigurator` (0.5.16 on) rather than in `ModelRunner`."""
    return importlib.util.find_spec("sglang.srt.mem_cache.kv_cache_configurator") is not None


def configurator(tp: int, **kwargs):
    """A `KVCacheConfigurator` of this release: with a trivial `ParallelState` of `tp` attention ranks where the
    release takes one (up to 0.5.19), else with `attn_dp_size`; at 0.5.15 a `RunnerSizing`."""
    if not has_configurator():
        return RunnerSizing(tp, **kwargs)
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import SpecAuxHiddenStateConfig

    kwargs.setdefault("spec_aux_config", SpecAuxHiddenStateConfig())

    names = accepted(KVCacheConfigurator, {"ps": None, "attn_dp_size": None})
    if "ps" in names:
        from sglang.srt.distributed.parallel_state_wrapper import ParallelState

        kwargs["ps"] = build(ParallelState.trivial, tp_size=tp, attn_tp_size=tp)
    kwargs.setdefault("attn_dp_size", 1)
    return build(KVCacheConfigurator, **kwargs)


def resolve(server_args) -> None:
    """What the launcher does to the server arguments: `resolve_once` and the environment variables they set
    (--mamba-ssm-dtype becomes SGLANG_MAMBA_SSM_DTYPE); up to 0.5.17 the constructor did both."""
    if hasattr(server_args, "resolve_once"):
        server_args.resolve_once()
        from sglang.srt.arg_groups.serving_hook import handle_environment_variables

        handle_environment_variables(server_args)


def resolved(server_args) -> dict:
    """The resolved server arguments: `resolved_dict`, or the resolved view's fields up to 0.5.17."""
    if hasattr(server_args, "resolved_dict"):
        return server_args.resolved_dict()
    view = server_args._resolved() if hasattr(server_args, "_resolved") else server_args
    return {name: getattr(view, name, None) for name in type(server_args).__dataclass_fields__}


def layer_ids(mc) -> tuple[list[int] | None, list[int] | None]:
    """The model's SWA and full-attention layer ids (None where this release leaves them unset)."""
    return getattr(mc, "swa_attention_layer_ids", None), getattr(mc, "full_attention_layer_ids", None)


def group(name: str, server_args):
    """The resolved settings group `name` ("schedule", "model"): `get_<name>()` where the release has it (0.5.17
    on), else the server arguments, which carry the same fields."""
    import sglang.srt.runtime_context as runtime

    getter = getattr(runtime, f"get_{name}", None)
    return getter() if getter is not None else server_args


def override(server_args, source: str, **fields) -> None:
    """Change resolved settings for the rest of the run: the runtime context's `override` where the release has it
    (0.5.17 on), else `ServerArgs.override`, which the configurator reads before (0.5.16), else the field."""
    from sglang.srt.runtime_context import get_context

    context = get_context()
    if hasattr(context, "override"):
        context.override(source, **fields)
    elif hasattr(server_args, "override"):
        server_args.override(source=source, **fields)
    else:  # 0.5.15: the runner assigns the field itself (model_runner_kv_cache_mixin.py handle_max_mamba_cache)
        for name, value in fields.items():
            setattr(server_args, name, value)


_OPEN: list = []


def pin_parallel(parallel, **fields) -> None:
    """What the attention widths are for the rest of the run (no process groups exist): `override_permanently`
    from 0.5.21; before, the `override` context entered and left open, with the fields that release knows. 0.5.15's
    pool and state-shape code reads the attention TP width from the process group (`get_attention_tp_size`,
    layers/dp_attention.py:339 at 0.5.15, gone in 0.5.16): a stand-in group of that width."""
    if hasattr(type(parallel), "override_permanently"):
        parallel.override_permanently(**fields)
        return
    import sglang.srt.runtime_context as runtime
    from sglang.srt.layers import dp_attention

    if hasattr(dp_attention, "get_attention_tp_size"):  # 0.5.15: its pool code asks the process group itself
        from sglang.srt.distributed import parallel_state

        parallel_state._ATTN_TP = types.SimpleNamespace(world_size=fields["attn_tp_size"], rank_in_group=0)

    known = getattr(runtime, "_PARALLEL_FIELDS", set(fields))
    context = parallel.override(**{k: v for k, v in fields.items() if k in known})
    context.__enter__()
    _OPEN.append(context)  # a collected generator context would run its `finally` and drop the override


def layers(**fields):
    """The runner's layer range (`ModelLayerInfo` from 0.5.16, which declares the fields it takes; 0.5.15 keeps
    them on the runner: a namespace)."""
    try:
        from sglang.srt.model_executor.model_runner_components.layer_setup import ModelLayerInfo
    except ImportError:
        return types.SimpleNamespace(**fields)
    return build(ModelLayerInfo, **fields)


def layer_indices(mc):
    """The target worker's layer range without a model (no pipeline stages): `resolve_layer_indices` from 0.5.16;
    at 0.5.15 `ModelRunner.initialize` works it out inline (model_runner.py:744-767 at 0.5.15), by the same rule:
    every hidden or attention layer (one for the MTP-only architectures), times `loop_num` for LoopCoder."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    try:
        from sglang.srt.model_executor.model_runner_components.layer_setup import resolve_layer_indices
    except ImportError:
        count = max(mc.num_hidden_layers, mc.num_attention_layers)
        if mc.hf_config.architectures[0] in ("MiMoV2MTP", "Step3p5MTP"):
            count = 1
        loops = getattr(mc.hf_config, "loop_num", 1)
        return types.SimpleNamespace(start_layer=0, end_layer=count,
                                     num_effective_layers=count * (loops if loops > 1 else 1))
    return build(resolve_layer_indices, model=types.SimpleNamespace(), model_config=mc, is_draft_worker=False,
                 spec_algorithm=SpeculativeAlgorithm.NONE)


def sliding_window(model, mc):
    """The window the runner sizes the SWA pool with: `resolve_sliding_window_size` from 0.5.16; at 0.5.15
    `ModelRunner.load_model` decides it inline (model_runner.py:1556-1569 at 0.5.15), in the same order: the
    model class's `get_attention_sliding_window_size`, a hybrid-SWA model's window, the attention chunk."""
    try:
        from sglang.srt.model_executor.model_runner_components.load_model_utils import resolve_sliding_window_size
    except ImportError:
        if hasattr(model, "get_attention_sliding_window_size"):
            return model.get_attention_sliding_window_size()
        if mc.is_hybrid_swa and mc.sliding_window_size is not None:
            return mc.sliding_window_size
        return mc.attention_chunk_size
    return resolve_sliding_window_size(model, mc)


def kv_cache_dtype(server_args, mc) -> tuple[str | None, object]:
    """The KV cache dtype the runner resolves without a model (no checkpoint KV scales): (the resolved string where
    the release returns one, the torch dtype). `mem_cache/kv_cache_dtype.py` from 0.5.16; at 0.5.15 the runner's
    own `configure_kv_cache_dtype`, run on a bare runner."""
    try:
        from sglang.srt.mem_cache import kv_cache_dtype as kvd
    except ImportError:
        from sglang.srt.model_executor.model_runner import ModelRunner

        runner = object.__new__(ModelRunner)
        runner.__dict__.update(server_args=server_args, model=None, dtype=mc.dtype)
        ModelRunner.configure_kv_cache_dtype(runner)
        return None, runner.kv_cache_dtype
    return build(kvd.configure_kv_cache_dtype, server_args_kv_cache_dtype=group("model", server_args).kv_cache_dtype,
                 model=None, model_dtype=mc.dtype, is_draft_worker=False, is_dflash=False,
                 speculative_draft_attention_backend=None)


def pool_sizes(**fields):
    """The pool sizes `_init_pools` takes (`_PoolSizes` from 0.5.16, which declares the fields it takes; a
    namespace for `RunnerSizing`)."""
    if not has_configurator():
        return types.SimpleNamespace(**fields)
    from sglang.srt.mem_cache.kv_cache_configurator import _PoolSizes

    return build(_PoolSizes, **fields)


def pool_configurator(kvc):
    """The release's memory-pool configurator (model_executor/pool_configurator.py) for `kvc`: it reads the
    configurator from 0.5.16, the model runner at 0.5.15."""
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

    return create_memory_pool_configurator(kvc.runner if isinstance(kvc, RunnerSizing) else kvc)


class RunnerSizing:
    """0.5.15's pool sizing, which lives on `ModelRunner` (model_executor/model_runner_kv_cache_mixin.py): a runner
    whose `__init__` is not run, holding the attributes that `__init__`, `initialize` and `load_model` set and the
    sizing reads, behind the names 0.5.16's `KVCacheConfigurator` gives the same steps."""

    def __init__(self, tp: int, *, model_config, server_args, kv_cache_dtype, page_size, sliding_window_size,
                 spec_algorithm, is_draft_worker, is_hybrid_swa, use_mla_backend, layer_info, device, gpu_id,
                 **_unused):
        from sglang.srt.model_executor import model_runner

        runner = object.__new__(model_runner.ModelRunner)
        runner.__dict__.update(
            server_args=server_args, model_config=model_config, device=device, gpu_id=gpu_id, tp_size=tp,
            dp_size=server_args.dp_size if server_args.enable_dp_attention else 1, pp_size=1, pp_group=None,
            dcp_size=server_args.dcp_size, page_size=page_size, kv_cache_dtype=kv_cache_dtype,
            dtype=model_config.dtype, sliding_window_size=sliding_window_size, spec_algorithm=spec_algorithm,
            is_draft_worker=is_draft_worker, is_hybrid_swa=is_hybrid_swa, use_mla_backend=use_mla_backend,
            is_hybrid_swa_compress=getattr(model_config, "is_hybrid_swa_compress", False),
            start_layer=layer_info.start_layer, end_layer=layer_info.end_layer,
            num_effective_layers=layer_info.num_effective_layers, enable_hisparse=server_args.enable_hisparse,
            mem_fraction_static=server_args.mem_fraction_static, memory_pool_config=None, forward_stream=None,
            req_to_token_pool=None, token_to_kv_pool_allocator=None, eagle_draft_num_layers=None,
            dflash_draft_num_layers=None, _linear_attn_registry_cache=model_runner._UNSET)
        runner.adjust_hybrid_swa_layers_for_pp()  # what initialize does next (a no-op without pipeline stages)
        self.runner = runner

    @property
    def server_args(self):
        return self.runner.server_args

    @property
    def mambaish_config(self):
        return self.runner.mambaish_config

    @property
    def hybrid_gdn_config(self):
        return self.runner.hybrid_gdn_config

    @property
    def sliding_window_size(self):
        return self.runner.sliding_window_size

    def _handle_max_mamba_cache(self, rest_gib: float) -> float:
        return self.runner.handle_max_mamba_cache(rest_gib)

    def _calculate_mamba_ratio(self) -> int:
        return self.runner._calculate_mamba_ratio()

    def config_from_budget(self, budget_bytes: int):
        """What `_resolve_memory_pool_config` does with the profiled bytes before the request cap: the pool
        configurator's sizes, redone at the user's --max-total-tokens where that is lower."""
        pools = pool_configurator(self)
        page = self.runner.server_args.page_size
        config = pools.calculate_pool_sizes(budget_bytes, page)
        capped = self.runner._apply_token_constraints(config.max_total_num_tokens)
        if capped != config.max_total_num_tokens:
            config = pools.calculate_pool_sizes_from_max_tokens(capped, page)
        return config

    def resolve_max_num_reqs(self, tokens: int) -> int:
        return self.runner._resolve_max_num_reqs(tokens)

    def _init_pools(self, *, sizes, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        """The runner's `_init_pools` at `sizes` (set as `_apply_memory_pool_config` sets them): the pools built."""
        runner = self.runner
        runner.__dict__.update(vars(sizes), req_to_token_pool=req_to_token_pool,
                               token_to_kv_pool_allocator=token_to_kv_pool_allocator)
        runner._init_pools()
        return types.SimpleNamespace(req_to_token_pool=runner.req_to_token_pool,
                                     token_to_kv_pool=runner.token_to_kv_pool,
                                     token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator)
