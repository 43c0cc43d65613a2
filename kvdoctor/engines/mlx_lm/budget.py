"""mlx-lm 0.32.2: the caches one request holds after a prompt of L tokens, and their peak on the way.

mlx-lm has no pool and no admission control: memory is per request, and the caller decides how
many requests share the device. `make_prompt_cache` uses the model's own `make_cache` when the
class defines one (then `--max-kv-size` is ignored); otherwise every layer gets a RotatingKVCache
of `max_kv_size` (keep=4) or a growing KVCache. The prompt is fed the way `generate_step` feeds it
(chunks of `prefill_step_size`, the last token alone), and `--kv-bits` converts growing caches
once their offset reaches `quantized_kv_start`. Shapes only: this module simulates buffer lengths.
File:line references are to the mlx_lm 0.32.2 wheel.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET, UnsetType
from msgspec.structs import replace

from kvdoctor.engines.budget.common import Budget, BudgetView, EngineRefusal, Record, n, size
from kvdoctor.engines.budget.facts import ModelFacts, dtype_bytes
from kvdoctor.engines.budget.run import default_context, kv_memory
from kvdoctor.engines.pins import PINS
from kvdoctor.errors import InputError
from kvdoctor.engines.sglang_mlx.mlxlm import make_cache_module, module_name_for

if TYPE_CHECKING:
    from kvdoctor.engines.budget.settings import BudgetSettings
    from kvdoctor.engines.mlx_lm.settings import MlxLmSettings

VERSION = PINS["mlx-lm"]
STEP = 256  # KVCache / RotatingKVCache / QuantizedKVCache growth step
REFS = {
    "make_prompt_cache": "mlx_lm/models/cache.py:15-40",
    "kv_cache": "mlx_lm/models/cache.py:339-420",
    "rotating": "mlx_lm/models/cache.py:423-594",
    "quantized": "mlx_lm/models/cache.py:251-336",
    "generate_step": "mlx_lm/generate.py:305-470",
}


class Mode(msgspec.Struct, frozen=True):
    context: int  # tokens in the request (the prompt processed so far)
    kv_budget_bytes: int
    max_kv_size: int | None = None
    kv_bits: int | None = None
    kv_group_size: int = 64
    quantized_kv_start: int = 5000
    prefill_step_size: int = 2048


class Prefill(msgspec.Struct):
    """A prompt fed as generate_step does: the caches' bytes at the end and at their peak."""

    bytes: int
    peak_bytes: int
    chunks: int
    lengths: list[int | None]  # each layer's cache length at the end; None for a state layer


class ModeRecord(Record, kw_only=True):
    context: int
    max_kv_size: int | None
    max_kv_size_honored: bool | None  # None: no --max-kv-size given
    kv_bits: int | None
    kv_group_size: int
    quantized_kv_start: int
    prefill_step_size: int
    dtype: str


class LayerKindRecord(Record, kw_only=True):
    kind: str
    cache: str  # the mlx-lm class: KVCache | RotatingKVCache | ArraysCache
    max_size: int | None  # a RotatingKVCache's window
    layers: int
    bytes_per_token_per_layer: int


class StateRecord(Record, kw_only=True):
    kind: str
    bytes_per_request_per_layer: int
    layers: int


class CapacityRecord(Record, kw_only=True):
    """No shared pool: each request holds its own caches."""

    unit: str = "requests"
    context: int
    per_request_bytes: int | UnsetType = UNSET
    peak_prefill_bytes: int | UnsetType = UNSET
    max_concurrency: float | None | UnsetType = UNSET
    max_context_fit: int | None | UnsetType = UNSET
    kv_budget_bytes: int


class MlxBudget(Budget, kw_only=True):
    mode: ModeRecord
    capacity: CapacityRecord
    layer_kinds: list[LayerKindRecord] = []
    state: StateRecord | None = None
    prefill: Prefill | None = None  # None: refused before the prompt was fed

    def parts(self) -> tuple[ModeRecord, list[LayerKindRecord], StateRecord | None, CapacityRecord]:
        return self.mode, self.layer_kinds, self.state, self.capacity


class CacheSim(msgspec.Struct):
    """Buffer length along the token axis of one layer's cache, updated as mlx-lm updates it."""

    kind: str  # kv | rotating | quantized
    max_size: int = 0
    keep: int = 0
    length: int = 0
    offset: int = 0
    idx: int = 0

    def update(self, n: int) -> None:
        if self.kind in ("kv", "quantized"):
            if self.length == 0 or self.offset + n > self.length:
                grow = (STEP + n - 1) // STEP * STEP
                if self.length and self.offset % STEP:
                    self.length = self.offset
                self.length += grow
            self.offset += n
        elif n > 1:
            self._concat(n)
        else:
            self._in_place(n)

    def _concat(self, n: int) -> None:
        if self.length == 0:
            self.length = n
        else:
            if self.idx != self.length and self.idx >= self.offset:
                self.length = self.idx  # unused tail sliced off
            trim = self.length - self.max_size + 1
            self.length = self.length - max(trim, 0) + n
        self.offset += n
        self.idx = self.length

    def _in_place(self, n: int) -> None:
        prev = self.offset
        if self.length == 0 or (prev >= self.length and self.length < self.max_size):
            self.length += min(STEP, self.max_size - prev)
            self.idx = prev
        if self.length > self.max_size:
            self.length = self.max_size
            self.idx = self.max_size
        if self.idx == self.max_size:
            self.idx = self.keep
        self.offset += n
        self.idx += n


def honours_max_kv_size(facts: ModelFacts) -> bool:
    """mlx-lm gives every layer a RotatingKVCache of --max-kv-size unless the class it loads builds its
    own caches (the pinned wheel's list, as the mlx-lm plan reads it)."""
    return not make_cache_module(loaded_module(facts))


def loaded_module(facts: ModelFacts) -> str:
    """The mlx_lm.models module mlx-lm loads: the profile's reading of the whole config (a VLM's outer
    model_type); facts made without the profile have only the text model's."""
    return facts.mlx_lm_module or text_module(facts)


def text_module(facts: ModelFacts) -> str:
    """The mlx_lm.models module of the text model, whose class lays out the layers' caches."""
    return module_name_for({"model_type": facts.model_type, "architectures": facts.architectures})


def layer_caches(facts: ModelFacts, mode: Mode, config: dict[str, Any]) -> list[str]:
    """Each layer's cache kind: 'kv', 'rotating:W:keep' or 'state'."""
    n = len(facts.layers)
    if honours_max_kv_size(facts):
        return [f"rotating:{mode.max_kv_size}:4"] * n if mode.max_kv_size is not None else ["kv"] * n
    model_type = text_module(facts)
    window = config.get("sliding_window")
    if model_type in ("gemma3_text", "llama", "olmo3", "gpt_oss") and any(l.kind == "sliding" for l in facts.layers) \
            and not (isinstance(window, int) and window > 0):
        raise InputError(f"{facts.name}: config.json gives no sliding_window, so mlx-lm's {model_type} takes the "
                         "default of its own ModelArgs, which kvdoctor budget does not read; give sliding_window")
    if model_type in ("qwen3_next", "kimi_linear"):
        return ["state" if layer.kind in ("gdn", "kda") else "kv" for layer in facts.layers]
    if model_type == "gemma3_text":
        pattern = config.get("sliding_window_pattern", 6)
        return ["kv" if i % pattern == pattern - 1 else f"rotating:{window}:0" for i in range(n)]
    if model_type in ("llama", "olmo3", "gpt_oss"):
        types = config.get("layer_types")
        if not isinstance(types, list):
            types = (["full_attention"] * n if model_type == "llama"
                     else ["sliding_attention" if layer.kind == "sliding" else "full_attention"
                           for layer in facts.layers])
        return ["kv" if t == "full_attention" else f"rotating:{window}:0" for t in types[:n]]
    raise EngineRefusal("kvdoctor", f"mlx-lm model type {facts.model_type!r} builds its own caches "
                                    "(make_cache), which kvdoctor does not price yet", stage="load")


def kv_token_bytes(facts: ModelFacts, kind: str, bits: int | None, group: int) -> int:
    """Bytes one token takes in one attention layer's cache (all KV heads, keys and values)."""
    act = dtype_bytes(facts.activation_dtype)
    if facts.mla_latent and kind == "mla":
        dims, heads = facts.mla_latent, 1  # latent as keys, rope part as values
    else:
        dims, heads = (facts.head_dim, facts.head_dim), facts.kv_heads
    if bits is None:
        return heads * sum(dims) * act
    return heads * sum(d * bits // 8 + 2 * (d // group) * act for d in dims)


def state_bytes(facts: ModelFacts) -> int:
    """A GDN / KDA layer's ArraysCache: conv states in the activation dtype, recurrent state in fp32."""
    act = dtype_bytes(facts.activation_dtype)
    if facts.gdn:
        g = facts.gdn
        conv_dim = 2 * g.key_heads * g.key_dim + g.value_heads * g.value_dim
        return (g.conv_kernel - 1) * conv_dim * act + g.value_heads * g.value_dim * g.key_dim * 4
    k = facts.kda
    return 3 * (k.conv_kernel - 1) * k.heads * k.head_dim * act + k.heads * k.head_dim * k.head_dim * 4


def simulate(facts: ModelFacts, mode: Mode, kinds: list[str]) -> Prefill:
    """Feed a prompt of `mode.context` tokens as generate_step does; return bytes now and at peak."""
    sims: list[CacheSim | None] = []
    for kind in kinds:
        if kind.startswith("rotating"):
            _, size, keep = kind.split(":")
            sims.append(CacheSim("rotating", max_size=int(size), keep=int(keep)))
        else:
            sims.append(None if kind == "state" else CacheSim("kv"))
    chunks = []
    done = 0
    while mode.context - done > 1:
        n = min(mode.prefill_step_size, mode.context - done - 1)
        chunks.append(n)
        done += n
    chunks.append(mode.context - done)
    peak, current = 0, 0
    for n in chunks:
        for sim in sims:
            if sim is not None:
                sim.update(n)
        _maybe_quantize(sims, mode)
        current = _held(facts, mode, sims, kinds)
        peak = max(peak, current)
    return Prefill(bytes=current, peak_bytes=peak, chunks=len(chunks),
                   lengths=[None if s is None else s.length for s in sims])


def _maybe_quantize(sims: list[CacheSim | None], mode: Mode) -> None:
    if mode.kv_bits is None:
        return
    for sim in sims:
        if sim is None or sim.offset < mode.quantized_kv_start:
            continue
        if sim.kind == "rotating":
            raise EngineRefusal("NotImplementedError", "RotatingKVCache Quantization NYI", stage="prefill")
        sim.kind = "quantized"


def _held(facts: ModelFacts, mode: Mode, sims: list[CacheSim | None], kinds: list[str]) -> int:
    total = 0
    for layer, sim in zip(facts.layers, sims):
        if sim is None:
            total += state_bytes(facts)
            continue
        bits = mode.kv_bits if sim.kind == "quantized" else None
        total += sim.length * kv_token_bytes(facts, layer.kind, bits, mode.kv_group_size)
    return total


def describe_mode(facts: ModelFacts, mode: Mode, honoured: bool | None) -> ModeRecord:
    return ModeRecord(context=mode.context, max_kv_size=mode.max_kv_size, max_kv_size_honored=honoured,
                      kv_bits=mode.kv_bits, kv_group_size=mode.kv_group_size,
                      quantized_kv_start=mode.quantized_kv_start, prefill_step_size=mode.prefill_step_size,
                      dtype=facts.activation_dtype)


CACHE_CLASSES = {"kv": "KVCache", "rotating": "RotatingKVCache", "state": "ArraysCache"}


def plan(facts: ModelFacts, mode: Mode, config: dict[str, Any]) -> MlxBudget:
    budget = MlxBudget(engine="mlx-lm", version=VERSION, mode=describe_mode(facts, mode, None),
                       capacity=CapacityRecord(context=mode.context, kv_budget_bytes=mode.kv_budget_bytes),
                       provenance={"formula": "kvdoctor.engines.mlx_lm.budget", "checked_against": "goldens/mlx.json",
                                   "refs": [f"mlx_lm/{r}" for r in REFS.values()]})
    if mode.max_kv_size is not None:
        budget.mode.max_kv_size_honored = honours_max_kv_size(facts)
        if not budget.mode.max_kv_size_honored:
            budget.notes.append(f"mlx-lm's {loaded_module(facts)} class builds its own caches "
                                f"(make_cache): --max-kv-size {mode.max_kv_size} is ignored")
    try:
        kinds = layer_caches(facts, mode, config)
        rows: dict[str, LayerKindRecord] = {}
        for layer, kind in zip(facts.layers, kinds):
            label = kind.split(":")[0]
            row = rows.setdefault(f"{layer.kind}/{kind}", LayerKindRecord(
                kind=layer.kind, cache=CACHE_CLASSES[label],
                max_size=int(kind.split(":")[1]) if label == "rotating" else None, layers=0,
                bytes_per_token_per_layer=0 if label == "state" else kv_token_bytes(facts, layer.kind, None, 64)))
            row.layers += 1
        budget.layer_kinds = list(rows.values())
        if facts.state_kind:
            budget.state = StateRecord(kind=facts.state_kind, bytes_per_request_per_layer=state_bytes(facts),
                                       layers=facts.count(facts.state_kind))
        sim = simulate(facts, mode, kinds)
    except EngineRefusal as refusal:
        budget.error = refusal
        return budget
    budget.prefill = sim
    budget.capacity.per_request_bytes = sim.bytes
    budget.capacity.peak_prefill_bytes = sim.peak_bytes
    budget.capacity.max_concurrency = mode.kv_budget_bytes / sim.bytes if sim.bytes else None
    return budget


# --- the budget half of the mlx-lm profile: the `mlx_lm:` section's modes, the memory, one Budget per mode

def usable_memory(gpu: int, weights: int) -> tuple[int, str]:
    """What the weights leave of Metal's working set on a Mac of `gpu` bytes (mlx-lm reserves nothing of its own;
    the same working set `kvdoctor fit` takes, `budget.fit.working_set`)."""
    from kvdoctor.engines.budget.fit import working_set

    wired, how = working_set(gpu)
    return wired - weights, f"working set {wired} B ({how}) - weights {weights} B"


def modes(facts: ModelFacts, s: MlxLmSettings, context: int, memory: int, all_modes: bool) -> list[Mode]:
    base = Mode(context=context, kv_budget_bytes=memory, max_kv_size=s.max_kv_size, kv_bits=s.kv_bits,
                kv_group_size=s.kv_group_size, quantized_kv_start=s.quantized_kv_start,
                prefill_step_size=s.prefill_step_size)
    if not all_modes:
        return [base]
    out = [base]
    for bits in (8, 4):
        if bits != base.kv_bits:
            out.append(replace(base, kv_bits=bits))
    if base.max_kv_size is None:
        out.append(replace(base, max_kv_size=min(4096, context)))
    return out


def budgets(facts: ModelFacts, config: dict[str, Any], s: MlxLmSettings, inputs: BudgetSettings,
            all_modes: bool) -> tuple[list[MlxBudget], dict[str, Any]]:
    memory, how = kv_memory("mlx-lm", facts, inputs, usable_memory)
    context = default_context(facts, inputs)
    chosen = modes(facts, s, context, memory, all_modes)
    out = [plan(facts, m, config) for m in chosen]
    for m, b in zip(chosen, out):
        b.capacity.max_context_fit = max_context_fit(facts, config, m, b)
    return out, how


def max_context_fit(facts: ModelFacts, config: dict, mode: Mode, budget: MlxBudget) -> int | None:
    """The longest prompt, up to the requested context, whose caches fit the budget at their
    prefill peak (as vLLM searches up to max_model_len); None when the mode fails."""
    if budget.error is not None:
        return None
    kinds = layer_caches(facts, mode, config)

    def fits(t: int) -> bool:
        try:
            return simulate(facts, replace(mode, context=t), kinds).peak_bytes <= mode.kv_budget_bytes
        except EngineRefusal:
            return False

    if not fits(1):
        return 0
    hi = mode.context
    if fits(hi):
        return hi
    lo = 1
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def view(row: dict[str, Any]) -> BudgetView:
    """A budget row as the reports show it: mlx-lm's knobs, each layer's cache class, and (no pool) the
    whole requests that fit times their length as the tokens that fit."""
    m, c, s = row["mode"], row["capacity"], row.get("state")
    label = (f"kv_bits {m['kv_bits']}", f"max_kv_size {m['max_kv_size']}")
    state = f"{s['kind']} {size(s['bytes_per_request_per_layer'])}/layer x{s['layers']}" if s else "-"
    refused = bool(row.get("error"))
    capacity = "" if refused else (f"{size(c['per_request_bytes'])}/request at {n(c['context'])}\n"
                                   f"peak {size(c['peak_prefill_bytes'])}\n{c['max_concurrency']:.2f} requests")
    return BudgetView(mode=(*label, m["dtype"]), label=label,
                      layout="\n".join(f"{k['cache']} x{k['layers']}" for k in row["layer_kinds"]), state=state,
                      capacity=capacity, tokens=None if refused else int(c["max_concurrency"] * c["context"]),
                      colour="magenta")
