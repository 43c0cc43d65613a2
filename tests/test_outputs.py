"""Output formats of `kvdoctor check`: exit codes for every format, the text of each, several at once."""
from __future__ import annotations

import json

import pytest

from helpers import make_model, run

FORMATS = ["rich", "concise", "json", "json-lines", "sarif", "junit", "github", "gitlab"]


def truncate_layer_types(cfg):
    cfg["layer_types"] = cfg["layer_types"][:-1]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs")
    return {
        "root": root,
        "clean": make_model(root, "gpt-oss-20b", dirname="models/clean"),
        "broken": make_model(root, "gpt-oss-20b", dirname="models/broken", edit=truncate_layer_types),
        "warn": make_model(root, "llama-3.1-8b", dirname="models/warn",
                           edit=lambda c: c.update(sliding_window=4096)),
    }


def check(models, *args):
    return run("check", "--static", *args, cwd=models["root"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_exit_codes_for_every_format(models, fmt):
    clean = check(models, "models/clean", "--format", fmt)
    assert clean.returncode == 0, clean.stderr
    broken = check(models, "models/broken", "--format", fmt)
    assert broken.returncode == 1, broken.stderr
    assert "CFG001" in broken.stdout
    missing = check(models, "models/clean", "models/nothing-here", "--format", fmt)
    assert missing.returncode == 2
    assert "models/nothing-here" in missing.stderr and "Traceback" not in missing.stderr


def test_exit_zero_never_hides_exit_2(models):
    assert check(models, "models/broken", "--format", "sarif", "--exit-zero").returncode == 0
    assert check(models, "models/nothing-here", "--format", "junit", "--exit-zero").returncode == 2


def test_fail_on_warning_turns_a_warning_into_exit_1(models):
    assert check(models, "models/warn", "--format", "concise").returncode == 0
    proc = check(models, "models/warn", "--format", "concise", "--fail-on", "warning")
    assert proc.returncode == 1
    assert "CFG004 [warning]" in proc.stdout


def test_output_format_alias_and_unknown_format(models):
    proc = check(models, "models/broken", "--output-format", "concise")
    assert proc.returncode == 1 and "CFG001" in proc.stdout
    bad = check(models, "models/broken", "--format", "xml")
    assert bad.returncode == 2 and "--format 'xml'" in bad.stderr


def test_concise_points_at_the_config_line(models):
    proc = check(models, "models/broken", "models/warn", "--format", "concise")
    cfg = (models["broken"] / "config.json").read_text().splitlines()
    line = next(i for i, text in enumerate(cfg, 1) if '"layer_types"' in text)
    lines = proc.stdout.splitlines()
    assert lines[0] == (f"models/broken/config.json:{line}: CFG001 [error] layer_types lists 23 layers but "
                        "num_hidden_layers is 24")
    assert lines[1].startswith("models/warn/config.json:") and "CFG004 [warning]" in lines[1]
    assert lines[-1] == ("2 model(s): 1 with errors, 1 with warnings, 0 clean; "
                        "findings: 1 error(s), 1 warning(s), 0 info")


def test_json_lines_one_object_per_finding(models):
    proc = check(models, "models/broken", "models/warn", "models/nothing-here", "--format", "json-lines")
    objs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [o.get("code") for o in objs] == ["CFG001", "CFG004", None]
    assert objs[0]["path"] == "models/broken/config.json" and objs[0]["engine"] == "hf"
    assert objs[0]["target"] == "models/broken" and len(objs[0]["fingerprint"]) == 24
    assert objs[2]["target"] == "models/nothing-here" and "no such directory" in objs[2]["error"]


def test_json_carries_fingerprints(models):
    proc = check(models, "models/broken", "--format", "json")
    doc = json.loads(proc.stdout)
    finding = doc["results"][0]["findings"][0]
    assert finding["code"] == "CFG001" and len(finding["fingerprint"]) == 24
    assert "suppressed" not in doc["summary"]  # no baseline given


def test_github_annotations_and_summary(models):
    proc = check(models, "models/broken", "models/warn", "models/nothing-here", "--format", "github")
    lines = proc.stdout.splitlines()
    cfg = (models["broken"] / "config.json").read_text().splitlines()
    line = next(i for i, text in enumerate(cfg, 1) if '"layer_types"' in text)
    assert lines[0].startswith(f"::error file=models/broken/config.json,line={line},"
                               "title=CFG001 layer-types-length-mismatch::layer_types lists 23 layers")
    assert "%0Afix: " in lines[0]  # the fixes ride along on escaped newlines
    assert lines[1].startswith("::warning file=models/warn/config.json,line=") and "title=CFG004 " in lines[1]
    assert lines[2].startswith("::error file=models/nothing-here/config.json,title=kvdoctor%3A cannot check::")
    assert lines[-1] == ("kvdoctor: 3 model(s): 1 with errors, 1 with warnings, 0 clean, 1 could not be checked; "
                         "findings: 1 error(s), 1 warning(s), 0 info")


def test_github_escapes_workflow_command_characters():
    from kvdoctor.report.github import annotation

    text = annotation("error", "50% of\r\nlayers", "A:B,C", "dir,x/config.json", 3)
    assert text == "::error file=dir%2Cx/config.json,line=3,title=A%3AB%2CC::50%25 of%0D%0Alayers"


def test_gitlab_code_quality(models):
    proc = check(models, "models/broken", "models/warn", "--format", "gitlab")
    issues = json.loads(proc.stdout)
    assert [i["check_name"] for i in issues] == ["CFG001", "CFG004"]
    assert [i["severity"] for i in issues] == ["major", "minor"]
    assert issues[0]["location"]["path"] == "models/broken/config.json"
    assert issues[0]["location"]["lines"]["begin"] > 1
    assert len({i["fingerprint"] for i in issues}) == 2
    for issue in issues:
        assert set(issue) == {"description", "check_name", "fingerprint", "severity", "location"}


def test_gitlab_fingerprints_stay_unique_for_repeated_findings(tmp_path):
    def bad_k(layout):
        for i in (2, 4):
            name = f"model.layers.{i}.self_attn.k_proj.weight"
            dtype, shape = layout[name]
            layout[name] = (dtype, [shape[0] * 2, shape[1]])

    make_model(tmp_path, "gpt-oss-20b", dirname="m", tensors=bad_k)
    proc = run("check", "--static", "m", "--format", "gitlab", cwd=tmp_path)
    issues = json.loads(proc.stdout)
    assert [i["check_name"] for i in issues] == ["CKPT001", "CKPT001"]
    first, second = (i["fingerprint"] for i in issues)
    assert second == first + ":2"


def test_statistics_counts_per_code(models, tmp_path):
    proc = check(models, "models/broken", "models/warn", "models/clean", "--statistics")
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == ["1  CFG001  [error] layer-types-length-mismatch",
                                        "1  CFG004  [warning] window-without-sliding-layers"]
    as_json = check(models, "models/broken", "models/warn", "--statistics", "--format", "json")
    assert json.loads(as_json.stdout) == [
        {"code": "CFG001", "name": "layer-types-length-mismatch", "severity": "error", "count": 1},
        {"code": "CFG004", "name": "window-without-sliding-layers", "severity": "warning", "count": 1}]
    assert check(models, "models/clean", "--statistics").stdout.strip() == "no findings"


def test_several_outputs_in_one_run(models, tmp_path):
    sarif, junit, js, gl = (tmp_path / n for n in ("k.sarif", "k.xml", "k.json", "k.gitlab.json"))
    out = tmp_path / "concise.txt"
    proc = check(models, "models/broken", "--format", "concise", "-o", str(out), "--sarif-output", str(sarif),
                 "--junit-output", str(junit), "--json-output", str(js), "--gitlab-output", str(gl))
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert out.read_text().startswith("models/broken/config.json:")
    assert json.loads(sarif.read_text())["runs"][0]["results"][0]["ruleId"] == "CFG001"
    assert "<testsuites" in junit.read_text()
    assert json.loads(js.read_text())["results"][0]["findings"][0]["code"] == "CFG001"
    assert json.loads(gl.read_text())[0]["check_name"] == "CFG001"


def test_rich_report_to_stdout_and_to_a_file(models, tmp_path):
    proc = check(models, "models/broken")
    assert proc.returncode == 1
    assert "CFG001" in proc.stdout and "layer-types-length-mismatch" in proc.stdout
    out = tmp_path / "report.txt"
    proc = check(models, "models/broken", "-o", str(out))
    assert proc.stdout == "" and "CFG001" in out.read_text()
    assert "\x1b[" not in out.read_text()


def test_unwritable_output_file_is_an_input_error(models, tmp_path):
    proc = check(models, "models/broken", "--sarif-output", str(tmp_path / "no" / "such" / "dir" / "k.sarif"))
    assert proc.returncode == 2
    assert "cannot write" in proc.stderr and "Traceback" not in proc.stderr


def test_pre_commit_hooks_run_the_cli(models):
    import shlex

    import yaml

    from helpers import ROOT

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert {h["id"] for h in hooks} == {"kvdoctor", "kvdoctor-static"}
    for hook in hooks:
        assert {"id", "name", "entry", "language", "files"} <= set(hook) and hook["pass_filenames"] is False
    static = next(h for h in hooks if h["id"] == "kvdoctor-static")
    argv = shlex.split(static["entry"])
    assert argv[0] == "kvdoctor"
    assert run(*argv[1:], "models/broken", cwd=models["root"]).returncode == 1
    assert run(*argv[1:], "models/clean", cwd=models["root"]).returncode == 0
