"""The catalog lints itself: every entry loads, codes are unique, patterns compile, checks exist."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import yaml

from kvdoctor.catalog import CODE_RE, load_catalog, load_entry
from kvdoctor.checks import RULE_MODULES, all_checks
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
    if entry.implemented:
        assert entry.check in RULE_MODULES, f"{entry.check} is not a registered rule module"
        module = importlib.import_module(entry.check)
        assert entry.code in module.RULE.codes, f"{entry.check} does not declare {entry.code} in its RULE"
        assert callable(module.run)


def test_every_declared_code_has_an_entry():
    catalog = load_catalog(RULES)
    for check in all_checks():
        for code in check.codes:
            entry = catalog.get(code)
            assert entry is not None, f"{check.module} emits {code}, which has no catalog entry"
            assert entry.check == check.module


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
