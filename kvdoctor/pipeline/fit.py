"""The whole deploy question for one model: on this GPU, with this engine, does it start, how long a
context and how many requests at once does it serve, and which layout and launch command get there.

`fit_document` asks the engine's profile (`EngineProfile.fit`) for every layout of the GPU count given
(the "asked" rows), then for the recommendation: the smallest count of 1, 2, 4, 8 (and the count given)
whose plainest layout serves the request. The JSON document is `kvdoctor.fit/1`.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from kvdoctor.errors import InputError

if TYPE_CHECKING:
    from kvdoctor.engines.budget.fit import FitRow, Gpu, Request
    from kvdoctor.engines.deploy import Deploy
    from kvdoctor.model import ModelSpec

COUNTS = (1, 2, 4, 8)


def fit_rows(spec: ModelSpec, engine: str, gpu: Gpu, gpus: int, request: Request,
             settings: dict[str, Any]) -> list[FitRow]:
    """Every layout of `gpus` GPUs the engine can start, each priced; InputError for an engine without a
    fit model or a model it cannot price."""
    from kvdoctor.engines import fit_engines, profile

    if engine not in fit_engines():
        raise InputError(f"--engine {engine!r}: expected one of {', '.join(fit_engines())}")
    if gpus <= 0:
        raise InputError(f"--gpus {gpus}: expected a positive number of GPUs")
    if spec.checkpoint is None or not spec.checkpoint.tensors:
        raise InputError(f"{spec.target}: fit prices the weights from the checkpoint's safetensors headers, and "
                         "this model has none")
    prof = profile(engine)
    facts = prof.budget_facts(spec)
    layout = settings.get("layout")
    layouts = [layout] if layout else prof.fit_layouts(facts, spec.config, gpus)
    if not layouts:
        raise InputError(f"{spec.target}: {engine} has no layout of {gpus} GPU(s) for its {len(facts.layers)} layers")
    return [prof.fit(spec, facts, gpu, lay, request, settings) for lay in layouts]


def recommend(spec: ModelSpec, engine: str, gpu: Gpu, request: Request, settings: dict[str, Any],
              most: int) -> FitRow | None:
    """The first row that fits, over the smallest GPU counts first (and, in each, the plainest layout)."""
    from kvdoctor.engines import profile

    prof = profile(engine)
    facts = prof.budget_facts(spec)
    for count in sorted({c for c in COUNTS if c <= most} | {most}):
        if not prof.fit_layouts(facts, spec.config, count):
            continue  # the engine has no layout of this many GPUs (mlx-lm: one device)
        for row in fit_rows(spec, engine, gpu, count, request, {k: v for k, v in settings.items() if k != "layout"}):
            if row.fits:
                return row
    return None


def fit_document(spec: ModelSpec, engine: str, gpu: Gpu, gpus: int | None, request: Request,
                 settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fit JSON for one model: the rows of the GPU count asked for (all its layouts) and the
    recommendation (None when no count up to max(8, gpus) serves the request)."""
    settings = dict(settings or {})
    asked = fit_rows(spec, engine, gpu, gpus or 1, request, settings)
    best = next((r for r in asked if r.fits), None) or recommend(spec, engine, gpu, request, settings,
                                                                 max(8, gpus or 1))
    raw = (spec.model_dir / "config.json").read_bytes()
    return {
        "schema": "kvdoctor.fit/1",
        "model": {"id": spec.hf_id or spec.model_dir.name, "target": spec.target, "model_type": spec.model_type,
                  "config_sha256": hashlib.sha256(raw).hexdigest(), "layers": spec.num_hidden_layers},
        "inputs": {"engine": engine, "gpu": gpu.name, "gpu_memory_bytes": gpu.memory_bytes, "gpu_source": gpu.source,
                   "gpus": gpus or 1, "context": request.context, "concurrency": request.concurrency,
                   "kv_cache_dtype": request.kv_cache_dtype},
        "rows": [r.to_json() for r in asked],
        "recommendation": best.to_json() if best is not None else None,
    }


def fit_from_options(target: str, engine: str, gpu: str | None, gpus: int | None, gpu_memory: str | None,
                     context: int | None, concurrency: int | None, kv_cache_dtype: str | None,
                     deploy: Deploy) -> dict[str, Any]:
    """The fit document for the command line's (or the API's) options over the deploy file's settings."""
    from kvdoctor.engines.releases import for_engine, parse_engine
    from kvdoctor.engines.budget.fit import Request, layout_of
    from kvdoctor.engines.budget.fit import gpu as gpu_preset
    from kvdoctor.load.loader import load_model

    engine, named = parse_engine(engine, "fit")
    deploy = for_engine(deploy, engine, named, "--engine")
    for name, value in (("--context", context), ("--concurrency", concurrency), ("--gpus", gpus)):
        if value is not None and value <= 0:
            raise InputError(f"{name} {value}: expected a positive number")
    asked = deploy.budget
    section: dict[str, Any] = deploy.settings(engine).model_dump()
    memory = gpu_memory or (str(asked.gpu_memory) if asked and asked.gpu_memory is not None else None)
    chosen = gpu_preset(gpu or (asked.gpu if asked else None), memory)
    settings = {k: v for k, v in section.items() if v is not None}
    release = deploy.release(engine)
    if release is not None:  # the release priced: its defaults, its refusals' wording, its KV plan
        settings["version"] = release.version
    layout = layout_of(section)
    if layout is not None and gpus is None:
        settings["layout"] = layout
        gpus = int(layout["tp"]) * int(layout["pp"]) * (1 if layout["dp_attention"] else int(layout["dp"]))
    request = Request(context=context or (asked.context if asked else None) or section.get("max_model_len")
                      or section.get("context_length"),
                      concurrency=concurrency or (asked.concurrency if asked else None),
                      kv_cache_dtype=kv_cache_dtype or (section.get("kv_cache_dtype")
                                                        if section.get("kv_cache_dtype") not in (None, "auto") else None))
    # the headers are parsed and checked entry by entry; the safetensors library's second opinion (an import of
    # numpy and a map of every shard) is for check, not for pricing them
    doc = fit_document(load_model(target, library_check=False), engine, chosen,
                       gpus or (asked.gpus if asked else None), request, settings)
    if release is not None:
        doc["inputs"]["release"] = {"dist": release.dist, "version": release.version, "why": release.why}
    return doc
