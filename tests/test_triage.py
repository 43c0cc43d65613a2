"""`kvdoctor triage`: every catalog error is named from a real-looking traceback, near-identical messages
are told apart, colour codes and wrapped lines are survived, unrelated errors are not matched."""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run
from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.triage import read_lines, triage_lines

CATALOG = builtin_catalog()
WITH_ERROR = [e for e in CATALOG.entries.values() if e.error is not None]

# Values tried for the {placeholders} of an engine message, one kind at a time, until the entry's own
# pattern accepts the filled message.
FILLERS = ["12", "sliding_attention", "'flashinfer'", "(4, 8, 16, 128)", "bfloat16",
           "<class 'mlx_lm.models.gemma3_text.DecoderLayer'>"]
PLACEHOLDER = re.compile(r"\{[^{}]*\}")

NOISE = """\
[2026-05-02 10:11:09] INFO:     Started server process [4121]
[2026-05-02 10:11:09 TP0] Load weight begin. avail mem=78.52 GB
[2026-05-02 10:11:12 TP0] Using sliding window attention for 12 of 24 layers (window 128)
[2026-05-02 10:11:12 TP0] KV Cache is allocated. #tokens: 412000, K size: 9.43 GB, V size: 9.43 GB
[2026-05-02 10:11:13] INFO:     127.0.0.1:50412 - "GET /health HTTP/1.1" 200 OK
"""

UNRELATED = """\
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/site-packages/sglang/srt/model_executor/model_runner.py", line 455, in init_memory_pool
    self.token_to_kv_pool = MHATokenToKVPool(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/site-packages/mlx_lm/utils.py", line 180, in load_model
    model.load_weights(list(weights.items()), strict=strict)
KeyError: 'model.layers.0.self_attn.sinks'
ValueError: recent_window_tokens must be positive
RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!
[2026-05-02 10:12:00 TP0] WARNING: sliding window size 128 is smaller than the chunk size 8192
AssertionError: page_size must be a power of two
"""


def fill(entry) -> str:
    """The entry's message with its placeholders filled so that its own pattern matches."""
    for value in FILLERS:
        text = PLACEHOLDER.sub(lambda _, filler=value: filler, entry.error.message)
        if re.search(entry.error.pattern, text):
            return text
    raise AssertionError(f"{entry.code}: no filler makes error.pattern match error.message "
                         f"({entry.error.message!r} vs {entry.error.pattern!r})")


def source_of(entry) -> tuple[str, int]:
    m = re.search(r"([\w/.-]+\.py):(\d+)", entry.error.source)
    return (m.group(1), int(m.group(2))) if m else ("sglang/srt/server.py", 1)


def context_for(entry) -> str:
    """A log line holding a sample of each of the entry's context regexes (generic GPU errors)."""
    from kvdoctor.catalog.matcher import _longest_literal, _split_top

    samples = [_longest_literal(_split_top(regex)[0]) for regex in entry.error.context]
    assert all(re.search(r, " ".join(samples)) for r in entry.error.context), entry.code
    return "[2026-05-02 10:11:13] server context: " + " ".join(samples) + "\n" if samples else ""


def traceback_for(entry, message: str | None = None) -> str:
    """A traceback as an sglang / mlx-lm server prints it, ending in the entry's error."""
    path, line = source_of(entry)
    path = path.removeprefix("python/")
    if entry.error.message.startswith(("assert ", "raise ")):  # a bare statement: named by its frame
        return (f'  File "/usr/local/lib/python3.12/site-packages/{path}", line {line}, in check\n'
                f"    {entry.error.message}\n{entry.error.class_}\n")
    message = fill(entry) if message is None else message
    if "warning" in entry.error.class_.lower():
        return f"[2026-05-02 10:11:14 TP0] WARNING {Path(path).name}:{line}: {message}\n"
    return (
        "[2026-05-02 10:11:14 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 2711, in '
        "run_scheduler_process\n"
        "    scheduler.event_loop_normal()\n"
        '  File "/usr/local/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 1024, in '
        "event_loop_normal\n"
        "    result = self.run_batch(batch)\n"
        "             ^^^^^^^^^^^^^^^^^^^^^\n"
        f'  File "/usr/local/lib/python3.12/site-packages/{path}", line {line}, in check\n'
        f"    raise {entry.error.class_}(\n"
        f"{entry.error.class_}: {message}\n"
        "\n"
        "[2026-05-02 10:11:14] Received sigquit from a child process. It usually means the child failed.\n"
    )


def codes_in(text: str) -> list[str]:
    hits, _ = triage_lines(read_lines(io.BytesIO(text.encode())), CATALOG)
    return [h.entry.code for h in hits]


def _engines(entry) -> set[str]:
    return {r.name for r in entry.engines}


def same_pattern(entry) -> set[str]:
    """Entries whose pattern is literally the same (one engine error with several catalogued causes), and
    entries of other engines whose pattern matches this one's text: a library's error (a transformers
    configuration class refusing config.json) that each engine raises, catalogued once per engine."""
    text = fill(entry)
    return {e.code for e in WITH_ERROR if e.error.pattern == entry.error.pattern
            or (not _engines(e) & _engines(entry) and re.search(e.error.pattern, text))}


def test_the_catalog_has_engine_errors_to_triage():
    assert {"SWA010", "SWA011", "SWA012"} <= {e.code for e in WITH_ERROR}


@pytest.mark.parametrize("entry", WITH_ERROR, ids=lambda e: e.code)
def test_each_catalog_error_is_named_from_its_traceback(entry):
    context = context_for(entry)
    assert set(codes_in(context + NOISE + traceback_for(entry) + UNRELATED)) == same_pattern(entry)
    # the message itself, or the frame of the engine's file that raises it, may be the context the entry asks for
    said = all(re.search(c, fill(entry)) or re.search(c, traceback_for(entry)) for c in entry.error.context)
    if context and not said:  # a generic error without the lines that say what it is about
        assert entry.code not in codes_in(NOISE + traceback_for(entry) + UNRELATED)


def test_a_generic_python_error_is_named_only_with_the_engine_frame_its_entry_asks_for():
    """VLM291's TypeError is Python's own for any None indexed: AFMoE's model frame makes it vLLM's."""
    error = "TypeError: 'NoneType' object is not subscriptable\n"
    elsewhere = 'Traceback (most recent call last):\n  File "/app/serve.py", line 10, in <module>\n    x = f()[0]\n'
    afmoe = ('Traceback (most recent call last):\n  File "/opt/venv/lib/python3.12/site-packages/vllm/model_executor/'
             'models/afmoe.py", line 192, in __init__\n    if config.layer_types[layer_idx] == "sliding_attention":\n')
    assert "VLM291" not in codes_in(NOISE + elsewhere + error)
    assert "VLM291" in codes_in(NOISE + afmoe + error)


def test_a_log_with_every_catalog_error_names_every_one_and_nothing_else():
    log = NOISE + "".join(context_for(e) + traceback_for(e) + UNRELATED for e in WITH_ERROR)
    hits, lines = triage_lines(read_lines(io.BytesIO(log.encode())), CATALOG)
    assert {h.entry.code for h in hits} == {e.code for e in WITH_ERROR}
    assert lines == log.count("\n")
    firsts = [h.lines[0] for h in hits]
    assert firsts == sorted(firsts)  # in order of first appearance


def test_near_identical_recent_window_messages_are_told_apart():
    swa011, swa012 = CATALOG["SWA011"], CATALOG["SWA012"]
    assert codes_in(traceback_for(swa011)) == ["SWA011"]
    assert codes_in(traceback_for(swa012)) == ["SWA012"]
    assert codes_in("ValueError: recent_window_tokens must be non-negative or None\n"
                    "ValueError: recent_window_tokens must be >= 0 or None\n") == ["SWA011", "SWA012"]


def test_a_match_inside_a_longer_match_yields_to_it(tmp_path):
    """A pattern that is a prefix of another entry's message must not shadow that entry."""
    from kvdoctor.catalog import load_catalog

    for code, message in (("TST001", "pool index map missing"),
                          ("TST002", "pool index map missing for the fused RoPE kernel")):
        (tmp_path / f"{code}.yaml").write_text(json.dumps({
            "code": code, "name": f"test-{code.lower()}", "severity": "error", "summary": "s",
            "engines": [{"name": "vllm", "versions": ">=0.1"}],
            "error": {"class": "ValueError", "message": message, "pattern": re.escape(message), "source": "x.py:1"},
            "meaning": "m", "triggers": [], "fixes": [{"summary": "f"}]}))
    catalog = load_catalog(tmp_path)
    hits, _ = triage_lines(read_lines(io.BytesIO(b"ValueError: pool index map missing for the fused RoPE kernel\n"
                                                 b"ValueError: pool index map missing\n")), catalog)
    assert [(h.entry.code, h.lines) for h in hits] == [("TST002", [1]), ("TST001", [2])]


def test_colour_codes_are_ignored():
    entry = CATALOG["SWA010"]
    message = fill(entry)
    coloured = f"\x1b[1;31m{entry.error.class_}\x1b[0m: \x1b[33m{message[:9]}\x1b[0m{message[9:]}\x1b[K\n"
    assert codes_in(coloured) == ["SWA010"]
    hits, _ = triage_lines(read_lines(io.BytesIO(coloured.encode())), CATALOG)
    assert "\x1b" not in hits[0].text


def test_white_space_runs_inside_a_message_are_survived():
    message = fill(CATALOG["VLM006"]).replace(" for the cache", "  for\tthe   cache")
    assert codes_in(f"ValueError: {message}\n") == ["VLM006"]


def test_a_message_wrapped_over_two_lines_is_found_once():
    entry = CATALOG["SWA011"]
    text = f"{entry.error.class_}: recent_window_tokens must be non-neg\native or None\n"  # a hard wrap mid-word
    hits, _ = triage_lines(read_lines(io.BytesIO(text.encode())), CATALOG)
    assert [(h.entry.code, h.lines) for h in hits] == [("SWA011", [1])]
    text = "ValueError: recent_window_tokens must be >= 0\n    or None\n"  # a logger's wrap at a space
    assert codes_in(text) == ["SWA012"]


def test_carriage_returns_and_windows_line_ends():
    message = fill(CATALOG["SWA010"])
    text = f"loading  10%\rloading 100%\r\nValueError: {message}\r\n"
    hits, lines = triage_lines(read_lines(io.BytesIO(text.encode())), CATALOG)
    assert [(h.entry.code, h.lines) for h in hits] == [("SWA010", [2])] and lines == 2


def test_unrelated_errors_match_nothing():
    assert codes_in(NOISE + UNRELATED) == []


# The founding errors (shared/seeds/<file>), as a user would paste them.
SEED_TRACEBACKS = {
    "SWA001": ("000_a0cfac6e6b564b1e.txt", """\
[2026-05-02 10:20:41 TP0] Prefill batch. #new-seq: 1, #new-token: 9000, #cached-token: 0
[2026-05-02 10:20:41 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/opt/sglang/python/sglang/srt/managers/scheduler.py", line 2711, in run_scheduler_process
    scheduler.event_loop_normal()
  File "/opt/sglang/python/sglang/srt/hardware_backend/mlx/model_runner.py", line 1102, in forward_extend
    logits = self.model(input_ids, cache=caches)
             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/venv/lib/python3.12/site-packages/mlx_lm/models/gpt_oss.py", line 268, in __call__
    full_mask = create_attention_mask(h, cache[self.fa_idx])
                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/venv/lib/python3.12/site-packages/mlx_lm/models/base.py", line 58, in create_attention_mask
    return cache.make_mask(N, return_array=return_array, window_size=window_size)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/sglang/python/sglang/srt/hardware_backend/mlx/kv_cache/attention_kv_cache.py", line 203, in make_mask
    raise RuntimeError(
RuntimeError: WindowedAttentionKVCache holds only the trailing window and cannot serve a full-context attention mask
"""),
    "POOL001": ("001_e66fa97668f23b03.txt", """\
\x1b[32m[2026-05-02 10:31:02 TP0]\x1b[0m Decode batch. #running-req: 4, #token: 5120, token usage: 0.01
\x1b[32m[2026-05-02 10:31:02 TP0]\x1b[0m Scheduler hit an exception: Traceback (most recent call last):
  File "/opt/sglang/python/sglang/srt/hardware_backend/mlx/model_runner.py", line 1388, in forward_decode
    ctx = BatchedDecodeContext(
          ^^^^^^^^^^^^^^^^^^^^^
  File "<string>", line 13, in __init__
  File "/opt/sglang/python/sglang/srt/hardware_backend/mlx/kv_cache/attention_wrapper.py", line 82, in __post_init__
    raise ValueError(
\x1b[31mValueError\x1b[0m: BatchedDecodeContext requires full_kv_pool_index_by_layer when the fused AOT RoPE + pool-scatter kernel is active
"""),
    "KDA001": ("004_463e482f4b09b96e.txt", """\
[2026-05-02 11:02:17 TP3] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/layers/attention/linear/kda_backend.py", line 311, in forward_decode
    core_attn_out = self.replayssm_decode(
                    ^^^^^^^^^^^^^^^^^^^^^^
  File "/sgl-workspace/sglang/python/sglang/kernels/ops/attention/helion/kda_replayssm.py", line 742, in helion_fused_recurrent_kda_replayssm_decode
    raise ValueError("`g_cache` must have shape [slots, HV, L, K].")
ValueError: `g_cache` must have shape [slots, HV, L, K].

[2026-05-02 11:02:17] SIGQUIT received. signum=None, frame=None. It usually means one child failed.
"""),
}


@pytest.mark.parametrize("code", sorted(SEED_TRACEBACKS))
def test_seed_errors_are_named_from_hand_written_tracebacks(code):
    _, log = SEED_TRACEBACKS[code]
    if CATALOG.get(code) is None:
        pytest.skip(f"catalog entry {code} not written yet")
    assert CATALOG[code].error.message in log  # the entry quotes the seed's message verbatim
    assert codes_in(NOISE + log + UNRELATED) == [code]


def test_cli_exit_codes_json_and_stdin(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(NOISE + traceback_for(CATALOG["SWA012"]) + UNRELATED)
    proc = run("triage", str(log))
    assert proc.returncode == 1, proc.stderr
    assert "SWA012" in proc.stdout and CATALOG["SWA012"].fixes[0].summary[:40] in proc.stdout
    assert "1 known error(s)" in proc.stdout

    proc = run("triage", str(log), "--format", "json")
    doc = json.loads(proc.stdout)
    (match,) = doc["matches"]
    assert match["code"] == "SWA012" and match["name"] == CATALOG["SWA012"].name
    assert match["meaning"] == CATALOG["SWA012"].meaning.strip()
    assert match["fixes"][0]["summary"] == CATALOG["SWA012"].fixes[0].summary
    expected_line = 1 + (NOISE + traceback_for(CATALOG["SWA012"])).splitlines().index(
        "ValueError: recent_window_tokens must be >= 0 or None")
    assert expected_line in match["lines"]
    assert doc["lines_read"] == log.read_text().count("\n")

    clean = tmp_path / "clean.log"
    clean.write_text(NOISE + UNRELATED)
    proc = run("triage", str(clean), "--format", "json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["matches"] == []

    piped = subprocess.run([sys.executable, "-m", "kvdoctor", "triage", "-", "--format", "json"],
                           input=log.read_bytes(), capture_output=True, timeout=600)
    assert piped.returncode == 1 and json.loads(piped.stdout)["matches"][0]["code"] == "SWA012"


def test_cli_bad_input_is_exit_2(tmp_path):
    proc = run("triage", str(tmp_path / "missing.log"))
    assert proc.returncode == 2 and "missing.log" in proc.stderr and "Traceback" not in proc.stderr
    proc = run("triage", str(tmp_path))
    assert proc.returncode == 2 and "found a directory" in proc.stderr


@pytest.mark.parametrize("pattern, literals", [
    ("recent_window_tokens must be >= 0 or None", ["recent_window_tokens must be >= 0 or None"]),
    (r"kv-canary: SWA slot -?\d+ is outside", ["kv-canary: SWA slot "]),
    (r"foo\.bar\(x\) baz", ["foo.bar(x) baz"]),
    ("(?:alpha beta|gamma delta)", ["alpha beta", "gamma delta"]),
    ("abc?defg", ["defg"]),                # c is optional: 'abc' is not required
    ("wxyza*", ["wxyz"]),
    (r"x{2,3}yyyy", ["yyyy"]),
    ("[]x]yyyy", ["yyyy"]),
    ("(?:ab|cd)efgh", ["efgh"]),
    ("(alpha beta|gamma delta)", ["alpha beta", "gamma delta"]),  # a capturing group around it all
    ("(alpha beta)?gamma delta", ["gamma delta"]),
    ("(?i)hello world", None),             # flags: a substring test could miss a match
    (r"\x41bcdef", None),                  # a numeric escape is not its own text
    ("one|tw", None),                      # a branch too short to filter on
    (r"page\s+size\s+of", ["page size of"]),  # a white-space run is one space of the squeezed line
    (r"abcd\s?efgh", ["abcd"]),               # an optional white space breaks the literal
])
def test_required_literals_are_in_every_match(pattern, literals):
    from kvdoctor.catalog.matcher import required_literals

    assert required_literals(pattern) == literals


@pytest.mark.parametrize("entry", WITH_ERROR, ids=lambda e: e.code)
def test_the_prefilter_keeps_every_catalog_message(entry):
    from kvdoctor.catalog.matcher import required_literals

    literals = required_literals(entry.error.pattern)
    assert literals is None or any(lit in " ".join(fill(entry).split()) for lit in literals)


# ---- real-log shapes: prefixes, bare assertions, generic GPU errors, unknown logs ----------------------

def report_of(text: str):
    from kvdoctor.pipeline.triage import triage_report

    return triage_report(read_lines(io.BytesIO(text.encode())), CATALOG)


def test_worker_and_engine_prefixes_are_removed():
    message = fill(CATALOG["MEM002"])
    prefixed = (f"(APIServer pid=45) (EngineCore_DP0 pid=386) ERROR 04-29 18:34:40 [core.py:1100] ValueError: {message}\n"
                f"(Worker_TP0_EP0 pid=10816) ERROR 06-15 08:40:03 [multiproc_executor.py:962] ValueError: {message}\n"
                f"vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ValueError: {message}\n"
                f"[rank0]: ValueError: {message}\n")
    report = report_of(prefixed)
    assert [h.entry.code for h in report.hits] == ["MEM002"] and report.hits[0].lines == [1, 2, 3, 4]
    from kvdoctor.pipeline.triage import strip_prefixes
    assert strip_prefixes("(Worker_TP0 pid=123) ERROR 06-15 08:40:03 [x.py:9] AssertionError") == "AssertionError"
    assert strip_prefixes("[2026-05-02 10:11:14 TP0] Scheduler hit an exception") == "Scheduler hit an exception"


def test_an_older_wording_is_named_by_the_same_entry():
    old = "ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be " \
          "stored in KV cache (3664). Try increasing `gpu_memory_utilization`\n"
    assert codes_in(old) == ["MEM004"]


def test_a_message_cut_after_its_first_sentence_is_still_named():
    entry = CATALOG["VLM010"]
    assert len(entry.error.message.split(". ")) > 1
    cut = entry.error.message.split(". ")[0]
    assert codes_in(f"crash at init with `NotImplementedError: {cut}` because the pages differ\n") == ["VLM010"]


BARE_ASSERT = """\
(EngineCore pid=2518) ERROR 06-23 18:03:05 [core.py:1136] EngineCore failed to start.
(EngineCore pid=2518) ERROR 06-23 18:03:05 [core.py:1136] Traceback (most recent call last):
(EngineCore pid=2518) ERROR 06-23 18:03:05 [core.py:1136]   File "/usr/local/lib/python3.12/site-packages/vllm/v1/core/{file}", line {line}, in unify_kv_cache_spec_page_size
(EngineCore pid=2518) ERROR 06-23 18:03:05 [core.py:1136]     {code}
(EngineCore pid=2518) ERROR 06-23 18:03:05 [core.py:1136]            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=2518) ERROR 06-23 18:03:05 [core.py:1136] AssertionError
"""


def test_a_bare_assertion_is_named_by_its_raising_frame():
    entry = CATALOG["VLM101"]
    statement = entry.error.message
    at_release = BARE_ASSERT.format(file="kv_cache_utils.py", line=1407, code="assert something_else")
    report = report_of(at_release)  # the line of a release the entry lists
    assert [(h.entry.code, h.how) for h in report.hits] == [("VLM101", "frame")]
    moved = BARE_ASSERT.format(file="kv_cache_utils.py", line=1399, code=statement)  # a dev build: same statement
    assert [h.entry.code for h in report_of(moved).hits] == ["VLM101"]
    elsewhere = BARE_ASSERT.replace("vllm/v1/core/", "vllm/other/").format(file="kv_cache_utils.py", line=1399,
                                                                         code=statement)
    report = report_of(elsewhere)
    assert report.hits == [] and report.unknown == {"line": 6, "text": "AssertionError"}


def test_a_bare_assertion_is_named_by_a_function_it_alone_asserts_in():
    """VLM101's statement is the only bare assert of unify_kv_cache_spec_page_size (vLLM 0.25.1-0.34.0), so
    that frame names it at any line; a frame in another function, another file, or showing another
    statement does not."""
    unlisted = BARE_ASSERT.format(file="kv_cache_planning.py", line=977, code="")
    assert [(h.entry.code, h.how) for h in report_of(unlisted).hits] == [("VLM101", "frame")]
    other_function = unlisted.replace("in unify_kv_cache_spec_page_size", "in get_kv_cache_config")
    assert report_of(other_function).hits == []
    other_file = BARE_ASSERT.format(file="kv_cache_manager.py", line=977, code="")
    assert report_of(other_file).hits == []
    other_statement = BARE_ASSERT.format(file="kv_cache_planning.py", line=977, code="assert len(specs) > 0")
    assert report_of(other_statement).hits == []
    swa = ('  File "/sgl-workspace/sglang/python/sglang/srt/mem_cache/allocator/swa.py", line 611, in _release_swa\n'
           "AssertionError\n")
    assert [h.entry.code for h in report_of(swa).hits] == ["SGL144"]
    assert report_of(swa.replace("_release_swa", "free_group_end")).hits == []  # two bare asserts there


def test_a_raise_statement_in_a_cut_traceback_names_its_entry():
    text = ('  File "/opt/vllm/v1/core/kv_cache_utils.py", line 699, in check_enough_kv_cache_memory\n'
            '    raise ValueError("No available memory for the cache blocks. "\n'
            '                     "Try increasing `gpu_memory_utilization` when "\n')
    assert codes_in(text) == ["VLM006"]


CUT_AT_RAISE = """\
[2026-05-02 10:11:14 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/managers/schedule_batch.py", line 1849, in prepare_for_extend
    out_cache_loc, req_pool_indices_tensor, _ = alloc_for_extend(self)
  File "/sgl-workspace/sglang/python/sglang/srt/mem_cache/common.py", line 412, in alloc_paged_token_slots_extend
    {code}
"""


def test_a_traceback_cut_at_a_raise_names_the_entry_of_that_function_and_line():
    """SGL200's `raise RuntimeError(error_msg)` in alloc_paged_token_slots_extend (`error.statements`): the
    frame and its printed line name it without the message, also when the paste cuts the line; a line of
    another function, a shorter cut, a deeper frame after it, or another exception class do not."""
    statement = "raise RuntimeError(error_msg)"
    assert [(h.entry.code, h.how) for h in report_of(CUT_AT_RAISE.format(code=statement)).hits] == [("SGL200", "frame")]
    assert codes_in(CUT_AT_RAISE.format(code="raise RuntimeError(error_m")) == ["SGL200"]
    assert codes_in(CUT_AT_RAISE.format(code="raise RuntimeErr")) == []
    decode = CUT_AT_RAISE.replace("alloc_paged_token_slots_extend", "alloc_paged_token_slots_decode")
    assert codes_in(decode.format(code=statement)) == ["SGL139"]
    assert codes_in(CUT_AT_RAISE.replace("alloc_paged_token_slots_extend", "alloc_token_slots").format(code=statement)) == []
    deeper = CUT_AT_RAISE.format(code=statement) + '  File "/x/torch/cuda/memory.py", line 9, in f\n    x = y\n'
    assert codes_in(deeper) == []
    assert codes_in(CUT_AT_RAISE.format(code=statement) + "KeyError: 'x'\n") == []
    named_later = CUT_AT_RAISE.format(code=statement) + "RuntimeError: something the catalog does not quote\n"
    assert codes_in(named_later) == ["SGL200"]


def test_an_old_vllm_log_prefix_is_removed_so_its_traceback_frames_are_read():
    """vLLM 0.4-0.6 printed `ERROR 06-01 09:25:52 async_llm_engine.py:45] ` before each traceback line."""
    prefix = "ERROR 06-01 09:25:52 async_llm_engine.py:45] "
    lines = ['  File "/home/vllm/vllm/model_executor/layers/sampler.py", line 760, in _get_logprobs',
             "    assert len(next_token_ids) == len(query_indices)", "AssertionError"]
    assert codes_in("".join(prefix + line + "\n" for line in lines)) == ["VLM307"]


def test_a_cut_traceback_followed_by_another_names_the_first_one_raise():
    first = CUT_AT_RAISE.format(code="raise RuntimeError(error_msg)")
    second = 'Traceback (most recent call last):\n  File "/x/app.py", line 3, in main\n    run()\nKeyError: 1\n'
    assert codes_in(first + second) == ["SGL200"]


OOB = ('/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: [93,0,0], thread: [55,0,0] '
       'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.\n')


def test_a_device_side_assert_is_attributed_only_with_its_context():
    alone = report_of(NOISE + OOB)
    assert alone.hits == [] and alone.unknown is None
    (item,) = alone.unattributed
    assert item["line"] == NOISE.count("\n") + 1 and "index out of bounds" in item["text"]
    assert item["hint"]["text"] == "IndexKernel"
    launch = ("[2026-01-23 10:00:00] server_args=ServerArgs(model_path='openai/gpt-oss-120b', "
              "speculative_algorithm='EAGLE3', swa_full_tokens_ratio=0.8)\n")
    report = report_of(launch + NOISE + OOB)
    assert [(h.entry.code, h.how) for h in report.hits] == [("SPEC001", "context")]
    far = launch + NOISE * 20 + OOB  # the launch line is too far away to be this error's context
    assert report_of(far).hits == []


def test_an_unknown_log_says_which_line_it_looked_at():
    report = report_of(NOISE + UNRELATED)
    assert report.hits == [] and report.unattributed == []
    assert report.unknown["text"] == "AssertionError: page_size must be a power of two"
    assert report.unknown["line"] == (NOISE + UNRELATED).count("\n")


def test_json_states_engine_range_and_the_check_that_prevents_it(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(NOISE + traceback_for(CATALOG["MEM004"]))
    doc = json.loads(run("triage", str(log), "--format", "json").stdout)
    (match,) = doc["matches"]
    assert match["engines"] == [e.model_dump() for e in CATALOG["MEM004"].engines]
    assert match["prevented_by"] == ["MEM004"] and doc["unknown"] is None
    log.write_text(NOISE + UNRELATED)
    proc = run("triage", str(log))
    assert proc.returncode == 0 and "unknown" in proc.stdout and "page_size must be a power of two" in proc.stdout
    piped = subprocess.run([sys.executable, "-m", "kvdoctor", "triage", "-"], input=(NOISE + OOB).encode(),
                           capture_output=True, timeout=600)
    assert piped.returncode == 0 and b"unattributed" in piped.stdout and b"IndexKernel" in piped.stdout


# Real lines from public threads (vllm-project/vllm#36734, NVIDIA-NeMo/RL#2620, vllm-project/vllm#38270),
# broken the way a terminal, a quoted GitHub comment, a logger and a boxed traceback break them.
ALIGN = ("(EngineCore_DP0 pid=2931) ERROR 03-17 11:31:02 [core.py:1029]  Assertion failed, In Mamba cache "
         "align mode, block_size (2096) must be <= max_num_batched_tokens (2048). [type=assertion_error, "
         "input_value=ArgsKwargs((), {'model_co...transfer_config': None}), input_type=ArgsKwargs]")
MAMBA = ("ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (658). Each decode sequence "
         "requires one Mamba cache block, so CUDA graph capture cannot proceed. Please lower max_num_seqs "
         "to at most 658 or increase gpu_memory_utilization.")
PREFIX = "(Worker_TP1 pid=509811) ERROR 03-26 18:27:04 [multiproc_executor.py:949] "


def hard_wrap(line: str, width: int) -> str:
    return "\n".join(line[i:i + width] for i in range(0, len(line), width)) + "\n"


def test_a_message_hard_wrapped_by_a_terminal_over_several_lines_is_found_on_its_first_line():
    text = hard_wrap(ALIGN, 60)  # breaks inside words and at spaces, the message over three lines
    assert len(text.splitlines()) >= 4
    hits, _ = triage_lines(read_lines(io.BytesIO(text.encode())), CATALOG)
    assert [(h.entry.code, h.lines) for h in hits] == [("VLM144", [2])]


def test_a_message_wrapped_in_a_quoted_comment_is_found():
    text = ("> ValueError: max_num_seqs (1024) exceeds available\n"
            ">   Mamba cache\n"
            "> blocks (658). Each decode sequence requires one Mamba cache block\n")
    assert codes_in(text) == ["MEM001"]


def test_a_logger_that_repeats_its_prefix_on_each_wrapped_line_is_followed():
    words = MAMBA.split(" ")
    text = "".join(f"{PREFIX}{' '.join(words[i:i + 4])}\n" for i in range(0, 12, 4))
    assert not any("exceeds available Mamba cache blocks" in line for line in text.splitlines())
    assert codes_in(text) == ["MEM001"]


def test_a_boxed_traceback_is_read_inside_its_borders():
    text = ("│ ValueError: max_num_seqs (1024) exceeds available Mamba         │\n"
            "│ cache blocks (658). Each decode sequence requires one Mamba cache │\n")
    assert codes_in(text) == ["MEM001"]


def test_halves_of_a_message_in_two_records_or_across_a_gap_are_not_joined():
    other = "(Worker_TP0 pid=509810) ERROR 03-26 18:27:05 [multiproc_executor.py:949] "
    two_records = f"{PREFIX}ValueError: max_num_seqs (1024) exceeds\n{other}available Mamba cache blocks (658).\n"
    assert codes_in(two_records) == []
    gap = "ValueError: max_num_seqs (1024) exceeds\n\navailable Mamba cache blocks (658).\n"
    assert codes_in(gap) == []
    frame = ('ValueError: max_num_seqs (1024) exceeds\n  File "/x/vllm/config.py", line 3, in f\n'
             "available Mamba cache blocks (658).\n")
    assert codes_in(frame) == []


WRAPPABLE = [e for e in WITH_ERROR if not e.error.context and not e.error.message.startswith(("assert ", "raise "))
             and "\n" not in e.error.message]


@pytest.mark.parametrize("entry", WRAPPABLE, ids=lambda e: e.code)
def test_every_catalog_message_hard_wrapped_over_two_to_four_lines_is_found(entry):
    """The wrapped-line prefilter (only patterns whose literal is in a line or may run across a
    break are tried) loses no catalog message, however a terminal breaks it."""
    from kvdoctor.pipeline.triage import strip_prefixes

    message = fill(entry)
    for lines in (2, 3, 4):
        width = -(-len(message) // lines)
        text = hard_wrap(message, width)
        assert len(text.splitlines()) <= lines
        if any(strip_prefixes(line) != line for line in text.splitlines()):
            continue  # a piece that begins like a log prefix ("> " of a quoted reply) is read as one
        assert entry.code in codes_in(text), (lines, text)


def test_a_message_wrapped_over_more_lines_than_the_window_is_not_rejoined():
    text = hard_wrap("ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (658).", 12)
    assert len(text.splitlines()) > 4 and codes_in(text) == []
    assert codes_in(hard_wrap("ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (658).", 20)) \
        == ["MEM001"]
