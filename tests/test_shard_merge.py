"""--shard K/N picks a stable 1/N of the targets, and `kvdoctor merge` of the shards' JSON renders
every output format exactly as one unsharded run over the same targets, with the same exit code."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REAL_NAMES, make_model, real_config, run
from kvdoctor.fleet.runner import in_shard

FORMATS = ("json", "sarif", "junit", "github", "gitlab", "concise", "json-lines", "rich")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Real configs with checkpoints, one with a finding and one that cannot be read."""
    root = tmp_path_factory.mktemp("shards")
    for name in REAL_NAMES[:6]:
        make_model(root, real_config(name), dirname=f"models/{name}")
    make_model(root, "gpt-oss-20b", dirname="models/zz-broken", edit=lambda c: c.update(layer_types=c["layer_types"][:-1]))
    (root / "models" / "zz-unreadable").mkdir()
    (root / "models" / "zz-unreadable" / "config.json").write_text("{not json")
    return root


def test_shard_membership_depends_on_the_identity_alone():
    names = [f"models/m{i}" for i in range(200)]
    shards = {name: [k for k in (1, 2, 3, 4) if in_shard(name, (k, 4))] for name in names}
    assert all(len(ks) == 1 for ks in shards.values())  # every target in exactly one shard
    sizes = [sum(1 for ks in shards.values() if ks == [k]) for k in (1, 2, 3, 4)]
    assert min(sizes) >= 30  # a hash spreads them, not one shard taking all
    # the same in another process with another string-hash seed: CI jobs on other machines agree
    code = ("import json, sys; from kvdoctor.fleet.runner import in_shard; "
            "print(json.dumps({n: [k for k in (1, 2, 3, 4) if in_shard(n, (k, 4))] for n in json.loads(sys.argv[1])}))")
    other = subprocess.run([sys.executable, "-c", code, json.dumps(names)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True)
    assert json.loads(other.stdout) == shards


def test_shards_merge_to_the_unsharded_run_in_every_format(fleet, tmp_path):
    whole = run("check", "models", "--format", "json", "--select", "ALL", cwd=fleet)
    assert whole.returncode == 2, whole.stderr  # the unreadable model
    targets = [r["target"] for r in json.loads(whole.stdout)["results"]]
    parts = []
    for k in (1, 2, 3):
        out = tmp_path / f"part{k}.json"
        proc = run("check", "models", "--shard", f"{k}/3", "--format", "json", "-o", str(out), cwd=fleet)
        assert proc.returncode in (0, 1, 2) and "Traceback" not in proc.stderr, proc.stderr
        parts.append(str(out))
    sharded = sorted(r["target"] for p in parts for r in json.loads(Path(p).read_text())["results"])
    assert sharded == sorted(targets)  # nothing lost, nothing twice
    for fmt in FORMATS:
        one = run("check", *sorted(targets), "--format", fmt, cwd=fleet)
        merged = run("merge", *parts, "--format", fmt, cwd=fleet)
        assert merged.stdout == one.stdout, fmt
        assert merged.returncode == one.returncode == 2, fmt
    # the exit rule without the unreadable target: findings at or above --fail-on fail, --exit-zero passes
    kept = [p for p in parts if "zz-unreadable" not in Path(p).read_text()]
    readable = [t for t in targets if any(t in Path(p).read_text() for p in kept)]
    for extra in ((), ("--fail-on", "info"), ("--exit-zero",)):
        one = run("check", *sorted(readable), "--format", "json", *extra, cwd=fleet)
        merged = run("merge", *kept, "--format", "json", *extra, cwd=fleet)
        assert (merged.returncode, merged.stdout) == (one.returncode, one.stdout), extra


@pytest.mark.parametrize("value", ["0/3", "4/3", "1/0", "a/b", "2"])
def test_a_bad_shard_is_one_line_and_exit_2(fleet, value):
    proc = run("check", "models", "--shard", value, cwd=fleet)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--shard" in proc.stderr


def test_merge_refuses_what_is_not_a_report_and_overlapping_parts(fleet, tmp_path):
    part = tmp_path / "p.json"
    run("check", "models/zz-broken", "--format", "json", "-o", str(part), cwd=fleet)
    (tmp_path / "other.json").write_text(json.dumps({"results": []}))
    for args, words in (((str(part), str(part)), "also in"), ((str(tmp_path / "other.json"),), "not a kvdoctor"),
                        ((str(tmp_path / "missing.json"),), "missing.json")):
        proc = run("merge", *args, cwd=fleet)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
