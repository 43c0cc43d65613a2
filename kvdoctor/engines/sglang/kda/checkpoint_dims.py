"""KDA dimensions as the checkpoint headers reveal them (no weights read).

HV = b_proj rows (A_log numel agrees); K = dt_bias numel / HV; V = o_norm numel;
H = q_proj rows / K (k_proj agrees). Quantized projections keep dim 0 intact, so only rows are used.
"""
from __future__ import annotations

import msgspec

from kvdoctor.load.loader import layer_tensor
from kvdoctor.model import ModelSpec, Source, TensorInfo


class CheckpointDims(msgspec.Struct):
    layer: int
    HV: int | None = None
    K: int | None = None
    V: int | None = None
    H: int | None = None
    conv_kernel: int | None = None
    sources: dict[str, Source] = msgspec.field(default_factory=dict)
    tensors: dict[str, TensorInfo] = msgspec.field(default_factory=dict)


TENSORS = {
    "b_proj": "self_attn.b_proj.weight",
    "A_log": "self_attn.A_log",
    "dt_bias": "self_attn.dt_bias",
    "o_norm": "self_attn.o_norm.weight",
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "q_conv1d": "self_attn.q_conv1d.weight",
}


def from_checkpoint(spec: ModelSpec, layer: int) -> CheckpointDims | None:
    """The dimensions one KDA layer's tensors imply, or None when the layer has no KDA tensors."""
    found = {key: layer_tensor(spec, layer, name) for key, name in TENSORS.items()}
    found = {k: v for k, v in found.items() if v is not None}
    if not found:
        return None
    dims = CheckpointDims(layer=layer, tensors=found)

    def src(key: str) -> Source:
        info = found[key]
        return Source("tensor", info.name, info.file)

    if "b_proj" in found:
        dims.HV, dims.sources["HV"] = found["b_proj"].shape[0], src("b_proj")
    elif "A_log" in found:
        dims.HV, dims.sources["HV"] = found["A_log"].numel, src("A_log")
    if "dt_bias" in found and dims.HV:
        dims.K, dims.sources["K"] = found["dt_bias"].numel // dims.HV, src("dt_bias")
    if "o_norm" in found:
        dims.V, dims.sources["V"] = found["o_norm"].numel, src("o_norm")
    if "q_proj" in found and dims.K:
        dims.H, dims.sources["H"] = found["q_proj"].shape[0] // dims.K, src("q_proj")
    if "q_conv1d" in found and len(found["q_conv1d"].shape) == 3:
        dims.conv_kernel, dims.sources["conv_kernel"] = found["q_conv1d"].shape[-1], src("q_conv1d")
    return dims
