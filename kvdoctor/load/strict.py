"""Strict value types for deploy files and the command line.

YAML and pydantic are both forgiving by default: `context_length: true` becomes 1, `"8"` becomes 8,
`2.0` becomes 2 and `.nan` passes every range check (NaN compares false to everything). A deploy
file is read before a deploy, so a forgiving reading hides a typo until the engine starts. These
types accept a value only in its own type: booleans are `true` or `false`, integers are integers
(never booleans, floats or strings), numbers are finite, names are not empty, and sizes such as
`40GiB` are parsed to a whole number of bytes.

Ranges follow the engine where the engine states one (its own check is cited); otherwise they are
kvdoctor's sanity bounds, past which a value is a typo rather than a setting. The command line
uses the same types through `CommandLineValue`, so `--jobs 0` and `jobs: 0` get the same answer.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated, Any, Union

from pydantic import AfterValidator, AllowInfNan, Field, Strict, TypeAdapter, ValidationError

from kvdoctor.errors import InputError
from kvdoctor.limits import PLAIN_INT_RANGES

# --- the basic kinds ---------------------------------------------------------------------------------

Bool = Annotated[bool, Strict()]
Int = Annotated[int, Strict()]

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _name(value: str) -> str:
    if not value.strip():
        raise ValueError("expected a non-empty name")
    if _CONTROL.search(value):
        raise ValueError("expected a name without control characters (newline, tab, NUL)")
    return value


Name = Annotated[str, Strict(), AfterValidator(_name)]

# --- sizes -------------------------------------------------------------------------------------------

UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
         "t": 1000 ** 4, "tb": 1000 ** 4, "p": 1000 ** 5, "pb": 1000 ** 5,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50}
SIZE_RE = re.compile(r"^\s*([0-9]{1,16}(?:\.[0-9]{1,16})?)\s*([A-Za-z]{0,3})\s*$")
MAX_BYTES = 1 << 50


def size_bytes(value: Any) -> int:
    """'40GiB', '80 GB', '1.5TiB' or a whole byte count -> bytes. Booleans, floats, fractions of a
    byte, exponents, NaN and sizes past 1 PiB are refused (ValueError)."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = Fraction(value)
    elif isinstance(value, str) and (match := SIZE_RE.match(value)) and match.group(2).lower() in UNITS:
        size = Fraction(match.group(1)) * UNITS[match.group(2).lower()]
    else:
        raise ValueError("expected a size such as 40GiB or 80GB")
    if size.denominator != 1:
        raise ValueError("expected a whole number of bytes")
    if not 0 < size <= MAX_BYTES:
        raise ValueError("out of range; expected more than 0 and at most 1 PiB")
    return int(size)


def parse_size(value: Any, what: str = "size") -> int:
    """`size_bytes`, with an InputError naming `what` and the value."""
    try:
        return size_bytes(value)
    except ValueError as exc:
        raise InputError(f"{what}: {value!r}: {exc}") from None


def _size(value: Union[str, int]) -> Union[str, int]:
    size_bytes(value)
    return value


# The value as written ("40GiB"), checked; `parse_size` turns it into bytes where it is used.
Size = Annotated[Union[Annotated[str, Strict()], Int], AfterValidator(_size)]

# --- ranges ------------------------------------------------------------------------------------------

MAX_CONTEXT = 1 << 26  # kvdoctor's bound: 67.1M tokens, so twice Llama-4-Scout's 10.5M context is the engines' to refuse
MAX_COUNT = 1 << 24  # slots, sequences, cached states: kvdoctor's bound
MAX_TP = 1024  # kvdoctor's bound; the engines take any positive size

Positive = Annotated[int, Strict(), Field(ge=1, le=MAX_COUNT)]
NonNegative = Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
Tokens = Annotated[int, Strict(), Field(ge=1, le=MAX_CONTEXT)]
TensorParallel = Annotated[int, Strict(), Field(ge=1, le=MAX_TP)]
Ratio = Annotated[float, Strict(), AllowInfNan(False), Field(gt=0, le=1)]
PositiveFloat = Annotated[float, Strict(), AllowInfNan(False), Field(gt=0, le=MAX_COUNT)]
SpeculativeTokens = Annotated[int, Strict(), Field(ge=0, le=64)]  # kvdoctor's bound on draft tokens per step

# vLLM 0.33.0 refuses a tensor-parallel size below 1:
# https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/config/parallel.py#L142
VllmTensorParallel = TensorParallel
# ... a max_num_batched_tokens or max_num_seqs below 1:
# https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/config/scheduler.py#L48 (and #L62)
VllmTokens = Tokens
VllmSeqs = Positive
# ... and a block size of 0: https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/config/cache.py#L187
VllmBlockSize = Annotated[int, Strict(), Field(ge=1, le=1 << 16)]

# SGLang 0.5.23 refuses "--swa-full-tokens-ratio should be in range (0, 1.0].":
# https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/arg_groups/kv_cache_hook.py#L427
SglangSwaRatio = Ratio
# Its "--linear-replayssm-cache-len must be >= 1" refusal
# (https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/arg_groups/attention_hook.py#L434)
# is a finding, KDA062, with the engine's own message: the type lets 0 and below through to it.
SglangReplayCacheLen = Annotated[int, Strict(), Field(le=1 << 16)]


def _one_of(*allowed: int):
    def check(value: int) -> int:
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(map(str, allowed))}")
        return value
    return AfterValidator(check)


# mlx 0.32.4's mx.quantize (what mlx-lm's quantized KV cache calls) accepts group sizes 32, 64 and 128
# ("The supported group sizes are 32, 64, and 128.",
# https://github.com/ml-explore/mlx/blob/v0.32.1/mlx/ops.cpp#L5047) and bits 1, 2, 3, 4, 5, 6 and 8
# (1-bit came after v0.32.1, in ml-explore/mlx commit 309f947e6; 0.32.4 reports "The supported bits
# are 1, 2, 3, 4, 5, 6 and 8.").
MlxKvBits = Annotated[int, Strict(), _one_of(1, 2, 3, 4, 5, 6, 8)]
MlxGroupSize = Annotated[int, Strict(), _one_of(32, 64, 128)]

# The command line (kvdoctor's own bounds).
Jobs = Annotated[int, Strict(), Field(ge=PLAIN_INT_RANGES["Jobs"][0], le=PLAIN_INT_RANGES["Jobs"][1])]
Seconds = Annotated[float, Strict(), AllowInfNan(False), Field(ge=1, le=24 * 3600)]


# --- the command line --------------------------------------------------------------------------------

def _cli_parse(kind: type, text: str) -> Any:
    """Command-line text to the value it spells, before the type's own checks."""
    if kind is int:
        if not re.fullmatch(r"[+-]?[0-9]{1,30}", text.strip()):
            raise ValueError("expected a whole number")
        return int(text)
    if kind is float:
        try:
            return float(text)  # 'nan' and 'inf' parse here and are refused by the type
        except ValueError:
            raise ValueError("expected a number") from None
    return text


def check_value(annotated: Any, value: Any) -> Any:
    """Validate `value` against one of the types above: the value, or ValueError with the reason."""
    try:
        return TypeAdapter(annotated).validate_python(value)
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ValueError(msg[:1].lower() + msg[1:]) from None


def command_line_type(annotated: Any, kind: type = str, metavar: str | None = None):
    """A click parameter type that validates with `annotated`, for `typer.Option(click_type=...)`."""
    from typer._click.types import ParamType  # typer 0.28 carries its own copy of click

    class CommandLineValue(ParamType):
        name = metavar or {int: "INTEGER", float: "NUMBER"}.get(kind, "TEXT")

        def convert(self, value: Any, param, ctx) -> Any:
            if not isinstance(value, str):
                return value  # a default
            try:
                return check_value(annotated, _cli_parse(kind, value))
            except ValueError as exc:
                self.fail(f"{value!r}: {exc}", param, ctx)

    return CommandLineValue()
