"""The numbers a KDA layer's caches and decode inputs are built from, per tensor-parallel rank.

Head counts and head dims come from the checkpoint headers when present (kvdoctor.engines.sglang.kda.checkpoint_dims) and from
`linear_attn_config` otherwise. The activation widths the decode wrapper receives (packed q/k/v,
gate, beta, A_log, dt_bias) are taken from the raw tensor sizes, so a checkpoint whose tensors
disagree with each other reaches the wrapper's own checks, as it would in the engine.
"""
from __future__ import annotations

from typing import Any

import msgspec
from msgspec.structs import replace

from kvdoctor.engines.sglang.kda import checkpoint_dims as kda_dims
from kvdoctor.load.loader import layer_tensor
from kvdoctor.model import KDA, ModelSpec, Source

# The latent-bug probe's geometry: every symbol distinct, K and V powers of two, grouped heads.
PROBE = {"H": 2, "HV": 4, "K": 32, "V": 64, "L": 3}


class Geometry(msgspec.Struct, frozen=True):
    """One build: per-rank heads and dims, ring length, and the decode inputs' widths."""

    H: int
    HV: int
    K: int
    V: int
    L: int
    W: int
    q_width: int
    k_width: int
    v_width: int
    a_width: int
    b_width: int
    A_log_numel: int
    dt_bias_numel: int

    def symbols(self, batch: int) -> dict[str, int]:
        return {"H": self.H, "HV": self.HV, "K": self.K, "V": self.V, "L": self.L, "W": self.W, "B": batch}

    @classmethod
    def consistent(cls, H: int, HV: int, K: int, V: int, L: int, W: int = 4) -> "Geometry":
        """A geometry whose decode inputs agree with its heads and dims."""
        return cls(H=H, HV=HV, K=K, V=V, L=L, W=W, q_width=H * K, k_width=H * K, v_width=HV * V,
                   a_width=HV * K, b_width=HV, A_log_numel=HV, dt_bias_numel=HV * K)

    def with_heads(self, H: int, HV: int) -> "Geometry":
        """The same dims and ring with fewer heads (cheap kernel runs keep the HV/H grouping)."""
        return replace(self, H=H, HV=HV, q_width=H * self.K, k_width=H * self.K, v_width=HV * self.V,
                       a_width=HV * self.K, b_width=HV, A_log_numel=HV, dt_bias_numel=HV * self.K)


class LayerDims(msgspec.Struct):
    """Whole-model (TP 1) numbers for one KDA layer, with where each came from."""

    layer: int
    H: int
    HV: int
    K: int
    V: int
    W: int
    config_heads: int  # linear_attn_config.num_heads: what sglang shards by TP
    widths: dict[str, int]
    sources: dict[str, Source] = msgspec.field(default_factory=dict)

    def signature(self) -> tuple:
        return (self.H, self.HV, self.K, self.V, self.W, self.config_heads, tuple(sorted(self.widths.items())))

    def tp_error(self, tp: int) -> str | None:
        """sglang's load-time refusal for this TP size, verbatim, or None."""
        if self.config_heads % tp:
            return f"KDA num_heads ({self.config_heads}) must be divisible by shard tp_size ({tp})"
        return None

    def geometry(self, tp: int, L: int) -> Geometry:
        w = {k: v // tp for k, v in self.widths.items()}
        return Geometry(H=self.H // tp, HV=self.HV // tp, K=self.K, V=self.V, L=L, W=self.W, **w)

    def to_json(self) -> dict[str, Any]:
        return {"H": self.H, "HV": self.HV, "K": self.K, "V": self.V, "conv_kernel": self.W,
                "sources": {k: s.to_json() for k, s in self.sources.items()}}


def _rows(spec: ModelSpec, layer: int, name: str) -> int | None:
    info = layer_tensor(spec, layer, name)
    return info.shape[0] if info is not None and info.shape else None


def _numel(spec: ModelSpec, layer: int, name: str) -> int | None:
    info = layer_tensor(spec, layer, name)
    return info.numel if info is not None else None


def layer_dims(spec: ModelSpec, index: int) -> LayerDims | None:
    """Dims of one KDA layer (checkpoint first, config second), or None when they cannot be known."""
    lac = spec.config.get("linear_attn_config")
    lac = lac if isinstance(lac, dict) else {}
    cfg_heads, cfg_dim = lac.get("num_heads"), lac.get("head_dim")
    cfg_conv = lac.get("short_conv_kernel_size", 4)
    found = kda_dims.from_checkpoint(spec, index)
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    config_fallback = {"HV": ("num_heads", cfg_heads), "H": ("num_heads", cfg_heads),
                       "K": ("head_dim", cfg_dim), "V": ("head_dim", cfg_dim),
                       "W": ("short_conv_kernel_size", cfg_conv)}
    for sym, (key, cfg_value) in config_fallback.items():
        got = getattr(found, "conv_kernel" if sym == "W" else sym, None) if found else None
        if isinstance(got, int) and got > 0:
            values[sym], sources[sym] = got, found.sources["conv_kernel" if sym == "W" else sym]
        elif isinstance(cfg_value, int) and not isinstance(cfg_value, bool) and cfg_value > 0:
            values[sym], sources[sym] = cfg_value, spec.key_source(f"linear_attn_config.{key}")
    if len(values) < 5:
        return None
    H, HV, K, V = values["H"], values["HV"], values["K"], values["V"]
    measured = {
        "q_width": _rows(spec, index, "self_attn.q_proj.weight"),
        "k_width": _rows(spec, index, "self_attn.k_proj.weight"),
        "v_width": _rows(spec, index, "self_attn.v_proj.weight"),
        "a_width": _rows(spec, index, "self_attn.f_b_proj.weight"),
        "b_width": _rows(spec, index, "self_attn.b_proj.weight"),
        "A_log_numel": _numel(spec, index, "self_attn.A_log"),
        "dt_bias_numel": _numel(spec, index, "self_attn.dt_bias"),
    }
    implied = Geometry.consistent(H, HV, K, V, L=1)
    widths = {k: (v if v is not None else getattr(implied, k)) for k, v in measured.items()}
    heads = cfg_heads if isinstance(cfg_heads, int) and cfg_heads > 0 else HV
    return LayerDims(layer=index, H=H, HV=HV, K=K, V=V, W=values["W"], config_heads=heads, widths=widths,
                     sources=sources)


def kda_groups(spec: ModelSpec) -> list[list[LayerDims]]:
    """KDA layers grouped by identical numbers: one cache build serves every layer of a group."""
    groups: dict[tuple, list[LayerDims]] = {}
    for layer in spec.layers:
        if layer.kind != KDA:
            continue
        dims = layer_dims(spec, layer.index)
        if dims is not None:
            groups.setdefault(dims.signature(), []).append(dims)
    return list(groups.values())
