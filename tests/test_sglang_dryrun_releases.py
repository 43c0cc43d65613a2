"""`--engine sglang --dry-run` at each profiled SGLang release: the child (engines/sglang/startup.py) runs on the
release's own API through shims/sglang_api.py, the adapter the golden oracles use too.

Runs each release whose venv goldens/releases.py built (goldens/.venv/sglang-<release>), and skips the others
with the command that builds one. At each release the dry run's answer is held to that release's own start-up
goldens (goldens/sglang_check-<release>.json; 0.5.23's in sglang_check.json), which the oracle made with the same
release: gpt-oss-20b starts (hybrid-SWA, its layer ids, runner window, pool class and 40 GiB sizing as the goldens
say), and EXAONE-4.0-32B is refused up to 0.5.21 (an assertion on the attention backend, in the release's own
words and at its own line) and starts from 0.5.22. The static plan at that release agrees with both runs.
Each run takes 20-60 s on two cores.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvdoctor.catalog import builtin_catalog
from kvdoctor.checks import dryrun_sglang
from kvdoctor.engines import profile
from kvdoctor.engines.sglang import dryrun
from kvdoctor.engines.sglang.settings import SglangSettings
from kvdoctor.load.loader import load_model

ROOT = Path(__file__).resolve().parent.parent
GOLDENS, REAL = ROOT / "goldens", ROOT / "fixtures" / "configs" / "real"
RELEASES = {**{r: f"sglang_check-{r}.json" for r in ("0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19",
                                                      "0.5.20", "0.5.21", "0.5.22")},
            "0.5.23": "sglang_check.json"}
MODELS = ("openai__gpt-oss-20b", "LGAI-EXAONE__EXAONE-4.0-32B")
MODEL_FIELDS = ("attention_arch", "is_hybrid_swa", "swa_attention_layer_ids", "full_attention_layer_ids",
                "runner_sliding_window_size", "num_hidden_layers", "context_len")
SIZING = ("max_total_num_tokens", "full_max_total_num_tokens", "swa_max_total_num_tokens", "max_running_requests")


def golden(release: str, model: str) -> dict:
    """The release's own start-up of `model`, unmutated, at the default settings."""
    doc = json.loads((GOLDENS / RELEASES[release]).read_text())
    assert doc["versions"]["sglang"] == release
    (point,) = [p for p in doc["points"]
                if p["model"] == model and p.get("mutation", "none") == "none" and p["setting"] == "default"]
    return point


def test_the_goldens_hold_a_start_and_a_refusal_at_the_older_releases():
    """The test below shows both outcomes: EXAONE-4.0-32B is refused by the releases before 0.5.22."""
    outcomes = {r: golden(r, "LGAI-EXAONE__EXAONE-4.0-32B")["result"]["outcome"] for r in RELEASES}
    assert outcomes == {**dict.fromkeys(("0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20",
                                         "0.5.21"), "refused"),
                        "0.5.22": "ok", "0.5.23": "ok"}
    assert {golden(r, "openai__gpt-oss-20b")["result"]["outcome"] for r in RELEASES} == {"ok"}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("release", RELEASES)
def test_the_dry_run_gives_the_release_s_own_answer(release, model, tmp_path):
    python = GOLDENS / ".venv" / f"sglang-{release}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no SGLang {release} venv (python goldens/releases.py --venv-only sglang=={release})")
    (tmp_path / "config.json").write_text((REAL / f"{model}.json").read_text())
    spec = load_model(str(tmp_path), with_checkpoint=False, library_check=False)
    settings = SglangSettings().at_release(release)
    plan = profile("sglang").plan(spec, settings)
    result = dryrun.launch(spec, dryrun.server_args(settings), dryrun.DEFAULT_BUDGET, python, timeout=600,
                           planned_sliding=dryrun.planned_sliding(plan), release=release)
    result["budget_from_deploy"] = False
    assert result["versions"]["sglang"] == release, result["stderr_tail"]
    want = golden(release, model)["result"]
    outcome = result["outcome"]
    if want["outcome"] == "refused":
        error = want["error"]
        assert (outcome["start"], outcome["step"], outcome["class"], outcome["message"]) == (
            False, want["refused_at"], error["class"], error["message"])
        assert outcome["raised_at_sglang"].split(" in ")[0] == error["raised_at_sglang"]  # the release's own line
    else:
        assert outcome == {"start": True}, result["stderr_tail"]
        assert {k: result["model"][k] for k in MODEL_FIELDS} == {k: want["model"][k] for k in MODEL_FIELDS}
        assert {k: result["sizing"][k] for k in SIZING} == {k: want["sizing_40GiB"][k] for k in SIZING}
        assert result["pools"]["token_to_kv_pool"]["class"] == want["pools_tiny"]["token_to_kv_pool"]["class"]
    assert dryrun.disagreements(plan, result) == []
    assert dryrun_sglang.findings(spec, plan, dryrun.record(plan, result), builtin_catalog()) == []
