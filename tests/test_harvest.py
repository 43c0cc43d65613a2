"""tools/harvest: messages and patterns from engine-like source, grouping across releases, ranges."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "harvest"))

import harvest  # noqa: E402

OLD = '''
class Pool:
    def alloc(self, n):
        if n > self.size:
            raise ValueError(f"Pool of {self.size} tokens cannot hold {n} tokens.")
        assert self.page_size == 16
        msg = "page size " + str(self.page_size) + " is not supported"
        if self.page_size > 64:
            raise NotImplementedError(msg)
        logger.warning("sliding window %d is smaller than chunk %d", self.w, self.c)
        raise RuntimeError("unrelated to anything")
'''
NEW = OLD.replace("cannot hold {n} tokens.", "cannot hold {n} tokens. Increase --mem-fraction-static.")


def test_sites_messages_and_patterns():
    sites = harvest.sites_in(OLD, "sglang/srt/mem_cache/pool.py", "0.5.2", "?")
    by_kind = {(s.kind, s.cls): s for s in sites}
    raise_site = by_kind[("raise", "ValueError")]
    assert raise_site.template == "Pool of {self.size} tokens cannot hold {n} tokens." and raise_site.line == 5
    assert raise_site.function == "Pool.alloc"
    assert by_kind[("assert", "AssertionError")].template == "" and by_kind[("assert", "AssertionError")].code == \
        "assert self.page_size == 16"
    assert by_kind[("raise", "NotImplementedError")].template == "page size {...} is not supported"
    assert by_kind[("log", "WARNING")].template == "sliding window {...} is smaller than chunk {...}"
    assert ("raise", "RuntimeError") not in by_kind  # '?' scope: no cache concept in the message
    pattern = harvest.pattern_of(raise_site.template)
    assert re.search(pattern, "ValueError: Pool of 4096 tokens cannot hold 9000 tokens.")
    assert not re.search(pattern, "Pool of tokens")


def test_a_changed_wording_is_one_draft_with_the_old_pattern_and_a_range():
    sites = (harvest.sites_in(OLD, "sglang/srt/mem_cache/pool.py", "0.5.2", "*")
             + harvest.sites_in(NEW, "sglang/srt/mem_cache/pool.py", "0.5.6", "*"))
    drafts = harvest.group("sglang", sites)
    records = [harvest.draft_record(d, ["0.5.2", "0.5.6"]) for d in drafts]
    (pool,) = [r for r in records if r["message"].startswith("Pool of")]
    assert pool["message"].endswith("Increase --mem-fraction-static.")
    assert pool["wording_changed_in"] == ["0.5.2"] and len(pool["patterns"]) == 1
    assert re.search(pool["patterns"][0], "Pool of 1 tokens cannot hold 2 tokens.")
    assert pool["versions"] == {"name": "sglang", "versions": ">=0.5.2"}
    assert pool["url"] == "https://github.com/sgl-project/sglang/blob/v0.5.6/python/sglang/srt/mem_cache/pool.py#L5"
    gone = [r for r in records if r["class"] == "RuntimeError"]
    assert gone and gone[0]["versions"]["versions"] == ">=0.5.2"


def test_version_range_of_an_error_that_disappears():
    assert harvest.version_range({"0.10.2", "0.12.0"}, ["0.10.2", "0.12.0", "0.15.1"]) == ">=0.10.2,<0.15.1"
    assert harvest.version_range({"0.15.1"}, ["0.10.2", "0.12.0", "0.15.1"]) == ">=0.15.1"


def test_templates_from_format_and_concatenation():
    node = ast.parse('"block {} of {size}".format(i, size=s)').body[0].value
    assert harvest.template_of(node, {}) == "block {i} of {size}"
    node = ast.parse('"a " + b + " c"').body[0].value
    assert harvest.template_of(node, {}) == "a {...} c"


def test_closing_punctuation_after_the_last_value_is_not_required():
    pattern = harvest.pattern_of("Speculative decoding requires a trimmable prompt cache (got {types}).")
    assert re.search(pattern, "ValueError: Speculative decoding requires a trimmable prompt cache (got {'ArraysCache'})")
    assert harvest.pattern_of("cannot hold {n} tokens, try {m} instead.").endswith("instead\\.")
