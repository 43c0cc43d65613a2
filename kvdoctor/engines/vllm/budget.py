"""vLLM 0.33.0 (v1 engine, CUDA, FlashAttention backends): how it sizes and shares the KV pool.

The steps, in the engine's order: per-layer specs (page bytes per block), the hybrid block
alignment for Mamba-style state, spec promotion when the hybrid manager is off, page unification,
grouping with padding, one shared pool of blocks, the admission check with its null block, and
capacity as concurrency at max_model_len. File:line references are to the vllm 0.33.0 wheel.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Mapping, TypeVar

import msgspec
from msgspec import UNSET, UnsetType
from msgspec.structs import replace

from kvdoctor.engines.budget.common import (Budget, BudgetView, EngineRefusal, GiB, Record, StateTensor, cdiv,
                                            longest_fitting, n, size)
from kvdoctor.engines.budget.facts import ModelFacts, dtype_bytes
from kvdoctor.engines.budget.run import default_context, kv_memory
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.releases import Ranged, at
from kvdoctor.engines.vllm import dsv4
from kvdoctor.engines.vllm import releases as R
from kvdoctor.errors import InputError

if TYPE_CHECKING:
    from kvdoctor.engines.budget.settings import BudgetSettings
    from kvdoctor.engines.vllm.settings import VllmSettings

VERSION = PINS["vllm"]
KERNEL_BLOCK = 16  # the smallest kernel block those backends declare (MultipleOf(16))
MLA_HYBRID_ALIGN = 128  # platforms/interface.py: MLA + Mamba hybrids keep blocks a multiple of 128
FP8_NAMES = ("fp8", "fp8_e4m3", "fp8_e5m2")
REFS = {
    "page": "v1/kv_cache_interface.py:586-601",
    "sliding_reserve": "v1/kv_cache_interface.py:918-955",
    "mamba_reserve": "v1/kv_cache_interface.py:1135-1141",
    "align": "platforms/interface.py:940-1137",
    "promote": "v1/core/kv_cache_planning.py:744-876",
    "groups": "v1/core/kv_cache_planning.py:416-556",
    "pool": "v1/core/kv_cache_planning.py:574-605",
    "admission": "v1/core/kv_cache_planning.py:50-86,1461-1560",
    "capacity": "v1/core/kv_cache_utils.py:1061-1128",
    "in_flight": "config/vllm.py:588-609",
    "heads": "config/model.py:1545-1683",
}


class Mode(msgspec.Struct, frozen=True):
    """Every knob vLLM's KV sizing reads, with the H200 server defaults."""

    max_model_len: int
    kv_budget_bytes: int
    kv_cache_dtype: str = "auto"
    tp: int = 1
    hma: bool = True  # the hybrid KV cache manager (--disable-hybrid-kv-cache-manager turns it off)
    prefix_caching: bool = True  # on: Mamba state in 'align' mode, off: 'none'
    num_speculative_tokens: int = 0  # a draft-free method (ngram); EAGLE/MTP draft layers are not priced
    max_num_batched_tokens: int = 8192  # OpenAI server on a >= 70 GiB non-A100 GPU
    async_scheduling: bool = True
    max_num_seqs: int = 1024
    block_size: int | None = None  # None: the backend default (releases.DEFAULT_BLOCK)
    release: str = VERSION  # the vLLM release sized (what differs between releases: kvdoctor.engines.vllm.releases)

    @property
    def in_flight_tokens(self) -> int:
        """Tokens scheduled but not yet settled: two batches with async scheduling at PP=1."""
        return (2 if self.async_scheduling else 1) * self.max_num_batched_tokens


class Spec(msgspec.Struct, frozen=True):
    """One layer's cache spec: the fields vLLM compares when it groups layers."""

    cls: str  # FullAttentionSpec | SlidingWindowSpec | MLAAttentionSpec | MambaSpec
    block_size: int
    per_token: int = 0  # attention bytes per token (all heads of this rank)
    state_bytes: int = 0  # Mamba: the state of one request (one block), unpadded
    padded: int | None = None
    window: int | None = None
    spec_blocks: int = 0
    align_mode: bool = False

    @property
    def page(self) -> int:
        if self.padded is not None:
            return self.padded
        return self.state_bytes if self.cls == "MambaSpec" else self.block_size * self.per_token

    def blocks_per_request(self, mode: Mode, length: int) -> int:
        """cdiv(max_memory_usage_bytes, page): the blocks one request at `length` holds."""
        if self.cls == "SlidingWindowSpec":
            return cdiv(min(self.window - 1 + mode.in_flight_tokens, length), self.block_size) + 1
        if self.cls == "ChunkedLocalAttentionSpec":  # `window` holds the attention chunk size
            return cdiv(min(self.window + mode.in_flight_tokens, length), self.block_size)
        if self.cls == "MambaSpec":
            return (2 if self.align_mode else 1) + self.spec_blocks
        return cdiv(length, self.block_size)


class Group(msgspec.Struct):
    spec: Spec
    layers: list[int]
    per_layer: list[Spec]
    padding_layers: int = 0

    def bytes_per_block(self) -> int:
        return sum(s.page for s in self.per_layer)

    def blocks_per_request(self, mode: Mode, length: int) -> int:
        return max(s.blocks_per_request(mode, length) for s in self.per_layer)


class Sizing(msgspec.Struct, kw_only=True):
    """What the plan works out on the way (not printed): the profile builds its layer plans from it and
    the MEM rules read the request's bytes and the pool's blocks."""

    kv_heads_per_rank: int
    head_size: int  # K + V
    bytes_per_token: int
    block_size: int = 0
    layer_geometry: dict[int, tuple[int, int]] = {}  # layer index -> (kv heads per rank, head size K+V), own ones
    state_bytes: int = 0
    state_tensors: list[StateTensor] = []
    state_padded: int | None = None
    state_padding_pct: float | None = None
    groups: list[Group] = []
    num_blocks: int | None = None
    needed_bytes: int | None = None  # one request at max_model_len, in bytes of the pool


class ModeRecord(Record, kw_only=True):
    hma: bool
    kv_cache_dtype: str
    dtype: str
    tp: int
    max_model_len: int
    prefix_caching: bool
    mamba_cache_mode: str | None  # align | none, for a model with recurrent state
    num_speculative_tokens: int
    max_num_batched_tokens: int
    async_scheduling: bool
    in_flight_tokens: int
    max_num_seqs: int
    block_size: int
    kv_heads_per_rank: int | UnsetType = UNSET


class LayerKindRecord(Record, kw_only=True):
    kind: str
    spec: str
    layers: int
    window: int | None
    bytes_per_token_per_layer: int
    page_bytes: int
    block_size: int
    reserved_blocks_per_request: int


class GroupRecord(Record, kw_only=True):
    id: int
    spec: str
    layers: int
    first_layer: int
    block_size: int
    page_bytes: int
    window: int | None
    padding_layers: int
    blocks_per_request: int


class PoolRecord(Record, kw_only=True):
    bytes_per_block: int
    num_blocks: int
    padding_bytes_per_block: int


class StateRecord(Record, kw_only=True):
    kind: str
    bytes_per_request_per_layer: int
    padded_page_bytes: int | None
    padding_pct: float
    tensors: list[StateTensor]
    blocks_per_request: int


class CapacityRecord(Record, kw_only=True):
    """'tokens' is vLLM's 'GPU KV cache size': concurrency x max_model_len."""

    unit: str = "request_tokens_at_L"
    max_model_len: int
    max_model_len_fit: int | UnsetType = UNSET
    blocks_per_request: int | UnsetType = UNSET
    max_concurrency: float | UnsetType = UNSET
    tokens: int | UnsetType = UNSET
    kv_budget_bytes: int


class VllmBudget(Budget, kw_only=True):
    mode: ModeRecord
    capacity: CapacityRecord
    layer_kinds: list[LayerKindRecord] = []
    state: StateRecord | None = None
    groups: list[GroupRecord] | None = None
    pool: PoolRecord | None = None
    sizing: Sizing | None = None  # None: refused before the layers were sized

    def parts(self) -> tuple[ModeRecord, list[LayerKindRecord], StateRecord | None, CapacityRecord]:
        return self.mode, self.layer_kinds, self.state, self.capacity

    def layout_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.groups is not None:
            out["groups"] = [g.to_json() for g in self.groups]
        if self.pool is not None:
            out["pool"] = self.pool.to_json()
        return out


def kv_dtype_bytes(facts: ModelFacts, mode: Mode) -> int:
    if mode.kv_cache_dtype == "auto":
        return dtype_bytes(facts.serving_dtype)
    if mode.kv_cache_dtype in FP8_NAMES:
        return 1  # stored as uint8 (utils/torch_utils.py:40-47)
    return dtype_bytes(mode.kv_cache_dtype)


def attention_per_token(facts: ModelFacts, mode: Mode) -> tuple[int, int, int]:
    """(kv heads per rank, head size K+V, bytes per token) of one attention layer on one rank."""
    size = kv_dtype_bytes(facts, mode)
    if facts.mla_latent:
        rank, rope = facts.mla_latent
        return 1, rank + rope, (rank + rope) * size  # one latent "head", no separate V
    heads = max(1, facts.kv_heads // mode.tp)  # TP above kv_heads replicates heads
    return heads, 2 * facts.head_dim, heads * 2 * facts.head_dim * size


# The architectures whose SSM state vLLM keeps in the config's mamba_ssm_dtype (float32 in Qwen3.5/3.6's configs)
# while mamba_ssm_cache_dtype is auto: Qwen3_5ForConditionalGenerationConfig.verify_and_update_config and the
# architectures mapped to it (model_executor/models/config.py:953-977 and 1214-1264 @ 0.33.0). Other GDN models
# (Qwen3-Next) keep the model dtype.
SSM_DTYPE_FROM_CONFIG = frozenset({
    "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration", "ColQwen3_5", "D3ForSequenceClassification",
})


def state_bytes(facts: ModelFacts, mode: Mode) -> tuple[int, list[StateTensor]]:
    """One request's recurrent state in one linear layer (vLLM's MambaSpec page) and its tensors."""
    act = dtype_bytes(facts.serving_dtype)  # mamba_cache_dtype=auto: the model dtype
    conv_len = None
    if facts.gdn:
        g = facts.gdn
        conv_dim = g.key_dim * g.key_heads * 2 + g.value_dim * g.value_heads
        conv_len = g.conv_kernel - 1 + mode.num_speculative_tokens
        ssm = dtype_bytes(facts.config_ssm_dtype) if facts.config_ssm_dtype in ("float32", "bfloat16", "float16") \
            and SSM_DTYPE_FROM_CONFIG & set(facts.architectures) else act
        tensors = [("conv", (conv_len, _split(conv_dim, mode.tp)), act),
                   ("ssm", (_split(g.value_heads, mode.tp), g.value_dim, g.key_dim), ssm)]
    elif facts.mamba:  # MambaStateShapeCalculator.mamba2_state_shape: groups padded up to the TP size
        m = facts.mamba
        groups = m.n_groups if m.n_groups % mode.tp == 0 else mode.tp
        conv_dim = m.heads * m.head_dim + 2 * groups * m.state_size
        conv_len = m.conv_kernel - 1 + mode.num_speculative_tokens
        tensors = [("conv", (conv_len, _split(conv_dim, mode.tp)), act),
                   ("ssm", (_split(m.heads, mode.tp), m.head_dim, m.state_size), dtype_bytes(m.ssm_dtype or "float32"))]
    elif facts.mamba1:  # MambaStateShapeCalculator.mamba1_state_shape: no speculative slots; both in the model dtype
        j = facts.mamba1
        tensors = [("conv", (j.conv_kernel - 1, _split(j.intermediate, mode.tp)), act),
                   ("ssm", (_split(j.intermediate, mode.tp), j.state_size), act)]
    elif facts.short_conv:  # MambaStateShapeCalculator.short_conv_state_shape
        c = facts.short_conv
        conv_len = c.conv_kernel - 1 + mode.num_speculative_tokens
        tensors = [("conv", (conv_len, _split(c.conv_dim, mode.tp)), act)]
    else:
        k = facts.kda
        assert k is not None  # state_bytes runs for a model with a state kind
        conv_dim = 3 * k.heads * k.head_dim
        conv_len = k.conv_kernel - 1 + (mode.num_speculative_tokens if at(R.KDA_CONV_HOLDS_SPEC_TOKENS, mode.release)
                                        else 0)
        tensors = [("conv", (conv_len, _split(conv_dim, mode.tp)), act),
                   ("recurrent", (_split(k.heads, mode.tp), k.head_dim, k.head_dim), 4)]  # KDA state: fp32
    total = 0
    rows = []
    for name, shape, width in tensors:
        numel = 1
        for d in shape:
            numel *= d
        total += numel * width
        rows.append(StateTensor(tensor=name, shape=list(shape), dtype_bytes=width, bytes=numel * width))
    return total, rows


def _split(value: int, tp: int) -> int:
    if value % tp:
        raise EngineRefusal("AssertionError", f"{value} is not divisible by {tp}")
    return value // tp


def check_tp(facts: ModelFacts, mode: Mode) -> None:
    if facts.attention_heads and facts.attention_heads % mode.tp:
        raise EngineRefusal("ValueError", f"Total number of attention heads ({facts.attention_heads}) must be "
                                          f"divisible by tensor parallel size ({mode.tp}).")


def align_hybrid(block: int, attn_per_token: int, state_page: int, mla: bool,
                 mla_unit: int = MLA_HYBRID_ALIGN) -> tuple[int, int | None]:
    """Raise the attention block until its page holds one Mamba state; pad the state page to it.
    `mla_unit`: 128 from 0.27.0, none in 0.26.0 (releases.MLA_HYBRID_UNIT)."""
    unit = max(KERNEL_BLOCK, block)
    if mla:
        unit = max(unit, mla_unit)
    need = unit * cdiv(state_page, unit * attn_per_token)
    need = KERNEL_BLOCK * cdiv(need, KERNEL_BLOCK)
    block = max(block, need)
    page = block * attn_per_token
    return block, (None if page == state_page else page)


STATE_LAYER_KINDS = ("gdn", "kda", "mamba", "short_conv")


def own_geometry(facts: ModelFacts, mode: Mode, layer) -> tuple[int, int, int] | None:
    """(kv heads per rank, head size K+V, bytes per token) of a layer with its own key/value geometry
    (Gemma-4's global layers: global_head_dim, num_global_key_value_heads): vLLM builds that layer's
    Attention with its own sizes, so its spec has its own page (v1/kv_cache_interface.py AttentionSpec)."""
    if facts.mla_latent or (layer.kv_heads is None and layer.head_dim is None and layer.v_head_dim is None):
        return None
    key = layer.head_dim or facts.head_dim
    heads = max(1, (layer.kv_heads or facts.kv_heads) // mode.tp)
    size = key + (layer.v_head_dim or key)
    return heads, size, heads * size * kv_dtype_bytes(facts, mode)


def layer_specs(facts: ModelFacts, mode: Mode, notes: list[str]) -> tuple[list[Spec], Sizing]:
    block = mode.block_size or at(R.DEFAULT_BLOCK, mode.release)
    heads, head_size, per_token = attention_per_token(facts, mode)
    info = Sizing(kv_heads_per_rank=heads, head_size=head_size, bytes_per_token=per_token)
    padded = None
    state = 0
    align = mode.prefix_caching and facts.state_kind is not None
    if facts.state_kind:
        state, tensors = state_bytes(facts, mode)
        base = block
        if any(layer.kind not in STATE_LAYER_KINDS for layer in facts.layers):  # an attention page to align to
            block, padded = align_hybrid(block, per_token, state, bool(facts.mla_latent),
                                         at(R.MLA_HYBRID_UNIT, mode.release))
        info.state_bytes, info.state_tensors, info.state_padded = state, tensors, padded
        if block != base:
            notes.append(f"Setting attention block size to {block} tokens to ensure that attention page size "
                         "is >= mamba page size.")
        if padded is not None:
            pct = 100 * (padded - state) / state
            info.state_padding_pct = pct
            notes.append(f"Padding mamba page size by {pct:.2f}% to ensure that mamba page size and attention "
                         "page size are exactly equal.")
    state_block = block if align else mode.max_model_len
    specs = []
    geometry: dict[int, tuple[int, int]] = {}
    for layer in facts.layers:
        own = None if layer.kind in STATE_LAYER_KINDS else own_geometry(facts, mode, layer)
        if own is not None:
            geometry[layer.index] = own[:2]
        per_token = own[2] if own is not None else info.bytes_per_token
        if layer.kind in STATE_LAYER_KINDS:
            specs.append(Spec("MambaSpec", state_block, state_bytes=state, padded=padded,
                              spec_blocks=mode.num_speculative_tokens, align_mode=align))
        elif layer.kind == "mla":
            specs.append(Spec("MLAAttentionSpec", block, per_token))
        elif layer.kind == "sliding":
            specs.append(Spec("SlidingWindowSpec", block, per_token, window=layer.window))
        elif layer.kind == "chunked":
            specs.append(Spec("ChunkedLocalAttentionSpec", block, per_token, window=layer.window))
        else:
            specs.append(Spec("FullAttentionSpec", block, per_token))
    info.block_size, info.layer_geometry = block, geometry
    return specs, info


def _mergeable(specs: list[Spec]) -> bool:
    """Whether vLLM puts these in one group: one spec (full specs may differ only in window), or one type
    of attention spec at one block size whose pages differ (UniformTypeKVCacheSpecs.is_uniform_type,
    v1/kv_cache_interface.py: same block size, same class, same window or chunk)."""
    first = specs[0]
    if all(s == first for s in specs):
        return True
    if all(s.cls == "FullAttentionSpec" for s in specs):
        if len({replace(s, window=None, per_token=0) for s in specs}) == 1:
            return len({s.window for s in specs if s.window is not None}) <= 1
    if first.cls in ("SlidingWindowSpec", "ChunkedLocalAttentionSpec"):
        return len({replace(s, per_token=0) for s in specs}) == 1
    return False


def promote(specs: list[Spec], notes: list[str], release: str = VERSION) -> list[Spec]:
    """Hybrid manager off: sliding layers become full-length reservations (window kept for compute), at the
    full-attention layers' block size from 0.27 (their own before)."""
    if _mergeable(specs):
        return specs
    classes = {s.cls for s in specs}
    local = {"SlidingWindowSpec", "ChunkedLocalAttentionSpec"}
    if "FullAttentionSpec" in classes and classes & local:
        full_block = next(s.block_size for s in specs if s.cls == "FullAttentionSpec")
        take = at(R.PROMOTED_TAKE_FULL_BLOCK, release)
        specs = [replace(s, cls="FullAttentionSpec", block_size=full_block if take else s.block_size)
                 if s.cls in local else s for s in specs]
        notes.append("Hybrid KV cache manager is disabled for this hybrid model, This means we do not enable any "
                     "optimizations for saving KV cache memory (e.g., dropping the KV cache outside the sliding "
                     "window). The compute of layers like sliding window is still saved.")
    if not _mergeable(specs):
        raise EngineRefusal("ValueError", at(R.PROMOTION_FAILED, release))
    return specs


def unify_pages(specs: list[Spec]) -> list[Spec]:
    top = max(s.page for s in specs)
    out = []
    for s in specs:
        if s.page == top:
            out.append(s)
        elif s.cls == "MambaSpec":
            out.append(replace(s, padded=top))
        elif top % s.page == 0:
            out.append(replace(s, block_size=s.block_size * (top // s.page)))
        elif s.cls != "MLAAttentionSpec":
            out.append(replace(s, padded=top))
        else:
            raise EngineRefusal("NotImplementedError", "page size is not divisible by the maximum page size and "
                                                       "cannot be padded. Padding is only supported for non-MLA "
                                                       "attention layers.")
    return out


def make_groups(specs: list[Spec], notes: list[str], release: str = VERSION) -> list[Group]:
    indices = list(range(len(specs)))
    if _mergeable(specs):
        return [Group(specs[0], indices, list(specs))]
    specs = unify_pages(specs)
    buckets: list[tuple[list[int], list[Spec]]] = []
    by_spec: dict[Spec, list[int]] = {}
    for i, s in enumerate(specs):
        by_spec.setdefault(s, []).append(i)
    for spec, layers in by_spec.items():
        for bucket_layers, bucket_specs in buckets if at(R.MERGE_COMPATIBLE_SPECS, release) else ():
            if _mergeable([*bucket_specs, spec]):
                bucket_layers.extend(layers)
                bucket_specs.append(spec)
                break
        else:
            buckets.append((list(layers), [spec]))
    sizes = [len(layers) for layers, _ in buckets]
    size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups = []
    for layers, _specs in buckets:
        pad = size - len(layers) % size
        if pad != size:
            notes.append(f"Add {pad} padding layers, may waste at most {pad / len(layers) * 100:.2f}% KV cache memory")
        count = cdiv(len(layers), size)
        for i in range(count):
            members = layers[i::count]
            groups.append(Group(specs[members[0]], members, [specs[j] for j in members],
                                padding_layers=size - len(members)))
    return groups


def format_gib(value: int) -> str:
    return f"{round(value / GiB, 2)}"


def largest_fitting_length(groups: list[Group], mode: Mode, stride: int, memory: int) -> int:
    """vLLM's binary search for the longest max_model_len whose blocks fit `memory`."""
    return longest_fitting(lambda length: stride * sum(g.blocks_per_request(mode, length) for g in groups) <= memory,
                           mode.max_model_len)


def admission_refusal(needed: int, available: int, length: int, estimate: int, release: str = VERSION) -> EngineRefusal:
    hint = (f"Based on the available memory, the estimated maximum model length is {estimate}. "
            if estimate > 0 else "")
    return EngineRefusal(
        "ValueError",
        f"To serve at least one request with the model's max seq len ({length}), ({format_gib(needed)} GiB KV "
        f"cache is needed, which is larger than the available KV cache memory ({format_gib(available)} GiB). "
        f"{hint}{at(R.ADMISSION_TAIL, release)}")


def describe_mode(facts: ModelFacts, mode: Mode) -> ModeRecord:
    return ModeRecord(hma=mode.hma, kv_cache_dtype=mode.kv_cache_dtype,
                      dtype=facts.serving_dtype if mode.kv_cache_dtype == "auto" else mode.kv_cache_dtype,
                      tp=mode.tp, max_model_len=mode.max_model_len, prefix_caching=mode.prefix_caching,
                      mamba_cache_mode=("align" if mode.prefix_caching else "none") if facts.state_kind else None,
                      num_speculative_tokens=mode.num_speculative_tokens,
                      max_num_batched_tokens=mode.max_num_batched_tokens, async_scheduling=mode.async_scheduling,
                      in_flight_tokens=mode.in_flight_tokens, max_num_seqs=mode.max_num_seqs,
                      block_size=mode.block_size or at(R.DEFAULT_BLOCK, mode.release))


def plan(facts: ModelFacts, mode: Mode) -> VllmBudget:
    """vLLM's plan for this model in this mode: groups, pool, capacity, or the error it raises."""
    budget = VllmBudget(engine="vllm", version=mode.release, mode=describe_mode(facts, mode),
                        capacity=CapacityRecord(max_model_len=mode.max_model_len, kv_budget_bytes=mode.kv_budget_bytes),
                        provenance={"formula": "kvdoctor.engines.vllm.budget", "checked_against": "goldens/vllm.json",
                                    "refs": [f"vllm/{r}" for r in REFS.values()]})
    if facts.dsv4 is not None:
        return _plan_dsv4(budget, facts.dsv4, mode)
    try:
        check_tp(facts, mode)
        specs, info = layer_specs(facts, mode, budget.notes)
        budget.mode.block_size = info.block_size
        budget.mode.kv_heads_per_rank = info.kv_heads_per_rank
        budget.sizing = info
        if facts.state_kind:
            budget.state = StateRecord(kind=facts.state_kind, bytes_per_request_per_layer=info.state_bytes,
                                       padded_page_bytes=info.state_padded, padding_pct=info.state_padding_pct or 0.0,
                                       tensors=info.state_tensors,
                                       blocks_per_request=(2 if budget.mode.mamba_cache_mode == "align" else 1)
                                       + mode.num_speculative_tokens)
        _fill_layer_kinds(budget, facts, mode, specs)
        if not mode.hma:
            specs = promote(specs, budget.notes, mode.release)
            _fill_layer_kinds(budget, facts, mode, specs)  # what each kind reserves once promoted
        groups = make_groups(specs, budget.notes, mode.release)
    except EngineRefusal as refusal:
        budget.error = refusal
        return budget
    stride = max(g.bytes_per_block() for g in groups)
    per_request = [g.blocks_per_request(mode, mode.max_model_len) for g in groups]
    budget.groups = [GroupRecord(id=i, spec=g.spec.cls, layers=len(g.layers), first_layer=g.layers[0],
                                 block_size=g.spec.block_size, page_bytes=g.spec.page, window=g.spec.window,
                                 padding_layers=g.padding_layers, blocks_per_request=n)
                     for i, (g, n) in enumerate(zip(groups, per_request))]
    num_blocks = mode.kv_budget_bytes // stride
    budget.pool = PoolRecord(bytes_per_block=stride, num_blocks=num_blocks,
                             padding_bytes_per_block=sum(g.padding_layers * g.spec.page for g in groups))
    # the null block the block pool holds back (from 0.29.0: releases.ADMISSION_RESERVES_NULL_BLOCK)
    check = mode.kv_budget_bytes - (stride if at(R.ADMISSION_RESERVES_NULL_BLOCK, mode.release) else 0)
    fit = largest_fitting_length(groups, mode, stride, check) if check > 0 else 0
    budget.capacity.max_model_len_fit = fit
    budget.capacity.blocks_per_request = sum(per_request)
    needed = stride * sum(per_request)
    info.num_blocks, info.needed_bytes, info.groups = num_blocks, needed, groups
    if check <= 0:
        budget.error = EngineRefusal("ValueError", at(R.NO_MEMORY, mode.release))
        return budget
    if needed > check:
        budget.error = admission_refusal(needed, check, mode.max_model_len, fit, mode.release)
        return budget
    if at(R.CONCURRENCY_PER_GROUP, mode.release):
        concurrency = num_blocks / sum(per_request)
    else:  # 0.26: the groups' bytes at max_model_len together, in pages of the first group
        concurrency = num_blocks / cdiv(sum(n * g.spec.page for g, n in zip(groups, per_request)), groups[0].spec.page)
    budget.capacity.max_concurrency = concurrency
    budget.capacity.tokens = int(concurrency * mode.max_model_len)
    return budget


def _plan_dsv4(budget: VllmBudget, cfg: dict[str, Any], mode: Mode) -> VllmBudget:
    """DeepSeek-V4's caches, groups and pool (kvdoctor.engines.vllm.dsv4, the one model of them): its block sizes are
    its own and its caches fp8_ds_mla whatever kv_cache_dtype says; the pool and admission check are the others'."""
    if not at(R.DSV4_PLANNED, mode.release):
        raise InputError(f"DeepSeek-V4's caches are planned from vLLM 0.30.0 on, not at {mode.release}")
    sizing = dsv4.size(dsv4.as_release_reads(cfg, mode.release), mode.hma, mode.max_model_len, mode.in_flight_tokens)
    stride = sizing.bytes_per_block
    per_request = [max(c.blocks(mode.max_model_len, mode.in_flight_tokens) for c in g) for g in sizing.groups]
    budget.mode.block_size = dsv4.COMPRESSED_BLOCK
    budget.groups = [GroupRecord(id=i, spec=g[0].spec, layers=len({c.index for c in g}), first_layer=g[0].index,
                                 block_size=g[0].block_size, page_bytes=sum(c.page for c in g),
                                 window=g[0].window if g[0].spec == dsv4.SLIDING_MLA else None, padding_layers=0,
                                 blocks_per_request=n) for i, (g, n) in enumerate(zip(sizing.groups, per_request))]
    num_blocks = mode.kv_budget_bytes // stride
    budget.pool = PoolRecord(bytes_per_block=stride, num_blocks=num_blocks, padding_bytes_per_block=0)
    budget.sizing = Sizing(kv_heads_per_rank=1, head_size=sizing.specs[0].head_size, bytes_per_token=0,
                           block_size=dsv4.COMPRESSED_BLOCK, num_blocks=num_blocks, needed_bytes=sizing.needed)
    check = mode.kv_budget_bytes - (stride if at(R.ADMISSION_RESERVES_NULL_BLOCK, mode.release) else 0)
    fit = dsv4.largest_fitting_length(sizing.groups, stride, mode.in_flight_tokens, check, mode.max_model_len) \
        if check > 0 else 0
    budget.capacity.max_model_len_fit = fit
    budget.capacity.blocks_per_request = sum(per_request)
    if check <= 0:
        budget.error = EngineRefusal("ValueError", at(R.NO_MEMORY, mode.release))
    elif sizing.needed > check:
        budget.error = admission_refusal(sizing.needed, check, mode.max_model_len, fit, mode.release)
    else:
        budget.capacity.max_concurrency = num_blocks / sum(per_request)
        budget.capacity.tokens = int(budget.capacity.max_concurrency * mode.max_model_len)
    return budget


def _fill_layer_kinds(budget: VllmBudget, facts: ModelFacts, mode: Mode, specs: list[Spec]) -> None:
    rows: dict[tuple, LayerKindRecord] = {}
    for layer, spec in zip(facts.layers, specs):
        key = (layer.kind, spec.window)
        row = rows.get(key)
        if row is None:
            row = rows[key] = LayerKindRecord(
                kind=layer.kind, spec=spec.cls, layers=0, window=spec.window,
                bytes_per_token_per_layer=spec.per_token if spec.cls != "MambaSpec" else 0, page_bytes=spec.page,
                block_size=spec.block_size, reserved_blocks_per_request=spec.blocks_per_request(mode, mode.max_model_len))
        row.layers += 1
    budget.layer_kinds = list(rows.values())


# --- the budget half of the vLLM profile: the `vllm:` section's modes, the memory, one Budget per mode

# The estimated sizing's utilization where the extensible KV cache is off (DEFAULT_GPU_MEMORY_UTILIZATION,
# config/cache.py:186 @ 0.34.0; every release before 0.34.0 defaults to it too, R.GPU_UTILIZATION).
ESTIMATED_UTILIZATION = 0.92
T = TypeVar("T")


def in_force(values: tuple[Ranged[T], ...], version: str) -> T:
    """A value (a message, a rule) as `version` has it; for a release outside the ranges (a start-up log's),
    the pinned release's."""
    try:
        return at(values, version)
    except LookupError:
        return at(values, VERSION)


def extensible(version: str, s: Mapping[str, Any]) -> bool:
    """Whether `version` sizes the KV cache from measured memory (R.EXTENSIBLE_KV_CACHE): by default from 0.34.0,
    unless `enable_extensible_kv_cache: false` or a KV budget (kv_cache_memory_bytes) is given (config/vllm.py:
    3203-3207 @ 0.34.0). Asking for it on an earlier release is an input error: its parser has no such flag.
    `budget` and `fit` both decide here, from the `vllm:` section's keys."""
    known = in_force(R.EXTENSIBLE_KV_CACHE, version)
    asked = s.get("enable_extensible_kv_cache")
    if asked is not None and not known:
        raise InputError(f"vllm.enable_extensible_kv_cache: vLLM {version} has no extensible KV cache (from 0.34.0)")
    return known and asked is not False and s.get("kv_budget") is None


def utilization(version: str, s: Mapping[str, Any]) -> tuple[float, bool]:
    """(gpu_memory_utilization, whether the extensible KV cache sizes the memory): the one given, else the
    release's default for the mode (1.0 with the extensible cache, config/cache.py:495-501 @ 0.34.0; 0.92 without)."""
    measured = extensible(version, s)
    given = s.get("gpu_memory_utilization")
    return float(given or (in_force(R.GPU_UTILIZATION, version) if measured else ESTIMATED_UTILIZATION)), measured


def usable_memory(gpu: int, weights: int, release: str = VERSION,
                  settings: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """What vLLM leaves for KV caches on a GPU of `gpu` bytes (before its activation profile), with the `vllm:`
    section's utilization and extensible-cache keys in `settings`, decided as `fit` decides them."""
    util, measured = utilization(release, settings or {})
    # the extensible KV cache keeps at least its margin's floor free (the rest of the margin scales with the
    # activation peak, which this estimate does not price; `kvdoctor fit` does)
    margin = in_force(R.EXTENSIBLE_MARGIN, release)[0] if measured else 0
    given = (settings or {}).get("gpu_memory_utilization")
    return int(gpu * util) - weights - margin, (
        f"GPU {gpu} B x gpu_memory_utilization {util} ({'given' if given else f'vLLM {release} default'}"
        f"{', extensible KV cache' if measured else ''}) - weights {weights} B per rank"
        + (f" - the extensible KV cache's margin floor {margin} B" if margin else "")
        + "; the activation peak vLLM profiles is not subtracted")


def modes(facts: ModelFacts, s: VllmSettings, context: int, memory: int, all_modes: bool,
          hma: bool = True) -> list[Mode]:
    """The modes of the `vllm:` section (vLLM's names; unset knobs at vLLM's defaults). `hma` is the
    profile's decision (the deploy flag, or vLLM's own choice when unset)."""
    base = Mode(max_model_len=context, kv_budget_bytes=memory, kv_cache_dtype=s.kv_cache_dtype,
                tp=s.tensor_parallel_size, hma=hma, prefix_caching=s.enable_prefix_caching is not False,
                num_speculative_tokens=s.num_speculative_tokens, async_scheduling=s.async_scheduling,
                block_size=s.block_size, release=s.release or VERSION)
    given: dict[str, Any] = {k: v for k, v in (("max_num_batched_tokens", s.max_num_batched_tokens),
                               ("max_num_seqs", s.max_num_seqs)) if v is not None}
    base = replace(base, **given)
    if not all_modes:
        return [base]
    out = [base, replace(base, hma=not base.hma)]
    if base.kv_cache_dtype == "auto":
        out.append(replace(base, kv_cache_dtype="fp8"))
    if facts.state_kind:
        out.append(replace(base, prefix_caching=not base.prefix_caching))
    if facts.windows:
        out.append(replace(base, max_num_batched_tokens=2048, async_scheduling=False))
    return out


def budgets(facts: ModelFacts, s: VllmSettings, inputs: BudgetSettings, all_modes: bool,
            hma: bool = True) -> tuple[list[VllmBudget], dict[str, Any]]:
    """The `vllm:` section's max_model_len and kv_budget stand in for budget.context / budget.kv_budget
    when those are not given."""
    if inputs.kv_budget is None and s.kv_budget is not None:
        inputs = inputs.model_copy(update={"kv_budget": s.kv_budget})
    keys = {"gpu_memory_utilization": s.gpu_memory_utilization,
            "enable_extensible_kv_cache": s.enable_extensible_kv_cache, "kv_budget": s.kv_budget}
    memory, how = kv_memory("vllm", facts, inputs, partial(usable_memory, release=s.release or VERSION, settings=keys),
                            tp=s.tensor_parallel_size)
    context = inputs.context or s.max_model_len or default_context(facts, inputs)
    return [plan(facts, m) for m in modes(facts, s, context, memory, all_modes, hma)], how


def view(row: dict[str, Any]) -> BudgetView:
    """A budget row as the reports show it: vLLM's knobs, its KV cache groups, and the 'GPU KV cache
    size' (concurrency x max_model_len) as the tokens that fit."""
    m, c, s = row["mode"], row["capacity"], row.get("state")
    label = [f"hma {'on' if m['hma'] else 'off'}", f"kv {m['kv_cache_dtype']}", f"tp {m['tp']}"]
    extra = [f"mamba {m['mamba_cache_mode']}"] if m.get("mamba_cache_mode") else []
    layout = "-"
    if row.get("groups"):
        pad = sum(g["padding_layers"] for g in row["groups"])
        sizes = sorted({g["layers"] for g in row["groups"]})
        count = len(row["groups"])
        layout = (f"{count} group{'s' if count > 1 else ''} of {'/'.join(map(str, sizes))} layers\n"
                  f"{n(row['pool']['bytes_per_block'])} B/block\n{n(row['pool']['num_blocks'])} blocks")
        layout += f"\n+{pad} padding layers" if pad else ""
    state = "-"
    if s:
        pad_pct = f" (+{s['padding_pct']:.2f}%)" if s.get("padded_page_bytes") else ""
        state = (f"{s['kind']} {size(s['bytes_per_request_per_layer'])}/layer{pad_pct}\n"
                 f"{s['blocks_per_request']} blocks/request")
    refused = bool(row.get("error"))
    return BudgetView(
        mode=(*label, f"block {m['block_size']}", f"in-flight {n(m['in_flight_tokens'])}", *extra),
        label=(*label, *extra), layout=layout, state=state,
        capacity="" if refused else f"{c['max_concurrency']:.2f}x at {n(c['max_model_len'])}\n{n(c['tokens'])} tokens",
        tokens=None if refused else c["tokens"], colour="blue")
