"""Fixed bounds on what any input can make kvdoctor read, parse or build.

Files are refused past a size bound before they are read; sizes in a config are refused past a
sanity bound before any layer is built. Caches are sized before they are built, twice over:
`run` (check LIM001) adds up the smallest caches any probe builds for the model, and when even
those pass the probe budget no probe runs at all; and each probe lists what it will build
(`kvdoctor.engines.base.Cost`) before it builds anything, the pipeline turning the first entry past
the budget into LIM001 (`ProbeOverBudget.finding`) while the other checks go on.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from kvdoctor.checks import Rule
from kvdoctor.model import ATTENTION_KINDS, STATE_KINDS, Finding, LayerSpec, ModelSpec, Source

RULE = Rule(codes=("LIM001",))  # sizes the smallest probe caches up front; the probe stage also reports it

if TYPE_CHECKING:
    from kvdoctor.checks.context import Context

MiB = 1024 * 1024

# Files.
MAX_JSON_BYTES = 16 * MiB  # config.json, model.safetensors.index.json
MAX_JSON_DEPTH = 64
MAX_YAML_BYTES = 1 * MiB  # deploy files and catalog entries
MAX_YAML_NODES = 100_000  # counted with every alias expanded: a YAML "billion laughs" stops here
MAX_YAML_DEPTH = 64
# Safetensors headers: parsing one takes about 20 bytes of memory per header byte at peak (610 MiB
# for 30 MiB of header, 380,000 tensors). Qwen3-Next-80B's 74,000 tensors in one file take 9 MiB.
MAX_HEADER_BYTES = 32 * MiB  # one file (the safetensors library allows 100 MB)
MAX_TOTAL_HEADER_BYTES = 128 * MiB  # all files of one checkpoint together
MAX_SHARDS = 4096

# Config sizes: anything past these is a typo or hostile, not a model.
MAX_LAYERS = 10_000
MAX_HEADS = 4096
MAX_HEAD_DIM = 16_384
MAX_HIDDEN = 1 << 20
MAX_CONV_KERNEL = 4096
MAX_TOKENS = 1 << 40  # windows, chunk sizes, context lengths

# Caches one probe may build for one model, all of them together.
PROBE_BUDGET_BYTES = 1024 * MiB
# The least any probe builds: one slot of this many tokens per attention layer, one recurrent state
# (float32) per linear-attention layer.
PROBE_MIN_TOKENS = 16
STATE_BYTES = 4

# Bytes per element, under the safetensors names and the torch / mlx names.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
    "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int16": 2, "float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4, "float32": 4,
    "int64": 8, "float64": 8,
}


def human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} PiB"


def tensor_nbytes(shape: tuple[int, ...] | list[int], dtype: str) -> int:
    """Bytes a dense tensor of this shape and dtype (a name such as "bfloat16" or "BF16") holds."""
    n = DTYPE_BYTES[str(dtype).removeprefix("torch.").removeprefix("mlx.core.")]
    for d in shape:
        n *= int(d)
    return n


class ProbeOverBudget(Exception):
    """A probe was about to build caches larger than the budget; it builds nothing."""

    def __init__(self, what: str, nbytes: int, budget: int, source: Source | None = None,
                 layer: int | None = None):
        super().__init__(f"{what} would need {human_bytes(nbytes)}, more than the {human_bytes(budget)} probe "
                         "budget, so they were not built and the checks that need them did not run")
        self.what, self.nbytes, self.budget, self.source, self.layer = what, nbytes, budget, source, layer

    def finding(self) -> Finding:
        return Finding.at("LIM001", str(self), self.source, layer=self.layer,
                          evidence={"what": self.what, "bytes": self.nbytes, "budget_bytes": self.budget})


def _smallest_cache_bytes(layer: LayerSpec) -> int:
    heads = layer.n_kv_heads or layer.n_heads or 0
    k = layer.head_dim or 0
    v = layer.v_head_dim or k
    if layer.kind in STATE_KINDS:
        return heads * k * v * STATE_BYTES
    if layer.kind in ATTENTION_KINDS:
        return PROBE_MIN_TOKENS * heads * (k + v) * DTYPE_BYTES.get(layer.dtype or "", 4)
    return 0


def smallest_probe_bytes(spec: ModelSpec) -> tuple[int, LayerSpec | None]:
    """(bytes of the smallest caches any probe builds for this model, the layer that needs most)."""
    sizes = [(_smallest_cache_bytes(layer), layer) for layer in spec.layers]
    total = sum(n for n, _ in sizes)
    return total, max(sizes, key=lambda s: s[0])[1] if sizes else None


def probes_fit(spec: ModelSpec) -> bool:
    return smallest_probe_bytes(spec)[0] <= PROBE_BUDGET_BYTES


def run(ctx: Context) -> Iterable[Finding]:
    """LIM001 when even the smallest probe caches pass the budget (no probe runs then)."""
    total, layer = smallest_probe_bytes(ctx.spec)
    if total > PROBE_BUDGET_BYTES and layer is not None:
        source = layer.sources.get("n_kv_heads") or layer.sources.get("n_heads")
        yield ProbeOverBudget(f"the smallest probe caches for {len(ctx.spec.layers)} layers", total,
                              PROBE_BUDGET_BYTES, source, layer.index).finding()
