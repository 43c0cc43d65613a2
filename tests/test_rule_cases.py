"""Rule cases as data (as sqlfluff keeps its rule fixtures): tests/rule_cases/FAMILY.yaml holds, per rule
family, a list of named cases; one parametrized test builds each case's model and deploy settings and runs
the real pipeline (`check_target`) in-process, then compares the codes it reports with the case's `expect`.

A case (a mapping; any other key fails the case):

  name:        unique, kebab-case; the test id
  model:       a key of helpers.SHORT (a fixture model under fixtures/models), or `real/<stem>` for
               fixtures/configs/real/<stem>.json (a config only: no checkpoint of its own shapes is promised)
  engine:      the engine profile checked for (default hf)
  checkpoint:  true writes the synthetic sparse checkpoint of the *unedited* config (default false)
  shards:      how many shards that checkpoint has (default 1)
  static:      default true (no probes); false runs the rules that build caches (MLX / torch)
  edit:        config.json edits, applied after the checkpoint is written, operation by operation in the
               order written:
                 set:      {dotted.path: value}  an integer part indexes a list (one past the end appends)
                 delete:   [dotted.path, ...]
                 truncate: {dotted.path: N}      keep the first N items of a list
               every path must exist (set may add the last key of a mapping, or append to a list)
  tensors:     checkpoint layout edits (needs checkpoint: true), {glob over tensor names: {dtype: F32,
               shape: [..]}}; each glob must match at least one tensor
  files:       {path: text} written (or, with null, deleted) in the case's folder after the model is built;
               the model directory is `model/`, and the deploy mapping is read as if from `deploy.yaml`
               there (so a relative `kda_recipe: recipe.yaml` names `recipe.yaml` in that folder)
  deploy:      a deploy-file mapping (kvdoctor.engines.deploy.deploy_from); absent: no deploy file
  select:      codes or prefixes the check selects (default: the family, the file's name)
  expect:      exactly the codes (sorted, unique) reported within the selection; [] for a healthy case

YAML anchors and merge keys (`<<:`) may share parts between cases; a key given twice in one mapping fails.

With engine sglang, KVDOCTOR_SGLANG_PYTHON points nowhere, as in the SGLang tests, so that a machine with an
SGLang venv gives the same results. A case that runs probes whose optional package is missing is skipped.
"""
from __future__ import annotations

import copy
import fnmatch
import json
import re
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from helpers import ROOT, SHORT, make_model
from kvdoctor.catalog import builtin_catalog
from kvdoctor.checks.selection import Selection, validate_selectors
from kvdoctor.engines import PROFILES, require_extras
from kvdoctor.engines.deploy import deploy_from
from kvdoctor.engines.nodeploy import NoDeployFile
from kvdoctor.extras import MissingExtra
from kvdoctor.pipeline.check import Options, check_target

CASES_DIR = Path(__file__).resolve().parent / "rule_cases"
REAL_CONFIGS = ROOT / "fixtures" / "configs" / "real"
FAMILIES = ("CFG", "CKPT", "SWA", "POOL", "KDA", "ENG", "VLM", "SGL", "MEM", "LIM", "MLX")
REQUIRED = {"name", "model", "expect"}
OPTIONAL = {"engine", "checkpoint", "shards", "static", "edit", "tensors", "files", "deploy", "select"}
EDIT_OPS = {"set", "delete", "truncate"}
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
MODEL_DIR, DEPLOY_NAME = "model", "deploy.yaml"


def load_cases() -> list[tuple[str, Any]]:
    """(family, case) for every case of every file, in file order; a file that is not a list of
    mappings becomes one (family, raw content) entry that the test fails."""
    out: list[tuple[str, Any]] = []
    for path in sorted(CASES_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(data, list) or not all(isinstance(case, dict) for case in data):
            out.append((path.stem, {"name": f"{path.stem}-file", "_broken": f"{path.name} is not a list of cases"}))
            continue
        out.extend((path.stem, case) for case in data)
    return out


CASES = load_cases()


def case_id(family: str, index: int, case: dict) -> str:
    name = case.get("name")
    return name if isinstance(name, str) else f"{family}-case-{index}"


# --- building the case -------------------------------------------------------------------------------

def _parts(path: str) -> list[str | int]:
    return [int(p) if re.fullmatch(r"-?\d+", p) else p for p in str(path).split(".")]


def _parent(cfg: Any, path: str, name: str) -> tuple[Any, str | int]:
    """The container holding `path`'s last part, and that part; every part before it must exist."""
    parts = _parts(path)
    node = cfg
    for i, part in enumerate(parts[:-1]):
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            raise AssertionError(f"{name}: edit path {path!r}: {'.'.join(map(str, parts[:i + 1]))!r} not in the config") from None
    last = parts[-1]
    if isinstance(node, list) and not isinstance(last, int):
        raise AssertionError(f"{name}: edit path {path!r}: {last!r} indexes a list")
    if not isinstance(node, (dict, list)):
        raise AssertionError(f"{name}: edit path {path!r}: the parent is a {type(node).__name__}")
    return node, last


def _set(cfg: dict, path: str, value: Any, name: str) -> None:
    node, last = _parent(cfg, path, name)
    if isinstance(node, list):
        assert isinstance(last, int) and 0 <= last <= len(node), f"{name}: set {path!r}: index out of range"
        if last == len(node):
            node.append(value)
        else:
            node[last] = value
    else:
        node[last] = value


def _delete(cfg: dict, path: str, name: str) -> None:
    node, last = _parent(cfg, path, name)
    if isinstance(node, list):
        assert isinstance(last, int) and 0 <= last < len(node), f"{name}: delete {path!r}: index out of range"
    else:
        assert last in node, f"{name}: delete {path!r}: not in the config"
    del node[last]


def _truncate(cfg: dict, path: str, keep: Any, name: str) -> None:
    node, last = _parent(cfg, path, name)
    try:
        items = node[last]
    except (KeyError, IndexError, TypeError):
        raise AssertionError(f"{name}: truncate {path!r}: not in the config") from None
    assert isinstance(items, list), f"{name}: truncate {path!r}: not a list"
    assert isinstance(keep, int) and 0 <= keep < len(items), f"{name}: truncate {path!r} to {keep}: keeps every item"
    node[last] = items[:keep]


def config_edit(edit: dict, name: str) -> Callable[[dict], None]:
    def apply(cfg: dict) -> None:
        for op, args in edit.items():
            if op == "set":
                for path, value in args.items():
                    _set(cfg, path, copy.deepcopy(value), name)
            elif op == "delete":
                for path in args:
                    _delete(cfg, path, name)
            else:
                for path, keep in args.items():
                    _truncate(cfg, path, keep, name)
    return apply


def tensor_edit(tensors: dict, name: str) -> Callable[[dict], None]:
    def apply(layout: dict) -> None:
        for pattern, change in tensors.items():
            hits = fnmatch.filter(layout, pattern)
            assert hits, f"{name}: tensors: {pattern!r} matches no tensor of the checkpoint"
            for tensor in hits:
                dtype, shape = layout[tensor]
                layout[tensor] = (change.get("dtype", dtype), list(change.get("shape", shape)))
    return apply


def validate(family: str, case: dict) -> None:
    """Every key known and well typed, so that a typo fails the case instead of being ignored."""
    name = case.get("name")
    assert "_broken" not in case, case.get("_broken")
    unknown = set(case) - REQUIRED - OPTIONAL
    assert not unknown, f"{name}: unknown keys {sorted(unknown)} (known: {sorted(REQUIRED | OPTIONAL)})"
    missing = REQUIRED - set(case)
    assert not missing, f"{name}: missing keys {sorted(missing)}"
    assert isinstance(name, str) and NAME_RE.match(name), f"{name!r}: a case name is kebab-case"
    model = case["model"]
    assert isinstance(model, str), f"{name}: model must be a string"
    if model.startswith("real/"):
        assert (REAL_CONFIGS / f"{model[5:]}.json").is_file(), f"{name}: no fixtures/configs/real/{model[5:]}.json"
    else:
        assert model in SHORT, f"{name}: model {model!r} is not a key of helpers.SHORT ({sorted(SHORT)}) nor real/<stem>"
    assert case.get("engine", "hf") in PROFILES, f"{name}: engine {case.get('engine')!r} is not one of {sorted(PROFILES)}"
    for key in ("checkpoint", "static"):
        assert isinstance(case.get(key, True), bool), f"{name}: {key} must be true or false"
    shards = case.get("shards", 1)
    assert isinstance(shards, int) and not isinstance(shards, bool) and shards >= 1, f"{name}: shards must be >= 1"
    if "shards" in case or "tensors" in case:
        assert case.get("checkpoint") is True, f"{name}: shards and tensors need checkpoint: true"
    edit = case.get("edit", {"set": {}})
    assert isinstance(edit, dict) and edit, f"{name}: edit must be a non-empty mapping"
    assert not set(edit) - EDIT_OPS, f"{name}: unknown edit operations {sorted(set(edit) - EDIT_OPS)}"
    for op in ("set", "truncate"):
        assert isinstance(edit.get(op, {}), dict), f"{name}: edit.{op} must be a mapping"
    assert isinstance(edit.get("delete", []), list), f"{name}: edit.delete must be a list"
    tensors = case.get("tensors", {})
    assert isinstance(tensors, dict) and all(
        isinstance(change, dict) and change and not set(change) - {"dtype", "shape"} for change in tensors.values()
    ), f"{name}: tensors maps a glob to {{dtype, shape}}"
    files = case.get("files", {})
    assert isinstance(files, dict) and all(
        isinstance(path, str) and not Path(path).is_absolute() and ".." not in Path(path).parts
        and (text is None or isinstance(text, str)) for path, text in files.items()
    ), f"{name}: files maps a relative path to text or null"
    deploy = case.get("deploy", {})
    assert isinstance(deploy, dict), f"{name}: deploy must be a mapping"
    assert deploy.get("engine", case.get("engine", "hf")) == case.get("engine", "hf"), \
        f"{name}: the deploy's engine differs from the case's engine"
    known = builtin_catalog().codes()
    select = case.get("select", [family])
    assert isinstance(select, list) and select and all(isinstance(s, str) for s in select), \
        f"{name}: select must be a list of codes or prefixes"
    assert not validate_selectors(select, known), f"{name}: select {validate_selectors(select, known)} matches no code"
    expect = case["expect"]
    assert isinstance(expect, list) and all(isinstance(c, str) for c in expect), f"{name}: expect must be a list"
    assert expect == sorted(set(expect)), f"{name}: expect must be sorted and unique"
    assert not set(expect) - set(known), f"{name}: expect names unknown codes {sorted(set(expect) - set(known))}"
    selection = Selection(select=tuple(select))
    assert all(selection.enabled(c) for c in expect), f"{name}: expect names codes outside the selection {select}"


def build(case: dict, tmp_path: Path) -> tuple[Path, Any]:
    name = case["name"]
    model = case["model"]
    source: str | dict = json.loads((REAL_CONFIGS / f"{model[5:]}.json").read_text()) if model.startswith("real/") \
        else model
    edit = case.get("edit")
    tensors = case.get("tensors")
    model_dir = make_model(tmp_path, source, edit=config_edit(edit, name) if edit else None,
                           checkpoint=case.get("checkpoint", False), shards=case.get("shards", 1),
                           tensors=tensor_edit(tensors, name) if tensors else None, dirname=MODEL_DIR)
    for rel, text in case.get("files", {}).items():
        path = tmp_path / rel
        if text is None:
            assert path.exists(), f"{name}: files: {rel} to delete does not exist"
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    # Options.deploy: a Deploy, or what check_target uses when no deploy file is given
    deploy: Any = deploy_from(copy.deepcopy(case["deploy"]), str(tmp_path / DEPLOY_NAME)) if "deploy" in case \
        else NoDeployFile()
    return model_dir, deploy


# --- the tests ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("family, case", CASES, ids=[case_id(f, i, c) for i, (f, c) in enumerate(CASES)])
def test_rule_case(family, case, tmp_path, monkeypatch):
    validate(family, case)
    engine, static = case.get("engine", "hf"), case.get("static", True)
    try:
        require_extras(engine, static, dry_run=False)
    except MissingExtra as missing:
        pytest.skip(f"{case['name']}: {missing}")
    if engine == "sglang":
        monkeypatch.setenv("KVDOCTOR_SGLANG_PYTHON", str(tmp_path / "no-sglang" / "python"))
    model_dir, deploy = build(case, tmp_path)
    opts = Options(catalog=builtin_catalog(), engine=engine, deploy=deploy, static=static,
                   selection=Selection(select=tuple(case.get("select", [family]))))
    result = check_target(str(model_dir), opts)
    assert result.error is None, f"{case['name']}: {result.error}"
    got = sorted({f.code for f in result.findings})
    detail = "\n".join(f"  {f.code} {f.severity} layer={f.layer}: {f.message[:200]}" for f in result.findings)
    assert got == case["expect"], f"{case['name']}: reported {got}, expected {case['expect']}\n{detail}"


def test_case_names_are_unique():
    names = [case.get("name") for _, case in CASES]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_every_family_has_a_file_with_a_healthy_case():
    files = {path.stem for path in CASES_DIR.glob("*.yaml")}
    assert files == set(FAMILIES), f"rule case files {sorted(files)}, families {sorted(FAMILIES)}"
    for family in FAMILIES:
        cases = [case for fam, case in CASES if fam == family]
        assert cases, f"{family}.yaml has no cases"
        assert any(case.get("expect") == [] for case in cases), f"{family}.yaml has no healthy case (expect: [])"
        assert any(case.get("expect") for case in cases), f"{family}.yaml has no firing case"


def _duplicate_keys(node: yaml.Node, where: str) -> list[str]:
    """Keys given twice in one mapping (yaml.safe_load keeps the last silently), at any depth."""
    out: list[str] = []
    if isinstance(node, yaml.MappingNode):
        keys = [key.value for key, _ in node.value if isinstance(key, yaml.ScalarNode)]
        out += [f"{where}: line {node.start_mark.line + 1}: {k!r}" for k in sorted({k for k in keys if keys.count(k) > 1})]
        children = [value for _, value in node.value]
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        children = []
    for child in children:
        out += _duplicate_keys(child, where)
    return out


def test_case_files_have_no_duplicate_keys():
    found = []
    for path in sorted(CASES_DIR.glob("*.yaml")):
        found += _duplicate_keys(yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader), path.name)
    assert not found, found


def test_every_family_is_a_catalog_prefix():
    codes = builtin_catalog().codes()
    for family in FAMILIES:
        assert any(re.fullmatch(rf"{family}\d+", code) for code in codes), family
