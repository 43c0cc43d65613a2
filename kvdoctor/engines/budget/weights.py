"""Weight bytes per rank, from the safetensors headers and an engine's own sharding rules.

Each engine's package gives its rules as data (`ShardRules`: a tensor-name pattern and how the
engine's layer for it is split) and its parallel layout; this module prices every tensor as stored
(a quantized tensor's packed bytes, its scales beside it) and adds them up per pipeline stage and
rank. Ways a tensor is split:

  column      output dim over the TP group (q/gate/up projections, their biases and scales)
  kv_column   column, but a rank holds at least one KV head: TP above the KV heads replicates them
  row         input dim over the TP group (o/down projections); a row layer's bias is replicated
  replicated  every rank holds it whole (norms, routers, MLA's low-rank down-projections)
  vocab       rows of the vocabulary, padded to the engine's multiple, over the TP group
  expert      routed experts: over the EP group when expert parallelism is on, else split like a
              column or row layer inside each expert
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import msgspec

from kvdoctor.engines.budget.common import Record, cdiv
from kvdoctor.errors import InputError
from kvdoctor.model import Checkpoint

# The split of the tensors every family of the Llama, Qwen, Mistral, DeepSeek, gpt-oss and Qwen3-Next
# lines names alike; an engine's table starts from it and adds its own.
COMMON_RULES: tuple[tuple[str, str], ...] = (
    (r"\.experts\.", "expert"),  # routed experts, per-expert or stacked (not shared_expert(s))
    (r"embed_tokens|word_embeddings|(^|\.)wte\.|lm_head|embed_out", "vocab"),
    (r"norm|layernorm|(^|\.)ln_", "replicated"),  # input/post norms, q/k norms, MLA's kv_a_layernorm
    (r"q_a_proj|kv_a_proj_with_mqa|fused_qkv_a_proj", "replicated"),  # MLA: ReplicatedLinear
    (r"(f_a_proj|g_a_proj)\.", "replicated"),  # Kimi's KDA gates: ReplicatedLinear down-projections
    (r"\.gate\.(weight|bias)|\.router\.|e_score_correction_bias|shared_expert_gate", "replicated"),
    (r"(o_proj|down_proj|out_proj|dense_4h_to_h|c_proj)\.bias$", "replicated"),  # a row layer's bias
    (r"(^|\.)(k_proj|v_proj)\.", "kv_column"),
    (r"(o_proj|down_proj|out_proj|dense_4h_to_h|c_proj)\.", "row"),
    (r"(q_proj|gate_proj|up_proj|gate_up_proj|qkv_proj|q_b_proj|kv_b_proj|b_proj|f_b_proj|g_b_proj|in_proj\w*|conv1d|dense_h_to_4h)\.",
     "column"),
    (r"\.(A_log|dt_bias|D|sinks)$", "column"),  # per-head parameters of Mamba/GDN mixers and gpt-oss sinks
    (r"\.fc2\.bias$", "replicated"),  # a vision encoder's MLP (SigLIP): fc1 column-, fc2 row-parallel
    (r"\.fc1\.", "column"),
    (r"\.fc2\.", "row"),
)
KINDS = ("column", "kv_column", "row", "replicated", "vocab", "expert")
LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# A vision or audio encoder and its projector: their numbered layers are not the decoder's; the engines build them
# on the first pipeline stage, beside the embeddings.
TOWER_RE = re.compile(r"(^|\.)(vision_tower|vision_model|visual|multi_modal_projector|audio_tower|mm_projector)\.")
_NUMBERS = re.compile(r"\.\d+\.")


class ShardRules(msgspec.Struct, frozen=True):
    """An engine's sharding of one model family's tensor names, first match wins; what no rule names
    is priced replicated (the most a rank could hold) and counted in `unmatched`."""

    rules: tuple[tuple[str, str], ...]  # (regex searched in the tensor name, kind)
    vocab_padding: int  # vocab rows are padded to a multiple of this before the TP split
    source: str  # where the rules were read (file:line at the pinned release)

    def kind(self, name: str) -> str | None:
        for pattern, kind in _compiled(self.rules):
            if pattern.search(name):
                return kind
        return None


@lru_cache(maxsize=8)
def _compiled(rules: tuple[tuple[str, str], ...]) -> list[tuple[re.Pattern[str], str]]:
    assert all(kind in KINDS for _, kind in rules)
    return [(re.compile(pattern), kind) for pattern, kind in rules]


class Parallel(msgspec.Struct, frozen=True):
    """A parallel layout. `attn_tp` is the TP group attention layers are split over (SGLang's attention
    DP gives each DP rank its own attention: attn_tp = tp / dp); `ep` the expert-parallel group size
    (1: experts are split by TP instead)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    attn_tp: int | None = None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * (1 if self.attn_tp is not None else self.dp)

    @property
    def attention_tp(self) -> int:
        return self.attn_tp or self.tp


class WeightsRecord(Record, kw_only=True):
    """Weight bytes of the fullest rank, and each pipeline stage's, by kind of split."""

    bytes_per_rank: int  # the largest rank's
    per_stage: list[int]  # the largest rank of each pipeline stage
    by_kind: dict[str, int]  # bytes on the fullest rank, per kind of split
    checkpoint_bytes: int
    tensors: int
    unmatched: list[str]  # tensor names no rule named (priced replicated), the first few
    stage_layers: list[list[int]]  # [first, last + 1) of each stage
    source: str


def padding_bytes(expert_bytes: int, hidden: int, per_rank: int, h_align: int, i_align: int) -> int:
    """Bytes a MoE kernel's tile padding adds to a rank's experts, loaded into shapes whose hidden size and
    per-rank intermediate size are rounded up to those alignments."""
    padded = cdiv(hidden, h_align) * h_align * (cdiv(per_rank, i_align) * i_align)
    return expert_bytes * padded // (hidden * per_rank) - expert_bytes


def pp_partition(layers: int, pp: int) -> list[tuple[int, int]]:
    """Layers of each pipeline stage: an even split, the remainder one each on the stages before the
    last, counted from the end (vLLM's get_pp_indices, distributed/utils.py:198-240 @ 0.33.0)."""
    if pp > layers:
        raise InputError(f"pipeline parallel size {pp} exceeds the model's {layers} layers")
    sizes = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        sizes[-i] += 1
    out, start = [], 0
    for n in sizes:
        out.append((start, start + n))
        start += n
    return out


def _share(kind: str, nbytes: int, rows: int, par: Parallel, attention: bool, rules: ShardRules,
           kv_heads: int, experts_fraction: tuple[int, int]) -> int:
    tp = par.attention_tp if attention else par.tp
    if kind == "replicated":
        return nbytes
    if kind == "column" or kind == "row":
        return cdiv(nbytes, tp)
    if kind == "kv_column":
        per_rank = max(1, kv_heads // tp) if kv_heads else 0
        return cdiv(nbytes * per_rank, kv_heads) if per_rank else cdiv(nbytes, tp)
    if kind == "vocab":
        padded = cdiv(rows, rules.vocab_padding) * rules.vocab_padding
        return cdiv(nbytes * cdiv(padded, par.tp), rows) if rows else nbytes
    held, total = experts_fraction  # expert
    if par.ep > 1:
        return cdiv(nbytes * held, total)
    return cdiv(nbytes, par.tp)


class _Group(msgspec.Struct):
    """Tensors priced alike: one kind of split, in one layer (-1: outside the layers), attention or not."""

    kind: str
    layer: int
    attention: bool
    place: str  # layer | embed | head (the output head and the final norm) | first
    nbytes: int = 0
    rows: int = 0  # a vocab tensor's rows (vocab tensors are kept one a group)


class _Classified(msgspec.Struct):
    groups: list[_Group]
    total: int
    tensors: int
    unmatched: list[str]


_LAST: dict[int, tuple[Checkpoint, tuple[ShardRules, int | None, int | None], _Classified]] = {}


# Float tensors the engines cast to the serving dtype as they load them: the layers' weights. Scales of quantized
# tensors, per-head parameters (A_log, dt_bias, sinks) and the like keep the dtype the model code gives them.
_CAST = {"BF16", "F16", "F32"}


# The splits of the engines' linear layers (and routed experts): what an engine quantizing a float checkpoint as it
# loads it (vLLM's --quantization fp8) stores in the narrower type. Embeddings, the head and norms stay as they are.
_LINEAR = {"column", "kv_column", "row", "expert"}


def _cast(name: str, dtype: str) -> bool:
    return dtype in _CAST and name.endswith(".weight") and "scale" not in name


def _classify(ckpt: Checkpoint, rules: ShardRules, float_bits: int | None = None,
              linear_bits: int | None = None) -> _Classified:
    """Each tensor's split and place, summed into groups once per checkpoint, so that pricing one more
    layout costs a pass over a few hundred groups, not over every tensor."""
    hit = _LAST.get(id(ckpt))
    if hit is not None and hit[0] is ckpt and hit[1] == (rules, float_bits, linear_bits):
        return hit[2]
    from kvdoctor.load.checkpoint import DTYPE_BITS

    groups: dict[tuple, _Group] = {}
    unmatched: list[str] = []
    kinds: dict[str, str | None] = {}  # by the name with its layer and expert numbers blanked: a few hundred
    total = 0
    for name, dtype, shape, _file in ckpt.tensors.values():
        numel = 1
        for d in shape:
            numel *= d
        pattern = _NUMBERS.sub("#", name)
        kind = kinds[pattern] if pattern in kinds else kinds.setdefault(pattern, rules.kind(name))
        bits = float_bits if float_bits and _cast(name, dtype) else DTYPE_BITS[dtype]
        if linear_bits and kind in _LINEAR and len(shape) >= 2 and _cast(name, dtype):
            bits = linear_bits
        nbytes = (numel * bits + 7) // 8
        total += nbytes
        if kind is None:
            kind = "replicated"
            if len(unmatched) < 20:
                unmatched.append(name)
        tower = TOWER_RE.search(name) is not None
        m = None if tower else LAYER_RE.search(name)
        layer = int(m.group(1)) if m is not None else -1
        place = "layer" if m is not None else "first" if tower else "embed" if kind == "vocab" and "embed" in name \
            else "head" if kind == "vocab" or "norm" in name else "first"
        attention = "attn" in name or "attention" in name
        key: tuple = (kind, layer, attention, place, name if kind == "vocab" else "")
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(kind=kind, layer=layer, attention=attention, place=place,
                                         rows=shape[0] if kind == "vocab" and shape else 0)
        group.nbytes += nbytes
    out = _Classified(groups=list(groups.values()), total=total, tensors=len(ckpt.tensors), unmatched=unmatched)
    _LAST.clear()
    _LAST[id(ckpt)] = (ckpt, (rules, float_bits, linear_bits), out)
    return out


def weights_per_rank(ckpt: Checkpoint, config: dict[str, Any], rules: ShardRules, par: Parallel,
                     layers: int, float_bytes: int | None = None, linear_bytes: int | None = None) -> WeightsRecord:
    """Price every tensor on the fullest rank of each pipeline stage. Embeddings sit on the first stage;
    the output head and final norm on the last (a tied head too, once there is more than one stage).
    `float_bytes`: the serving dtype's width, which the engine casts the float weights to (a float32
    checkpoint served in bfloat16, or `--dtype float32`); None: priced as stored (mlx-lm). `linear_bytes`: the
    width the engine quantizes the float weights of its linear layers and experts to as it loads them."""
    if not ckpt.tensors:
        raise InputError("weights per rank need the checkpoint's safetensors headers; this model has none")
    stages = pp_partition(layers, par.pp)
    stage_of = [0] * layers
    for s, (a, b) in enumerate(stages):
        for i in range(a, b):
            stage_of[i] = s
    kv_heads = int(config.get("num_key_value_heads") or config.get("num_attention_heads") or 0)
    experts = int(config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts") or 0)
    held = cdiv(experts, par.ep) if experts else 0
    per_stage = [0] * par.pp
    by_kind: dict[str, list[int]] = {k: [0] * par.pp for k in KINDS}
    tied = bool(config.get("tie_word_embeddings"))
    classified = _classify(ckpt, rules, 8 * float_bytes if float_bytes else None, 8 * linear_bytes if linear_bytes else None)
    for g in classified.groups:
        share = _share(g.kind, g.nbytes, g.rows, par, g.attention, rules, kv_heads, (held, experts))
        if g.place == "layer":
            targets = [stage_of[g.layer]] if g.layer < layers else [par.pp - 1]  # MTP layers past the last
        elif g.place == "embed":
            targets = [0, par.pp - 1] if tied and par.pp > 1 else [0]
        else:
            targets = [par.pp - 1] if g.place == "head" else [0]
        for s in targets:
            per_stage[s] += share
            by_kind[g.kind][s] += share
    top = max(range(par.pp), key=per_stage.__getitem__)
    return WeightsRecord(bytes_per_rank=per_stage[top], per_stage=per_stage,
                         by_kind={k: v[top] for k, v in by_kind.items() if v[top]}, checkpoint_bytes=classified.total,
                         tensors=classified.tensors, unmatched=classified.unmatched,
                         stage_layers=[list(s) for s in stages], source=rules.source)
