"""Per-layer key/value geometry read from the config: a value width of its own (`v_head_dim`), transformers'
per-layer table (Gemma-4's global layers), and the `swa_*` keys of sliding layers (MiMo-V2)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from kvdoctor.load.loader import load_model

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "configs" / "real"


def shapes(tmp_path: Path, name: str, edit=None) -> tuple[Counter, object]:
    cfg = json.loads((REAL / f"{name}.json").read_text())
    if edit:
        edit(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_model(str(tmp_path), with_checkpoint=False)
    return Counter((l.kind, l.n_kv_heads, l.head_dim, l.v_head_dim) for l in spec.layers), spec


def test_gemma4_global_layers_take_their_own_heads_and_width(tmp_path):
    got, spec = shapes(tmp_path, "google__gemma-4-26B-A4B")
    assert got == {("sliding_attention", 8, 256, 256): 25, ("full_attention", 2, 512, 512): 5}
    full = next(l for l in spec.layers if l.kind == "full_attention")
    assert "per_layer_config" in full.sources["head_dim"].ref


def test_mimo_v2_value_width_and_sliding_heads(tmp_path):
    got, _ = shapes(tmp_path, "XiaomiMiMo__MiMo-V2-Flash")
    assert got == {("full_attention", 4, 192, 128): 9, ("sliding_attention", 8, 192, 128): 39}
    got, _ = shapes(tmp_path, "XiaomiMiMo__MiMo-V2-Flash", lambda c: c.pop("swa_num_key_value_heads"))
    assert ("sliding_attention", 4, 192, 128) in got  # without the key the sliding layers keep the global heads


def test_a_uniform_model_is_unchanged(tmp_path):
    got, _ = shapes(tmp_path, "Qwen__Qwen3-8B")
    assert len(got) == 1 and next(iter(got))[2] == next(iter(got))[3]
