"""The light commands never import torch, mlx, mlx_lm or transformers: they must start fast and work
where those are not installed."""
from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "mlx", "mlx_lm", "transformers")

PROBE = """
import sys
from kvdoctor.cli import main
sys.argv = ["kvdoctor", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
heavy = sorted({name.split(".")[0] for name in sys.modules} & set(%r))
print("HEAVY:" + ",".join(heavy), file=sys.stderr)
""" % (HEAVY,)


@pytest.mark.parametrize("args", [["--version"], ["rules"], ["rules", "--format", "json"], ["explain", "CFG001"],
                                  ["triage", "-"], ["config"]], ids=" ".join)
def test_light_commands_import_no_heavy_module(args):
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], input=b"ValueError: recent_window_tokens must be "
                          b">= 0 or None\n", capture_output=True, timeout=600)
    marker = [line for line in proc.stderr.decode().splitlines() if line.startswith("HEAVY:")]
    assert marker == ["HEAVY:"], proc.stderr.decode()[-2000:]


@pytest.mark.parametrize("engine", ["hf", "sglang"])
def test_static_check_imports_no_heavy_module(tmp_path, engine):
    """`check --static` reads headers and config only: no torch, mlx or numpy (the safetensors
    library's own check, which imports numpy, runs in full checks)."""
    from helpers import make_model

    d = make_model(tmp_path, "kimi-linear", shards=2)
    proc = subprocess.run([sys.executable, "-c", PROBE.replace("%r" % (HEAVY,), "%r" % (HEAVY + ("numpy",),)),
                           "check", str(d), "--static", "--engine", engine, "--format", "json"],
                          capture_output=True, timeout=600)
    marker = [line for line in proc.stderr.decode().splitlines() if line.startswith("HEAVY:")]
    assert marker == ["HEAVY:"], proc.stderr.decode()[-2000:]
