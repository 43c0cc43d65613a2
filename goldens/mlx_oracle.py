"""mlx-lm oracle: the real mlx-lm 0.32.2 caches of every config, fed the way generate_step feeds them.

Run in goldens/.venv/mlx (see README.md). The full-size model is instantiated from config.json
(`_get_classes` + `ModelArgs.from_dict`; parameters stay lazy, nothing is evaluated), its caches
come from `make_prompt_cache` (so models with `make_cache` ignore `max_kv_size`, as in the engine),
and one real forward pass of one token gives every layer's key/value shapes and dtype and the
linear-attention state (ArraysCache). Then zero keys/values of those shapes go through each
cache's own `update_and_fetch` in generate_step's chunks (prefill_step_size, the last token alone),
with mlx-lm's own `maybe_quantize_kv_cache` after each call; `nbytes` (shape metadata) is read
after every step for the held and the peak bytes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GiB, max_position, model_dirs, only_models, write  # noqa: E402

PREFILL_STEP = 2048
QUANTIZED_KV_START = 5000
GROUP_SIZE = 64


def contexts(limit: int) -> list[int]:
    return sorted({t for t in (1, 100, 2048, 2049, 5000, 8191, 32768, 131072) if t <= limit})


def grid(limit: int) -> list[dict]:
    return [{"context": t, "kv_bits": bits, "max_kv_size": size, "kv_group_size": GROUP_SIZE,
             "quantized_kv_start": QUANTIZED_KV_START, "prefill_step_size": PREFILL_STEP,
             "kv_budget_bytes": 40 * GiB}
            for t in contexts(limit) for bits in (None, 8, 4) for size in (None, 4096)]


def model_dtype(config: dict):
    import mlx.core as mx

    text = config.get("text_config") or config
    name = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16"
    return {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}[name]


def build(model_dir: Path):
    import mlx.core as mx
    from mlx_lm.utils import _get_classes

    config = json.loads((model_dir / "config.json").read_text())
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    model.set_dtype(model_dtype(config))
    return model, mx


def layer_shapes(model, mx) -> list:
    """Per layer: (key shape, value shape, dtype) from one real one-token forward, or the
    ArraysCache bytes for a linear-attention layer."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.zeros((1, 1), dtype=mx.int32), cache=cache)
    shapes = []
    for c in cache:
        if hasattr(c, "keys") and c.keys is not None:
            shapes.append(("kv", (c.keys.shape[0], c.keys.shape[1], c.keys.shape[3]),
                           (c.values.shape[0], c.values.shape[1], c.values.shape[3]), c.keys.dtype))
        else:
            shapes.append(("state", c.nbytes, None, None))
    return shapes


def run_point(model, mx, shapes, point: dict) -> dict:
    from mlx_lm.generate import maybe_quantize_kv_cache
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model, max_kv_size=point["max_kv_size"])
    out = {"caches": {}}
    for c in cache:
        name = type(c).__name__ + (f"({c.max_size},keep={c.keep})" if hasattr(c, "max_size") else "")
        out["caches"][name] = out["caches"].get(name, 0) + 1
    chunks, done = [], 0
    while point["context"] - done > 1:
        n = min(point["prefill_step_size"], point["context"] - done - 1)
        chunks.append(n)
        done += n
    chunks.append(point["context"] - done)
    peak = held = 0
    try:
        for n in chunks:
            for i, (kind, kshape, vshape, dtype) in enumerate(shapes):
                if kind == "kv":
                    b, h, d = kshape
                    keys = mx.zeros((b, h, n, d), dtype=dtype)
                    vb, vh, vd = vshape
                    values = mx.zeros((vb, vh, n, vd), dtype=dtype)
                    cache[i].update_and_fetch(keys, values)
            maybe_quantize_kv_cache(cache, point["quantized_kv_start"], point["kv_group_size"], point["kv_bits"])
            held = sum(kshape if kind == "state" else cache[i].nbytes
                       for i, (kind, kshape, _, _) in enumerate(shapes))
            peak = max(peak, held)
    except NotImplementedError as exc:
        out["error"] = {"class": "NotImplementedError", "message": str(exc)}
        return out
    out.update(bytes=held, peak_bytes=peak,
               lengths=[None if kind == "state" else (c.keys[0] if isinstance(c.keys, (list, tuple)) else c.keys).shape[2]
                        for c, (kind, *_rest) in zip(cache, shapes)])
    return out


def main() -> None:
    import mlx_lm

    wanted = only_models()
    points = []
    for name, model_dir in model_dirs().items():
        if wanted and name not in wanted:
            continue
        model, mx = build(model_dir)
        shapes = layer_shapes(model, mx)
        for point in grid(max_position(model_dir)):
            points.append({"model": name, "settings": point, "result": run_point(model, mx, shapes, point)})
        print(name, len(points), flush=True)
    import mlx.core
    write("mlx", "mlx-lm", {"mlx_lm": mlx_lm.__version__, "mlx": mlx.core.__version__}, points)


if __name__ == "__main__":
    main()
