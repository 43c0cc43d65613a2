"""tools/vllm_golden_rerun.py: a rerun of a vLLM oracle against the stored goldens, point by point."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "vllm_golden_rerun.py"
CHECK = json.loads((ROOT / "goldens" / "vllm_check-0.27.1.json").read_text())
BUDGET = json.loads((ROOT / "goldens" / "vllm-0.27.1.json").read_text())
BUDGET_0_33 = json.loads((ROOT / "goldens" / "vllm.json").read_text())  # written by an older oracle


def compare(tmp_path: Path, stored: dict, rerun: dict, *options: str) -> subprocess.CompletedProcess:
    (tmp_path / "stored.json").write_text(json.dumps(stored))
    (tmp_path / "rerun.json").write_text(json.dumps(rerun))
    return subprocess.run([sys.executable, str(TOOL), str(tmp_path / "stored.json"), str(tmp_path / "rerun.json"),
                           *options], capture_output=True, text=True)


def sample(doc: dict, n: int) -> dict:
    return {**doc, "points": copy.deepcopy(doc["points"][:n])}


def test_a_rerun_that_reproduces_agrees_on_every_point(tmp_path):
    rerun = sample(CHECK, 6)
    logged = next(p for p in rerun["points"] if len(p["log"]) > 1)
    logged["log"].reverse()  # the order warnings were logged in is not compared
    done = compare(tmp_path, CHECK, rerun)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "6/6 points agree", done.stdout
    done = compare(tmp_path, BUDGET, sample(BUDGET, 20))
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "20/20 points agree", done.stdout


def test_a_changed_number_or_warning_is_a_difference(tmp_path):
    rerun = sample(BUDGET, 20)
    rerun["points"][3]["result"]["num_blocks"] += 1
    done = compare(tmp_path, BUDGET, rerun)
    assert done.returncode == 1 and done.stdout.splitlines()[-1] == "19/20 points agree", done.stdout
    assert ".result.num_blocks" in done.stdout
    rerun = sample(CHECK, 6)
    next(p for p in rerun["points"] if p["log"])["log"].pop()
    done = compare(tmp_path, CHECK, rerun)
    assert done.returncode == 1 and "log: the warnings differ" in done.stdout, done.stdout


def test_a_point_the_stored_file_lacks_is_reported(tmp_path):
    rerun = sample(CHECK, 2)
    rerun["points"][0]["setting"] = "tp8"
    done = compare(tmp_path, CHECK, rerun)
    assert done.returncode == 1 and "not in the stored file" in done.stdout and done.stdout.endswith("1/1 points agree\n")


def test_an_ignored_field_is_left_out_wherever_it_occurs(tmp_path):
    """What an older oracle recorded and today's does not (vllm.json's groups beside an admission refusal)."""
    rerun = sample(BUDGET_0_33, 20)
    refused = next(p for p in rerun["points"] if "error" in p["result"] and "groups" in p["result"])
    del refused["result"]["groups"]
    assert compare(tmp_path, BUDGET_0_33, rerun).returncode == 1
    done = compare(tmp_path, BUDGET_0_33, rerun, "--ignore", "groups")
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "20/20 points agree (leaving out groups)", done.stdout
