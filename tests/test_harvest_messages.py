"""tools/harvest_messages.py --bare: the functions a bare AssertionError can be named from by its frame."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "harvest_messages.py"

SOURCE = '''
def lone(pool):
    assert pool.free >= 0
    if pool.busy:
        assert pool.free >= 0


def two_statements(pool):
    assert pool.free >= 0
    assert pool.used >= 0


def with_message(pool):
    assert pool.free >= 0, "free count went negative"


def outer(pool):
    def inner():
        assert pool.used >= 0
    assert pool.free >= 0
    return inner


def unify_kv_cache_spec_page_size(specs):
    assert len(specs) > 0
'''


def harvest(root: Path) -> list[str]:
    run = subprocess.run([sys.executable, str(TOOL), str(root), "engine/**/*.py", "--bare"],
                         capture_output=True, text=True, check=True)
    return run.stdout.splitlines()


def test_only_functions_whose_bare_asserts_are_one_statement_are_listed(tmp_path):
    (tmp_path / "engine" / "core").mkdir(parents=True)
    (tmp_path / "engine" / "core" / "pool.py").write_text(SOURCE)
    assert harvest(tmp_path) == [
        "engine/core/pool.py:3  in lone  assert pool.free >= 0",
        "engine/core/pool.py:19  in inner  assert pool.used >= 0",
        "engine/core/pool.py:20  in outer  assert pool.free >= 0",
        "engine/core/pool.py:25  in unify_kv_cache_spec_page_size  assert len(specs) > 0",
    ]


def test_a_function_an_entry_already_names_by_its_frame_is_left_out(tmp_path):
    """VLM101 lists `vllm/v1/core/kv_cache_utils.py in unify_kv_cache_spec_page_size`."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "kv_cache_utils.py").write_text(SOURCE)
    listed = harvest(tmp_path)
    assert not any("unify_kv_cache_spec_page_size" in line for line in listed)
    assert "engine/kv_cache_utils.py:3  in lone  assert pool.free >= 0" in listed


STATEMENTS = '''
def alloc_paged_token_slots_extend(pool, n):
    if pool.free < n:
        error_msg = f"Prefill out of memory. Try to lower your batch size.\\nTry to allocate {n} tokens."
        raise RuntimeError(error_msg)


def alloc_token_slots(pool, n):
    if pool.free < n:
        error_msg = f"Pool of {pool.name} is busy now"
        raise RuntimeError(error_msg)


def two_causes(pool, n):
    if n < 0:
        raise ValueError(
            f"Prefill out of memory. Try to lower your batch size. {n}")
    if pool is None:
        raise ValueError(
            f"no pool for {n}")
'''


def test_statements_map_each_raise_line_to_the_codes_its_raises_are(tmp_path):
    """A raise of a message held in a variable is read through its assignment; a line whose raises are
    one entry's names it (SGL200 here), one with a raise no entry names says `?`, and a first line two
    raises share carries both."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "allocation.py").write_text(STATEMENTS)
    run = subprocess.run([sys.executable, str(TOOL), str(tmp_path), "engine/*.py", "--statements", "9.9.9"],
                         capture_output=True, text=True, check=True)
    assert run.stdout.splitlines() == [
        "SGL200  engine/allocation.py in alloc_paged_token_slots_extend: raise RuntimeError(error_msg)",
        "?  engine/allocation.py in alloc_token_slots: raise RuntimeError(error_msg)",
        "?,SGL200  engine/allocation.py in two_causes: raise ValueError(",  # two raises, one line: neither named
    ]
