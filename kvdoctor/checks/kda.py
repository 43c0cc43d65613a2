"""KDA (static): what sglang refuses before any cache exists — at load (heads not divisible by the
tensor-parallel size) and at startup (ReplaySSM server-argument guards). No torch."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.context import Context
from kvdoctor.engines.sglang import REPLAYSSM_BACKENDS
from kvdoctor.model import Finding


def run(ctx: Context) -> Iterable[Finding]:
    kp = ctx.plan.data.get("kda")
    if kp is None:
        return
    settings, deploy = kp.settings, ctx.deploy
    if settings.enable_linear_replayssm and settings.linear_attn_decode_backend not in REPLAYSSM_BACKENDS:
        message = ("--enable-linear-replayssm requires Triton, or Helion for KDA, as the linear-attn decode "
                   f"backend; got --linear-attn-decode-backend={settings.linear_attn_decode_backend!r}.")
        yield Finding.at("KDA061", f"sglang refuses to start: {message}",
                         deploy.source("sglang.linear_attn_decode_backend"),
                         engine_error={"class": "ValueError", "message": message, "stage": "startup"},
                         evidence={"decode_backend": settings.linear_attn_decode_backend})
    if kp.L < 1:
        message = f"--linear-replayssm-cache-len must be >= 1, got {kp.L}."
        if settings.enable_linear_replayssm:
            yield Finding.at("KDA062", f"sglang refuses to start: {message}",
                             deploy.source("sglang.linear_replayssm_cache_len"),
                             engine_error={"class": "ValueError", "message": message, "stage": "startup"},
                             evidence={"cache_len": kp.L})
        else:
            yield Finding.at("KDA062", f"{message} (refused at startup once enable_linear_replayssm is on)",
                             deploy.source("sglang.linear_replayssm_cache_len"), severity="warning",
                             evidence={"cache_len": kp.L})
    for group in kp.groups:
        dims = group[0]
        for tp in kp.tp_sizes:
            refusal = dims.tp_error(tp)
            if refusal is None:
                continue
            layers = [d.layer for d in group]
            where = (deploy.source("sglang.tp_size") if kp.tp_from_deploy
                     else ctx.spec.key_source("linear_attn_config.num_heads"))
            if kp.tp_from_deploy:
                text = f"layer {dims.layer} (KDA): sglang cannot load this model at TP {tp}: {refusal}"
            else:
                text = (f"layer {dims.layer} (KDA): this model cannot be served at TP {tp} (one of the sizes checked "
                        f"by default): {refusal}")
            yield Finding.at("KDA060", text, where, layer=dims.layer,
                             severity=None if kp.tp_from_deploy else "warning",
                             engine_error={"class": "ValueError", "message": refusal, "stage": "load"},
                             evidence={"tp_size": tp, "num_heads": dims.config_heads, "layers": layers})
