"""MLX131: mlx-lm's own caches, built with the model's shapes and driven by the probe, did something the
plan did not predict: an operation raised (named through the catalog's matcher where an entry knows the
text) and the plan predicted no refusal of that code, one the plan said raises did not, or a rotating
cache held other positions than its window."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.model import Finding

RULE = Rule(codes=("MLX131",), engines=("mlx-lm",), needs=("probe:mlx_lm_caches",))


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.catalog.matcher import code_for
    from kvdoctor.engines.mlx_lm.plan import UNMERGEABLE
    from kvdoctor.engines.mlx_lm.probes import CacheDrive

    drive = ctx.observations.get("mlx_lm_caches")
    if not isinstance(drive, CacheDrive):
        return
    planned = {refusal.code for refusal in ctx.plan.refusals}  # what the plan foresaw, the probe confirms
    for group in drive.groups:
        where = ctx.spec.key_source("model_type")
        if group.window is not None and group.window.outcome == "error":
            yield Finding.at("MLX131", f"mlx-lm's {group.mlx_class} for layers {_layers(group.layers)} holds positions "
                             f"{group.window.detail['held']} after the window wrapped, not "
                             f"{group.window.detail['expected']}", where, layer=group.layers[0])
        for step in ("quantize", "merge"):
            seen = getattr(group, step)
            if seen is None:
                continue
            # the plan's reasons: a RotatingKVCache cannot be quantized (MEM011), a class without merge
            # cannot join a batch (MLX102)
            raised = seen.outcome == "error"
            expected = group.mlx_class == "RotatingKVCache" if step == "quantize" else group.mlx_class in UNMERGEABLE
            known = code_for(builtin_catalog(), "mlx-lm", seen.cls or "", seen.message or "") if raised else None
            if raised and not expected and known not in planned:
                named = f" (the catalog's {known})" if known else ""
                yield Finding.at("MLX131", f"mlx-lm's {group.mlx_class} for layers {_layers(group.layers)} raised in "
                                 f"the probe's {step}, which the plan did not predict{named}", where,
                                 layer=group.layers[0], engine_error={"class": seen.cls, "message": seen.message,
                                                                      "stage": "prefill"})
            elif expected and not raised:
                yield Finding.at("MLX131", f"the plan says mlx-lm's {group.mlx_class} fails the {step}, but for layers "
                                 f"{_layers(group.layers)} it went through the probe's", where, layer=group.layers[0])


def _layers(layers: tuple[int, ...]) -> str:
    shown = ", ".join(map(str, layers[:6]))
    return shown + (f" (+{len(layers) - 6})" if len(layers) > 6 else "")
