"""`--engine sglang --dry-run`: SGLang's own CUDA start-up (startup.py) in a child process, and what it tells us.

kvdoctor's process never imports SGLang. The child runs in a Python that has a profiled SGLang release
(`--engine-python`, else $KVDOCTOR_SGLANG_PYTHON, else this checkout's goldens/.venv/sglang; startup.py adapts to
each release's API through shims/sglang_api.py, as the golden oracles do), bounded in
time (its process group is killed) and in address space, on a temporary directory holding only the
model's config.json (no weights; the model's own directory is never written). Nothing is shrunk: SGLang
reads the layer count and head geometry to decide pools and maps, the pools are built at a few hundred
token rows, and no weight is ever allocated.

Its outcome is an observation, held against the plan here (`disagreements`: start-up outcome, hybrid-SWA
decision, SWA / full layer ids, runner window, pool classes, each layer's pool and buffer index, buffer
and state shapes and dtypes, pool tokens and max running requests at the deploy's `kv_budget`, the keys a
layer's attention reads); kvdoctor.checks.dryrun_sglang turns it into findings.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Mapping

from kvdoctor.engines.base import DryRun, DryRunError, DryRunner, Plan, stages_reached
from kvdoctor.engines.child import STUBS, find_python, run_child
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.sglang import archs
from kvdoctor.model import ModelSpec

CHILD = Path(__file__).resolve().parent / "startup.py"
ENV_PYTHON = "KVDOCTOR_SGLANG_PYTHON"
DEFAULT_TIMEOUT = 300.0
DEFAULT_BUDGET = 40 << 30  # sizing needs a number; the deploy's kv_budget when given (and only then compared)
IMPORT_SECONDS, IMPORT_BYTES = 15.0, 600 << 20  # SGLang + torch import on one core, measured (docs/sglang.md)
# The child's steps, in order (startup.py); pools and window reads run once SGLang has started.
STAGES = ("server_args", "model_config", "model_arch", "model_window", "configurator", "sizing", "pools", "window_reads")
COMPARED = ("start-up outcome", "hybrid-SWA decision", "SWA and full layer ids", "runner window", "KV dtype",
            "pools and buffers", "state shapes", "sizes at the deploy's kv_budget", "keys each window read")


def server_args(settings: Any) -> dict[str, Any]:
    """The deploy section as ServerArgs keyword arguments (only the ones set)."""
    return settings.server_args()


def estimate(spec: ModelSpec, plan: Plan[Any]) -> dict[str, Any]:
    """What the child will cost, before it runs: the import, the tiny pools and the window-read scores."""
    pools = getattr(plan.facts, "pools", None)
    window = getattr(pools, "runner_sliding_window", None)
    length = window + 1 + 64 if window is not None and window >= 0 else 128  # startup.window_request
    tokens = max(256, length + 2 + 64)  # startup.run: the request and an earlier one
    per_token = 0
    for layer in spec.layers:
        heads, dim = layer.n_kv_heads or 1, (layer.head_dim or 0) + (layer.v_head_dim or layer.head_dim or 0)
        per_token += heads * dim * 2
    scores = 4 * (tokens ** 2) * max((l.n_kv_heads or 1) for l in spec.layers) if spec.layers else 0
    return {"seconds": IMPORT_SECONDS, "bytes": IMPORT_BYTES + per_token * tokens + 2 * scores,
            "pool_tokens": tokens}


def planned_sliding(plan: Plan[Any]) -> list[int]:
    """The layers the static plan gives a window: the child reads one of them when SGLang lists no SWA ids
    (hybrid-SWA memory off)."""
    return [l.index for l in plan.layers if l.engine_window is not None]


def launch(spec: ModelSpec, args: dict[str, Any], budget: int, python: Path, timeout: float = DEFAULT_TIMEOUT,
           planned_sliding: list[int] | None = None, release: str | None = None) -> dict[str, Any]:
    """Run the child; returns its result with `timed_out`, `returncode`, `seconds` and `stderr_tail`. `release`:
    the SGLang release the plan describes, whose registry says which architectures SGLang serves natively."""
    with tempfile.TemporaryDirectory(prefix="kvdoctor-sglang-dryrun-") as tmp:
        model_dir = Path(tmp) / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(spec.raw_config))
        request = {"model_dir": str(model_dir), "server_args": args, "kv_budget_bytes": budget,
                   "planned_sliding_layers": planned_sliding or [],
                   "native_architectures": sorted(archs.registry(release or PINS["sglang"])["architectures"])}
        env = {"TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(STUBS)}
        # one warm child per tp size: the shims make torch report that many devices before SGLang imports
        return run_child(python, CHILD, Path(tmp), request, env, timeout, warm_key={"tp_size": args.get("tp_size") or 1})


class SglangDryRunner(DryRunner):
    """`--dry-run` for `--engine sglang`: the child's result as a record, with the estimate made before it
    ran, or an unavailable one without an SGLang Python (the rule reports ENG050 then)."""

    def run(self, spec: ModelSpec, settings: Any, plan: Plan[object], options: Mapping[str, Any]) -> DryRun:
        python = find_python(options.get("engine_python"), ENV_PYTHON, "sglang")
        if python is None:
            return DryRun(engine="sglang", outcome="unavailable", reason=f"no Python with SGLang "
                          f"{settings.release or PINS['sglang']} "
                          f"found (run `kvdoctor engines install sglang`, or give --engine-python, or set "
                          f"{ENV_PYTHON})")
        cost = estimate(spec, plan)
        result = launch(spec, server_args(settings), settings.kv_budget or DEFAULT_BUDGET, python,
                        timeout=options.get("dry_run_timeout") or DEFAULT_TIMEOUT,
                        planned_sliding=planned_sliding(plan), release=settings.release)
        return record(plan, {**result, "estimate": cost, "budget_from_deploy": settings.kv_budget is not None,
                             "python": str(python)})


def record(plan: Plan[Any], result: dict[str, Any]) -> DryRun:
    """The child's result as the dry-run record every engine gives: what SGLang decided, the cost, and the
    differences from the plan."""
    outcome = result.get("outcome")
    common: dict[str, Any] = {"engine": "sglang", "versions": result.get("versions") or {},
                              "seconds": result.get("seconds"), "stderr_tail": result.get("stderr_tail", ""),
                              "python": result.get("python"), "observation": result}
    done = result.get("stages") or []
    if outcome is None:  # the child ended before SGLang's start-up did
        why = "timed out" if result.get("timed_out") else f"exited with {result.get('returncode')}"
        return DryRun(outcome="timeout" if result.get("timed_out") else "crashed", reason=why,
                      stages=stages_reached(STAGES, done), **common)
    error = None
    if not outcome["start"]:
        error = DryRunError(outcome["class"], outcome["message"], outcome["step"],
                            outcome.get("raised_at_sglang") or outcome.get("raised_at"))
    keep = ("server_args", "model", "kv_cache_dtype", "state", "sizing", "window_reads", "window_reads_skipped",
            "pools_error", "estimate")
    extra = {k: result[k] for k in keep if k in result}
    pools = result.get("pools")
    if pools:
        extra["pools"] = {k: pools[k] for k in ("tokens", "req_to_token_pool", "allocator", "token_to_kv_pool",
                                                "mamba_pool", "placements") if k in pools}
    return DryRun(outcome="clean" if error is None else "error", error=error,
                  stages=stages_reached(STAGES, done, None if error is None else error.stage),
                  compared=COMPARED, differences=disagreements(plan, result), extra=extra, **common)


def startup_refusals(plan: Plan[Any]) -> list[Any]:
    """The refusals the child can meet: the CUDA plan's own (the KDA ReplaySSM flags are not passed)."""
    return [r for r in plan.refusals if r.code.startswith("SGL") and not r.latent and r.stage == "startup"]


def sizing_at_default(outcome: dict[str, Any], result: dict[str, Any]) -> bool:
    """A sizing refusal at kvdoctor's own default budget says nothing about the deploy."""
    return outcome.get("step") == "sizing" and not result.get("budget_from_deploy")


def _ids(value: Any) -> list[int] | None:
    return None if value is None else [int(i) for i in value]


def disagreements(plan: Plan[Any], result: dict[str, Any]) -> list[str]:
    """What the static plan got wrong, by SGLang's own answer; empty when they agree."""
    outcome = result["outcome"]
    predicted = startup_refusals(plan)
    if sizing_at_default(outcome, result):
        outcome = {"start": True}
    failed = result.get("pools_error") or {}
    if outcome["start"] and predicted and failed.get("raised_at_sglang") \
            and (failed.get("class"), failed.get("message")) == (predicted[0].error_class, predicted[0].message):
        return []  # sized, then SGLang's own pool build raised what the plan predicts (DeepSeek-V4, SGL306)
    if outcome["start"] == bool(predicted):
        said = "start" if not predicted else f"{predicted[0].error_class}: {predicted[0].message[:120]}"
        did = "started" if outcome["start"] else f"{outcome['class']}: {outcome['message'][:120]}"
        return [f"start-up: plan {said}; SGLang {did}"]
    if not outcome["start"]:
        mine = (predicted[0].error_class, predicted[0].message)
        theirs = (outcome["class"], outcome["message"])
        return [] if mine == theirs else [f"start-up refusal: plan {mine[0]}: {mine[1][:120]}; SGLang "
                                          f"{theirs[0]}: {theirs[1][:120]}"]
    facts = getattr(plan.facts, "pools", None)
    if facts is None or "model" not in result:
        return []
    out: list[str] = []
    model = result["model"]

    def differ(what: str, mine: Any, theirs: Any) -> None:
        if mine != theirs:
            out.append(f"{what}: plan {mine}, SGLang {theirs}")

    differ("attention arch", facts.attention_arch, model["attention_arch"])
    differ("hybrid-SWA memory", facts.hybrid_swa, model["is_hybrid_swa"])
    differ("SWA layer ids", _ids(facts.swa_layer_ids), _ids(model["swa_attention_layer_ids"]))
    differ("full layer ids", _ids(facts.full_layer_ids), _ids(model["full_attention_layer_ids"]))
    differ("runner window (window_left)", facts.runner_sliding_window, model["runner_sliding_window_size"])
    differ("KV dtype", facts.kv_cache_dtype, result.get("kv_cache_dtype"))
    pools = result.get("pools")
    if pools:
        out += _pool_differences(plan, facts, pools)
    out += _budget_differences(facts, result)
    out += _read_differences(plan, result)
    return out


def _pool_differences(plan: Plan[Any], facts: Any, pools: dict[str, Any]) -> list[str]:
    out = []
    kv = pools["token_to_kv_pool"]
    if facts.pools.get("token_to_kv_pool") != kv["class"]:
        out.append(f"token-to-KV pool: plan {facts.pools.get('token_to_kv_pool')}, SGLang {kv['class']}")
    if facts.pools.get("req_to_token_pool") != pools["req_to_token_pool"]:
        out.append(f"request pool: plan {facts.pools.get('req_to_token_pool')}, SGLang {pools['req_to_token_pool']}")
    theirs = {int(k): tuple(v) for k, v in pools["placements"].items()}
    mine = {l.index: (l.extra["pool"], l.extra["pool_index"]) for l in plan.layers if "pool" in l.extra}
    wrong = [i for i in sorted(set(mine) | set(theirs)) if mine.get(i) != theirs.get(i)]
    if wrong:
        i = wrong[0]
        out.append(f"layer -> pool buffer for {len(wrong)} layer(s), first layer {i}: plan {mine.get(i)}, "
                   f"SGLang {theirs.get(i)}")
    for sub, label in (("full_kv_pool", "attention_buffer_per_token"), ("swa_kv_pool", "swa_buffer_per_token")):
        pool = kv.get(sub) or (kv if sub == "full_kv_pool" else None)
        buffer = facts.pools.get(label)
        if pool is None or buffer is None:
            continue
        for name in ("k_buffer", "v_buffer", "kv_buffer"):
            if name in pool and (buffer.get(name), buffer.get("dtype")) != (pool[name][0]["shape"][1:],
                                                                             pool[name][0]["dtype"]):
                out.append(f"{sub} {name} per token: plan {buffer.get(name)} {buffer.get('dtype')}, SGLang "
                           f"{pool[name][0]['shape'][1:]} {pool[name][0]['dtype']}")
    mamba = pools.get("mamba_pool")
    state = next((l.state for l in plan.layers if l.state and "conv" in next(iter(l.state.values()), {})), None)
    if mamba and state:
        tp = str(facts.pools.get("tp_size", 1))
        for name in ("conv", "temporal"):
            want = state.get(tp, {}).get(name)
            if want and mamba.get(name) and (want["shape"], want["dtype"]) != (mamba[name][0]["shape"][2:],
                                                                               mamba[name][0]["dtype"]):
                out.append(f"{name} state per slot: plan {want['shape']} {want['dtype']}, SGLang "
                           f"{mamba[name][0]['shape'][2:]} {mamba[name][0]['dtype']}")
    return out


def _budget_differences(facts: Any, result: dict[str, Any]) -> list[str]:
    """Sizes are compared only at the deploy's own kv_budget, and only where the plan priced them."""
    mine, theirs = facts.budget, result.get("sizing")
    if not result.get("budget_from_deploy") or not mine or theirs is None or "error" in mine or "not_priced" in mine:
        return []
    out = []
    if mine["max_running_requests"] != theirs["max_running_requests"]:
        out.append(f"max running requests at the kv budget: plan {mine['max_running_requests']}, SGLang "
                   f"{theirs['max_running_requests']}")
    pools = ({"full": theirs["full_max_total_num_tokens"], "swa": theirs["swa_max_total_num_tokens"]}
             if theirs["swa_max_total_num_tokens"] is not None else {"full": theirs["max_total_num_tokens"]})
    if mine["pools"] != pools:
        out.append(f"pool tokens at the kv budget: plan {mine['pools']}, SGLang {pools}")
    if "max_mamba_cache_size" in theirs and mine.get("state") and \
            mine["state"]["slots"] != theirs["max_mamba_cache_size"]:
        out.append(f"state slots at the kv budget: plan {mine['state']['slots']}, SGLang "
                   f"{theirs['max_mamba_cache_size']}")
    return out


def _read_differences(plan: Plan[Any], result: dict[str, Any]) -> list[str]:
    """The keys each query of a checked layer read, against the plan's window for that layer."""
    out = []
    layers = {l.index: l for l in plan.layers}
    for run in result.get("window_reads") or []:
        layer = layers.get(run["layer"])
        if layer is None or "error" in run or run.get("after_swa_release"):
            continue
        window = layer.engine_window
        if run["off_window_count"]:
            first = run["off_window"][0]
            out.append(f"layer {run['layer']} attention ({run['backend']}): {run['off_window_count']} of "
                       f"{run['queries']} queries read other keys than their last {run['window_left'] + 1} "
                       f"(query {first['query']} read {first['count']} keys, {first['first']}..{first['last']})")
        elif (window or None) != (run["window_left"] + 1 if run["window_left"] >= 0 else None):
            out.append(f"layer {run['layer']} attention ({run['backend']}): reads a window of "
                       f"{run['keys_read_max'] if run['window_left'] >= 0 else 'every'} keys, plan's engine_window "
                       f"{window}")
    return out
