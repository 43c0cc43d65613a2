"""List the errors vLLM, SGLang and mlx-lm raise about KV caches, attention backends and state caches,
at several releases, as draft catalog entries.

A release is read either from a git mirror (`git show TAG:path`) or from an unpacked wheel directory.
For every `raise`, `assert ..., msg` and logged error or warning in the modules in scope, the
harvester records the exception class, the message (an f-string becomes a template with `{expr}`
placeholders and a regex), and file:line at each release. Messages that read nearly alike in different
releases are one error whose wording changed: the newest wording is the message, older ones become
extra patterns. It writes facts only; meaning, triggers and fixes are for a person to write.

    python tools/harvest/harvest.py --engine vllm --tree 0.33.0=/path/unpacked ... --out drafts/vllm.jsonl
    python tools/harvest/harvest.py --engine mlx-lm --git /work/.mirror/ml-explore+mlx-lm/repo \\
        --tags v0.30.0,v0.31.3 --out drafts/mlx.jsonl
"""
from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import hashlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

# Modules that own KV caches, attention backends and their selection, sliding-window and chunked
# attention, hybrid / linear / Mamba state, cache config and memory planning, speculative pools.
# "*" entries keep every error; "?" entries keep only errors whose message names a cache concept.
SCOPE = {
    "vllm": [
        ("vllm/v1/core/*.py", "*"), ("vllm/v1/core/sched/*.py", "?"), ("vllm/v1/kv_cache_interface.py", "*"),
        ("vllm/config/cache.py", "*"), ("vllm/config/speculative.py", "*"), ("vllm/config/compilation.py", "?"),
        ("vllm/config/model.py", "?"), ("vllm/config/vllm.py", "?"), ("vllm/config/scheduler.py", "?"),
        ("vllm/config/attention.py", "*"),
        ("vllm/attention/*.py", "*"), ("vllm/attention/**/*.py", "*"), ("vllm/v1/attention/**/*.py", "*"),
        ("vllm/v1/attention/*.py", "*"),
        ("vllm/platforms/cuda.py", "?"), ("vllm/platforms/rocm.py", "?"), ("vllm/platforms/interface.py", "?"),
        ("vllm/model_executor/layers/mamba/*.py", "*"), ("vllm/model_executor/layers/mamba/**/*.py", "?"),
        ("vllm/model_executor/models/config.py", "*"), ("vllm/model_executor/layers/attention/*.py", "*"),
        ("vllm/model_executor/layers/attention_layer_base.py", "*"),
        ("vllm/v1/spec_decode/*.py", "?"), ("vllm/v1/worker/gpu_model_runner.py", "?"),
        ("vllm/v1/worker/utils.py", "?"), ("vllm/v1/worker/gpu_worker.py", "?"),
        ("vllm/v1/worker/gpu/*.py", "?"), ("vllm/v1/engine/core.py", "?"), ("vllm/engine/arg_utils.py", "?"),
        ("vllm/worker/cache_engine.py", "*"), ("vllm/worker/worker.py", "?"),
    ],
    "sglang": [
        ("sglang/srt/mem_cache/*.py", "*"), ("sglang/srt/mem_cache/**/*.py", "?"),
        ("sglang/srt/model_executor/model_runner.py", "?"), ("sglang/srt/model_executor/*pool*.py", "*"),
        ("sglang/srt/model_executor/model_runner_kv_cache_mixin.py", "*"),
        ("sglang/srt/layers/attention/*.py", "*"), ("sglang/srt/layers/attention/**/*.py", "?"),
        ("sglang/srt/layers/radix_attention.py", "*"),
        ("sglang/srt/server_args.py", "?"), ("sglang/srt/arg_groups/*.py", "?"),
        ("sglang/srt/speculative/*.py", "?"), ("sglang/srt/configs/model_config.py", "?"),
        ("sglang/srt/configs/mamba_utils.py", "*"), ("sglang/srt/managers/scheduler.py", "?"),
        ("sglang/srt/managers/schedule_batch.py", "?"), ("sglang/srt/managers/tp_worker.py", "?"),
        ("sglang/srt/hardware_backend/mlx/**/*.py", "*"), ("sglang/srt/hardware_backend/mlx/*.py", "*"),
    ],
    "mlx-lm": [
        ("mlx_lm/models/cache.py", "*"), ("mlx_lm/models/base.py", "*"), ("mlx_lm/generate.py", "?"),
        ("mlx_lm/server.py", "?"), ("mlx_lm/utils.py", "?"), ("mlx_lm/models/*.py", "?"),
        ("mlx_lm/cache_prompt.py", "?"),
    ],
}

CONCEPTS = re.compile(
    r"kv|cache|block|page|attention|attn|backend|sliding|window|mamba|state|spec|draft|eagle|mtp|head|chunk|"
    r"prefix|swa|sink|fp8|dtype|max_model_len|max_num_seqs|memory|seq_len|token|layer|rotat|quant|hybrid|"
    r"radix|pool|slot|offset|mla|sparse|linear|prefill|decode|cuda graph|num_gpu_blocks", re.I)
LOG_METHODS = {"error", "warning", "warning_once", "exception", "critical", "warn"}


@dataclass
class Site:
    version: str
    path: str
    line: int
    function: str
    kind: str  # raise, assert, log
    cls: str
    template: str  # the message with {expr} placeholders; "" for a bare assert
    code: str  # the statement's first line, as a traceback shows it


@dataclass
class Draft:
    engine: str
    cls: str
    sites: list[Site] = field(default_factory=list)

    def newest(self) -> Site:
        return max(self.sites, key=lambda s: Version(s.version))


# ---- reading a release -------------------------------------------------------------------------------

class Tree:
    """One release's source: an unpacked wheel directory or a tag of a git mirror."""

    def __init__(self, version: str, root: Path | None = None, git: Path | None = None, tag: str | None = None):
        self.version, self.root, self.git, self.tag = version, root, git, tag

    def files(self) -> list[str]:
        if self.root is not None:
            return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*.py"))
        out = subprocess.run(["git", "-C", str(self.git), "ls-tree", "-r", "--name-only", self.tag],
                             capture_output=True, text=True, check=True).stdout
        return [p for p in out.splitlines() if p.endswith(".py")]

    def read(self, path: str) -> str:
        if self.root is not None:
            return (self.root / path).read_text(errors="replace")
        return subprocess.run(["git", "-C", str(self.git), "show", f"{self.tag}:{path}"],
                              capture_output=True, text=True, check=True).stdout


def in_scope(engine: str, path: str) -> str | None:
    """'*' or '?' for a file in scope (the first matching glob wins), None otherwise."""
    for glob, mode in SCOPE[engine]:
        if fnmatch.fnmatch(path, glob):
            return mode
    return None


# ---- messages -------------------------------------------------------------------------------------------

def template_of(node: ast.AST, assigns: dict[str, ast.AST], depth: int = 0) -> str | None:
    """The message an expression builds, with {expr} where a value goes in; None when not a string."""
    if depth > 4:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace("{", "{{").replace("}", "}}")
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value).replace("{", "{{").replace("}", "}}"))
            elif isinstance(value, ast.FormattedValue):
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template_of(node.left, assigns, depth + 1), template_of(node.right, assigns, depth + 1)
        if left is None and right is None:
            return None
        return (left if left is not None else "{...}") + (right if right is not None else "{...}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = template_of(node.left, assigns, depth + 1)
        return None if left is None else re.sub(r"%[-+ #0-9.]*[sdrfgixX]", "{...}", left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        base = template_of(node.func.value, assigns, depth + 1)
        if base is None:
            return None
        names = iter([ast.unparse(a) for a in node.args])
        return re.sub(r"\{\{(\w*)[^{}]*\}\}", lambda m: "{" + (m.group(1) or next(names, "...")) + "}", base)
    if isinstance(node, ast.Name) and node.id in assigns:
        return template_of(assigns[node.id], assigns, depth + 1)
    return None


def log_template(call: ast.Call, assigns: dict) -> str | None:
    if not call.args:
        return None
    text = template_of(call.args[0], assigns)
    return None if text is None else re.sub(r"%[-+ #0-9.]*[sdrfgixX]", "{...}", text)


def pattern_of(template: str) -> str:
    """A regex for the message: literal text escaped, each placeholder any text; a placeholder at
    either end is dropped (the log line goes on), and so is punctuation after the last one; runs of
    white space match any white space."""
    pieces = re.split(r"(?<!\{)\{(?!\{)[^{}]*\}(?!\})", template)
    pieces = [p.replace("{{", "{").replace("}}", "}") for p in pieces]
    while pieces and not pieces[0].strip():
        pieces.pop(0)
    while pieces and not pieces[-1].strip():
        pieces.pop()
    # Punctuation closing the message after its last value (").", "'.") is often cut or changed in
    # logs; the pattern ends at the value instead.
    while len(pieces) > 1 and len(pieces[-1].strip()) <= 3 and not any(c.isalnum() for c in pieces[-1]):
        pieces.pop()
    escaped = [re.sub(r"(\\\s)+|\s+", r"\\s+", re.escape(p.strip() if i in (0, len(pieces) - 1) else p))
               for i, p in enumerate(pieces)]
    return ".+?".join(escaped)


def literal_skeleton(template: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\{[^{}]*\}", "", template)).strip().lower()


# ---- walking one file ----------------------------------------------------------------------------------

def class_name(node: ast.AST) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ast.unparse(target)


def sites_in(source: str, path: str, version: str, mode: str) -> list[Site]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines()
    found: list[Site] = []

    def visit(node: ast.AST, function: str, assigns: dict) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{function}.{child.name}" if function else child.name
                visit(child, name, {} if not isinstance(child, ast.ClassDef) else assigns)
                continue
            if isinstance(child, ast.Assign) and len(child.targets) == 1 and isinstance(child.targets[0], ast.Name):
                assigns[child.targets[0].id] = child.value
            record(child, function, assigns)
            visit(child, function, assigns)

    def record(node: ast.AST, function: str, assigns: dict) -> None:
        kind = cls = text = None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            kind, cls = "raise", class_name(node.exc)
            text = template_of(node.exc.args[0], assigns) if node.exc.args else ""
        elif isinstance(node, ast.Assert):
            kind, cls = "assert", "AssertionError"
            text = template_of(node.msg, assigns) if node.msg is not None else ""
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
              and isinstance(node.value.func, ast.Attribute) and node.value.func.attr in LOG_METHODS
              and ast.unparse(node.value.func.value) in {"logger", "logging", "warnings", "log"}):
            kind, cls = "log", node.value.func.attr.replace("_once", "").upper()
            text = log_template(node.value, assigns)
        if kind is None or text is None:
            return
        code = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""
        if mode == "?" and not CONCEPTS.search(text or code):
            return
        if kind == "log" and not text.strip():
            return
        found.append(Site(version, path, node.lineno, function, kind, cls, text, code))

    visit(tree, "", {})
    return found


# ---- grouping across releases --------------------------------------------------------------------------

def group(engine: str, sites: list[Site]) -> list[Draft]:
    """One draft per error: sites with the same class and nearly the same literal text (or one text
    extending the other), or, for bare asserts, the same assertion in the same file and function."""
    drafts: list[Draft] = []
    by_key: dict[tuple, Draft] = {}
    for site in sorted(sites, key=lambda s: Version(s.version), reverse=True):
        if site.template:
            key = (site.cls, literal_skeleton(site.template))
        else:
            key = (site.cls, Path(site.path).name, site.function.split(".")[-1], site.code)
        draft = by_key.get(key)
        if draft is None and site.template:
            skeleton = key[1]
            for other_key, other in by_key.items():
                if other_key[0] == site.cls and len(other_key) == 2:
                    shorter, longer = sorted((skeleton, other_key[1]), key=len)
                    if len(shorter) >= 30 and longer.startswith(shorter):  # a sentence added or dropped
                        draft = other
                        break
                    matcher = difflib.SequenceMatcher(None, skeleton, other_key[1])
                    if matcher.real_quick_ratio() > 0.85 and matcher.quick_ratio() > 0.85 and matcher.ratio() > 0.85:
                        draft = other
                        break
        if draft is None:
            draft = Draft(engine, site.cls)
            drafts.append(draft)
        by_key[key] = draft
        draft.sites.append(site)
    return drafts


def version_range(present: set[str], scanned: list[str]) -> str:
    """'>=first' when the error is in the newest release scanned, else '>=first,<next release without it'."""
    ordered = sorted(scanned, key=Version)
    first = min(present, key=Version)
    last = max(present, key=Version)
    if last == ordered[-1]:
        return f">={first}"
    after = ordered[ordered.index(last) + 1]
    return f">={first},<{after}"


REPOS = {"vllm": ("vllm-project/vllm", ""), "sglang": ("sgl-project/sglang", "python/"),
         "mlx-lm": ("ml-explore/mlx-lm", "")}


def pinned_url(engine: str, site: Site) -> str:
    repo, prefix = REPOS[engine]
    return f"https://github.com/{repo}/blob/v{site.version}/{prefix}{site.path}#L{site.line}"


def draft_record(draft: Draft, scanned: list[str]) -> dict:
    newest = draft.newest()
    templates: list[str] = []
    for site in sorted(draft.sites, key=lambda s: Version(s.version), reverse=True):
        if site.template and site.template not in templates:
            templates.append(site.template)
    message = newest.template.replace("{{", "{").replace("}}", "}") if newest.template else ""
    pattern = pattern_of(newest.template) if newest.template else re.escape(newest.code)
    older = [pattern_of(t) for t in templates[1:]]
    per_version: dict[str, str] = {}
    for site in draft.sites:
        per_version.setdefault(site.version, f"{site.path}:{site.line}")
    ident = hashlib.sha1(f"{draft.engine}|{draft.cls}|{message or newest.code}".encode()).hexdigest()[:10]
    changed = [s.version for s in sorted(draft.sites, key=lambda s: Version(s.version))]
    return {
        "id": ident, "engine": draft.engine, "kind": newest.kind, "class": draft.cls, "message": message,
        "pattern": pattern, "patterns": [p for p in dict.fromkeys(older) if p != pattern],
        "code": newest.code, "function": newest.function,
        "source": f"{newest.path}:{newest.line} @ {newest.version}",
        "sites": [f"{path} @ {v}" for v, path in sorted(per_version.items(), key=lambda kv: Version(kv[0]))],
        "wording_changed_in": sorted({s.version for s in draft.sites if s.template and s.template != newest.template},
                                     key=Version),
        "versions": {"name": draft.engine, "versions": version_range(set(changed), scanned)},
        "url": pinned_url(draft.engine, newest),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", required=True, choices=sorted(SCOPE))
    parser.add_argument("--tree", action="append", default=[], help="VERSION=DIR of an unpacked release")
    parser.add_argument("--git", type=Path, help="a git mirror of the engine")
    parser.add_argument("--tags", default="", help="comma-separated tags of --git, e.g. v0.30.0,v0.31.3")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines of draft entries")
    args = parser.parse_args(argv)

    trees = [Tree(v, root=Path(d)) for v, d in (t.split("=", 1) for t in args.tree)]
    trees += [Tree(tag.lstrip("v"), git=args.git, tag=tag) for tag in args.tags.split(",") if tag]
    if not trees:
        parser.error("give --tree or --git with --tags")
    sites: list[Site] = []
    for tree in trees:
        for path in tree.files():
            mode = in_scope(args.engine, path)
            if mode:
                sites += sites_in(tree.read(path), path, tree.version, mode)
    scanned = [t.version for t in trees]
    records = [draft_record(d, scanned) for d in group(args.engine, sites)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")
    print(f"{args.engine}: {len(sites)} sites in {len(trees)} releases -> {len(records)} drafts in {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
