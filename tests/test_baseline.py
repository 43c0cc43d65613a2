"""Baselines: today's findings are suppressed tomorrow, a new one gets through, fixing one finding or
moving lines resurfaces nothing, and the fingerprint never holds a line number."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import make_model, run
from kvdoctor.report.baseline import (apply_baseline, fingerprint_parts, load_baseline, model_identity, record,
                               write_baseline)
from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.check import Options, check_target
from kvdoctor.errors import InputError


def widen_k(*layers):
    """A tensors() edit: k_proj of these layers gets twice the rows (CKPT001 on each)."""
    def edit(layout):
        for i in layers:
            name = f"model.layers.{i}.self_attn.k_proj.weight"
            dtype, shape = layout[name]
            layout[name] = (dtype, [shape[0] * 2, shape[1]])
    return edit


def with_auto_map(cfg):
    cfg["auto_map"] = {"AutoModel": "modeling_x.XModel"}  # CFG010 (info)


def build(root: Path, *bad_layers: int, extra_keys: bool = False) -> Path:
    """gpt-oss-20b (even layers sliding, odd full) with CFG010 and CKPT001 on the given layers."""
    model = make_model(root, "gpt-oss-20b", dirname="models/m", edit=with_auto_map, tensors=widen_k(*bad_layers))
    if extra_keys:  # two keys in front: every line of config.json moves down by two
        cfg = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({"_a": 1, "_b": 2, **cfg}, indent=2))
    return model


def check(model: Path):
    opts = Options(catalog=builtin_catalog(), static=True)
    result = check_target(str(model), opts)
    assert result.error is None, result.error
    return result


def summary(result):
    return [(f.code, f.layer) for f in result.findings]


def test_fingerprint_parts_name_code_model_engine_group_key(tmp_path):
    model = build(tmp_path, 2, 3)
    result = check(model)
    parts = [fingerprint_parts(result, f, tmp_path) for f in result.findings]
    by_layer = {f.layer: p for f, p in zip(result.findings, parts)}
    assert by_layer[2] == {"code": "CKPT001", "model": "models/m", "engine": "hf", "group": "sliding_attention",
                           "key": by_layer[2]["key"]}
    assert by_layer[3]["group"] == "full_attention"
    assert by_layer[None]["group"] == "model" and by_layer[None]["key"] == "auto_map"
    for p in parts:
        assert not any(str(result.findings[0].line) == v for v in p.values())


def test_model_identity_is_relative_to_the_project_or_the_hf_id(tmp_path):
    (tmp_path / "models" / "m").mkdir(parents=True)
    assert model_identity(str(tmp_path / "models" / "m"), tmp_path) == "models/m"
    assert model_identity("org/some-model", tmp_path) == "org/some-model"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert model_identity(str(outside), tmp_path / "models") == outside.as_posix()


def test_baseline_suppresses_exactly_todays_findings_and_lets_a_new_one_through(tmp_path):
    model = build(tmp_path, 2, 3)
    today = check(model)
    assert summary(today) == [("CKPT001", 2), ("CKPT001", 3), ("CFG010", None)]
    path = tmp_path / "baseline.json"
    assert write_baseline(str(path), [today], tmp_path, []) == 3
    baseline = load_baseline(str(path))

    again = check(model)
    assert apply_baseline([again], baseline, tmp_path) == 3
    assert again.findings == []

    build(tmp_path, 2, 3, 5)  # tomorrow: a new bad layer, full attention like layer 3
    tomorrow = check(model)
    assert apply_baseline([tomorrow], baseline, tmp_path) == 3
    assert summary(tomorrow) == [("CKPT001", 5)]


def test_a_new_finding_in_a_known_group_is_the_one_reported(tmp_path):
    """Layers 2 and 4 are both sliding: same fingerprint. The baseline knew layer 2, so 4 is new."""
    model = build(tmp_path, 2)
    path = tmp_path / "b.json"
    write_baseline(str(path), [check(model)], tmp_path, [])
    build(tmp_path, 4, 2)
    result = check(model)
    assert apply_baseline([result], load_baseline(str(path)), tmp_path) == 2
    assert summary(result) == [("CKPT001", 4)]


def test_fixing_one_finding_or_moving_lines_resurfaces_nothing(tmp_path):
    model = build(tmp_path, 2, 3)
    path = tmp_path / "b.json"
    today = check(model)
    write_baseline(str(path), [today], tmp_path, [])
    baseline = load_baseline(str(path))

    build(tmp_path, 3)  # layer 2 fixed
    fixed_one = check(model)
    assert apply_baseline([fixed_one], baseline, tmp_path) == 2 and fixed_one.findings == []

    build(tmp_path, 2, 3, extra_keys=True)  # config.json edited: every key on another line
    moved = check(model)
    assert [f.line + 2 for f in today.findings] == [f.line for f in moved.findings]
    assert apply_baseline([moved], baseline, tmp_path) == 3 and moved.findings == []


def test_manual_entries_suppress_every_count_and_survive_a_rewrite(tmp_path):
    model = build(tmp_path, 2)
    path = tmp_path / "b.json"
    today = check(model)
    write_baseline(str(path), [today], tmp_path, [])
    doc = json.loads(path.read_text())
    ckpt = next(e for e in doc["findings"] if e["code"] == "CKPT001")
    doc["manual"] = [{"fingerprint": ckpt["fingerprint"], "reason": "wider k_proj is intended"}]
    path.write_text(json.dumps(doc))

    build(tmp_path, 2, 4, 6)
    result = check(model)
    assert apply_baseline([result], load_baseline(str(path)), tmp_path) == 4
    assert result.findings == []

    write_baseline(str(path), [check(model)], tmp_path, load_baseline(str(path)).manual)
    rewritten = json.loads(path.read_text())
    assert rewritten["manual"] == doc["manual"]
    assert next(e for e in rewritten["findings"] if e["code"] == "CKPT001")["count"] == 3


def test_recorded_entries_are_counted_and_ordered(tmp_path):
    model = build(tmp_path, 2, 4)
    (entry_ckpt, entry_cfg) = sorted(record([check(model)], tmp_path), key=lambda e: e.code, reverse=True)
    assert entry_ckpt.code == "CKPT001" and entry_ckpt.count == 2 and entry_ckpt.layers == [2, 4]
    assert entry_cfg.code == "CFG010" and entry_cfg.count == 1 and entry_cfg.layers == []


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('{"findings": []}', "not a kvdoctor baseline"),
    ('{"kvdoctor-baseline": 9}', "format 9 is not supported"),
    ('{"kvdoctor-baseline": 1, "findings": [{"fingerprint": 3}]}', "baseline field 'findings.0.fingerprint'"),
])
def test_bad_baseline_files_are_input_errors(tmp_path, content, message):
    path = tmp_path / "b.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        load_baseline(str(path))


def test_cli_write_then_apply_from_another_directory(tmp_path):
    """End to end: write today, check tomorrow from a subfolder (kvdoctor.toml marks the project root)."""
    (tmp_path / "kvdoctor.toml").write_text("fail-on = \"error\"\n")
    model = build(tmp_path, 2)
    proc = run("check", "--static", "models/m", "--write-baseline", "kvdoctor-baseline.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # recording a baseline accepts today's findings
    assert "recorded 2 finding(s) in baseline kvdoctor-baseline.json" in proc.stderr

    sub = tmp_path / "ci"
    sub.mkdir()
    proc = run("check", "--static", "../models/m", "--baseline", "../kvdoctor-baseline.json", "--format", "json",
               cwd=sub)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert doc["results"][0]["findings"] == [] and doc["summary"]["suppressed"] == 2

    build(tmp_path, 2, 3)
    for fmt, expected in (("concise", "2 finding(s) suppressed by baseline ../kvdoctor-baseline.json"),
                          ("rich", "2 finding(s) suppressed by baseline ../kvdoctor-baseline.json"),
                          ("github", "2 finding(s) suppressed by baseline")):
        proc = run("check", "--static", str(model), "--baseline", "../kvdoctor-baseline.json", "--format", fmt,
                   cwd=sub)
        assert proc.returncode == 1, proc.stderr
        assert expected in proc.stdout
        assert "CKPT001" in proc.stdout and "layer 3" in proc.stdout and "layer 2" not in proc.stdout


def test_cli_missing_baseline_and_first_run_with_one_file(tmp_path):
    build(tmp_path, 2)
    proc = run("check", "--static", "models/m", "--baseline", "none.json", cwd=tmp_path)
    assert proc.returncode == 2 and "none.json" in proc.stderr and "Traceback" not in proc.stderr
    proc = run("check", "--static", "models/m", "--baseline", "b.json", "--write-baseline", "b.json", cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "b.json").exists()
    proc = run("check", "--static", "models/m", "--baseline", "b.json", "--write-baseline", "b.json", cwd=tmp_path)
    assert proc.returncode == 0 and "2 finding(s) suppressed" in proc.stdout


def test_cli_never_overwrites_a_file_that_is_not_a_baseline(tmp_path):
    model = build(tmp_path, 2)
    before = (model / "config.json").read_text()
    proc = run("check", "--static", "models/m", "--write-baseline", "models/m/config.json", cwd=tmp_path)
    assert proc.returncode == 2 and "not a kvdoctor baseline" in proc.stderr
    assert (model / "config.json").read_text() == before
