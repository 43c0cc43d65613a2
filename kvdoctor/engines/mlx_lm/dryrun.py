"""The mlx-lm dry run's parent side: runs dryrun_child.py in a child process of kvdoctor's own Python (which
holds mlx and mlx-lm: the `mlx` extra), then turns its result into the `DryRun` record every engine gives,
with the caches mlx-lm built held against the plan's."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from kvdoctor.engines.base import DryRun, DryRunError, DryRunner, Plan, stages_reached

if TYPE_CHECKING:
    from pydantic import BaseModel

    from kvdoctor.model import ModelSpec

STAGES = ("load", "caches", "generate", "prompt_cache", "batch")
DEFAULT_TIMEOUT_SECONDS = 300.0
MAX_PROMPT = 4096 + 16  # a window longer than this is not crossed (the note says so)
COMPARED = ("mlx class", "max_size", "keep", "chunk_size")


def batches(plan: Plan[Any], settings: Any) -> bool:
    """Requests share a batch: through BatchGenerator itself, or mlx_lm.server when it can batch this model
    (no --kv-bits, no draft model, every cache mergeable)."""
    from kvdoctor.engines.mlx_lm.plan import UNMERGEABLE, MlxLmFacts

    if settings.batch_generate:
        return True
    facts = plan.facts
    mergeable = isinstance(facts, MlxLmFacts) and not facts.classes() & UNMERGEABLE
    return settings.kv_bits is None and settings.draft_model is None and mergeable


class MlxLmDryRun(DryRunner):
    def run(self, spec: ModelSpec, settings: BaseModel, plan: Plan[object], options: Mapping[str, Any]) -> DryRun:
        import kvdoctor
        from kvdoctor.engines.child import run_child
        from kvdoctor.engines.sglang_mlx.dryrun.shrink import SMALL_VOCAB, vocab_size
        from kvdoctor.engines.sglang_mlx.mlxlm import mlx_lm_installed

        if not mlx_lm_installed():
            return DryRun(engine="mlx-lm", outcome="unavailable", reason="mlx and mlx-lm are not installed "
                          "(pip install 'kvdoctor[mlx]')")
        config = dict(spec.raw_config)
        config.setdefault("model_type", spec.model_type)
        request = {"config": config, "settings": settings.model_dump(), "batch": batches(plan, settings),
                   "vocab": min(SMALL_VOCAB, vocab_size(config)), "max_prompt": MAX_PROMPT}
        package_root = Path(kvdoctor.__file__).resolve().parents[1]
        timeout = float(options.get("dry_run_timeout") or DEFAULT_TIMEOUT_SECONDS)
        with tempfile.TemporaryDirectory(prefix="kvdoctor-mlx-lm-") as tmp:
            raw = run_child(Path(sys.executable), Path(__file__).with_name("dryrun_child.py"), Path(tmp), request,
                            {"PYTHONPATH": str(package_root)}, timeout)
        return record(raw, plan)


def record(raw: Mapping[str, Any], plan: Plan[Any]) -> DryRun:
    """The child's result as the DryRun record, with where its caches differ from the plan's."""
    common = {"engine": "mlx-lm", "versions": raw.get("versions") or {}, "seconds": raw.get("seconds"),
              "stderr_tail": raw.get("stderr_tail", ""), "python": sys.executable, "observation": dict(raw)}
    if raw.get("timed_out"):
        return DryRun(outcome="timeout", reason="was stopped at its time bound", **common)
    if "done" not in raw:
        return DryRun(outcome="crashed", reason=f"ended with code {raw.get('returncode')} before writing its result",
                      **common)
    err = raw.get("error")
    error = None if err is None else DryRunError(cls=err["class"], message=err["message"], stage=err["stage"] or "load",
                                                 frame=err.get("frame"), copy=raw.get("copy"))
    layers = [dict(row) for row in raw.get("layers") or ()]
    differences = differences_from(plan, layers) if layers else []
    extra = {key: raw[key] for key in ("copy", "prompt_tokens", "after_generate", "prompt_cache", "batch")
             if key in raw}
    note = f"{len(layers)} caches built on a {raw.get('copy', 'shrunk')} copy" if layers else ""
    return DryRun(outcome="error" if error else "clean", stages=stages_reached(STAGES, raw["done"],
                  failed=None if error is None else error.stage), error=error, layers=layers,
                  compared=COMPARED if layers else (), differences=differences, extra=extra, note=note, **common)


def differences_from(plan: Plan[Any], layers: list[dict[str, Any]]) -> list[str]:
    from kvdoctor.engines.mlx_lm.plan import MlxLmFacts

    facts = plan.facts
    if not isinstance(facts, MlxLmFacts):
        return []
    planned = [c.json() for c in facts.built]
    if len(planned) != len(layers):
        return [f"mlx-lm built {len(layers)} caches, the plan {len(planned)}"]
    return [f"cache {i} (layer {cache.layer}): plan {want}, mlx-lm {got}"
            for i, (cache, want, got) in enumerate(zip(facts.built, planned, layers)) if want != got]
