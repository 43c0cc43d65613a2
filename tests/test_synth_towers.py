"""The synthesized checkpoints of multimodal and Llama-4 configs, and where fit's weights put a vision tower."""
from __future__ import annotations

import json
from pathlib import Path

from kvdoctor.engines.budget.weights import Parallel, weights_per_rank
from kvdoctor.engines.vllm import weights as vw
from kvdoctor.load.loader import load_model
from kvdoctor.load.synth import layout_for, write_checkpoint

TEXT = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024, "max_position_embeddings": 4096,
        "model_type": "gemma3_text"}
VISION = {"model_type": "siglip_vision_model", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
          "num_attention_heads": 4, "patch_size": 14, "image_size": 56}


def _gemma3(tmp_path: Path, index: dict | None = None) -> Path:
    d = tmp_path / "gemma3"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForConditionalGeneration"],
                                               "model_type": "gemma3", "text_config": TEXT,
                                               "vision_config": VISION}))
    if index is not None:
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    return d


def test_siglip_tower_is_laid_out_from_the_vision_config(tmp_path) -> None:
    layout = layout_for(_gemma3(tmp_path))
    tower = {n: s for n, (_dt, s) in layout.items() if n.startswith("vision_tower.")}
    assert len([n for n in tower if n.endswith("mlp.fc1.weight")]) == 3
    assert tower["vision_tower.vision_model.embeddings.position_embedding.weight"] == [16, 64]  # (56 / 14) ** 2
    assert layout["multi_modal_projector.mm_input_projection_weight"][1] == [64, 256]


def test_index_without_a_tower_keeps_it_out(tmp_path) -> None:
    layout = layout_for(_gemma3(tmp_path, index={"language_model.model.embed_tokens.weight": "a.safetensors"}))
    assert not any(n.startswith(("vision_tower.", "multi_modal_projector.")) for n in layout)


def test_tower_sits_on_the_first_pipeline_stage(tmp_path) -> None:
    d = _gemma3(tmp_path)
    write_checkpoint(d, layout_for(d))
    spec = load_model(str(d))
    assert spec.checkpoint is not None
    one = weights_per_rank(spec.checkpoint, spec.config, vw.RULES, Parallel(), spec.num_hidden_layers)
    two = weights_per_rank(spec.checkpoint, spec.config, vw.RULES, Parallel(pp=2), spec.num_hidden_layers)
    tower = sum(2 * _numel(shape) for name, (_dt, shape) in layout_for(d).items()
                if name.startswith(("vision_tower.", "multi_modal_projector.")))
    embed = 2 * TEXT["vocab_size"] * TEXT["hidden_size"]
    first, last = two.per_stage
    # two decoder layers a stage; the embedding and the whole tower on the first, the final norm on the last
    assert first - last == embed + tower - 2 * TEXT["hidden_size"]
    assert not [n for n in one.unmatched if ".fc1." in n or ".fc2." in n]  # SigLIP's MLP has its own rules


def _numel(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def test_llama4_moe_layers_have_a_shared_expert_and_dense_layers_between(tmp_path) -> None:
    d = tmp_path / "llama4"
    d.mkdir()
    cfg = {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "hidden_size": 128,
           "intermediate_size": 64, "intermediate_size_mlp": 256, "num_local_experts": 4, "num_experts_per_tok": 1,
           "interleave_moe_layer_step": 2, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 4096}
    (d / "config.json").write_text(json.dumps(cfg))
    layout = layout_for(d)
    assert layout["model.layers.1.mlp.shared_expert.down_proj.weight"][1] == [128, 64]
    assert layout["model.layers.0.mlp.gate_proj.weight"][1] == [256, 128]  # step 2: layer 0 dense
    assert "model.layers.0.mlp.experts.0.up_proj.weight" not in layout
