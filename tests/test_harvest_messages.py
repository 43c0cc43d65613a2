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
