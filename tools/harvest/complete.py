"""Join harvested facts with a person's prose into catalog entries (`rules/CODE.yaml`).

    python tools/harvest/complete.py --drafts drafts/*.jsonl --notes notes.yaml [--rules rules]

Each item of NOTES names a draft by `id` and gives the prose: code, name, severity, summary,
meaning, triggers, fixes, and optionally prevented_by, references, tags, context (regexes that must
appear near a generic error), extra_patterns (a wording seen in a public log but not in the source
read) and pattern (a hand-tightened regex). Everything quoted from the engine (class, message,
pattern, source, sites, version range, the pinned link) comes from the draft, never from the notes.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml

PROSE = ("code", "name", "severity", "summary", "meaning", "triggers", "fixes")


def _block(text: str) -> str:
    return text.strip() + "\n"


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def entry_from(draft: dict, note: dict) -> dict:
    missing = [k for k in PROSE if k not in note]
    if missing:
        raise SystemExit(f"note for {draft['id']} lacks {', '.join(missing)}")
    error = {"class": draft["class"], "message": draft["message"] or draft["code"],
             "pattern": note.get("pattern", draft["pattern"])}
    patterns = [p for p in draft["patterns"] + note.get("extra_patterns", []) if p != error["pattern"]]
    if patterns:
        error["patterns"] = patterns
    error["source"] = draft["source"]
    sites = [s for s in draft["sites"] if s != draft["source"]]
    if sites:
        error["sites"] = sites
    if note.get("context"):
        error["context"] = note["context"]
    for regex in [error["pattern"], *patterns, *error.get("context", [])]:
        re.compile(regex)
    engines = [draft["versions"]] + note.get("engines", [])
    entry = {
        "code": note["code"], "name": note["name"], "severity": note["severity"], "summary": note["summary"],
        "engines": engines, "error": error, "meaning": _block(note["meaning"]), "triggers": note["triggers"],
        "fixes": [{k: (_block(v) if k in ("before", "after") else v) for k, v in fix.items()} for fix in note["fixes"]],
    }
    if note.get("prevention"):
        entry["prevention"] = note["prevention"]
    entry["references"] = [draft["url"], *note.get("references", [])]
    entry["tags"] = note.get("tags", [])
    entry["check"] = "none yet"
    if note.get("prevented_by"):
        entry["prevented_by"] = note["prevented_by"]
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafts", nargs="+", type=Path, required=True)
    parser.add_argument("--notes", nargs="+", type=Path, required=True)
    parser.add_argument("--rules", type=Path, default=Path("rules"))
    args = parser.parse_args(argv)
    drafts = {}
    for path in args.drafts:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            drafts[record["id"]] = record
    written = 0
    for notes in args.notes:
        for note in yaml.safe_load(notes.read_text()) or []:
            draft = drafts.get(note["id"])
            if draft is None:
                raise SystemExit(f"{notes}: no draft with id {note['id']}")
            entry = entry_from(draft, note)
            out = args.rules / f"{entry['code']}.yaml"
            out.write_text(yaml.dump(entry, Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=True))
            written += 1
    print(f"wrote {written} entries into {args.rules}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
