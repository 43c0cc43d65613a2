"""CKPT: the checkpoint headers disagree with the config."""
from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

from kvdoctor.engines.sglang.kda import checkpoint_dims as kda_dims
from kvdoctor.load.checkpoint import FLOAT_DTYPES
from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.load.loader import layer_tensor
from kvdoctor.model import FULL, KDA, MLA, SLIDING, CHUNKED, ATTN_MAMBA, Finding, LayerSpec, ModelSpec, Source, TensorInfo

LAYER_RE = re.compile(r"^(?:model\.|model\.language_model\.|language_model\.model\.|backbone\.|transformer\.)(?:layers|h)\.(\d+)\.")
# The same names, each after a newline: a pattern that starts with a literal is searched for with a
# fast scan for that character, where a multiline ^ is tried at every position (2.2x slower).
LAYER_LINES_RE = re.compile("\n" + LAYER_RE.pattern.removeprefix("^"))
SOFTMAX_KINDS = {FULL, SLIDING, CHUNKED, ATTN_MAMBA}


def _tensor_source(info: TensorInfo) -> Source:
    return Source("tensor", info.name, info.file)


RULE = Rule(codes=("CKPT001", "CKPT002", "CKPT003", "CKPT004", "CKPT005", "CKPT006", "CKPT007", "CKPT008"))

def run(ctx: Context) -> Iterable[Finding]:
    spec = ctx.spec
    ckpt = spec.checkpoint
    if ckpt is None:
        yield Finding("CKPT008", "no safetensors checkpoint in the model directory: only the config was checked",
                      file=None)
        return
    for shard in ckpt.missing_shards:
        yield Finding("CKPT005", f"{ckpt.index_file} maps tensors to {shard}, which is not in the model directory",
                      file=ckpt.index_file, key=shard, evidence={"shard": shard})
    for shard in ckpt.extra_shards:
        yield Finding("CKPT006", f"{shard} is not referenced by {ckpt.index_file}; engines that load by the index "
                      "ignore it", file=shard, key=shard, evidence={"shard": shard})
    yield from _layer_count(spec)
    yield from _vocab(spec)
    dtypes: dict[int, TensorInfo] = {}
    for layer in spec.layers:
        if layer.kind in SOFTMAX_KINDS:
            yield from _projections(spec, layer)
        elif layer.kind == MLA:
            yield from _mla(spec, layer)
        elif layer.kind == KDA:
            yield from _kda(spec, layer)
        for name in ("self_attn.k_proj.weight", "self_attn.qkv_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"):
            info = layer_tensor(spec, layer.index, name)
            if info is not None and layer.kind in SOFTMAX_KINDS | {MLA}:
                dtypes[layer.index] = info
                break
    yield from _dtypes(dtypes)


def _layer_numbers(names: list[str]) -> list[str]:
    """The layer number of every name LAYER_RE matches: one regex pass over all names, each after a
    newline (a name holding a newline itself falls back to one match a name)."""
    text = "\n" + "\n".join(names)
    if text.count("\n") != len(names):
        return [m.group(1) for name in names if (m := LAYER_RE.match(name))]
    return LAYER_LINES_RE.findall(text)


def _layer_count(spec: ModelSpec) -> Iterable[Finding]:
    present = sorted(set(map(int, set(_layer_numbers(list(spec.checkpoint.tensors))))))  # each spelling read once
    if not present:
        return
    n = spec.num_hidden_layers
    extra_allowed = spec.config.get("num_nextn_predict_layers") or 0
    missing = [i for i in range(n) if i not in set(present)]
    extra = [i for i in present if i >= n + (extra_allowed if isinstance(extra_allowed, int) else 0)]
    src = spec.key_source("num_hidden_layers")
    if missing:
        yield Finding.at("CKPT002", f"num_hidden_layers is {n} but the checkpoint has no tensors for {len(missing)} "
                         f"of those layers (first missing: {missing[0]})", src, layer=missing[0],
                         evidence={"missing_layers": missing, "present": len(present)})
    if extra:
        yield Finding.at("CKPT002", f"the checkpoint has tensors for layers {extra[0]}..{extra[-1]} beyond "
                         f"num_hidden_layers = {n}; engines never load them", src, layer=extra[0],
                         evidence={"extra_layers": extra})


def _vocab(spec: ModelSpec) -> Iterable[Finding]:
    vocab = spec.vocab_size
    if not isinstance(vocab, int):
        return
    for name in ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "lm_head.weight",
                 "language_model.lm_head.weight", "backbone.embeddings.weight", "transformer.wte.weight"):
        info = spec.checkpoint.get(name)
        if info is not None and info.shape and info.shape[0] != vocab:
            yield Finding.at("CKPT003", f"vocab_size is {vocab} but {name} has {info.shape[0]} rows",
                             spec.key_source("vocab_size"),
                             evidence={"tensor": name, "rows": info.shape[0], "vocab_size": vocab})


def _rows(info: TensorInfo | None) -> int | None:
    return info.shape[0] if info is not None and info.shape else None


def _projections(spec: ModelSpec, layer: LayerSpec) -> Iterable[Finding]:
    """q/k/v rows = heads x head_dim (q may be doubled for a gated output); o columns = heads x head_dim."""
    h, kv, hd = layer.n_heads, layer.n_kv_heads, layer.head_dim
    if not all(isinstance(x, int) for x in (h, kv, hd)):
        return
    vd = layer.v_head_dim or hd
    expect = {
        "self_attn.q_proj.weight": ((h * hd, 2 * h * hd), "num_attention_heads x head_dim", "n_heads"),
        "self_attn.k_proj.weight": ((kv * hd,), "num_key_value_heads x head_dim", "n_kv_heads"),
        "self_attn.v_proj.weight": ((kv * vd,), "num_key_value_heads x head_dim", "n_kv_heads"),
        "self_attn.qkv_proj.weight": (((h + 2 * kv) * hd,), "(heads + 2 x kv heads) x head_dim", "n_heads"),
    }
    for suffix, (allowed, formula, src_key) in expect.items():
        info = layer_tensor(spec, layer.index, suffix)
        rows = _rows(info)
        if rows is not None and rows not in allowed:
            yield Finding.at("CKPT001", f"layer {layer.index}: {info.name} has {rows} rows, expected {allowed[0]} "
                             f"({formula} = {h}, {kv}, {hd})", layer.sources.get(src_key), layer=layer.index,
                             evidence={"tensor": info.name, "rows": rows, "expected": list(allowed)})
    o = layer_tensor(spec, layer.index, "self_attn.o_proj.weight")
    if o is not None and len(o.shape) == 2 and o.dtype in FLOAT_DTYPES and o.shape[1] != h * vd:
        yield Finding.at("CKPT001", f"layer {layer.index}: {o.name} has {o.shape[1]} input columns, expected "
                         f"{h * vd} (num_attention_heads x head_dim)", layer.sources.get("n_heads"),
                         layer=layer.index, evidence={"tensor": o.name, "columns": o.shape[1], "expected": h * vd})
    yield from _hidden_width(spec, layer)


def _hidden_width(spec: ModelSpec, layer: LayerSpec) -> Iterable[Finding]:
    """The projections read and write the residual stream: q/k/v take hidden_size input columns, o_proj gives
    hidden_size rows (unquantized float tensors only: packed formats change the column count)."""
    hidden = spec.hidden_size
    if not isinstance(hidden, int) or isinstance(hidden, bool):
        return
    sides = [(f"self_attn.{p}_proj.weight", 1, "input columns") for p in ("q", "k", "v", "qkv")]
    for suffix, axis, what in sides + [("self_attn.o_proj.weight", 0, "output rows")]:
        info = layer_tensor(spec, layer.index, suffix)
        if info is not None and len(info.shape) == 2 and info.dtype in FLOAT_DTYPES and info.shape[axis] != hidden:
            yield Finding.at("CKPT001", f"layer {layer.index}: {info.name} has {info.shape[axis]} {what}, expected "
                             f"hidden_size = {hidden}: the engine's projection of the config's width cannot load it",
                             spec.key_source("hidden_size"), layer=layer.index,
                             evidence={"tensor": info.name, what.replace(" ", "_"): info.shape[axis],
                                       "expected": hidden})
            return  # one layer's first mismatch says it; the rest follow from the same width


def _mla(spec: ModelSpec, layer: LayerSpec) -> Iterable[Finding]:
    cfg = spec.config
    rank, rope = cfg.get("kv_lora_rank"), cfg.get("qk_rope_head_dim")
    info = layer_tensor(spec, layer.index, "self_attn.kv_a_proj_with_mqa.weight")
    if info is not None and isinstance(rank, int) and isinstance(rope, int) and _rows(info) != rank + rope:
        yield Finding.at("CKPT001", f"layer {layer.index}: {info.name} has {_rows(info)} rows, expected "
                         f"kv_lora_rank + qk_rope_head_dim = {rank + rope}", spec.key_source("kv_lora_rank"),
                         layer=layer.index, evidence={"tensor": info.name, "rows": _rows(info), "expected": rank + rope})
    q = layer_tensor(spec, layer.index, "self_attn.q_proj.weight")
    if q is not None and isinstance(layer.n_heads, int) and isinstance(layer.head_dim, int):
        if _rows(q) != layer.n_heads * layer.head_dim:
            yield Finding.at("CKPT001", f"layer {layer.index}: {q.name} has {_rows(q)} rows, expected "
                             f"num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim) = "
                             f"{layer.n_heads * layer.head_dim}", layer.sources.get("n_heads"), layer=layer.index,
                             evidence={"tensor": q.name, "rows": _rows(q)})


def _kda(spec: ModelSpec, layer: LayerSpec) -> Iterable[Finding]:
    """KDA tensors vs linear_attn_config: b_proj rows and A_log = heads, dt_bias = heads x head_dim,
    o_norm = head_dim (value dim), q_proj rows = heads x head_dim."""
    dims = kda_dims.from_checkpoint(spec, layer.index)
    if dims is None:
        return
    heads, hd = layer.n_heads, layer.head_dim
    checks = []
    t = dims.tensors
    if "b_proj" in t:
        checks.append(("b_proj", _rows(t["b_proj"]), heads, "rows", "linear_attn_config.num_heads"))
    if "A_log" in t:
        checks.append(("A_log", t["A_log"].numel, heads, "elements", "linear_attn_config.num_heads"))
    if "dt_bias" in t and isinstance(heads, int) and isinstance(hd, int):
        checks.append(("dt_bias", t["dt_bias"].numel, heads * hd, "elements",
                       "linear_attn_config.num_heads x linear_attn_config.head_dim"))
    if "o_norm" in t:
        checks.append(("o_norm", t["o_norm"].numel, hd, "elements", "linear_attn_config.head_dim"))
    if "q_proj" in t and isinstance(heads, int) and isinstance(hd, int):
        checks.append(("q_proj", _rows(t["q_proj"]), heads * hd, "rows",
                       "linear_attn_config.num_heads x linear_attn_config.head_dim"))
    for key, got, want, unit, formula in checks:
        if want is not None and got != want:
            yield Finding.at("CKPT004", f"layer {layer.index} (KDA): {t[key].name} has {got} {unit}, expected "
                             f"{want} ({formula})", layer.sources.get("n_heads"), layer=layer.index,
                             evidence={"tensor": t[key].name, "got": got, "expected": want})


def _dtypes(dtypes: dict[int, TensorInfo]) -> Iterable[Finding]:
    if len(dtypes) < 2:
        return
    counts = Counter(info.dtype for info in dtypes.values())
    if len(counts) == 1:
        return
    common = counts.most_common(1)[0][0]
    odd = sorted(i for i, info in dtypes.items() if info.dtype != common)
    first = dtypes[odd[0]]
    yield Finding.at("CKPT007", f"attention layers store keys in different dtypes: {dict(counts)}; layer {odd[0]} "
                     f"uses {first.dtype} where most use {common}", _tensor_source(first), layer=odd[0],
                     evidence={"dtypes": {str(i): d.dtype for i, d in dtypes.items()}, "odd_layers": odd})
