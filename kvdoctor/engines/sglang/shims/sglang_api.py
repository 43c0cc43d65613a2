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
- 0.5.15 (and 0.5.15.post1) have no `KVCacheConfigurator`: the pools are sized and built by `ModelRunner`'s mixin
  (`model_executor/model_runner_kv_cache_mixin.py`), which these oracles do not drive yet.
"""
from __future__ import annotations

import inspect


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


def configurator(tp: int, **kwargs):
    """A `KVCacheConfigurator` of this release: with a trivial `ParallelState` of `tp` attention ranks where the
    release takes one (up to 0.5.19), else with `attn_dp_size`."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

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
    (0.5.17 on), else `ServerArgs.override`, which the configurator reads before."""
    from sglang.srt.runtime_context import get_context

    context = get_context()
    if hasattr(context, "override"):
        context.override(source, **fields)
    else:
        server_args.override(source=source, **fields)


_OPEN: list = []


def pin_parallel(parallel, **fields) -> None:
    """What the attention widths are for the rest of the run (no process groups exist): `override_permanently`
    from 0.5.21; before, the `override` context entered and left open, with the fields that release knows."""
    if hasattr(type(parallel), "override_permanently"):
        parallel.override_permanently(**fields)
        return
    import sglang.srt.runtime_context as runtime

    known = getattr(runtime, "_PARALLEL_FIELDS", set(fields))
    context = parallel.override(**{k: v for k, v in fields.items() if k in known})
    context.__enter__()
    _OPEN.append(context)  # a collected generator context would run its `finally` and drop the override
