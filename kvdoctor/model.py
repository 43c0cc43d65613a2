"""The data every stage shares: where a value came from, the per-layer spec, findings and results.

Data flows one way: load -> ModelSpec -> engine plan -> probes -> findings -> report.
Nothing here imports torch, mlx or any engine.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, NamedTuple

import msgspec

# Layer kinds, in the Hugging Face sense of what the model means.
FULL = "full_attention"
SLIDING = "sliding_attention"
CHUNKED = "chunked_attention"
KDA = "kda"
GDN = "gated_deltanet"
MAMBA = "mamba"
MLA = "mla"  # multi-head latent attention: one latent (kv_lora_rank) + rope key (qk_rope_head_dim) per token
SPARSE_MLA = "sparse_mla"  # MLA plus an indexer that keeps its own small key cache (DeepSeek-V3.2 DSA)
CONV = "conv"  # short-convolution layers of conv/attention hybrids: conv state, no KV cache
NO_ATTENTION = "none"  # a block with no token mixer that caches anything (NAS-style no-op attention)
COMPRESSED = "compressed_attention"  # attention over block-compressed keys (DeepSeek-V4 CSA / HCA layers)
LINEAR = "linear_attention"
ATTN_MAMBA = "attention+mamba"  # Falcon-H1: attention and a Mamba mixer side by side in every layer
UNKNOWN = "unknown"

ATTENTION_KINDS = frozenset({FULL, SLIDING, CHUNKED, MLA, SPARSE_MLA, COMPRESSED, ATTN_MAMBA})
STATE_KINDS = frozenset({KDA, GDN, MAMBA, LINEAR, CONV, ATTN_MAMBA})

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


class Source(msgspec.Struct, frozen=True):
    """Where one value came from, so a report can point at it.

    kind: "key" (read from a config key), "default" (the family default transformers applies),
    "tensor" (read from a checkpoint header), "derived" (computed from other values),
    "deploy" (a deploy-file setting), "transformers" (as the installed transformers' configuration
    class resolved it: its default, derived value or adjustment of the key).
    """

    kind: str
    ref: str
    file: str | None = None
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ref": self.ref, "file": self.file, "line": self.line}


class LayerSpec(msgspec.Struct):
    index: int
    kind: str
    window: int | None = None  # sliding: keys attended including the query's own; chunked: the chunk size
    n_heads: int | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None
    v_head_dim: int | None = None
    dtype: str | None = None
    kv_lora_rank: int | None = None  # MLA latent width cached per token
    qk_rope_head_dim: int | None = None  # MLA rope key width cached per token beside the latent
    index_head_dim: int | None = None  # sparse MLA: the indexer's key width
    index_topk: int | None = None  # sparse MLA: keys each query keeps
    conv_kernel: int | None = None  # conv layers: the convolution's length (state keeps kernel - 1 steps)
    sources: dict[str, Source] = msgspec.field(default_factory=dict)


class TensorInfo(NamedTuple):
    """One header entry. A named tuple, so that a 20k-tensor checkpoint's table is built in C
    (checkpoint.py) rather than by 20k record constructors."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class Checkpoint(msgspec.Struct):
    """Safetensors headers only: names, dtypes, shapes. Never tensor data."""

    files: list[str]
    tensors: dict[str, TensorInfo]
    index_file: str | None = None
    missing_shards: list[str] = msgspec.field(default_factory=list)
    extra_shards: list[str] = msgspec.field(default_factory=list)
    total_bytes: int = 0

    def get(self, name: str) -> TensorInfo | None:
        return self.tensors.get(name)


class ModelSpec(msgspec.Struct):
    target: str
    model_dir: Path
    model_type: str
    family: str
    raw_config: dict[str, Any]
    config: dict[str, Any]
    config_prefix: str
    layers: list[LayerSpec]
    num_hidden_layers: int
    hidden_size: int | None
    vocab_size: int | None
    dtype: str | None
    checkpoint: Checkpoint | None
    key_lines: dict[str, int]
    sources: dict[str, Source] = msgspec.field(default_factory=dict)
    defaults: dict[str, Any] = msgspec.field(default_factory=dict)
    notes: list[str] = msgspec.field(default_factory=list)
    hf_id: str | None = None
    semantics: str = "table"  # where the per-layer meaning came from: "table", "transformers" or "guess"
    rejected: Any = None  # kvdoctor.load.hf_config.Rejected: transformers' configuration class refused the config
    origin: dict[str, Any] = msgspec.field(default_factory=dict)  # where the files came from (the report's "source")
    # Why the layers could not be read (no layer count, and no library class knows the model_type): an engine
    # whose config stage refuses such a config before reading any layer (vLLM: an unknown model_type, or a
    # class that is the checkpoint's own code) answers it; everything that needs the layers raises it.
    unread: str | None = None

    def require_layers(self) -> None:
        """InputError where the loader could not read the layers (`unread`)."""
        if self.unread is not None:
            from kvdoctor.errors import InputError

            raise InputError(self.unread)

    def key_source(self, key: str) -> Source:
        """A Source for a config key (relative to the text config), with its line when present."""
        path = self.config_prefix + key
        return Source("key", path, "config.json", self.line_of(key))

    def line_of(self, key: str) -> int | None:
        """Line of a text-config key in config.json (nested keys as 'a.b'); falls back to the parent."""
        path = self.config_prefix + key
        while path:
            if path in self.key_lines:
                return self.key_lines[path]
            path = path.rpartition(".")[0]
        return None

    def kinds(self) -> set[str]:
        return {layer.kind for layer in self.layers}


class Finding(msgspec.Struct):
    """One problem. Rules fill code, message and location; the catalog supplies name, severity, fixes."""

    code: str
    message: str
    layer: int | None = None
    file: str | None = None
    line: int | None = None
    key: str | None = None  # the offending config key or deploy setting, for fingerprints
    engine_error: dict[str, Any] | None = None
    evidence: dict[str, Any] = msgspec.field(default_factory=dict)
    severity: str | None = None  # None: the catalog's severity
    name: str = ""
    fixes: list[str] = msgspec.field(default_factory=list)

    @classmethod
    def at(cls, code: str, message: str, source: Source | None, **kw: Any) -> "Finding":
        """A finding located at a Source (config key, tensor or deploy setting)."""
        if source is None:
            return cls(code, message, **kw)
        kw.setdefault("key", source.ref)
        return cls(code, message, file=source.file, line=source.line, **kw)


class Result(msgspec.Struct):
    target: str
    model_type: str | None
    engine: str
    engine_versions: dict[str, str]
    layers: list[dict[str, Any]]
    findings: list[Finding]
    error: str | None = None  # an input error for this target (exit 2), reported without a traceback
    model_dir: Path | None = None  # where the model's files were read (a Hugging Face id's snapshot)
    info: dict[str, Any] = msgspec.field(default_factory=dict)
    # The model's KV budget document (`kvdoctor budget`'s, for the same deploy file), when the check was
    # asked for it; else why it could not be sized. Reports show it; the JSON result does not carry it.
    budget: dict[str, Any] | None = None
    budget_error: str | None = None
    source: dict[str, Any] | None = None  # where the model's files came from: a directory, the HF cache, a Hub
