"""The catalog lints itself: every entry loads, codes are unique, patterns compile, checks exist."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kvdoctor.catalog import load_catalog, load_entry
from kvdoctor.catalog.codes import CODE_RE
from kvdoctor.checks import all_checks, rule_modules_by_code
from kvdoctor.errors import InputError

RULES = Path(__file__).resolve().parent.parent / "rules"
ENTRIES = sorted(RULES.glob("*.yaml"))


def test_catalog_loads_with_unique_codes():
    catalog = load_catalog(RULES)
    assert len(catalog.entries) == len(ENTRIES)
    names = [e.name for e in catalog.entries.values()]
    assert len(names) == len(set(names)), "two entries share a name"


@pytest.mark.parametrize("path", ENTRIES, ids=lambda p: p.stem)
def test_entry_is_complete(path):
    entry = load_entry(path)
    assert CODE_RE.match(entry.code) and path.stem == entry.code
    assert entry.meaning.strip() and entry.triggers and entry.fixes
    if entry.error is not None:
        pattern = re.compile(entry.error.pattern)
        example = re.sub(r"\{[^}]*\}", "7", entry.error.message)
        assert pattern.search(example), "the triage pattern must match the engine's own message"
        assert "@" in entry.error.source and ":" in entry.error.source


def test_every_declared_code_has_an_entry():
    catalog = load_catalog(RULES)
    for check in all_checks():
        for code in check.codes:
            entry = catalog.get(code)
            assert entry is not None, f"{check.module} emits {code}, which has no catalog entry"


def test_seed_entries_are_verbatim():
    catalog = load_catalog(RULES)
    seeds = Path(__file__).resolve().parent.parent.parent / "shared" / "seeds"
    if not seeds.is_dir():
        pytest.skip("shared/seeds not beside the checkout")
    text = " ".join(p.read_text() for p in seeds.iterdir())
    for code in ("SWA001", "POOL001", "KDA001"):
        entry = catalog.get(code)
        if entry is None:
            pytest.skip(f"{code} not written yet")
        assert entry.error.message in text.replace('\\"', '"')


@pytest.mark.parametrize("broken, field", [
    ({"severity": "fatal"}, "severity"),
    ({"name": "Not Kebab"}, "name"),
    ({"fixes": []}, "fixes"),
    ({"surprise": 1}, "surprise"),
    ({"error": {"class": "ValueError", "message": "m", "pattern": "(unclosed", "source": "a.py:1 @ 1"}}, "pattern"),
    ({"error": {"class": "AssertionError", "message": "assert x", "pattern": "x", "source": "a.py:1 @ 1",
                "functions": ["a.py:f"]}}, "functions"),
])
def test_schema_refuses_a_broken_entry(tmp_path, broken, field):
    good = yaml.safe_load((RULES / "CFG001.yaml").read_text())
    good.update(broken)
    path = tmp_path / "CFG001.yaml"
    path.write_text(yaml.safe_dump(good))
    with pytest.raises(InputError, match=field):
        load_entry(path)


def test_duplicate_codes_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "CFG001.yaml").write_text((RULES / "CFG001.yaml").read_text())
    with pytest.raises(InputError, match="duplicate"):
        load_catalog(RULES, extra_dirs=(tmp_path / "a",))


def test_entries_pinned_to_one_release_name_the_profiles_pin():
    """An entry that holds for exactly one engine release names the release the profile pins (its first pin:
    sglang-mlx is versioned by sglang), so a bumped pin shows every entry still written for the old one."""
    from kvdoctor.engines import PROFILES, profile_class

    catalog = load_catalog(RULES)
    for entry in catalog.entries.values():
        for engine in entry.engines:
            if engine.name not in PROFILES or not engine.versions.startswith("=="):
                continue
            pins = list(profile_class(engine.name).pins.values())
            assert pins and engine.versions == f"=={pins[0]}", (entry.code, engine.name, engine.versions)


def test_no_two_entries_share_an_engine_message():
    """One engine error, one entry: a second cause of the same message is a trigger of the first entry."""
    catalog = load_catalog(RULES)
    seen: dict[str, str] = {}
    for code, entry in catalog.entries.items():
        if entry.error is None:
            continue
        key = " ".join(entry.error.message.split())
        assert key not in seen, f"{code} and {seen[key]} quote the same engine message"
        seen[key] = code


def test_every_reference_is_public_and_docs_exist():
    root = RULES.parent
    for entry in load_catalog(RULES).entries.values():
        for ref in entry.references:
            head = ref.split()[0]
            assert not head.startswith("shared/")
            if head.startswith("docs/"):
                assert (root / head.split("#")[0]).is_file(), f"{entry.code}: {head} is not in docs/"


def test_every_entry_states_engine_version_ranges():
    from packaging.specifiers import SpecifierSet

    for entry in load_catalog(RULES).entries.values():
        assert entry.engines, entry.code
        for engine in entry.engines:
            assert str(SpecifierSet(engine.versions)), entry.code


def test_prevented_by_names_catalog_codes():
    catalog = load_catalog(RULES)
    for entry in catalog.entries.values():
        for code in entry.prevented_by:
            assert catalog.get(code) is not None, f"{entry.code}: prevented_by {code} has no entry"
            assert code in rule_modules_by_code(), f"{entry.code}: {code} is not a check kvdoctor runs"


@pytest.mark.parametrize("reference", [
    "shared/reference/kv-budget.md §1.6",
    "https://github.com/vllm-project/vllm/blob/main/vllm/config/cache.py#L120",
    "vllm-project/vllm PR #38632",
    "see the vLLM docs",
])
def test_schema_refuses_a_private_or_unpinned_reference(tmp_path, reference):
    good = yaml.safe_load((RULES / "CFG001.yaml").read_text())
    good["references"] = [reference]
    path = tmp_path / "CFG001.yaml"
    path.write_text(yaml.safe_dump(good))
    with pytest.raises(InputError, match="references"):
        load_entry(path)


@pytest.mark.parametrize("reference", [
    "https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/config/cache.py#L120",
    "https://github.com/sgl-project/sglang/blob/0123456789abcdef0123456789abcdef01234567/python/x.py",
    "vllm-project/vllm#38632",
    "docs/kda.md",
])
def test_schema_accepts_public_references(tmp_path, reference):
    good = yaml.safe_load((RULES / "CFG001.yaml").read_text())
    good["references"] = [reference]
    path = tmp_path / "CFG001.yaml"
    path.write_text(yaml.safe_dump(good))
    assert load_entry(path).references == [reference]


@pytest.mark.parametrize("broken, field", [
    ({"engines": []}, "engines"),
    ({"engines": [{"name": "vllm", "versions": "latest"}]}, "versions"),
    ({"engines": [{"name": "vllm", "versions": ""}]}, "versions"),
    ({"prevented_by": ["not a code"]}, "prevented_by"),
])
def test_schema_refuses_bad_engine_ranges(tmp_path, broken, field):
    good = yaml.safe_load((RULES / "CFG001.yaml").read_text())
    good.update(broken)
    path = tmp_path / "CFG001.yaml"
    path.write_text(yaml.safe_dump(good))
    with pytest.raises(InputError, match=field):
        load_entry(path)


def test_the_descriptions_index_is_the_entries_own(tmp_path):
    """rules/descriptions.json (what SARIF, JUnit and HTML say of a rule, read without YAML or pydantic)
    holds each validated entry's texts, fixes with their examples, error and references: `make briefs`
    after editing an entry. A stale index is not trusted for a code it lacks, and a user's entry is
    described from its validated self."""
    import msgspec

    from kvdoctor.catalog import DESCRIPTIONS_NAME, Catalog, Description, default_catalog_dir, describe, descriptions

    catalog = load_catalog()
    raw = (default_catalog_dir() / DESCRIPTIONS_NAME).read_bytes()
    index = msgspec.json.decode(raw, type=dict[str, Description])
    assert index == descriptions(catalog) and list(index) == catalog.codes()
    entry = catalog["SWA001"]
    described = catalog.description("SWA001")
    assert described == index["SWA001"]
    assert (described.summary, described.meaning, described.family, described.tags) == \
        (entry.summary, entry.meaning, entry.family, entry.tags)
    assert [(f.summary, f.before, f.after) for f in described.fixes] == [(f.summary, f.before, f.after) for f in entry.fixes]
    with_error = next(e for e in catalog.entries.values() if e.error is not None)
    assert catalog.description(with_error.code).error.class_ == with_error.error.class_
    assert json.loads(raw)[with_error.code]["error"]["class"] == with_error.error.class_
    (tmp_path / "SWA001.yaml").write_text((default_catalog_dir() / "SWA001.yaml").read_text(encoding="utf-8"))
    (tmp_path / DESCRIPTIONS_NAME).write_text("{}")
    stale = Catalog({"SWA001": tmp_path / "SWA001.yaml"}, builtin=frozenset({"SWA001"}))
    assert stale.description("SWA001") == index["SWA001"]
    mine = tmp_path / "mine"
    mine.mkdir()
    doc = yaml.safe_load((default_catalog_dir() / "SWA001.yaml").read_text(encoding="utf-8"))
    (mine / "ZZZ001.yaml").write_text(yaml.safe_dump({**doc, "code": "ZZZ001", "summary": "my own rule"}))
    user = load_catalog(extra_dirs=(mine,))
    assert user.description("ZZZ001") == describe(user["ZZZ001"]) and user.description("ZZZ001").summary == "my own rule"
    assert describe(entry) == index["SWA001"] and catalog.description("NOPE999") is None


def test_the_briefs_index_is_the_entries_own(tmp_path):
    """rules/briefs.json (what findings carry, read without YAML) says what the entries say: `make briefs`
    after editing an entry. A stale index is not trusted for a code it lacks."""
    from kvdoctor.catalog import BRIEFS_NAME, Catalog, briefs, default_catalog_dir

    catalog = load_catalog()
    index = json.loads((default_catalog_dir() / BRIEFS_NAME).read_text(encoding="utf-8"))
    assert index == briefs(catalog)
    assert all(catalog.brief(code) == tuple(index[code]) for code in list(index)[:5])
    (tmp_path / "SWA001.yaml").write_text((default_catalog_dir() / "SWA001.yaml").read_text(encoding="utf-8"))
    (tmp_path / BRIEFS_NAME).write_text("{}")
    stale = Catalog({"SWA001": tmp_path / "SWA001.yaml"}, builtin=frozenset({"SWA001"}))
    assert stale.brief("SWA001") == tuple(index["SWA001"]) and stale.brief("SWA001")[0] == "window-overflow-full-mask"
