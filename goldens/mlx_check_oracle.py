"""mlx-lm check oracle: what mlx-lm 0.32.2 builds per layer for every real config, and what its own
cache code does with those caches under `--kv-bits`, batching and prompt-cache reuse.

Run with a Python that has mlx-lm 0.32.2 and mlx (CPU is enough), from the repository root:

    python goldens/mlx_check_oracle.py        # rewrites goldens/mlx_check.json

Per config (fixtures/configs/real/*.json and fixtures/models/*/config.json) and per setting
(max_kv_size None | 4096, kv_bits None | 4): the model class is mlx-lm's own (`_get_classes` +
`ModelArgs.from_dict`; parameters stay lazy, nothing is evaluated), the caches come from
`make_prompt_cache(model, max_kv_size)`, and for each layer the class name, `max_size` and `keep`
are recorded. Then, on those fresh caches, mlx-lm's own calls: `maybe_quantize_kv_cache` with every
offset at `quantized_kv_start` (the first step `generate_step` converts), `generate._merge_caches`
of two requests' caches (the batch generator's merge) and `can_trim_prompt_cache` (prompt-cache
reuse and speculative decoding). Each gives the exception class and its exact text, or ok.
"""
from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
QUANTIZED_KV_START = 5000
SETTINGS = [{"max_kv_size": size, "kv_bits": bits} for size in (None, 4096) for bits in (None, 4)]


def configs() -> dict[str, dict]:
    out = {}
    for path in sorted((ROOT / "fixtures" / "configs" / "real").glob("*.json")):
        out[f"real/{path.stem}"] = json.loads(path.read_text())
    for path in sorted((ROOT / "fixtures" / "models").iterdir()):
        if (path / "config.json").exists():
            out[f"models/{path.name}"] = json.loads((path / "config.json").read_text())
    return out


def layer_record(cache) -> dict:
    row = {"class": type(cache).__name__}
    for attr in ("max_size", "keep", "chunk_size"):
        if isinstance(getattr(cache, attr, None), int):
            row[attr] = getattr(cache, attr)
    if row["class"] == "CacheList":
        row["parts"] = [type(c).__name__ for c in cache.caches]
    return row


def outcome(call) -> dict:
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - the engine's own error is the datum
        return {"outcome": "error", "class": type(exc).__name__, "message": str(exc)}
    return {"outcome": "ok"} if value is None else {"outcome": "ok", "value": value}


def at_offset(caches, offset: int) -> None:
    """Every cache's token count at `offset`, as after a prompt of that many tokens (no arrays)."""
    for cache in caches:
        for part in getattr(cache, "caches", (cache,)):
            if hasattr(part, "offset"):
                part.offset = offset


def run_config(config: dict) -> list[dict]:
    from mlx_lm.generate import _merge_caches, maybe_quantize_kv_cache
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache
    from mlx_lm.utils import _get_classes

    try:
        model_cls, args_cls = _get_classes(config)
        model = model_cls(args_cls.from_dict(config))
    except Exception as exc:  # noqa: BLE001
        return [{"settings": s, "result": {"outcome": "error", "stage": "load", "class": type(exc).__name__,
                                           "message": str(exc)}} for s in SETTINGS]
    points = []
    for settings in SETTINGS:
        caches = make_prompt_cache(model, max_kv_size=settings["max_kv_size"])
        result = {"outcome": "ok", "layers": [layer_record(c) for c in caches],
                  "trimmable": can_trim_prompt_cache(caches)}
        result["merge"] = outcome(lambda: len(_merge_caches([make_prompt_cache(model, settings["max_kv_size"]),
                                                             make_prompt_cache(model, settings["max_kv_size"])])))
        if settings["kv_bits"] is not None:
            quantized = make_prompt_cache(model, max_kv_size=settings["max_kv_size"])
            at_offset(quantized, QUANTIZED_KV_START)
            result["quantize"] = outcome(lambda: maybe_quantize_kv_cache(
                quantized, QUANTIZED_KV_START, 64, settings["kv_bits"]))
            if result["quantize"]["outcome"] == "ok":
                result["quantized_layers"] = [type(c).__name__ for c in quantized]
        points.append({"settings": settings, "result": result})
    return points


def main() -> None:
    import mlx_lm

    only = set(sys.argv[1:])
    points = []
    for name, config in configs().items():
        if only and name not in only:
            continue
        for point in run_config(config):
            points.append({"model": name, **point})
        print(name, file=sys.stderr, flush=True)
    doc = {"schema": "kvdoctor.goldens/1", "engine": "mlx-lm", "versions": {"mlx-lm": mlx_lm.__version__},
           "generated": datetime.date.today().isoformat(),
           "configs": "fixtures/configs/real, fixtures/models", "quantized_kv_start": QUANTIZED_KV_START,
           "points": points}
    out = HERE / "mlx_check.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out} ({len(points)} points)", file=sys.stderr)


if __name__ == "__main__":
    main()
