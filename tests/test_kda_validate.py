"""The decode wrappers' checks, replayed: every check fires on an input built to break it, in the
engine's order and with its exact message (the catalog's triage pattern must match it), and healthy
inputs built from the default recipe pass both wrappers and every invariant."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from kvdoctor.checks.kda_caches import CODE_OF_CHECK
from kvdoctor.engines.sglang import kda
from kvdoctor.catalog import builtin_catalog
from kvdoctor.engines.sglang.kda.caches import build_caches, build_inputs
from kvdoctor.engines.sglang.kda.dims import PROBE, Geometry
from kvdoctor.engines.sglang.kda.recipe import load_recipe
from kvdoctor.engines.sglang.kda.validate import helion_wrapper, invariants, triton_wrapper

GEOM = Geometry.consistent(**PROBE)  # H=2, HV=4, K=32, V=64, L=3: every symbol distinct


def healthy():
    recipe = load_recipe("sglang-0.5.23")
    return build_inputs(GEOM, act_dtype="bfloat16"), build_caches(recipe, GEOM, ssm_dtype="float32")


def test_healthy_inputs_pass_both_wrappers_and_the_invariants():
    x, c = healthy()
    assert helion_wrapper(x, c) is None
    assert triton_wrapper(x, c) is None
    assert invariants(x, c) == []


def _set(obj, name, value):
    setattr(obj, name, value)


# (code, mutation of (inputs, caches), exact Helion message)
HELION = [
    ("KDA011", lambda x, c: _set(x, "a", x.a.transpose(1, 2)), "KDA `a` must be a contiguous 2D or 3D tensor."),
    ("KDA012", lambda x, c: _set(x, "dt_bias", x.dt_bias.reshape(1, 1, -1)),
     "KDA `dt_bias` must be a contiguous 1D or 2D tensor."),
    ("KDA013", lambda x, c: _set(x, "mixed_qkv", x.mixed_qkv[:, None]), "`mixed_qkv` must be a 2D tensor (got ndim=3)."),
    ("KDA014", lambda x, c: _set(x, "mixed_qkv", torch.zeros(x.mixed_qkv.shape[1], 3).t()),
     "`mixed_qkv` must be contiguous in the last dim."),
    ("KDA015", lambda x, c: _set(x, "b", x.b[:, :, None]), "`a` and `b` must be 2D tensors (got a.ndim=2, b.ndim=3)."),
    ("KDA016", lambda x, c: _set(x, "b", torch.zeros(4, 3).t()), "`a`/`b` must be contiguous in the last dim."),
    ("KDA017", lambda x, c: _set(x, "A_log", x.A_log.reshape(1, 1, 4, 1)), "`A_log`/`dt_bias` must be 1D tensors."),
    ("KDA018", lambda x, c: _set(x, "A_log", torch.zeros(8)[::2]), "`A_log`/`dt_bias` must be contiguous."),
    ("KDA019", lambda x, c: _set(x, "ssm_state_indices", x.ssm_state_indices[:, None]),
     "`ssm_state_indices` must be 1D for packed decode (got ndim=2)."),
    ("KDA020", lambda x, c: _set(x, "out", torch.zeros(3, 1, 64, 4).transpose(2, 3)), "`out` must be contiguous."),
    ("KDA021", lambda x, c: _set(x, "A_log", x.A_log.to("meta")), "All inputs must be on the same device."),
    ("KDA022", lambda x, c: _set(x, "b", x.b[:2]), "Mismatched batch sizes: mixed_qkv.shape[0]=3, a.shape[0]=3, "
     "b.shape[0]=2."),
    ("KDA023", lambda x, c: _set(x, "ssm_state_indices", x.ssm_state_indices[:2]),
     "`ssm_state_indices` must have shape [B] (got (2,); expected (3,))."),
    ("KDA024", lambda x, c: _set(c, "initial_state", c.initial_state[0]), "`initial_state` must be a 4D tensor (got ndim=3)."),
    ("KDA025", lambda x, c: _set(c, "initial_state", c.initial_state.transpose(2, 3).contiguous().transpose(2, 3)),
     "`initial_state` must be contiguous in the last dim."),
    ("KDA026", lambda x, c: _set(c, "initial_state", torch.zeros(4, 4, 48, 32)),
     "Helion KDA decode requires power-of-two key and value head dimensions (got K=32, V=48)."),
    ("KDA027", lambda x, c: _set(x, "a", torch.zeros(3, 4, 16)),
     "`a` must have shape [B, HV*K] with HV=4, K=32 (got a.shape=(3, 64))."),
    ("KDA028", lambda x, c: _set(x, "b", torch.zeros(3, 2)), "`b` must have shape [B, HV] with HV=4 (got b.shape=(3, 2))."),
    ("KDA029", lambda x, c: _set(x, "A_log", torch.zeros(2)), "`A_log` must have 4 elements (got 2)."),
    ("KDA030", lambda x, c: _set(x, "dt_bias", torch.zeros(4, 16)), "`dt_bias` must have 128 elements (got 64)."),
    ("KDA031", lambda x, c: _set(x, "out", torch.zeros(3, 1, 4, 32)),
     "`out` must have shape (3, 1, 4, 64) (got out.shape=(3, 1, 4, 32))."),
    ("KDA032", lambda x, c: _set(x, "mixed_qkv", torch.zeros(3, 4 * 64 + 1)),
     "Invalid packed `mixed_qkv` last dim=257 for HV=4, V=64."),
    ("KDA033", lambda x, c: _set(x, "mixed_qkv", torch.zeros(3, 4 * 64 + 2 * 48)),
     "Invalid packed Q size 48: must be divisible by K=32. KDA packed decode requires num_q_heads == num_k_heads "
     "and head_q_dim == head_k_dim."),
    ("KDA034", lambda x, c: _set(x, "mixed_qkv", torch.zeros(3, 4 * 64 + 2 * 3 * 32)),
     "Invalid head config inferred from mixed_qkv: H=3, HV=4."),
    ("KDA006", lambda x, c: _set(c, "write_pos", c.write_pos.long()), "`write_pos` must be a 1D int32 tensor."),
    ("KDA007", lambda x, c: _set(c, "write_pos", torch.zeros(4, dtype=torch.int32)), "`write_pos` must have shape (3,)."),
    ("KDA008", lambda x, c: _set(c, "force_flush", c.force_flush.bool()),
     "`force_flush` must be a length-B int32 tensor or None."),
    ("KDA002", lambda x, c: _set(c, "d_cache", c.d_cache[:, 0, 0]),  # 2-D: torch's IndexError from size(2)
     "Dimension out of range (expected to be in range of [-2, 1], but got 2)"),
    ("KDA005", lambda x, c: _set(c, "d_cache", c.d_cache[:, :, :0]), "ReplaySSM cache length must be at least 1."),
    ("KDA002", lambda x, c: _set(c, "d_cache", torch.zeros(4, 4, 3, 32)), "`d_cache` must have shape [slots, HV, L, V]."),
    ("KDA003", lambda x, c: _set(c, "k_cache", torch.zeros(4, 4, 3, 32)), "`k_cache` must have shape [slots, H, L, K]."),
    ("KDA001", lambda x, c: _set(c, "g_cache", torch.zeros(4, 4, 3, 64)), "`g_cache` must have shape [slots, HV, L, K]."),
    ("KDA001", lambda x, c: _set(c, "g_cache", torch.zeros(4, 4, 3)), "`g_cache` must have shape [slots, HV, L, K]."),
    ("KDA004", lambda x, c: _set(c, "g_cache", c.g_cache.bfloat16()), "`g_cache` must have dtype torch.float32."),
    ("KDA009", lambda x, c: _set(c, "k_cache", c.k_cache.to("meta")), "ReplaySSM inputs must be on the same device."),
    ("KDA010", lambda x, c: _set(c, "force_flush", c.force_flush.to("meta")),
     "`force_flush` must be on the same device as the inputs."),
]

# The Triton twin: (code, mutation, exact message). Shared meaning, shared code.
TRITON = [
    ("KDA013", lambda x, c: _set(x, "mixed_qkv", x.mixed_qkv[:, None]), "`mixed_qkv` must be 2D (got ndim=3)."),
    ("KDA014", lambda x, c: _set(x, "mixed_qkv", torch.zeros(x.mixed_qkv.shape[1], 3).t()),
     "`mixed_qkv` must be contiguous in the last dim."),
    ("KDA015", lambda x, c: _set(x, "b", x.b[:, :, None]), "`b` must be 2D (got b.ndim=3)."),
    ("KDA017", lambda x, c: _set(x, "A_log", x.A_log.reshape(1, 1, 4, 1)), "`A_log` must be a 1D tensor."),
    ("KDA024", lambda x, c: _set(c, "initial_state", c.initial_state[0]), "`initial_state` must be 4D (got ndim=3)."),
    ("KDA020", lambda x, c: _set(x, "out", torch.zeros(3, 1, 64, 4).transpose(2, 3)), "`out` must be contiguous."),
    ("KDA006", lambda x, c: _set(c, "write_pos", c.write_pos.long()), "`write_pos` must be a 1D int32 tensor."),
    ("KDA008", lambda x, c: _set(c, "force_flush", c.force_flush.bool()), "`force_flush` must be a 1D int32 tensor or None."),
    ("KDA032", lambda x, c: _set(x, "mixed_qkv", torch.zeros(3, 4 * 64 + 2 * 48)),
     "Invalid packed `mixed_qkv` last dim=352 for HV=4, V=64, K=32."),
    ("KDA034", lambda x, c: _set(x, "mixed_qkv", torch.zeros(3, 4 * 64 + 2 * 3 * 32)),
     "Invalid head config inferred from mixed_qkv: H=3, HV=4."),
    ("KDA027", lambda x, c: _set(x, "a", x.a.reshape(3, -1)), "KDA `a` must have shape (3, 4, 32) (got (3, 128))."),
    ("KDA030", lambda x, c: _set(x, "dt_bias", x.dt_bias.reshape(-1)), "KDA `dt_bias` must have shape (4, 32) (got (128,))."),
    ("KDA035", lambda x, c: _set(x, "a", torch.zeros(3, 32, 4).transpose(1, 2)), "KDA `a`/`dt_bias` must be contiguous."),
    ("KDA002", lambda x, c: _set(c, "d_cache", torch.zeros(4, 4, 3, 32)),
     "`d_cache` per-slot shape must be (4, 3, 64) (got (4, 3, 32))."),
    ("KDA003", lambda x, c: _set(c, "k_cache", torch.zeros(4, 4, 3, 32)),
     "`k_cache` per-slot shape must be (2, 3, 32) (got (4, 3, 32))."),
    ("KDA001", lambda x, c: _set(c, "g_cache", torch.zeros(4, 4, 3, 64)),
     "`g_cache` per-slot shape must be (4, 3, 32) (got (4, 3, 64))."),
    ("KDA004", lambda x, c: _set(c, "g_cache", c.g_cache.bfloat16()), "`g_cache` must be float32 (got torch.bfloat16)."),
    ("KDA031", lambda x, c: _set(x, "out", torch.zeros(3, 1, 4, 32)), "`out` must have shape (3, 1, 4, 64) (got (3, 1, 4, 32))."),
    ("KDA007", lambda x, c: _set(c, "write_pos", torch.zeros(4, dtype=torch.int32)),
     "`write_pos` and `ssm_state_indices` must both have length B=3 (got 4, 3)."),
]


def _run(wrapper, mutate):
    x, c = healthy()
    mutate(x, c)
    return wrapper(x, c)


@pytest.mark.parametrize("code, mutate, message", HELION, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(HELION)])
def test_helion_wrapper_check_fires_with_its_exact_message(code, mutate, message):
    failure = _run(helion_wrapper, mutate)
    assert failure is not None and (CODE_OF_CHECK[failure.check], failure.message) == (code, message)
    entry = builtin_catalog()[code]
    if failure.error_class == "ValueError":
        assert re.search(entry.error.pattern, failure.message), "the catalog pattern must match the raised text"


@pytest.mark.parametrize("code, mutate, message", TRITON, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(TRITON)])
def test_triton_twin_check_fires_with_its_exact_message(code, mutate, message):
    failure = _run(triton_wrapper, mutate)
    assert failure is not None and (CODE_OF_CHECK[failure.check], failure.message) == (code, message)
    assert re.search(builtin_catalog()[code].error.pattern, failure.message)


def test_triton_twin_needs_key_dims_above_16():
    geom = Geometry.consistent(H=1, HV=1, K=16, V=16, L=2)
    x = build_inputs(geom)
    c = build_caches(load_recipe("sglang-0.5.23"), geom, ssm_dtype="float32")
    failure = triton_wrapper(x, c)
    assert (CODE_OF_CHECK[failure.check], failure.message) == ("KDA036", "BKT=8 must be >=16 for tl.dot (nk=2, BK=16).")
    assert helion_wrapper(x, c) is None  # the Helion wrapper has no such limit


def test_wrapper_order_first_failure_wins():
    """d_cache is checked before g_cache, as in the engine: both wrong -> the d_cache message."""
    x, c = healthy()
    c.d_cache = torch.zeros(4, 4, 3, 32)
    c.g_cache = torch.zeros(4, 4, 3, 64)
    assert CODE_OF_CHECK[helion_wrapper(x, c).check] == "KDA002"


def test_every_wrapper_code_in_the_catalog_has_a_firing_fixture():
    fired = {code for code, _, _ in HELION + TRITON} | {"KDA036"}
    catalog = builtin_catalog()
    wrapper_codes = {c for c in catalog.codes() if c.startswith("KDA") and int(c[3:]) <= 36}
    assert wrapper_codes == fired


def test_invariants_slot_dims_index_range_and_cursor_range():
    x, c = healthy()
    c.d_cache = c.d_cache[:3]
    found = {CODE_OF_CHECK[f.check] for f in invariants(x, c)}
    assert found == {"KDA040", "KDA042"}  # 3 ring slots while rows use slot 3
    x, c = healthy()
    c.write_pos = torch.tensor([0, 3, 0], dtype=torch.int32)  # L = 3: cursor 3 is past the ring
    [failure] = invariants(x, c)
    assert CODE_OF_CHECK[failure.check] == "KDA041" and "outside 0..2" in failure.message
    x, c = healthy()
    c.write_pos = torch.tensor([0, 0, 7], dtype=torch.int32)  # a padded row's cursor is never used
    assert invariants(x, c) == []


def test_every_check_name_is_its_catalog_entry_name():
    catalog = builtin_catalog()
    assert {name: catalog[code].name for name, code in CODE_OF_CHECK.items()} == {n: n for n in CODE_OF_CHECK}


def test_every_check_the_probes_can_fail_has_a_code():
    package = Path(kda.__file__).parent
    named = {m for p in package.glob("*.py") for m in re.findall(r'Failure\("([a-z0-9-]+)"', p.read_text())}
    assert named and named <= set(CODE_OF_CHECK), named - set(CODE_OF_CHECK)
