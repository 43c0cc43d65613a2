"""`--engine sglang --dry-run` through a warm child (kvdoctor.engines.warm, run_child's warm_key): the
result a fresh one-shot child gives, for models of different families one after another, and no
process left when a request is killed at its time bound. Needs a Python with SGLang 0.5.23.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import masked
from kvdoctor.engines import child
from kvdoctor.engines import profile, warm
from kvdoctor.engines.sglang.settings import SglangSettings
from kvdoctor.engines.sglang import dryrun
from kvdoctor.load.loader import load_model

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"
PYTHON = child.find_python(None, dryrun.ENV_PYTHON, "sglang")
pytestmark = [pytest.mark.skipif(PYTHON is None, reason="no Python with SGLang 0.5.23"),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm child forks (Linux only)")]
TIMING = {"seconds", "seconds_in_sglang", "stderr_tail"}
KIND = str(dryrun.CHILD)


def dry(name: str, timeout: float = 600) -> dict[str, Any]:
    spec = load_model(str(MODELS / name), with_checkpoint=False, library_check=False)
    section = SglangSettings()
    plan = profile("sglang").plan(spec, section)
    assert PYTHON is not None
    return dryrun.launch(spec, dryrun.server_args(section), dryrun.DEFAULT_BUDGET, PYTHON, timeout=timeout,
                         planned_sliding=dryrun.planned_sliding(plan))


def test_warm_results_equal_fresh_ones_and_a_killed_request_leaves_nothing(monkeypatch):
    names = ["Qwen__Qwen3-Next-80B-A3B-Instruct", "google__gemma-3-1b-it"]
    with monkeypatch.context() as patch:
        patch.setattr(warm, "available", lambda: False)
        fresh = {name: dry(name) for name in names}
    warm.drop(KIND)
    served_by = set()
    for name in names:
        result = dry(name)
        served_by.add(warm.pid_of(KIND))
        assert result["returncode"] == 0 and not result["timed_out"], result["stderr_tail"]
        assert masked(result, TIMING) == masked(fresh[name], TIMING), name
    assert len(served_by) == 1 and None not in served_by
    pid = served_by.pop()
    assert pid is not None
    killed = dry("openai__gpt-oss-20b", timeout=1.0)  # inside SGLang's start-up: the imports are done
    assert killed["timed_out"] and killed["returncode"] < 0
    assert killed.get("versions")  # the first thing the child writes, before the run
    assert warm.pid_of(KIND) is None and warm.live_members(pid) == []
