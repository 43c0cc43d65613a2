"""Join harvested facts with a person's prose into catalog entries (`rules/CODE.yaml`).

    python tools/harvest/complete.py --drafts drafts/*.jsonl --notes notes.yaml [--rules rules]

Each item of NOTES names a draft by `id` and gives the prose: code, name, severity, summary,
meaning, triggers, fixes, and optionally prevented_by, references, tags, context (regexes that must
appear near a generic error), extra_patterns (a wording seen in a public log but not in the source
read) and pattern (a hand-tightened regex). Everything quoted from the engine (class, message,
pattern, source, sites, version range, the pinned link) comes from the draft, never from the notes.

`versions: {range, evidence}` widens the harvested range when a public thread (the evidence,
owner/repo#N) shows the error at a release the harvest did not read. `also: [ID, ...]` folds other drafts into the entry: the same error under an older wording or in a
file it moved from (their patterns, sites and version ranges are merged). `manual:` stands in for
a draft where the error is raised below the engine (a Triton, MLX or CUDA message surfacing through
an engine frame): it gives class, message, pattern, source, versions and url, all verbatim from
the source read, and is used for triage-only entries.
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


def _bounds(spec: str) -> tuple[str | None, str | None]:
    low = re.search(r">=\s*([\w.]+)", spec)
    high = re.search(r"<\s*([\w.]+)", spec)
    return (low.group(1) if low else None, high.group(1) if high else None)


def merged(draft: dict, others: list[dict]) -> dict:
    """One draft for an error found under several wordings or files."""
    from packaging.version import Version

    out = dict(draft, patterns=list(draft["patterns"]), sites=list(draft["sites"]))
    lows, highs = [], []
    for d in [draft, *others]:
        low, high = _bounds(d["versions"]["versions"])
        lows.append(low)
        highs.append(high)
        if d is not draft:
            out["patterns"] += [p for p in [d["pattern"], *d["patterns"]] if p not in out["patterns"]]
            out["sites"] += [s for s in d["sites"] if s not in out["sites"]]
    low = min((v for v in lows if v), key=Version)
    high = None if None in highs else max(highs, key=Version)
    out["versions"] = {"name": draft["engine"], "versions": f">={low}" + (f",<{high}" if high else "")}
    return out


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
    if note.get("versions"):  # a public thread shows the error at a release the harvest did not read
        engines[0] = {"name": draft["versions"]["name"], "versions": note["versions"]["range"]}
    entry = {
        "code": note["code"], "name": note["name"], "severity": note["severity"], "summary": note["summary"],
        "engines": engines, "error": error, "meaning": _block(note["meaning"]), "triggers": note["triggers"],
        "fixes": [{k: (_block(v) if k in ("before", "after") else v) for k, v in fix.items()} for fix in note["fixes"]],
    }
    if note.get("prevention"):
        entry["prevention"] = note["prevention"]
    entry["references"] = [draft["url"], *note.get("references", [])]
    if note.get("versions"):
        entry["references"].append(note["versions"]["evidence"])
    entry["tags"] = note.get("tags", [])
    if note.get("prevented_by"):
        entry["prevented_by"] = note["prevented_by"]
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafts", nargs="+", type=Path, required=True)
    parser.add_argument("--notes", nargs="+", type=Path, required=True)
    parser.add_argument("--rules", type=Path, default=Path("rules"))
    args = parser.parse_args(argv)
    drafts: dict[str, dict] = {}
    for path in args.drafts:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["id"] in drafts:  # a bare statement in two files: one error that moved
                record = merged(record, [drafts[record["id"]]])
            drafts[record["id"]] = record
    written = 0
    for notes in args.notes:
        for note in yaml.safe_load(notes.read_text()) or []:
            if "manual" in note:
                m = note["manual"]
                draft = {"id": note["code"], "class": m["class"], "message": m["message"], "code": "",
                         "pattern": m["pattern"], "patterns": m.get("patterns", []), "source": m["source"],
                         "sites": [], "versions": m["versions"], "url": m["url"]}
            else:
                draft = drafts.get(str(note["id"]))
                if draft is None:
                    raise SystemExit(f"{notes}: no draft with id {note['id']}")
                if note.get("also"):
                    draft = merged(draft, [drafts[str(i)] for i in note["also"]])
            entry = entry_from(draft, note)
            out = args.rules / f"{entry['code']}.yaml"
            out.write_text(yaml.dump(entry, Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=True))
            written += 1
    print(f"wrote {written} entries into {args.rules}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
