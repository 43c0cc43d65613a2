"""Every malformed or hostile input ends in exit 2 with one line naming the file and field (or in a
named finding, or in a clean pass for a healthy one), never a traceback or a hang, never changes a
byte of the model directory, and never runs code the model ships.

The corpus (tests/badinput_gen.py and tests/badinput/) runs in-process through the real CLI entry
point, so the exit code and stderr are exactly what a user sees; one subprocess run then checks the
model-directory cases as a single many-target run, with healthy models among the bad ones.
"""
from __future__ import annotations

import json
import signal
import sys

import pytest
from badinput import CASES
from badinput_base import base_model, healthy_cached_model, tree_state
from badinput_gen import CATALOG_CASES, GOOD_ENTRY
from helpers import codes, run

from kvdoctor.catalog import load_catalog
from kvdoctor.errors import InputError


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`kvdoctor ARGS` through `kvdoctor.cli.main.main`, in this process: (exit code, stdout, stderr)."""
    from kvdoctor.cli.main import main

    monkeypatch.setattr(sys, "argv", ["kvdoctor", *args])
    capsys.readouterr()
    signal.alarm(120)  # a read that blocks (a FIFO, a device) fails the test instead of hanging it
    try:
        main()
        rc = 0
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        signal.alarm(0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_corpus_is_large_and_covers_every_kind():
    kinds = {c.kind for c in CASES}
    assert kinds == {"config", "header", "index", "deploy", "fs", "cache", "encoding", "files", "checkpoint",
                     "bait", "cli"}
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"
    assert len(CASES) + len(CATALOG_CASES) >= 400


def test_healthy_base_checks_cleanly(tmp_path, monkeypatch, capsys):
    """The corpus breaks one thing in this model; unbroken, it has no error and no error finding."""
    m = base_model(tmp_path)
    rc, out, err = cli(monkeypatch, capsys, "check", "--format", "json", str(m))
    doc = json.loads(out)
    assert rc == 0, err
    assert doc["results"][0].get("error") is None
    assert doc["results"][0]["layers"] and not [f for f in doc["results"][0]["findings"] if f["severity"] == "error"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_malformed_input(case, tmp_path, monkeypatch, capsys):
    built = case.build(tmp_path)
    before = tree_state(built.model_dir)
    for key, value in built.env.items():
        monkeypatch.setenv(key, value)
    loaded = set(sys.modules)
    argv = built.argv if built.argv is not None else ("check", "--format", "json", built.target, *built.args)
    rc, out, err = cli(monkeypatch, capsys, *argv)
    assert "Traceback" not in err + out
    assert tree_state(built.model_dir) == before, "the check changed the model directory"
    assert built.marker is None or not built.marker.exists(), "code shipped with the model ran"
    from_model = [name for name in set(sys.modules) - loaded
                  if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path))]
    assert not from_model, f"imported from the model's files: {from_model}"
    lines = err.strip().splitlines()
    if built.names is not None:
        assert rc == 2, (rc, err)
        assert len(lines) == 1, err
        assert lines[0].startswith("kvdoctor: error: ") and built.names in lines[0], lines[0]
    elif built.code is not None:
        assert rc in (0, 1), err
        assert built.code in codes(json.loads(out)), out
    else:
        assert rc in ((0, 1) if built.accepted else (0,)), err
        assert not [line for line in lines if line.startswith("kvdoctor: error")], err
        result = json.loads(out)["results"][0]
        assert result.get("error") is None and result["layers"], result.get("error")
        if not built.accepted:
            assert not [f for f in result["findings"] if f["severity"] == "error"], result["findings"]


@pytest.mark.parametrize("id,filename,content", CATALOG_CASES, ids=[c[0] for c in CATALOG_CASES])
def test_malformed_user_catalog(id, filename, content, tmp_path):
    folder = tmp_path / "catalog"
    folder.mkdir()
    path = folder / filename
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    before = tree_state(folder)
    signal.alarm(60)
    try:
        with pytest.raises(InputError) as exc:
            load_catalog(extra_dirs=(folder,))
    finally:
        signal.alarm(0)
    message = str(exc.value)
    assert "\n" not in message and filename in message, message
    assert tree_state(folder) == before


def test_good_user_catalog_loads(tmp_path):
    folder = tmp_path / "catalog"
    folder.mkdir()
    (folder / "USR001.yaml").write_text(GOOD_ENTRY)
    assert load_catalog(extra_dirs=(folder,)).get("USR001").name == "user-rule"


def test_user_catalog_dir_missing_or_a_symlink_loop(tmp_path):
    with pytest.raises(InputError, match="catalog directory not found"):
        load_catalog(extra_dirs=(tmp_path / "absent",))
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(InputError, match="loop"):
        load_catalog(extra_dirs=(tmp_path / "loop",))


def test_entry_that_is_a_symlink_loop(tmp_path):
    folder = tmp_path / "catalog"
    folder.mkdir()
    (folder / "USR001.yaml").symlink_to("USR001.yaml")
    with pytest.raises(InputError, match="USR001.yaml"):
        load_catalog(extra_dirs=(folder,))


def test_cached_model_with_links_into_blobs_loads(tmp_path, monkeypatch, capsys):
    """Hugging Face cache snapshots are symlinks into ../../blobs/: legitimate, inside the repo."""
    target, repo, env = healthy_cached_model(tmp_path)
    before = tree_state(repo)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    rc, out, err = cli(monkeypatch, capsys, "check", "--format", "json", target)
    result = json.loads(out)["results"][0]
    assert rc == 0, err
    assert result.get("error") is None and result["info"]["hf_id"] == target
    assert result["info"]["checkpoint"]["tensors"] > 0
    assert tree_state(repo) == before


def test_snapshot_path_of_the_cache_loads(tmp_path, monkeypatch, capsys):
    """The snapshot folder given as a path (what `huggingface-cli download` prints) loads too."""
    _, repo, _ = healthy_cached_model(tmp_path)
    snapshot = next((repo / "snapshots").iterdir())
    rc, out, err = cli(monkeypatch, capsys, "check", "--format", "json", str(snapshot))
    assert rc == 0, err
    assert json.loads(out)["results"][0]["info"]["checkpoint"]["tensors"] > 0


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() == 0,
                    reason="root reads files whatever their mode")
def test_unreadable_config(tmp_path, monkeypatch, capsys):
    m = base_model(tmp_path)
    (m / "config.json").chmod(0)
    rc, _, err = cli(monkeypatch, capsys, "check", str(m))
    assert rc == 2 and "config.json" in err and "Traceback" not in err


def test_unknown_config_keys_change_nothing(tmp_path, monkeypatch, capsys):
    plain = base_model(tmp_path / "a")
    noisy = base_model(tmp_path / "b")
    cfg = json.loads((noisy / "config.json").read_text())
    cfg.update({"my_extension": {"deep": [1, 2, {"x": None}]}, "zz_unknown": "value", "another_flag": True})
    (noisy / "config.json").write_text(json.dumps(cfg))
    docs = [json.loads(cli(monkeypatch, capsys, "check", "--format", "json", str(d))[1]) for d in (plain, noisy)]
    assert codes(docs[0]) == codes(docs[1])
    assert docs[0]["results"][0]["layers"] == docs[1]["results"][0]["layers"]


def test_many_targets_in_one_run(tmp_path):
    """The real CLI, once, over every model-directory case with healthy models among them: exit 2,
    each bad model its own one-line error, the healthy ones fully checked."""
    good_a, good_b = base_model(tmp_path / "good-a"), base_model(tmp_path / "good-b")
    bad = []
    for case in CASES:
        if case.kind in ("deploy", "cache", "cli", "bait"):
            continue  # those need their own flags or environment
        (tmp_path / case.id).mkdir()
        built = case.build(tmp_path / case.id)
        if built.names is not None and not built.args and not built.env:
            bad.append(built)
    targets = [str(good_a)] + [b.target for b in bad] + [str(good_b)]
    proc = run("check", "--format", "json", *targets)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    results = {r["target"]: r for r in doc["results"]}
    for good in (good_a, good_b):
        assert results[str(good)].get("error") is None and results[str(good)]["layers"]
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("kvdoctor: error: ")]
    assert len(error_lines) == len(bad) == len(proc.stderr.strip().splitlines())
    for built in bad:
        error = results[built.target].get("error")
        assert error and "\n" not in error and built.names in error, (built.target, error)
