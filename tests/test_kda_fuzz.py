"""Any recipe and any sglang settings: the KDA profile answers with findings or a one-line input
error, never a traceback, and never builds past the probe budget."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.check import Options, check_target
from kvdoctor.engines.deploy import load_deploy
from kvdoctor.checks.selection import Selection
from test_kda_cli import make_model, small_kimi

SYMBOLS = ["H", "HV", "K", "V", "L", "W", "B"]
atoms = st.sampled_from(SYMBOLS) | st.integers(-3, 300).map(str)
exprs = st.recursive(atoms, lambda inner: st.tuples(inner, st.sampled_from(["+", "-", "*", "//", "%"]), inner)
                     .map(lambda t: f"({t[0]} {t[1]} {t[2]})"), max_leaves=4)
shapes = st.lists(exprs, min_size=0, max_size=5).map(lambda xs: "[" + ", ".join(xs) + "]")
dtypes = st.sampled_from(["ssm", "conv", "float32", "bfloat16", "int32", "int64", "bool"])
cursors = st.sampled_from(["0 if flushed else (m + 1) % L", "(m + 1) % L", "(m + 1) % (L + 1)", "m", "0",
                           "(m + 1) % (L - L)"])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("fuzz"), small_kimi(), dirname="kimi")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=shapes, d=shapes, k=shapes, g=shapes, g_dtype=dtypes, wp=shapes, wp_dtype=dtypes, cursor=cursors,
       slots=st.sampled_from(["size + 1", "size", "size - 5", "1"]), L=st.integers(-2, 40),
       tp=st.sampled_from([None, 1, 3, 8]), backend=st.sampled_from(["triton", "helion", "flashinfer"]))
def test_any_recipe_gives_findings_or_an_input_error(model, tmp_path_factory, state, d, k, g, g_dtype, wp, wp_dtype,
                                                      cursor, slots, L, tp, backend):
    tmp = tmp_path_factory.mktemp("r")
    (tmp / "r.yaml").write_text(f"""name: fuzz
summary: fuzz
slots: {slots}
tensors:
  initial_state: {{shape: {state}, dtype: ssm}}
  d_cache: {{shape: {d}, dtype: ssm}}
  k_cache: {{shape: {k}, dtype: ssm}}
  g_cache: {{shape: {g}, dtype: {g_dtype}}}
write_pos: {{shape: {wp}, dtype: {wp_dtype}}}
cursor: "{cursor}"
""")
    lines = ["sglang:", "  kda_recipe: r.yaml", "  enable_linear_replayssm: true", f"  linear_replayssm_cache_len: {L}",
             f"  linear_attn_decode_backend: {backend}"] + ([f"  tp_size: {tp}"] if tp else [])
    (tmp / "d.yaml").write_text("\n".join(lines) + "\n")
    opts = Options(catalog=builtin_catalog(), engine="sglang", deploy=load_deploy(str(tmp / "d.yaml")),
                   selection=Selection(select=("KDA", "LIM")))
    result = check_target(str(model), opts)
    if result.error is not None:
        assert "\n" not in result.error
    else:
        assert all(f.code.startswith(("KDA", "LIM")) for f in result.findings)
