"""The mlx-lm dry run's child: `python -P dryrun_child.py REQUEST RESULT`, in a process of its own (on CPU).

mlx-lm's own model class is built by its own loader from a shrunk copy of the config (kvdoctor's sglang-mlx
shrink: small hidden, FFN, vocab and expert sizes, the layer structure and head geometry kept), with no
weights (lazy random initialisers), and driven through mlx-lm's own generation paths:

  caches        make_prompt_cache(model, max_kv_size): the class of each layer's cache
  generate      generate_step over a prompt past the smallest window, with the deploy's --kv-bits (its
                --quantized-kv-start lowered to the prompt, so the conversion happens), or
                speculative_generate_step with the same model as its own draft under --draft-model
  prompt_cache  the server's prompt-cache reuse on that cache: can_trim_prompt_cache, trim_prompt_cache
  batch         BatchGenerator with two requests of different lengths, one reusing the prompt cache

The first error stops the run and is written with the stage and the engine frame that raised it.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

STAGES = ("load", "caches", "generate", "prompt_cache", "batch")
DECODE = 3


def cache_row(cache: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"mlx_class": type(cache).__name__}
    for attr in ("max_size", "keep", "chunk_size"):
        if isinstance(getattr(cache, attr, None), int):
            row[attr] = getattr(cache, attr)
    return row


def engine_frame(exc: BaseException) -> str | None:
    """file:line (in function) of the innermost frame inside mlx_lm, where the error was raised."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/mlx_lm/" in f.filename]
    if not frames:
        return None
    last = frames[-1]
    return f"mlx_lm/{last.filename.split('/mlx_lm/', 1)[1]}:{last.lineno} (in {last.name})"


def build(config: dict[str, Any]) -> tuple[Any, str]:
    from kvdoctor.engines.sglang_mlx.dryrun.shrink import cast_floats, load_weightless, shrink_candidates

    error: Exception | None = None
    for label, shrunk in shrink_candidates(config):
        try:
            model, _ = load_weightless(shrunk)
        except Exception as exc:  # noqa: BLE001 - the next, larger copy may build
            error = exc
            continue
        cast_floats(model, "float32")
        return model, label
    assert error is not None
    raise error


def run(request: dict[str, Any], result: dict[str, Any]) -> None:
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator, generate_step, speculative_generate_step
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

    settings, done = request["settings"], result["done"]
    model, result["copy"] = build(request["config"])
    done.append("load")
    result["stage"] = "caches"
    cache = make_prompt_cache(model, max_kv_size=settings["max_kv_size"])
    result["layers"] = [cache_row(c) for c in cache]
    done.append("caches")
    result["stage"] = "generate"
    windows = [r["max_size"] for r in result["layers"] if "max_size" in r]
    length = min(max([16, *[w + 8 for w in windows]]), request["max_prompt"])
    prompt = mx.array([(7 * i) % request["vocab"] for i in range(length)], dtype=mx.int32)
    result["prompt_tokens"] = length
    kwargs = {"max_tokens": DECODE, "prefill_step_size": settings["prefill_step_size"],
              "kv_bits": settings["kv_bits"], "kv_group_size": settings["kv_group_size"],
              "quantized_kv_start": min(settings["quantized_kv_start"], length - 2)}
    steps: Any
    if settings["draft_model"] is not None:
        draft_cache = make_prompt_cache(model)
        steps = speculative_generate_step(prompt, model, model, prompt_cache=cache + draft_cache,
                                          num_draft_tokens=2, **kwargs)
    else:
        steps = generate_step(prompt, model, prompt_cache=cache, max_kv_size=settings["max_kv_size"], **kwargs)
    result["generated"] = [int(token) for token, *_ in steps]
    result["after_generate"] = [type(c).__name__ for c in cache]
    done.append("generate")
    result["stage"] = "prompt_cache"
    trimmable = can_trim_prompt_cache(cache)
    result["prompt_cache"] = {"trimmable": trimmable, "trimmed": trim_prompt_cache(cache, 2) if trimmable else 0}
    done.append("prompt_cache")
    if request["batch"]:
        result["stage"] = "batch"
        reused = make_prompt_cache(model, max_kv_size=settings["max_kv_size"])
        for _ in generate_step(prompt[:length // 2], model, prompt_cache=reused, max_tokens=1,
                               max_kv_size=settings["max_kv_size"]):
            pass
        batch = BatchGenerator(model, max_tokens=DECODE, max_kv_size=settings["max_kv_size"])
        tokens = [(7 * i) % request["vocab"] for i in range(length)]  # the prompt above, as a list
        fresh: Any = None  # the batch generator makes this request's cache
        uids = batch.insert([tokens[length // 2:], tokens[:5]], caches=[reused, fresh])
        finished: set[int] = set()
        for _ in range(8 * DECODE + length):
            _, generation = batch.next()
            finished |= {r.uid for r in generation if r.finish_reason is not None}
            if finished >= set(uids):
                break
        batch.close()
        result["batch"] = {"requests": len(uids), "finished": len(finished)}
        done.append("batch")
    result["stage"] = None


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[1]).read_text())
    result: dict[str, Any] = {"done": [], "stage": "load"}
    started = time.monotonic()
    try:
        import mlx_lm

        result["versions"] = {"mlx-lm": mlx_lm.__version__}
        run(request, result)
    except Exception as exc:  # noqa: BLE001 - the engine's own error is the result
        result["error"] = {"class": type(exc).__name__, "message": str(exc), "stage": result["stage"],
                           "frame": engine_frame(exc)}
    result["seconds"] = round(time.monotonic() - started, 2)
    Path(argv[2]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
