"""The reference kernels: the ReplaySSM replay on a recipe's caches against the naive gated delta
recurrence (fp32 on CPU, about 1e-6 relative), and the runs that catch a wrong cursor rule."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from kvdoctor.checks.kda_caches import CODE_OF_CHECK
from kvdoctor.engines.sglang.kda.caches import build_caches
from kvdoctor.engines.sglang.kda.dims import PROBE, Geometry
from kvdoctor.engines.sglang.kda.recipe import load_recipe
from kvdoctor.engines.sglang.kda.replay import FP32_TOLERANCE, kernel_run, naive_step, random_step, reconstruct, replay_step


def recipe(**changes):
    base = load_recipe("sglang-0.5.23")
    return base.model_copy(update=changes) if changes else base


@pytest.mark.parametrize("geom", [
    Geometry.consistent(**PROBE),                                   # GQA (HV = 2H), K != V
    Geometry.consistent(H=2, HV=2, K=128, V=128, L=16),             # Kimi-Linear-48B dims, two heads
    Geometry.consistent(H=1, HV=3, K=16, V=8, L=1),                 # L = 1: every step flushes
    Geometry.consistent(H=2, HV=2, K=32, V=32, L=2),
], ids=["probe", "kimi-dims", "L1", "L2"])
def test_replay_matches_the_recurrence(geom):
    run = kernel_run(recipe(), geom)
    assert run.ok, run.problems
    assert run.steps == 2 * geom.L + 3
    assert run.output_error < FP32_TOLERANCE and run.state_error < FP32_TOLERANCE
    assert run.padded_rows_zero and run.untouched_slots_intact
    assert run.flushes >= 2  # both occupied rows flush at least once in 2L + 3 steps
    if geom.L >= 3:
        assert run.forced_flushes == 1


def test_bounded_gate_also_matches():
    run = kernel_run(recipe(), Geometry.consistent(**PROBE), lower_bound=-5.0)
    assert run.ok, run.problems


def test_cursor_not_reset_after_a_forced_flush_is_caught():
    """Shapes all pass, but the ring replays tokens the forced flush already folded in: KDA051."""
    run = kernel_run(recipe(cursor="(m + 1) % L"), Geometry.consistent(**PROBE))
    assert not run.ok and run.failure is None
    assert any("outputs differ" in p for p in run.problems)


def test_cursor_leaving_the_ring_is_caught():
    run = kernel_run(recipe(cursor="(m + 1) % (L + 1)"), Geometry.consistent(**PROBE))
    assert run.failure is not None and CODE_OF_CHECK[run.failure.check] == "KDA041"


def test_sixteen_bit_rings_use_the_looser_tolerance():
    run = kernel_run(recipe(), Geometry.consistent(**PROBE), ssm_dtype="bfloat16")
    assert run.tolerance > FP32_TOLERANCE
    assert run.ok, run.problems
    assert run.output_error > 1e-5  # the rounding is real: bf16 rings are not exact


def _inputs(geom, slots, gen):
    x = random_step(geom, slots, gen)
    x.A_log = torch.randn(geom.HV, generator=gen)
    x.dt_bias = torch.randn(geom.HV, geom.K, generator=gen)
    return x


def test_reconstruction_with_an_empty_ring_is_the_checkpoint_and_ignores_stale_rows():
    geom = Geometry.consistent(**PROBE)
    c = build_caches(recipe(), geom, ssm_dtype="float32")
    c.initial_state.normal_()
    c.d_cache.normal_()  # stale rows at or past the cursor must not matter
    assert torch.equal(reconstruct(c, 1, 0, group=2), c.initial_state[1])


def test_a_non_flush_step_leaves_the_checkpoint_alone_and_a_flush_leaves_the_ring_alone():
    geom = Geometry.consistent(**PROBE)
    gen = torch.Generator().manual_seed(1)
    c = build_caches(recipe(), geom, ssm_dtype="float32")
    c.initial_state.normal_(generator=gen)
    x = _inputs(geom, [1, 3, -1], gen)
    state_before = c.initial_state.clone()
    replay_step(c, x, [0, 0, 0], geom)
    assert torch.equal(c.initial_state, state_before)
    assert c.d_cache[1, :, 0].abs().sum() > 0 and c.g_cache[1, :, 0].max() < 0  # appended: gates are log decays
    rings_before = (c.d_cache.clone(), c.k_cache.clone(), c.g_cache.clone())
    replay_step(c, _inputs(geom, [1, 3, -1], gen), [geom.L - 1, geom.L - 1, 0], geom)  # natural flush
    assert not torch.equal(c.initial_state[1], state_before[1])
    assert all(torch.equal(a, b) for a, b in zip((c.d_cache, c.k_cache, c.g_cache), rings_before))


def test_padded_rows_output_zero_and_touch_nothing():
    geom = Geometry.consistent(**PROBE)
    gen = torch.Generator().manual_seed(2)
    c = build_caches(recipe(), geom, ssm_dtype="float32")
    before = c.clone()
    dense = c.initial_state.clone()
    x = _inputs(geom, [-1, -1, -1], gen)
    assert replay_step(c, x, [0, 0, 0], geom).abs().max() == 0
    assert naive_step(dense, x, geom).abs().max() == 0
    assert torch.equal(c.initial_state, before.initial_state) and torch.equal(c.d_cache, before.d_cache)


@settings(max_examples=12, deadline=None)
@given(H=st.integers(1, 2), group=st.integers(1, 3), K=st.sampled_from([8, 16, 32]), V=st.sampled_from([8, 16, 64]),
       L=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_replay_matches_the_recurrence_for_any_small_geometry(H, group, K, V, L, seed):
    run = kernel_run(recipe(), Geometry.consistent(H=H, HV=H * group, K=K, V=V, L=L), seed=seed)
    assert run.ok, (run.problems, run.failure)

