"""Hybrid-SWA memory on or off, and why; the SWA and full layer ids; the window each layer attends.

SGLang 0.5.23 gives sliding layers their own windowed pool only for architectures on its allow-list
(`is_hybrid_swa_model`, configs/model_config.py:2651) and only when `--disable-hybrid-swa-memory` is
not set; everything else keeps every attention layer in one full-length pool. Separately, each model
class decides whether its attention masks a window at all (`archs.WINDOW_RULES`).
"""
from __future__ import annotations

import msgspec

from kvdoctor.engines.pins import PINS
from kvdoctor.engines.sglang import archs
from kvdoctor.engines.sglang.releases import hybrid_swa_archs
from kvdoctor.engines.sglang.settings import SglangSettings
from kvdoctor.model import SLIDING, ModelSpec

VERSION = PINS["sglang"]

ALLOW_LIST_REF = archs.ref("configs/model_config.py#L2651")
FLAG_REF = archs.ref("configs/model_config.py#L1214")


class SwaDecision(msgspec.Struct, frozen=True):
    on: bool
    why: str  # allow-list | not-on-allow-list | disabled-by-flag
    detail: str
    source: str
    override_warning: str | None = None  # what SGLang logs when a family override sets the flag
    swa_layer_ids: tuple[int, ...] | None = None
    full_layer_ids: tuple[int, ...] | None = None


def layer_types(spec: ModelSpec) -> list[str] | None:
    value = spec.config.get("layer_types")
    return list(value) if isinstance(value, list) else None


def on_allow_list(arch: str, spec: ModelSpec, release: str = VERSION) -> bool:
    if arch not in hybrid_swa_archs(release):
        return bool(spec.config.get("is_hybrid_swa"))
    if arch == "BeamForCausalLM":
        return SLIDING in (layer_types(spec) or [])
    if arch == "LagunaForCausalLM":
        return bool(spec.config.get("sliding_window"))
    return True


def split_ids(arch: str, spec: ModelSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """SGLang's `get_hybrid_layer_ids` for the families kvdoctor models (model_config.py:2700)."""
    n = spec.num_hidden_layers
    if arch == "Llama4ForConditionalGeneration":
        return tuple(i for i in range(n) if (i + 1) % 4), tuple(i for i in range(n) if (i + 1) % 4 == 0)
    if arch == "UnlimitedOCRForCausalLM":
        return tuple(range(n)), ()
    pattern = spec.config.get("hybrid_layer_pattern")
    if arch in ("MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM") and isinstance(pattern, list):
        return tuple(i for i in range(n) if pattern[i] == 1), tuple(i for i in range(n) if pattern[i] == 0)
    kinds = [layer.kind for layer in spec.layers]
    return (tuple(i for i, k in enumerate(kinds) if k == SLIDING),
            tuple(i for i, k in enumerate(kinds) if k != SLIDING and k in ("full_attention", "mla")))


def decide(spec: ModelSpec, settings: SglangSettings) -> SwaDecision:
    arch = archs.serving_arch(spec.raw_config)
    override = archs.OVERRIDE_DISABLES.get(arch)
    warning = override[0].format(arch=arch) if override else None
    release = settings.release or VERSION
    if not on_allow_list(arch, spec, release):
        return SwaDecision(False, "not-on-allow-list",
                           f"{arch or spec.model_type} is not on SGLang {release}'s hybrid-SWA allow-list: every attention "
                           "layer keeps full-length slots in one pool", ALLOW_LIST_REF, warning)
    if settings.disable_hybrid_swa_memory:
        return SwaDecision(False, "disabled-by-flag", "disable_hybrid_swa_memory is set: sliding layers keep "
                           "full-length slots in the one pool", FLAG_REF, warning)
    swa, full = (None, None) if arch in archs.DEEPSEEK_V4_ARCHS else split_ids(arch, spec)
    return SwaDecision(True, "allow-list", f"{arch} is on SGLang's hybrid-SWA allow-list: sliding layers get a "
                       "separate pool of swa_full_tokens_ratio times the full pool's tokens", ALLOW_LIST_REF,
                       warning, swa, full)


def engine_windows(spec: ModelSpec) -> dict[int, int | None]:
    """Layer id -> the window SGLang's attention applies (kvdoctor's convention), None: full attention."""
    arch = archs.serving_arch(spec.raw_config)
    rule = archs.WINDOW_RULES.get(arch)
    window = spec.config.get("sliding_window")
    out: dict[int, int | None] = {layer.index: None for layer in spec.layers}
    if rule is not None and rule[0] == "irope":
        chunk = spec.config.get("attention_chunk_size")
        return {i: (chunk if isinstance(chunk, int) and (i + 1) % 4 else None) for i in out}
    if rule is not None and rule[0] == "pattern":
        pattern, left = spec.config.get("hybrid_layer_pattern") or [], spec.config.get("sliding_window_size")
        return {i: (left + 1 if isinstance(left, int) and i < len(pattern) and pattern[i] == 1 else None)
                for i in out}
    if rule is None or not isinstance(window, int):
        return out
    types = layer_types(spec)
    for layer in spec.layers:
        if rule[0] == "alternate":
            sliding = layer.index % 2 == 0
        else:
            sliding = layer.kind == SLIDING if types is None else (
                layer.index < len(types) and types[layer.index] == SLIDING)
        out[layer.index] = window if sliding else None
    return out


def runner_window(spec: ModelSpec, hybrid_swa: bool) -> int | None:
    """The sliding window the runner hands the pool sizing and backends (`resolve_sliding_window_size`,
    model_runner_components/load_model_utils.py:144): the model class's own answer (window_left), else the
    config's window for a hybrid-SWA model, else the attention chunk size."""
    arch = archs.serving_arch(spec.raw_config)
    window = spec.config.get("sliding_window")
    if arch in archs.WINDOW_MINUS_ONE_SOURCES or arch in archs.WINDOW_MINUS_ONE_OR_NONE:
        return window - 1 if isinstance(window, int) else None
    if hybrid_swa and isinstance(window, int):
        return window
    chunk = spec.config.get("attention_chunk_size")
    return chunk if isinstance(chunk, int) else None
