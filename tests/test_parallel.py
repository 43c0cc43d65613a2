"""Many models in one run: folder expansion, -j N gives the same results in the same order as one by
one, a model that cannot be read is its own error, and a progress bar shows on a terminal."""
from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REAL, REAL_NAMES, make_model, real_config, run
from kvdoctor.fleet.runner import expand_targets


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Ten model folders under models/: eight real configs, one with a finding, one unreadable."""
    root = tmp_path_factory.mktemp("fleet")
    names = []
    for name in REAL_NAMES[:8]:
        make_model(root, real_config(name), dirname=f"models/{name}")
        names.append(f"models/{name}")
    make_model(root, "gpt-oss-20b", dirname="models/zz-broken",
               edit=lambda c: c.update(layer_types=c["layer_types"][:-1]))
    bad = root / "models" / "zz-unreadable"
    bad.mkdir(parents=True)
    (bad / "config.json").write_text("{not json")
    names += ["models/zz-broken", "models/zz-unreadable"]
    assert len(names) == 10
    return root, sorted(names)


def check_json(root: Path, *args: str) -> tuple[int, dict]:
    proc = run("check", "--format", "json", *args, cwd=root)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_ten_models_with_j2_match_one_by_one(fleet):
    root, names = fleet
    rc, together = check_json(root, "models", "-j", "2")
    assert rc == 2  # one model cannot be read; the others are still checked
    assert [r["target"] for r in together["results"]] == names
    for name, result in zip(names, together["results"]):
        _, alone = check_json(root, name, "-j", "1")
        assert result == alone["results"][0], name
    by_target = {r["target"]: r for r in together["results"]}
    assert "not valid JSON" in by_target["models/zz-unreadable"]["error"]
    assert [f["code"] for f in by_target["models/zz-broken"]["findings"]] == ["CFG001"]
    assert together["summary"]["targets"] == 10 and together["summary"]["input_errors"] == 1


def test_j1_and_j3_give_identical_documents_in_input_order(fleet):
    root, names = fleet
    order = list(reversed(names))
    _, serial = check_json(root, *order, "-j", "1")
    _, parallel = check_json(root, *order, "-j", "3")
    assert serial == parallel
    assert [r["target"] for r in parallel["results"]] == order


def test_expansion_of_folders_files_and_repeats(tmp_path, monkeypatch):
    for rel in ("zoo/b", "zoo/a", "zoo/nested/c", "zoo/.hidden/d", "zoo/a/draft"):
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    zoo = str(tmp_path / "zoo")
    expanded = expand_targets([zoo, str(tmp_path / "zoo" / "b" / "config.json"), "org/model", str(tmp_path / "empty")])
    assert expanded == [f"{zoo}/a", f"{zoo}/b", f"{zoo}/nested/c", "org/model", str(tmp_path / "empty")]
    # a model folder is a target itself, even with a model folder inside it
    assert expand_targets([f"{zoo}/a", f"{zoo}/a/"]) == [f"{zoo}/a"]
    # folders come out spelled as pathlib spells them, and sorted part by part, as Paths sort
    (tmp_path / "zoo" / "a-b").mkdir()
    (tmp_path / "zoo" / "a-b" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "zoo")
    assert expand_targets(["."]) == ["a", "a-b", "b", "nested/c"]
    assert expand_targets(["./"]) == ["a", "a-b", "b", "nested/c"]
    assert expand_targets([f"{zoo}//"]) == [f"{zoo}/a", f"{zoo}/a-b", f"{zoo}/b", f"{zoo}/nested/c"]


def test_expansion_skips_links_tool_folders_and_what_lies_too_deep(tmp_path):
    """Folders are walked as os.walk walks them (no symlinked folder followed, a symlink loop taken for
    no folder), without node_modules, site-packages or __pycache__, at most six levels down; a
    config.json that is a folder marks no model."""
    zoo = tmp_path / "zoo"
    deep = zoo / "1" / "2" / "3" / "4" / "5"
    for d in (zoo / "m", zoo / "node_modules" / "x", zoo / "site-packages" / "y", deep / "six", deep / "6" / "seven"):
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    (zoo / "folder" / "config.json").mkdir(parents=True)
    (zoo / "link").symlink_to(zoo / "m", target_is_directory=True)
    (zoo / "cycle").symlink_to(zoo / "cycle")  # a symlink loop: no folder
    (zoo / "loopy").mkdir()
    (zoo / "loopy" / "config.json").symlink_to(zoo / "loopy" / "config.json")  # a model, whose config check says why
    assert expand_targets([str(zoo)]) == [str(deep / "six"), str(zoo / "loopy"), str(zoo / "m")]


def test_a_folder_without_models_is_an_input_error(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run("check", "empty", cwd=tmp_path)
    assert proc.returncode == 2 and "no config.json" in proc.stderr and "Traceback" not in proc.stderr


def test_progress_bar_on_a_terminal_only(fleet):
    """The bar is drawn on stderr when both streams are terminals, never into stdout, and never when
    stdout is piped or with --quiet."""
    import select

    root, names = fleet
    piped = run("check", "--static", "--format", "concise", *names[:3], "-j", "2", cwd=root)
    assert "checking" not in piped.stderr

    def on_terminals(*extra: str) -> tuple[bytes, bytes]:
        (out_master, out_slave), (err_master, err_slave) = pty.openpty(), pty.openpty()
        env = {**os.environ, "COLUMNS": "100"}
        proc = subprocess.Popen([sys.executable, "-m", "kvdoctor", "check", "--static", *names[:3], "-j", "2",
                                 *extra], cwd=root, stdout=out_slave, stderr=err_slave, env=env)
        os.close(out_slave)
        os.close(err_slave)
        seen = {out_master: b"", err_master: b""}
        open_fds = set(seen)
        while open_fds:
            ready, _, _ = select.select(list(open_fds), [], [], 1.0)
            for fd in ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    chunk = b""
                if chunk:
                    seen[fd] += chunk
                else:
                    open_fds.discard(fd)
            if not ready and proc.poll() is not None:
                break
        assert proc.wait(timeout=600) == 0
        os.close(out_master)
        os.close(err_master)
        return seen[out_master], seen[err_master]

    stdout, stderr = on_terminals()
    assert b"checking" in stderr and b"/3" in stderr  # "checking ━━━ 2/3"
    assert b"checking" not in stdout
    last = re.sub(r"\x1b\[[0-9;]*m", "", stdout.decode().splitlines()[-1])
    assert last == "3 model(s): 0 with errors, 0 with warnings, 3 clean; findings: 0 error(s), 0 warning(s), 0 info"
    _, quiet = on_terminals("--quiet")
    assert b"checking" not in quiet


def test_real_fixture_folder_expands_to_every_real_config():
    assert expand_targets([str(REAL)]) == [str(REAL / name) for name in REAL_NAMES]


def test_the_json_parts_the_workers_render_join_to_the_parents_document(fleet, monkeypatch):
    """-j workers render their results' JSON entries; joined, they are the document the parent renders
    itself, byte for byte (a model with a finding, an unreadable one, a Hugging Face id not cached)."""
    from msgspec.structs import replace
    from functools import partial

    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.pipeline.check import Options, checked_codes
    from kvdoctor.fleet import runner
    from kvdoctor.cli.check import json_part
    from kvdoctor.report import Report, render_json
    from kvdoctor.fleet.runner import run_targets

    root, names = fleet
    monkeypatch.chdir(root)
    opts = Options(catalog=builtin_catalog())
    work = [(target, opts) for target in [*names, "some-org/not-cached"]]
    results, _, parts = run_targets(work, jobs=2, render=partial(json_part, root))
    assert parts is not None and len(parts) == len(work)
    report = Report(results, opts.catalog, root, checked=[checked_codes(o) for _, o in work], deploy_path="d.yaml")
    assert render_json(replace(report, json_parts=parts)) == render_json(report)
    empty = Report([], opts.catalog, root)
    assert render_json(replace(empty, json_parts=[])) == render_json(empty)
    _, _, none = run_targets(work[:4], jobs=2, render=_fails_on_the_third)
    assert none is None  # one result without its part: the parent renders them all
    monkeypatch.setattr(runner, "FORKS", False)  # the spawned pool of macOS and Windows gives the same
    monkeypatch.setattr(runner, "SPAWNED_POOL_COST_S", 0.0)  # two targets here, the third in the pool
    spawned, _, spawned_parts = run_targets(work[:3], jobs=2, render=partial(json_part, root))
    assert (spawned, spawned_parts) == (results[:3], parts[:3])


def _fails_on_the_third(result, opts):
    if result.target == f"models/{REAL_NAMES[2]}":
        raise TypeError("not serializable")
    return result.target


def test_the_rich_panels_the_workers_render_are_the_parents_report(fleet, monkeypatch):
    """Forked -j workers render their results' panels of the terminal report with the parent's console;
    written in order, they are the report the parent prints itself, colours and all, byte for byte."""
    import io

    from rich.console import Console

    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.pipeline.check import Options
    from kvdoctor.report.rich_report import panel_text, render

    def console() -> Console:
        return Console(file=io.StringIO(), width=100, force_terminal=True, color_system="truecolor")

    from kvdoctor.fleet import runner

    root, names = fleet
    monkeypatch.chdir(root)
    monkeypatch.setattr(runner, "FORKED_POOL_COST_S", 0.0)  # the first panel here, the others in the workers
    opts = Options(catalog=builtin_catalog(), engine="sglang", static=True)  # no probes: nothing that forks badly
    work = [(target, opts) for target in [*names, "some-org/not-cached"]]
    shared = console()
    results, _, parts = runner.run_targets(work, jobs=2, render=lambda result, _opts: panel_text(shared, result, True))
    assert parts is not None and len(parts) == len(work)
    alone, joined = console(), console()
    render(results, alone)
    render(results, joined, parts)
    assert "\x1b[" in alone.file.getvalue() and "CFG001" in alone.file.getvalue()
    assert joined.file.getvalue() == alone.file.getvalue()


def test_terminal_report_at_j2_is_the_one_at_j1(fleet, tmp_path):
    root, names = fleet
    env = {"FORCE_COLOR": "1", "COLUMNS": "100"}
    one, two = (run("check", "models", "-j", jobs, cwd=root, env=env) for jobs in ("1", "2"))
    assert one.returncode == two.returncode == 2 and "\x1b[" in one.stdout and "zz-unreadable" in one.stdout
    assert two.stdout == one.stdout
    for jobs in ("1", "2"):
        out = tmp_path / f"report-{jobs}.txt"
        assert run("check", "models", "-j", jobs, "-o", str(out), cwd=root).stdout == ""
    assert (tmp_path / "report-2.txt").read_text() == (tmp_path / "report-1.txt").read_text()
    assert "\x1b[" not in (tmp_path / "report-1.txt").read_text()


def test_light_targets_are_checked_here_until_helpers_would_pay(fleet, monkeypatch):
    """-j N checks static targets (and hf's, which build no caches) in this process, which forks helpers
    for the rest only once the rest would repay them, and then keeps checking its share; each part here
    is the pid of the process that checked it."""
    import time

    from kvdoctor.fleet import runner
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.pipeline.check import Options
    from kvdoctor.model import Result

    root, names = fleet
    monkeypatch.chdir(root)
    parent = os.getpid()
    static = [(target, Options(catalog=builtin_catalog(), static=True)) for target in names]
    where = lambda result, opts: os.getpid()  # noqa: E731
    monkeypatch.setattr(runner, "FORKED_POOL_COST_S", 3600.0)  # no helper could repay itself
    here, _, pids = runner.run_targets(static, jobs=2, render=where)
    assert set(pids) == {parent}
    monkeypatch.setattr(runner, "FORKED_POOL_COST_S", 0.0)  # any helper pays
    slow_here = lambda result, opts: (time.sleep(0.05) if os.getpid() == parent else None, os.getpid())[1]  # noqa: E731
    pooled, _, pids = runner.run_targets(static, jobs=3, render=slow_here)
    assert pids[0] == parent and len(set(pids) - {parent}) == 2  # two helpers and this process
    assert pooled == here and [r.target for r in here] == names
    # Before any check is timed, the estimate is the cheapest check measured: helpers that repay
    # themselves even then are forked at once, and the measured checks do not send them away.
    cheapest = runner.CHEAPEST_CHECK_S
    monkeypatch.setattr(runner, "FORKED_POOL_COST_S", 1000.0)
    monkeypatch.setattr(runner, "CHEAPEST_CHECK_S", 3600.0)
    _, _, pids = runner.run_targets(static, jobs=2, render=slow_here)
    assert pids[0] == parent and len(set(pids)) == 2
    monkeypatch.setattr(runner, "CHEAPEST_CHECK_S", cheapest)
    monkeypatch.setattr(runner, "FORKED_POOL_COST_S", 3600.0)
    hf = [(target, Options(catalog=builtin_catalog())) for target in names[:3]]  # no probes: here too
    _, _, pids = runner.run_targets(hf, jobs=2, render=where)
    assert set(pids) == {parent}
    # sglang-mlx's probes load mlx, so its checks never run here. (Nothing heavy runs in these workers:
    # this test process may hold mlx already, which a forked child cannot use.)
    monkeypatch.setattr(runner, "check_one", lambda target, opts: (Result(
        target=target, model_type=None, engine=opts.engine, engine_versions={}, layers=[], findings=[]), None))
    mlx = [(target, Options(catalog=builtin_catalog(), engine="sglang-mlx")) for target in names[:2]]
    _, _, pids = runner.run_targets(mlx, jobs=2, render=where)
    assert parent not in pids


def _pid(result, opts):
    return os.getpid()


def test_light_targets_are_checked_here_until_a_spawned_pool_would_pay(fleet, monkeypatch):
    """Where workers are spawned (macOS, Windows: here through Linux's spawn context), light targets are
    checked in this process until the rest would repay starting the pool, which then checks the rest."""
    from kvdoctor.fleet import runner
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.pipeline.check import Options

    root, names = fleet
    monkeypatch.chdir(root)
    monkeypatch.setattr(runner, "FORKS", False)
    static = [(target, Options(catalog=builtin_catalog(), static=True)) for target in names]
    monkeypatch.setattr(runner, "SPAWNED_POOL_COST_S", 3600.0)  # no pool could repay itself
    here, _, pids = runner.run_targets(static, jobs=2, render=_pid)
    assert set(pids) == {os.getpid()}
    monkeypatch.setattr(runner, "SPAWNED_POOL_COST_S", 0.0)  # any pool pays: two checks here, for the estimate
    spawned, _, pids = runner.run_targets(static, jobs=2, render=_pid)
    assert pids[:2] == [os.getpid()] * 2 and os.getpid() not in pids[2:]
    assert spawned == here and [r.target for r in here] == names


def test_a_worker_that_dies_loses_no_target(monkeypatch):
    """A check that kills its worker process (as the kernel's OOM killer would) becomes the error of
    the batch that worker held; a new worker checks the rest, every target is reported, in input
    order, and the run's exit code is 2. So whether this process checks targets too (static ones) or
    only hands them out (a profile's probes may load torch or mlx, which must not be forked)."""
    import signal
    import time

    from kvdoctor.fleet import runner
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.pipeline.check import Options
    from kvdoctor.model import Result
    from kvdoctor.report import exit_code

    parent = os.getpid()

    def check_or_die(target, opts):
        if target == "dies" and os.getpid() != parent:  # never this test's own process
            os.kill(os.getpid(), signal.SIGKILL)
        if os.getpid() == parent:
            time.sleep(0.05)  # the helpers take most batches, the one with "dies" among them
        return Result(target=target, model_type="llama", engine=opts.engine, engine_versions={}, layers=[],
                      findings=[]), None

    monkeypatch.setattr(runner, "check_one", check_or_die)  # the forked workers inherit it
    monkeypatch.setattr(runner, "FORKED_POOL_COST_S", 0.0)  # these checks take nothing: pool them all the same
    targets = [f"ok-{i}" for i in range(40)] + ["dies"] + [f"ok-{i}" for i in range(40, 80)]
    batch = next(b for b in runner.batches(len(targets), 2) if targets.index("dies") in b)
    for opts in (Options(catalog=builtin_catalog(), static=True), Options(catalog=builtin_catalog(), engine="sglang")):
        assert runner._is_light(opts) == opts.static
        results, _, _ = runner.run_targets([(t, opts) for t in targets], jobs=2)
        assert [r.target for r in results] == targets
        dead = next(r for r in results if r.target == "dies")
        assert dead.error == "internal error: the worker checking it died (killed by SIGKILL)"
        assert [r.target for r in results if r.error] == [targets[i] for i in batch]
        assert exit_code(results, "error") == 2


def test_the_work_queue_hands_out_every_batch_once_across_processes():
    """Two processes reading one _Queue of more numbers than a pipe holds get each number exactly once
    between them, this one topping the pipe up as it empties."""
    import json
    import select

    from kvdoctor.fleet.runner import _Queue

    count = 40_000  # 160 KB of numbers: more than a pipe's 64 KiB
    queue = _Queue(count)
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(out_r)
            for fd in queue.write_ends():
                os.close(fd)
            taken = []
            while record := os.read(queue.read_end, 4):
                taken.append(int.from_bytes(record, "little"))
            os.write(out_w, json.dumps(taken).encode())
        finally:
            os._exit(0)
    os.close(out_w)
    mine = []
    while queue.write_ends():
        _, writable, _ = select.select([], queue.write_ends(), [], 5)
        assert writable
        queue.top_up()
        if (number := queue.take()) is not None:
            mine.append(number)
    while (number := queue.take()) is not None:
        mine.append(number)
    theirs = json.loads(b"".join(iter(lambda: os.read(out_r, 1 << 20), b"")))
    os.waitpid(pid, 0)
    queue.close()
    assert queue.drained and mine and theirs
    assert sorted(mine + theirs) == list(range(count))


def test_helpers_are_forked_once_however_early_they_finish(monkeypatch):
    """This process forks its helpers once: when they have emptied the queue while it is still on its
    own batch, it finishes that batch alone instead of forking helpers that would find nothing."""
    import time

    from kvdoctor.fleet import runner
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.pipeline.check import Options
    from kvdoctor.model import Result

    parent = os.getpid()

    def slow_here(target, opts):
        if os.getpid() == parent:
            time.sleep(0.05)
        return Result(target=target, model_type="llama", engine=opts.engine, engine_versions={}, layers=[],
                      findings=[]), None

    forks = []
    real_fork = os.fork

    def counted_fork():
        pid = real_fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(runner, "check_one", slow_here)
    monkeypatch.setattr(runner.os, "fork", counted_fork)
    targets = [f"ok-{i}" for i in range(64)]
    assert len(runner.batches(len(targets), 2)[0]) > 1  # this process's first batch outlasts the helper's work
    results, _, _ = runner.run_targets([(t, Options(catalog=builtin_catalog(), static=True)) for t in targets], jobs=2)
    assert [r.target for r in results] == targets
    assert len(forks) == 1
