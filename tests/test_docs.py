"""The documentation is true to the checkout: code fences close, relative links resolve, nothing points
outside the repository, `make help` lists every target, and the README links the contributing guide and
the profile reference."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), ROOT / "goldens" / "README.md"])
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_code_fences_close_and_links_resolve(doc):
    lines = doc.read_text().splitlines()
    fences = [i for i, line in enumerate(lines, 1) if line.lstrip().startswith("```")]
    assert len(fences) % 2 == 0, f"{doc.name}: unclosed code fence (fences at lines {fences})"
    inline = [i for i, line in enumerate(lines, 1) if "```" in line and not line.lstrip().startswith("```")]
    assert not inline, f"{doc.name}: a fence in the middle of a line at {inline}"
    broken = [target for target in LINK.findall(doc.read_text())
              if "://" not in target and not target.startswith("mailto:") and not (doc.parent / target).exists()]
    assert not broken, f"{doc.name}: links to missing files {broken}"


def test_nothing_points_at_configs_outside_the_repository():
    places = [*DOCS, *(ROOT / "bench").glob("*.py"), *(ROOT / "goldens").glob("*.py"),
              *(ROOT / "goldens").glob("*.sh"), *(ROOT / "tools").glob("*.py")]
    outside = [str(p.relative_to(ROOT)) for p in places if re.search(r"shared/configs", p.read_text())]
    assert outside == []


def test_readme_links_the_contributing_guide_and_the_profiles():
    readme = ROOT / "README.md"
    assert {"CONTRIBUTING.md", "docs/profiles.md"} <= set(LINK.findall(readme.read_text()))


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_help_lists_every_target_with_one_line():
    makefile = (ROOT / "Makefile").read_text()
    targets = re.findall(r"^([a-z][a-z-]*):", makefile, re.M)
    shown = subprocess.run(["make", "-s", "-C", str(ROOT)], capture_output=True, text=True, check=True).stdout
    listed = dict(re.findall(r"^  make (\S+) +(\S.*)$", shown, re.M))
    assert sorted(listed) == sorted(targets)
    assert len(shown.strip().splitlines()) == len(targets)
