"""Engine profile `sglang` on KDA models, end to end: the real Kimi-Linear config with a checkpoint of
its real shapes is clean and reports its per-slot caches at TP 1, 2, 4 and 8; each recipe, deploy or
checkpoint fixture makes its rule fire; the healthy twin of each stays quiet."""
from __future__ import annotations

import copy

import pytest

from helpers import check_json, codes, make_model, real_config
from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.check import Options, check_target
from kvdoctor.engines.deploy import load_deploy
from kvdoctor.checks.selection import Selection

SEED_MESSAGE = "`g_cache` must have shape [slots, HV, L, K]."
DEFAULT_RECIPE = """name: {name}
summary: a fork's allocation
slots: {slots}
tensors:
  initial_state: {{shape: {state}, dtype: ssm}}
  conv_state: {{shape: [W - 1, HV * V + 2 * H * K], dtype: conv}}
  d_cache: {{shape: {d}, dtype: ssm{d_slots}}}
  k_cache: {{shape: {k}, dtype: ssm}}
  g_cache: {{shape: {g}, dtype: {g_dtype}}}
write_pos: {{shape: {wp_shape}, dtype: {wp_dtype}}}
force_flush: {{shape: [B], dtype: {ff_dtype}}}
cursor: {cursor}
"""
HEALTHY = dict(slots="size + 1", state="[HV, V, K]", d="[HV, L, V]", d_slots="", k="[H, L, K]", g="[HV, L, K]",
               g_dtype="float32", wp_shape="[B]", wp_dtype="int32", ff_dtype="int32",
               cursor="0 if flushed else (m + 1) % L")


def write_recipe(tmp_path, **changes) -> str:
    fields = {**HEALTHY, **changes}
    path = tmp_path / "recipe.yaml"
    path.write_text(DEFAULT_RECIPE.format(name="fork", **fields))
    return path.name


def deploy_file(tmp_path, recipe=None, **settings) -> str:
    settings = {"enable_linear_replayssm": True, **settings}
    if recipe:
        settings["kda_recipe"] = recipe
    lines = ["sglang:"] + [f"  {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()]
    path = tmp_path / "deploy.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def small_kimi(edit=None) -> dict:
    """Kimi-Linear-48B's real KDA and MLA dims, four layers and four experts (cheap checkpoints)."""
    cfg = copy.deepcopy(real_config("kimi-linear"))
    cfg.update(num_hidden_layers=4, num_experts=4, num_experts_per_token=2)
    cfg["linear_attn_config"].update(kda_layers=[1, 2, 3], full_attn_layers=[4])
    if edit:
        edit(cfg)
    return cfg


def kda_layers(layout) -> list[str]:
    """Prefixes ("model.layers.N.self_attn.") of the layers that have KDA tensors."""
    return [name[: -len("b_proj.weight")] for name in layout if name.endswith("self_attn.b_proj.weight")]


def value_dim(v: int, heads: int = 32):
    """A checkpoint whose KDA layers have value head dim v (K stays 128): K != V."""
    def edit(layout):
        for p in kda_layers(layout):
            for name, shape in ((p + "o_norm.weight", [v]), (p + "v_proj.weight", [heads * v, 2304]),
                                (p + "g_b_proj.weight", [heads * v, 128]), (p + "v_conv1d.weight", [heads * v, 1, 4]),
                                (p + "o_proj.weight", [2304, heads * v])):
                layout[name] = (layout[name][0], shape)
    return edit


def tensor(suffix: str, shape: list[int]):
    def edit(layout):
        for p in kda_layers(layout):
            layout[p + suffix] = (layout[p + suffix][0], shape)
    return edit


def check(model, deploy=None, select=("KDA",)):
    """The real pipeline in-process (load, plan, checks, catalog), to skip a torch import per fixture."""
    opts = Options(catalog=builtin_catalog(), engine="sglang", deploy=load_deploy(deploy),
                   selection=Selection(select=select))
    result = check_target(str(model), opts)
    assert result.error is None, result.error
    return result


def found(result) -> dict:
    return {f.code: f for f in result.findings}


# ---- the real model ---------------------------------------------------------------------------------------

def test_kimi_linear_is_clean_and_reports_caches_at_every_tp(tmp_path):
    model = make_model(tmp_path, "kimi-linear")
    rc, doc = check_json(str(model), "--engine", "sglang")
    assert rc == 0
    result = doc["results"][0]
    assert [f["code"] for f in result["findings"] if f["severity"] != "info"] == []
    assert result["engine"] == "sglang" and result["engine_versions"] == {"sglang": "0.5.23"}
    layers = result["layers"]
    kda = [row for row in layers if row["kind"] == "kda"]
    assert len(kda) == 20 and all(row["cache"] == "kda-replayssm" for row in kda)
    assert {row["cache"] for row in layers if row["kind"] == "mla"} == {"mla"}  # the pool SGLang keeps MLA latents in
    state = kda[0]["state"]
    assert sorted(state, key=int) == ["1", "2", "4", "8"]
    for tp in (1, 2, 4, 8):
        heads = 32 // tp
        entry = state[str(tp)]
        assert entry["initial_state"] == [heads, 128, 128]
        assert entry["d_cache"] == entry["k_cache"] == entry["g_cache"] == [heads, 16, 128]
        assert entry["conv_state"] == [3, 3 * 4096 // tp]
        assert entry["bytes_per_slot"] == (heads * 128 * 128 * 4 + 3 * heads * 16 * 128 * 4 + 3 * (3 * 4096 // tp) * 2)
    info = result["info"]["kda_replayssm"]
    assert info["recipe"] == "sglang-0.5.23" and info["tp_sizes"] == [1, 2, 4, 8]
    runs = info["kernel_runs"]
    assert [r["geometry"] for r in runs] == [{"H": 2, "HV": 2, "K": 128, "V": 128, "L": 16},
                                             {"H": 2, "HV": 4, "K": 32, "V": 64, "L": 3}]
    assert all(r["ok"] and r["output_rel_error"] < 1e-5 and r["steps"] >= 2 * r["geometry"]["L"] + 3 for r in runs)
    assert info["gpu"].startswith("skipped") or info["gpu_runs"]


def test_deploy_tp_size_limits_the_report_to_that_size(tmp_path):
    model = make_model(tmp_path, small_kimi(), dirname="kimi")
    result = check(model, deploy_file(tmp_path, tp_size=4), select=("ALL",))
    assert [r["state"] for r in result.layers if r["kind"] == "kda"][0].keys() == {"4"}


def test_g_cache_sized_with_v_is_latent_on_kimi_linear(tmp_path):
    model = make_model(tmp_path, "kimi-linear")
    recipe = write_recipe(tmp_path, g="[HV, L, V]")
    rc, doc = check_json(str(model), "--engine", "sglang", "--deploy",
                         deploy_file(tmp_path, recipe, linear_attn_decode_backend="helion"))
    assert rc == 0  # a warning: the real shapes pass
    [latent] = [f for f in doc["results"][0]["findings"] if f["code"] == "KDA050"]
    assert latent["severity"] == "warning" and "K = V = 128" in latent["message"]
    assert SEED_MESSAGE in latent["message"] and "sized with V where the kernel expects K" in latent["message"]
    assert latent["file"].endswith("recipe.yaml") and latent["line"] == 9  # the g_cache line
    assert "KDA001" not in codes(doc)


def test_g_cache_sized_with_v_fails_kda001_with_the_seed_text_when_k_differs_from_v(tmp_path):
    model = make_model(tmp_path, small_kimi(), dirname="kimi", tensors=value_dim(64))
    recipe = write_recipe(tmp_path, g="[HV, L, V]")
    rc, doc = check_json(str(model), "--engine", "sglang", "--select", "KDA", "--deploy",
                         deploy_file(tmp_path, recipe, linear_attn_decode_backend="helion"))
    assert rc == 1
    [finding] = doc["results"][0]["findings"]
    assert finding["code"] == "KDA001" and finding["severity"] == "error"
    assert finding["engine_error"] == {"class": "ValueError", "message": SEED_MESSAGE, "stage": "decode"}
    assert finding["evidence"]["tp_sizes"] == [1, 2, 4, 8] and finding["evidence"]["layers"] == [0, 1, 2]
    assert finding["evidence"]["shapes"]["g_cache"] == [4, 32, 16, 64]


def test_same_model_with_the_default_recipe_is_clean(tmp_path):
    model = make_model(tmp_path, small_kimi(), dirname="kimi", tensors=value_dim(64))
    result = check(model, deploy_file(tmp_path, linear_attn_decode_backend="helion"))
    assert result.findings == []
    assert result.layers[0]["state"]["1"]["g_cache"] == [32, 16, 128]
    assert result.layers[0]["state"]["1"]["d_cache"] == [32, 16, 64]


def test_triton_backend_reports_kda001_with_the_twins_text(tmp_path):
    model = make_model(tmp_path, small_kimi(), dirname="kimi", tensors=value_dim(64))
    result = check(model, deploy_file(tmp_path, write_recipe(tmp_path, g="[HV, L, V]")))
    [finding] = result.findings
    assert finding.code == "KDA001"
    assert finding.engine_error["message"] == "`g_cache` per-slot shape must be (32, 16, 128) (got (32, 16, 64))."


def test_rings_off_turns_the_error_into_a_warning(tmp_path):
    model = make_model(tmp_path, small_kimi(), dirname="kimi", tensors=value_dim(64))
    deploy = deploy_file(tmp_path, write_recipe(tmp_path, g="[HV, L, V]"), enable_linear_replayssm=False)
    [finding] = check(model, deploy).findings
    assert finding.code == "KDA001" and finding.severity == "warning" and "latent" in finding.message


# ---- recipe fixtures: each wrapper check or invariant a recipe can break ---------------------------------

@pytest.mark.parametrize("code, changes", [
    ("KDA002", {"d": "[HV, L, 2 * V]"}),
    ("KDA003", {"k": "[H, L + 1, K]"}),
    ("KDA004", {"g_dtype": "bfloat16"}),
    ("KDA005", {"d": "[HV, 0, V]", "k": "[H, 0, K]", "g": "[HV, 0, K]"}),
    ("KDA006", {"wp_dtype": "int64"}),
    ("KDA007", {"wp_shape": "[B + 1]"}),
    ("KDA008", {"ff_dtype": "bool"}),
    ("KDA024", {"state": "[HV, V * K]"}),
    ("KDA040", {"d_slots": ", slots: size"}),
    ("KDA042", {"slots": "size"}),
    ("KDA041", {"cursor": "(m + 1) % (L + 1)"}),
    ("KDA051", {"cursor": "(m + 1) % L"}),
])
def test_recipe_fixture_fires(tmp_path, code, changes):
    model = make_model(tmp_path, small_kimi(), dirname="kimi")
    result = check(model, deploy_file(tmp_path, write_recipe(tmp_path, **changes), linear_attn_decode_backend="helion"))
    hit = found(result)
    assert code in hit, [f.message for f in result.findings]
    finding = hit[code]
    assert finding.severity == "error" and finding.file.endswith("recipe.yaml") and finding.line
    if code in ("KDA040", "KDA041", "KDA042", "KDA051"):
        assert finding.engine_error is None  # the engine raises nothing: silent corruption
    else:
        assert finding.engine_error["stage"] == "decode"


def test_healthy_recipe_fixture_is_quiet(tmp_path):
    model = make_model(tmp_path, small_kimi(), dirname="kimi")
    assert check(model, deploy_file(tmp_path, write_recipe(tmp_path), linear_attn_decode_backend="helion")).findings == []


# ---- checkpoint and config fixtures ---------------------------------------------------------------------

@pytest.mark.parametrize("code, tensors, backend, message", [
    ("KDA029", tensor("A_log", [1, 1, 16, 1]), "helion", "`A_log` must have 32 elements (got 16)."),
    ("KDA027", tensor("f_b_proj.weight", [32 * 64, 128]), "helion",
     "`a` must have shape [B, HV*K] with HV=32, K=128 (got a.shape=(3, 2048))."),
    ("KDA027", tensor("f_b_proj.weight", [32 * 64, 128]), "triton", "KDA `a` must have shape (3, 32, 128) (got (3, 32, 64))."),
    ("KDA033", tensor("k_proj.weight", [4096 + 64, 2304]), "helion",
     "Invalid packed Q size 4128: must be divisible by K=128. KDA packed decode requires num_q_heads == num_k_heads "
     "and head_q_dim == head_k_dim."),
    ("KDA034", tensor("k_proj.weight", [2048, 2304]), "helion", "Invalid head config inferred from mixed_qkv: H=24, HV=32."),
])
def test_checkpoint_fixture_fires_with_the_wrappers_message(tmp_path, code, tensors, backend, message):
    model = make_model(tmp_path, small_kimi(), dirname="kimi", tensors=tensors)
    finding = found(check(model, deploy_file(tmp_path, tp_size=1, linear_attn_decode_backend=backend)))[code]
    assert finding.engine_error["message"] == message


def test_state_sized_with_head_dim_twice_fails_out_shape_on_a_separate_value_dim(tmp_path):
    """sglang 0.5.23's KimiLinearStateShape uses head_dim for both V and K; a layer with its own value dim
    then gets an `out` it cannot fill."""
    model = make_model(tmp_path, small_kimi(), dirname="kimi", tensors=value_dim(64))
    recipe = write_recipe(tmp_path, state="[HV, K, K]", d="[HV, L, K]")
    finding = found(check(model, deploy_file(tmp_path, recipe, tp_size=1, linear_attn_decode_backend="helion")))["KDA031"]
    assert finding.engine_error["message"] == "`out` must have shape (3, 1, 32, 128) (got out.shape=(3, 1, 32, 64))."


def test_helion_needs_power_of_two_dims_triton_does_not(tmp_path):
    cfg = small_kimi(lambda c: c["linear_attn_config"].update(head_dim=96))
    model = make_model(tmp_path, cfg, dirname="kimi")
    finding = found(check(model, deploy_file(tmp_path, linear_attn_decode_backend="helion")))["KDA026"]
    assert finding.engine_error["message"] == ("Helion KDA decode requires power-of-two key and value head dimensions "
                                               "(got K=96, V=96).")
    assert check(model, deploy_file(tmp_path, linear_attn_decode_backend="triton")).findings == []


def test_triton_key_dim_16_is_too_small(tmp_path):
    model = make_model(tmp_path, small_kimi(lambda c: c["linear_attn_config"].update(head_dim=16)), dirname="kimi")
    finding = found(check(model, deploy_file(tmp_path, linear_attn_decode_backend="triton")))["KDA036"]
    assert finding.engine_error["message"] == "BKT=8 must be >=16 for tl.dot (nk=2, BK=16)."


# ---- static: load-time and startup refusals ----------------------------------------------------------

def test_heads_not_divisible_by_tp(tmp_path):
    model = make_model(tmp_path, small_kimi(lambda c: c["linear_attn_config"].update(num_heads=12)), dirname="kimi")
    survey = found(check(model))
    assert survey["KDA060"].severity == "warning"  # TP 8 is only one of the sizes checked by default
    assert survey["KDA060"].engine_error["message"] == "KDA num_heads (12) must be divisible by shard tp_size (8)"
    result = check(model, deploy_file(tmp_path, tp_size=8))
    finding = found(result)["KDA060"]
    assert finding.severity == "error" and finding.engine_error["stage"] == "load" and finding.line == 3
    assert result.layers[0]["state"] == {"8": {"error": "KDA num_heads (12) must be divisible by shard tp_size (8)"}}
    assert "KDA060" not in found(check(model, deploy_file(tmp_path, tp_size=4)))


def test_replayssm_server_guards(tmp_path):
    model = make_model(tmp_path, small_kimi(), dirname="kimi")
    backend = found(check(model, deploy_file(tmp_path, linear_attn_decode_backend="flashinfer")))["KDA061"]
    assert backend.engine_error == {"class": "ValueError", "stage": "startup", "message":
                                    "--enable-linear-replayssm requires Triton, or Helion for KDA, as the linear-attn "
                                    "decode backend; got --linear-attn-decode-backend='flashinfer'."}
    length = check(model, deploy_file(tmp_path, linear_replayssm_cache_len=0))
    assert [f.code for f in length.findings] == ["KDA062"]  # no decode-time findings after a startup refusal
    assert length.findings[0].engine_error["message"] == "--linear-replayssm-cache-len must be >= 1, got 0."


def test_static_mode_builds_no_caches(tmp_path):
    model = make_model(tmp_path, small_kimi(), dirname="kimi")
    recipe = write_recipe(tmp_path, g_dtype="bfloat16")
    rc, doc = check_json(str(model), "--engine", "sglang", "--static", "--deploy", deploy_file(tmp_path, recipe))
    assert rc == 0 and "KDA004" not in codes(doc)
    assert "kernel_runs" not in doc["results"][0]["info"]["kda_replayssm"]
    assert doc["results"][0]["layers"][0]["state"]["1"]["g_cache"] == [32, 16, 128]  # shapes need no torch


def test_non_kda_models_get_cache_labels_and_no_kda_findings(tmp_path):
    model = make_model(tmp_path, "gpt-oss-20b")
    result = check(model, select=("ALL",))
    assert {r["cache"] for r in result.layers} == {"full", "swa"}  # SGLang's pools: gpt-oss is on its hybrid-SWA allow-list
    assert not [f for f in result.findings if f.code.startswith("KDA")]
    assert "kda_replayssm" not in result.info
