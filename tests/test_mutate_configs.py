"""tools/mutate_configs.py's mutations run through the real pipeline without a crash: the ones that crashed
kvdoctor's SGLang sizing once (every layer sliding, a null window, a window without layer types), at a KV
budget so that the sizing and the rules reading it run."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import ROOT, check_json

TOOL = ROOT / "tools" / "mutate_configs.py"


def test_the_sglang_sizing_mutations_do_not_crash(tmp_path):
    out = tmp_path / "outcomes.json"
    proc = subprocess.run([sys.executable, str(TOOL), "--engine", "sglang", "--kv-budget", "40GiB",
                           "--mutation", "all-sliding", "--mutation", "null-window",
                           "--mutation", "window-without-types", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KVDOCTOR_SGLANG_PYTHON": str(tmp_path / "no-sglang" / "python")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {row["mutation"] for row in rows} == {"all-sliding", "null-window", "window-without-types"}
    assert len(rows) > 50 and not any("crash" in row for row in rows)
    # a mutation that makes a config the engine refuses still says so: gemma-2 with a null window
    [gemma] = [row for row in rows if row["config"] == "google__gemma-2-2b" and row["mutation"] == "null-window"]
    assert "SGL003" in gemma["errors"] and "CFG003" in gemma["errors"]


def test_a_null_window_on_a_hybrid_swa_model_sizes_without_a_floor(tmp_path):
    """A sliding layer without a window at a budget: SGLang skips its SWA admission floor and its request
    cap when sliding_window_size is None (pool_configurator.py:208 and :1001 @ v0.5.23); kvdoctor added
    None to an int there once. The null itself is CFG003's error."""
    cfg = json.loads((ROOT / "fixtures" / "configs" / "real" / "meta-models__Muse-Glimmer-30B.json").read_text())
    cfg["text_config"]["sliding_window"] = None
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg))
    for extra in ("", "  max_running_requests: 8\n  radix_cache: false\n"):
        (tmp_path / "deploy.yaml").write_text("sglang:\n  kv_budget: 40GiB\n" + extra)
        rc, doc = check_json(str(tmp_path / "model"), "--engine", "sglang", "--static",
                             "--deploy", str(tmp_path / "deploy.yaml"),
                             env={"KVDOCTOR_SGLANG_PYTHON": str(tmp_path / "no-sglang" / "python")})
        result = doc["results"][0]
        assert result.get("error") is None, result["error"]
        assert rc == 1 and "CFG003" in {f["code"] for f in result["findings"] if f["severity"] == "error"}
