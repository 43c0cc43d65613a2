"""Allocation recipes: the expression language accepts arithmetic over known names and nothing else,
the built-in recipe reproduces sglang 0.5.23's sizes, and a bad recipe is a one-line input error."""
from __future__ import annotations

import pytest

from helpers import make_model, run
from kvdoctor.errors import InputError
from kvdoctor.engines.sglang.kda.caches import per_slot_report
from kvdoctor.engines.sglang.kda.dims import Geometry
from kvdoctor.engines.sglang.kda.recipe import CURSOR_SYMBOLS, SHAPE_SYMBOLS, Expr, builtin_names, load_recipe

RECIPE = """name: {name}
summary: test recipe
tensors:
  initial_state: {{shape: [HV, V, K], dtype: ssm}}
  d_cache: {{shape: [HV, L, V], dtype: ssm}}
  k_cache: {{shape: [H, L, K], dtype: ssm}}
  g_cache: {{shape: {g}, dtype: {gdtype}}}
write_pos: {{shape: [B], dtype: int32}}
"""


@pytest.mark.parametrize("text, values, want", [
    ("HV * V + 2 * H * K", dict(H=2, HV=4, K=32, V=64), 384),
    ("W - 1", dict(W=4), 3),
    ("(m + 1) % L", dict(m=15, L=16), 0),
    ("0 if flushed else (m + 1) % L", dict(m=3, L=16, flushed=1), 0),
    ("0 if flushed else (m + 1) % L", dict(m=3, L=16, flushed=0), 4),
    ("m == L - 1 or flushed", dict(m=2, L=3, flushed=0), 1),
])
def test_expressions_evaluate(text, values, want):
    assert Expr(text, SHAPE_SYMBOLS | CURSOR_SYMBOLS)(**values) == want


@pytest.mark.parametrize("text", ["__import__('os')", "K.bit_length()", "open", "K ** 2", "1.5 * K", "lambda: 1",
                                  "[K]", "Q + 1", "K if"])
def test_expressions_refuse_anything_else(text):
    with pytest.raises(ValueError):
        Expr(text, SHAPE_SYMBOLS)


def test_builtin_recipe_gives_sglang_sizes_for_kimi_linear():
    assert "sglang-0.5.23" in builtin_names()
    recipe = load_recipe("sglang-0.5.23")
    entry = per_slot_report(recipe, Geometry.consistent(H=32, HV=32, K=128, V=128, L=16, W=4), "float32")
    assert entry["initial_state"] == [32, 128, 128] and entry["g_cache"] == [32, 16, 128]
    assert entry["conv_state"] == [3, 3 * 4096]
    # fp32 state 2 MiB + three fp32 rings of 256 KiB + a bf16 conv state of 3 x 12288
    assert entry["bytes_per_slot"] == 2 * 2**20 + 3 * 256 * 2**10 + 3 * 12288 * 2
    bf16 = per_slot_report(recipe, Geometry.consistent(H=32, HV=32, K=128, V=128, L=16, W=4), "bfloat16")
    assert bf16["bytes_per_slot"] == 2**20 + 2 * 128 * 2**10 + 256 * 2**10 + 3 * 12288 * 2  # g stays fp32
    assert recipe.slot_count("g_cache", 3) == 4
    assert recipe.lines["tensors.g_cache"] > recipe.lines["tensors.d_cache"]


@pytest.mark.parametrize("g, gdtype, match", [
    ("[HV, L, Q]", "float32", "unknown name 'Q'"),
    ("[HV, L, K]", "float64", "unknown dtype"),
    ("[HV, L, K ** 2]", "float32", "unsupported syntax"),
])
def test_bad_recipe_fields_are_input_errors(tmp_path, g, gdtype, match):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(name="bad", g=g, gdtype=gdtype))
    with pytest.raises(InputError, match=match):
        load_recipe(str(path))


def test_unknown_name_and_missing_file(tmp_path):
    with pytest.raises(InputError, match="unknown KDA recipe 'nope'"):
        load_recipe("nope")
    with pytest.raises(InputError, match="not found"):
        load_recipe("missing.yaml", relative_to=tmp_path)
    (tmp_path / "r.yaml").write_text("name: [unclosed\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_recipe("r.yaml", relative_to=tmp_path)


def test_cli_refuses_a_bad_recipe_with_exit_2(tmp_path):
    model = make_model(tmp_path, "kimi-linear", checkpoint=False)
    (tmp_path / "fork.yaml").write_text(RECIPE.format(name="fork", g="[HV, L, oops]", gdtype="float32"))
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("sglang:\n  kda_recipe: fork.yaml\n")  # relative to the deploy file
    proc = run("check", str(model), "--engine", "sglang", "--deploy", str(deploy), "--static")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "fork.yaml" in proc.stderr and "unknown name 'oops'" in proc.stderr


def test_negative_sizes_are_refused(tmp_path):
    model = make_model(tmp_path, "kimi-linear", checkpoint=False)
    (tmp_path / "neg.yaml").write_text(RECIPE.format(name="neg", g="[HV, L - 100, K]", gdtype="float32"))
    (tmp_path / "d.yaml").write_text("sglang:\n  kda_recipe: neg.yaml\n")
    proc = run("check", str(model), "--engine", "sglang", "--deploy", str(tmp_path / "d.yaml"), "--static")
    assert proc.returncode == 2 and "negative size" in proc.stderr and "Traceback" not in proc.stderr
