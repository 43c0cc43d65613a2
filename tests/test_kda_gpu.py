"""The GPU path (sglang's own Helion wrapper and Triton twin): it skips cleanly without CUDA or the
packages, and where they exist every contract and numeric case of bench/gpu_kda.py must pass."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvdoctor.engines.sglang.kda import gpu

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu_kda.py"
REASON = gpu.unavailable_reason()


@pytest.mark.skipif(REASON is None, reason="a GPU and the packages are present: the real run applies")
def test_bench_skips_with_one_line_without_cuda_or_packages():
    proc = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"gpu_kda: skipped: {REASON}"
    assert proc.stderr == ""


@pytest.mark.skipif(REASON is not None, reason=f"GPU run skipped: {REASON}")
def test_engine_kernels_agree_with_kvdoctor_on_gpu(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH), "--json", str(tmp_path / "gpu.json")], capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 failing case(s)" in proc.stdout
