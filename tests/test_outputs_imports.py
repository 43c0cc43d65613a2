"""The light commands never import torch, mlx, mlx_lm or transformers: they must start fast and work
where those are not installed."""
from __future__ import annotations

import pytest

from import_probe import probe

HEAVY = ("torch", "mlx", "mlx_lm", "transformers")


@pytest.mark.parametrize("args", [["--version"], ["rules"], ["rules", "--format", "json"], ["explain", "CFG001"],
                                  ["triage", "-"], ["config"]], ids=" ".join)
def test_light_commands_import_no_heavy_module(args):
    run = probe(args, HEAVY, input="ValueError: recent_window_tokens must be >= 0 or None\n")
    assert run.loaded == set(), run.stderr[-2000:]


@pytest.mark.parametrize("engine", ["hf", "sglang"])
def test_static_check_imports_no_heavy_module(tmp_path, engine):
    """`check --static` reads headers and config only: no torch, mlx or numpy (the safetensors
    library's own check, which imports numpy, runs in full checks)."""
    from helpers import make_model

    d = make_model(tmp_path, "kimi-linear", shards=2)
    run = probe(["check", str(d), "--static", "--engine", engine, "--format", "json"], (*HEAVY, "numpy"))
    assert run.loaded == set(), run.stderr[-2000:]


def test_full_check_under_a_profile_without_probes_loads_neither_torch_nor_mlx():
    """hf builds no caches (no probes), so its full check loads neither torch nor mlx: -j N may check
    such targets in the parent before it forks (runner._is_light)."""
    from helpers import REAL

    run = probe(["check", str(REAL), "--format", "json", "-j", "1"], HEAVY[:3])
    assert run.loaded == set(), run.stderr[-2000:]
