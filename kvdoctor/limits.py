"""Fixed bounds on what any input can make kvdoctor read, parse or build.

Files are refused past a size bound before they are read; sizes in a config are refused past a
sanity bound before any layer is built. Caches are sized against the probe budget before they are
built (the rule LIM001, `kvdoctor.checks.lim`).
"""
from __future__ import annotations

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

# Ranges of the command line's integer types that a plain decimal spelling may bypass pydantic for
# (cli/types.py); strict.py builds the same types from them, so the two cannot drift.
PLAIN_INT_RANGES = {"Jobs": (1, 1024)}

# Caches one probe may build for one model, all of them together.
PROBE_BUDGET_BYTES = 1024 * MiB
# The least any probe builds: one slot of this many tokens per attention layer, one recurrent state
# (float32) per linear-attention layer.
PROBE_MIN_TOKENS = 16
STATE_BYTES = 4

# Bytes per element, under the safetensors names, the torch / mlx names and the engines' KV cache names:
# the one table of element widths.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
    "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int16": 2, "float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4, "float32": 4,
    "int64": 8, "float64": 8, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}


BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float, digits: int = 1, unit: str | None = None, largest: str = "PiB") -> str:
    """Bytes in binary units: the largest unit (up to `largest`) the value reaches, or the `unit` given,
    with `digits` decimals; whole bytes below a KiB. The one byte formatter of kvdoctor's texts."""
    if unit is None:
        top = BYTE_UNITS.index(largest)
        step = next((i for i in range(top, 0, -1) if n >= 1024 ** i), 0)
        if step == 0:
            return f"{n} B"
        unit = BYTE_UNITS[step]
    return f"{n / 1024 ** BYTE_UNITS.index(unit):.{digits}f} {unit}"


def tensor_nbytes(shape: tuple[int, ...] | list[int], dtype: str) -> int:
    """Bytes a dense tensor of this shape and dtype (a name such as "bfloat16" or "BF16") holds."""
    n = DTYPE_BYTES[str(dtype).removeprefix("torch.").removeprefix("mlx.core.")]
    for d in shape:
        n *= int(d)
    return n
