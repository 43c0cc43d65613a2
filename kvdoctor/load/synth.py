"""Synthetic checkpoints with real tensor names, dtypes and shapes, for tests, benchmarks and demos.

The data region of each file is a hole (a sparse file), so a 100 GB layout costs a few MB of
headers on disk. kvdoctor itself never uses this module when checking a model.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from kvdoctor.load.checkpoint import DTYPE_BITS, INDEX_NAME
from kvdoctor.load.loader import load_model
from kvdoctor.model import ATTN_MAMBA, CHUNKED, FULL, GDN, KDA, MAMBA, MLA, SLIDING

Layout = dict[str, tuple[str, list[int]]]
DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def _attention(out: Layout, p: str, cfg: dict, h: int, kv: int, hd: int, dt: str) -> None:
    hidden = cfg["hidden_size"]
    out[p + "self_attn.q_proj.weight"] = (dt, [h * hd, hidden])
    out[p + "self_attn.k_proj.weight"] = (dt, [kv * hd, hidden])
    out[p + "self_attn.v_proj.weight"] = (dt, [kv * hd, hidden])
    out[p + "self_attn.o_proj.weight"] = (dt, [hidden, h * hd])


def add_kda(out: Layout, p: str, cfg: dict, dt: str) -> None:
    """A Kimi KDA layer's tensors under prefix `p` (`model.layers.{i}.`)."""
    hidden = cfg["hidden_size"]
    lac = cfg["linear_attn_config"]
    heads, k = lac["num_heads"], lac["head_dim"]
    conv = lac.get("short_conv_kernel_size", 4)
    a = p + "self_attn."
    for name in ("q", "k", "v"):
        out[f"{a}{name}_proj.weight"] = (dt, [heads * k, hidden])
        out[f"{a}{name}_conv1d.weight"] = (dt, [heads * k, 1, conv])
    out[a + "b_proj.weight"] = (dt, [heads, hidden])
    out[a + "A_log"] = ("F32", [1, 1, heads, 1])
    out[a + "dt_bias"] = ("F32", [heads * k])
    out[a + "f_a_proj.weight"] = (dt, [k, hidden])
    out[a + "f_b_proj.weight"] = (dt, [heads * k, k])
    out[a + "g_a_proj.weight"] = (dt, [k, hidden])
    out[a + "g_b_proj.weight"] = (dt, [heads * k, k])
    out[a + "o_norm.weight"] = ("F32", [k])
    out[a + "o_proj.weight"] = (dt, [hidden, heads * k])


def add_mla(out: Layout, p: str, cfg: dict, dt: str) -> None:
    """An MLA layer's tensors (q_lora_rank null, as in Kimi Linear) under prefix `p`."""
    hidden, h = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v, rank = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    a = p + "self_attn."
    out[a + "q_proj.weight"] = (dt, [h * (nope + rope), hidden])
    out[a + "kv_a_proj_with_mqa.weight"] = (dt, [rank + rope, hidden])
    out[a + "kv_a_layernorm.weight"] = (dt, [rank])
    out[a + "kv_b_proj.weight"] = (dt, [h * (nope + v), rank])
    out[a + "o_proj.weight"] = (dt, [hidden, h * v])


def _state(out: Layout, p: str, cfg: dict, kind: str, dt: str) -> None:
    hidden = cfg["hidden_size"]
    name = "linear_attn." if kind == GDN else "mixer."
    out[p + name + "in_proj.weight"] = (dt, [2 * hidden, hidden])
    out[p + name + "A_log"] = ("F32", [cfg.get("linear_num_value_heads") or cfg.get("mamba_n_heads") or 8])
    out[p + name + "out_proj.weight"] = (dt, [hidden, hidden])


def _mlp(out: Layout, p: str, cfg: dict, dt: str) -> None:
    hidden = cfg["hidden_size"]
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    if experts:
        inter = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
        out[p + "mlp.gate.weight"] = (dt, [experts, hidden])
        for e in range(experts):
            for name, shape in (("gate_proj", [inter, hidden]), ("up_proj", [inter, hidden]),
                                ("down_proj", [hidden, inter])):
                out[f"{p}mlp.experts.{e}.{name}.weight"] = (dt, shape)
        if str(cfg.get("model_type") or "").startswith("llama4"):  # Llama-4's shared expert, as wide as one expert
            for name, shape in (("gate_proj", [inter, hidden]), ("up_proj", [inter, hidden]),
                                ("down_proj", [hidden, inter])):
                out[f"{p}mlp.shared_expert.{name}.weight"] = (dt, shape)
        shared = cfg.get("shared_expert_intermediate_size")
        if shared:  # Qwen2-MoE's always-on expert and its sigmoid gate
            for name, shape in (("gate_proj", [shared, hidden]), ("up_proj", [shared, hidden]),
                                ("down_proj", [hidden, shared])):
                out[f"{p}mlp.shared_expert.{name}.weight"] = (dt, shape)
            out[p + "mlp.shared_expert_gate.weight"] = (dt, [1, hidden])
    elif cfg.get("intermediate_size"):
        inter = cfg["intermediate_size"]
        out[p + "mlp.gate_proj.weight"] = (dt, [inter, hidden])
        out[p + "mlp.up_proj.weight"] = (dt, [inter, hidden])
        out[p + "mlp.down_proj.weight"] = (dt, [hidden, inter])


def add_siglip(out: Layout, vision: dict, text_hidden: int, dt: str) -> None:
    """A SigLIP vision tower and Gemma-3's projector onto the text width (transformers' SiglipVisionModel
    and Gemma3MultiModalProjector tensor names)."""
    hidden, inter = vision["hidden_size"], vision["intermediate_size"]
    patch, image = vision["patch_size"], vision["image_size"]
    v = "vision_tower.vision_model."
    out[v + "embeddings.patch_embedding.weight"] = (dt, [hidden, vision.get("num_channels", 3), patch, patch])
    out[v + "embeddings.patch_embedding.bias"] = (dt, [hidden])
    out[v + "embeddings.position_embedding.weight"] = (dt, [(image // patch) ** 2, hidden])
    for i in range(vision["num_hidden_layers"]):
        p = f"{v}encoder.layers.{i}."
        for norm in ("layer_norm1", "layer_norm2"):
            out[f"{p}{norm}.weight"] = (dt, [hidden])
            out[f"{p}{norm}.bias"] = (dt, [hidden])
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out[f"{p}self_attn.{proj}.weight"] = (dt, [hidden, hidden])
            out[f"{p}self_attn.{proj}.bias"] = (dt, [hidden])
        out[p + "mlp.fc1.weight"] = (dt, [inter, hidden])
        out[p + "mlp.fc1.bias"] = (dt, [inter])
        out[p + "mlp.fc2.weight"] = (dt, [hidden, inter])
        out[p + "mlp.fc2.bias"] = (dt, [hidden])
    out[v + "post_layernorm.weight"] = (dt, [hidden])
    out[v + "post_layernorm.bias"] = (dt, [hidden])
    out["multi_modal_projector.mm_input_projection_weight"] = (dt, [hidden, text_hidden])
    out["multi_modal_projector.mm_soft_emb_norm.weight"] = (dt, [hidden])


def _has_tower(model_dir: Path, cfg: dict) -> bool:
    """Whether the real checkpoint holds a vision tower kvdoctor can lay out: the index's weight_map says so
    where the index is stored beside the config; without one, the config's vision_config does."""
    vision = cfg.get("vision_config")
    if not isinstance(vision, dict) or vision.get("model_type") != "siglip_vision_model":
        return False
    index = model_dir / INDEX_NAME
    if index.exists():
        return any(name.startswith("vision_tower.") for name in json.loads(index.read_text())["weight_map"])
    return True


def _class_default(cfg: dict, key: str) -> object:
    """`key` as the model's transformers configuration class sets it when the config leaves it out (Gemma's
    tied head and Gemma-3's vocabulary, for one), or None without transformers or for a class that refuses."""
    from kvdoctor.load import hf_config

    if not hf_config.installed():
        return None
    try:
        view = hf_config.read(str(cfg.get("model_type") or ""), cfg, attrs=(key,))
    except hf_config.Rejected:
        return None
    return view.resolved.get(key) if view else None


def layout_for(model_dir: str | Path) -> Layout:
    """The tensors a checkpoint for this config would hold, from kvdoctor's own spec of it."""
    spec = load_model(str(model_dir), with_checkpoint=False)
    cfg = spec.config
    dt = DTYPES.get(spec.dtype or "bfloat16", "BF16")
    hidden, found = cfg["hidden_size"], cfg.get("vocab_size") or _class_default(cfg, "vocab_size")
    if not isinstance(found, int) or not found:
        raise KeyError("vocab_size")
    vocab: int = found
    out: Layout = {"model.embed_tokens.weight": (dt, [vocab, hidden]), "model.norm.weight": (dt, [hidden])}
    tied = cfg["tie_word_embeddings"] if "tie_word_embeddings" in cfg else _class_default(cfg, "tie_word_embeddings")
    if not tied:
        out["lm_head.weight"] = (dt, [vocab, hidden])
    for layer in spec.layers:
        p = f"model.layers.{layer.index}."
        out[p + "input_layernorm.weight"] = (dt, [hidden])
        if layer.kind in (FULL, SLIDING, CHUNKED, ATTN_MAMBA):
            _attention(out, p, cfg, layer.n_heads, layer.n_kv_heads, layer.head_dim, dt)
        if layer.kind == KDA:
            add_kda(out, p, cfg, dt)
        elif layer.kind == MLA:
            add_mla(out, p, cfg, dt)
        elif layer.kind in (GDN, MAMBA, ATTN_MAMBA):
            _state(out, p, cfg, layer.kind, dt)
        step = cfg.get("interleave_moe_layer_step")
        if step and (layer.index + 1) % int(step) and cfg.get("intermediate_size_mlp"):  # Llama-4's dense layers
            _mlp(out, p, {"hidden_size": hidden, "intermediate_size": cfg["intermediate_size_mlp"]}, dt)
        else:
            _mlp(out, p, cfg, dt)
    raw = json.loads((Path(model_dir) / "config.json").read_text())
    if _has_tower(Path(model_dir), raw):
        add_siglip(out, raw["vision_config"], hidden, dt)
    return out


def write_safetensors(path: Path, tensors: Layout, metadata: dict[str, str] | None = None) -> int:
    """Write a valid safetensors file whose data region is a hole. Returns its size in bytes."""
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        numel = 1
        for d in shape:
            numel *= d
        nbytes = (numel * DTYPE_BITS[dtype] + 7) // 8
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        fh.truncate(8 + len(raw) + offset)
    return 8 + len(raw) + offset


def write_checkpoint(model_dir: Path, tensors: Layout, shards: int = 1) -> list[str]:
    """Write `tensors` as one model.safetensors or `shards` files plus an index. Returns file names."""
    model_dir = Path(model_dir)
    if shards <= 1:
        write_safetensors(model_dir / "model.safetensors", tensors)
        return ["model.safetensors"]
    names = list(tensors)
    per = -(-len(names) // shards)
    files, weight_map = [], {}
    for i in range(shards):
        part = names[i * per:(i + 1) * per]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(model_dir / fname, {n: tensors[n] for n in part})
        files.append(fname)
        weight_map.update({n: fname for n in part})
    (model_dir / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return files


def main(argv: list[str] | None = None) -> None:
    """`python -m kvdoctor.load.synth CONFIG_DIR OUT_DIR [SHARDS]`: copy a config and write its sparse checkpoint."""
    import shutil
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        raise SystemExit("usage: python -m kvdoctor.load.synth CONFIG_DIR OUT_DIR [SHARDS]")
    src, dst = Path(args[0]), Path(args[1])
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    files = write_checkpoint(dst, layout_for(dst), shards=int(args[2]) if len(args) == 3 else 1)
    print(f"{dst}: {len(files)} sparse safetensors file(s)")


if __name__ == "__main__":
    main()
