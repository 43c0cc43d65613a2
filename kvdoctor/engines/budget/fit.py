"""What every engine's `fit` shares: the GPU presets, the request, one memory term with where it came
from, and the record of one parallel layout on one GPU (`FitRow`).

An engine's fit (engines/<engine>/fit.py) prices the weights on each rank with its own sharding
(`budget.weights`), subtracts its own reservations (each a `Term` that says whether it is read from the
engine's code or calibrated on start-up logs), and hands the memory left to its KV budget model, which
gives the tokens, the concurrency, the longest context that fits and the engine's refusal, if any.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import msgspec
from msgspec.structs import replace

from kvdoctor.engines.budget.common import GiB, EngineRefusal, Record
from kvdoctor.engines.budget.facts import ModelFacts
from kvdoctor.engines.budget.weights import WeightsRecord
from kvdoctor.errors import InputError


class Gpu(msgspec.Struct, frozen=True):
    name: str
    memory_bytes: int  # what the device reports to the engine
    vendor: str
    large_tier: bool = False  # vLLM's >= 70 GiB non-A100 tier (its larger scheduler defaults)
    unified: bool = False
    sm: int = 0  # CUDA compute capability x 10 (90: Hopper); 0: not NVIDIA or not known
    pcie_only: bool = False  # no NVLink mesh between the cards (the engines' custom all-reduce stays off beyond 2)
    source: str = ""
    working_set_bytes: int = 0  # Apple silicon: Metal's recommended working set (0: not unified memory)
    working_set_source: str = ""


# Metal's recommendedMaxWorkingSetSize, where no machine's own figure was seen: about three quarters of the
# unified memory (macOS's own fraction, which differs by release and machine size; `sysctl iogpu.wired_limit_mb`
# moves it, and the engines read it back through mx.device_info()).
WORKING_SET_FRACTION = 0.75


def working_set(memory_bytes: int, measured_gib: float | None = None, source: str = "") -> tuple[int, str]:
    """Metal's recommended working set of a Mac with `memory_bytes` of unified memory, and where it came from."""
    if measured_gib is not None:
        return int(measured_gib * GiB), source
    return int(memory_bytes * WORKING_SET_FRACTION), (
        f"about {WORKING_SET_FRACTION:.0%} of the unified memory (Metal's recommendedMaxWorkingSetSize varies by macOS "
        "release and machine; give the machine's own figure as the deploy section's working_set)")


def metal_working_set(device: Gpu, settings: dict[str, Any]) -> tuple[int, str]:
    """The working set an MLX engine sizes from on `device`: the deploy section's `working_set` (the machine's own
    mx.device_info()["max_recommended_working_set_size"]) when given, else the preset's figure."""
    if settings.get("working_set") is not None:
        from kvdoctor.load.strict import parse_size

        return (parse_size(settings["working_set"], "working_set"),
                "the deploy section's working_set (Metal's recommended working set)")
    if device.working_set_bytes:
        return device.working_set_bytes, device.working_set_source
    return working_set(device.memory_bytes)


@lru_cache(maxsize=1)
def _presets() -> dict[str, Any]:
    from kvdoctor.resources import data_dir

    return json.loads((data_dir() / "gpus.json").read_text(encoding="utf-8"))["gpus"]


def gpu_names() -> list[str]:
    return list(_presets())


def gpu(name: str | None, memory: str | None = None) -> Gpu:
    """A preset by name (case-insensitive), its memory replaced by `memory` ("80GiB") when given; with no
    name, a GPU of that memory alone. InputError for an unknown name."""
    from kvdoctor.load.strict import parse_size

    override = parse_size(memory, "--gpu-memory") if memory is not None else None
    if name is None:
        if override is None:
            raise InputError(f"give --gpu (one of {', '.join(gpu_names())}) or --gpu-memory SIZE")
        return Gpu(name=f"GPU-{memory}", memory_bytes=override, vendor="nvidia", large_tier=override >= 70 * GiB,
                   source="--gpu-memory")
    presets = {k.lower(): k for k in _presets()}
    key = presets.get(name.lower())
    if key is None:
        raise InputError(f"--gpu {name!r}: expected one of {', '.join(gpu_names())} (or --gpu-memory SIZE)")
    raw = _presets()[key]
    size = int(raw["memory_gib"] * GiB) if override is None else override
    wired, wired_source = 0, ""
    if raw.get("unified"):  # a machine's own figure holds for its own memory size only
        measured = raw.get("working_set_gib") if override is None else None
        wired, wired_source = working_set(size, measured, raw.get("working_set_source", ""))
    return Gpu(name=key, memory_bytes=size, vendor=raw["vendor"], large_tier=bool(raw.get("large_tier")),
               unified=bool(raw.get("unified")), sm=int(raw.get("sm", 0)),
               pcie_only=bool(raw.get("pcie_only")),
               source="--gpu-memory" if override is not None else raw["source"],
               working_set_bytes=wired, working_set_source=wired_source)


class Request(msgspec.Struct, frozen=True):
    """What the deployer asks for: a context per request (None: the model's longest) and a number of
    requests at that context served at once (None: one)."""

    context: int | None = None
    concurrency: int | None = None
    kv_cache_dtype: str | None = None  # the engine's own spelling (fp8, fp8_e4m3, ...); None: auto


class Term(Record, kw_only=True):
    """One part of a rank's memory, with where its figure came from."""

    name: str  # requested | weights | activations | non_torch | cuda_graphs | reserved | kv | free
    bytes: int
    source: str  # "vllm/v1/worker/gpu_worker.py:752-756 @ 0.33.0", "calibrated on 3 logs (...)", ...


class FitRow(Record, kw_only=True):
    """One engine, one parallel layout, one GPU: the memory of the fullest rank and what it serves."""

    engine: str
    version: str
    gpu: str
    gpu_memory_bytes: int
    gpus: int
    layout: dict[str, int | bool]  # tp, pp, dp, ep, dp_attention, ... in the engine's own names
    weights: WeightsRecord
    terms: list[Term]  # the fullest rank, top to bottom: the engine's share of the GPU, then what it holds
    kv_bytes: int  # memory left for the KV cache on that rank
    context: int  # the context asked for (or the model's longest)
    max_context: int | None = None  # the longest context one request can have (vLLM's --max-model-len auto)
    kv_tokens: int | None = None  # the engine's own KV token figure (vLLM: GPU KV cache size; SGLang: #tokens)
    max_concurrency: float | None = None  # requests at `context` served at once, all replicas together
    fits: bool = False  # starts, and serves the requested context and concurrency
    refusal: EngineRefusal | None = None
    notes: list[str] = msgspec.field(default_factory=list)
    launch: list[str] = msgspec.field(default_factory=list)  # the engine's own command line, one arg a string
    deploy: dict[str, Any] = msgspec.field(default_factory=dict)  # the deploy file's engine section

    def to_json(self) -> dict[str, Any]:
        out = msgspec.to_builtins(msgspec.structs.replace(self, refusal=None))
        out["refusal"] = self.refusal.to_json() if self.refusal is not None else None
        return out


def gib(value: float) -> str:
    return f"{value / GiB:.2f} GiB"


def weights_do_not_fit(weights: WeightsRecord, non_torch: int, gpu: Gpu, engine: str) -> EngineRefusal | None:
    """The out-of-memory error an engine stops with while loading weights larger than the GPU."""
    if weights.bytes_per_rank + non_torch <= gpu.memory_bytes:
        return None
    return EngineRefusal("torch.OutOfMemoryError", f"the weights, {weights.bytes_per_rank / GiB:.2f} GiB per rank, do "
                         f"not fit a {gpu.memory_bytes / GiB:.2f} GiB GPU: {engine} fails loading them with CUDA out "
                         "of memory", stage="load")


def layout_of(section: dict[str, Any]) -> dict[str, Any] | None:
    """The parallel layout an engine's deploy section fixes (vLLM's or SGLang's spellings), or None when
    it leaves every size at 1."""
    tp = section.get("tensor_parallel_size") or section.get("tp_size") or 1
    pp = section.get("pipeline_parallel_size") or section.get("pp_size") or 1
    dp = section.get("data_parallel_size") or section.get("dp_size") or 1
    ep = section.get("ep_size") or 1
    out = {"tp": int(tp), "pp": int(pp), "dp": int(dp), "ep": int(ep),
           "expert_parallel": bool(section.get("enable_expert_parallel")),
           "dp_attention": bool(section.get("enable_dp_attention"))}
    plain = {"tp": 1, "pp": 1, "dp": 1, "ep": 1, "expert_parallel": False, "dp_attention": False}
    return None if out == plain else out


def stage_facts(facts: ModelFacts, stage_layers: list[list[int]], pp: int) -> list[ModelFacts]:
    """Each pipeline stage's cache layers; a stage with none (attention-free blocks, as Nemotron-NAS has) holds
    no KV cache and is left out."""
    if pp == 1:
        return [facts]
    stages = [replace(facts, layers=[layer for layer in facts.layers if first <= layer.index < last])
              for first, last in stage_layers]
    return [stage for stage in stages if stage.layers] or [facts]
