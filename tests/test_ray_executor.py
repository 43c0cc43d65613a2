"""--executor ray: a real local Ray head on 127.0.0.1, started and stopped here. The JSON equals a
local run's, results come back in input order, and a killed worker loses no target: a task killed
once is retried, a task killed every time is reported as that target's error."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REAL_NAMES, make_model, real_config, run

# Ray maps 127.0.0.1 to the machine's outside address unless clusters are off: keep the head on loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def head():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        address = ray.get_runtime_context().gcs_address
        assert address.startswith("127.0.0.1:")
        yield address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("rayfleet")
    for name in REAL_NAMES[:5]:
        make_model(root, real_config(name), dirname=f"models/{name}")
    make_model(root, "gpt-oss-20b", dirname="models/zz-broken", edit=lambda c: c.update(layer_types=c["layer_types"][:-1]))
    return root


def test_ray_gives_the_local_json_in_input_order(head, fleet):
    targets = sorted(str(p.relative_to(fleet)) for p in (fleet / "models").iterdir())[::-1]
    local = run("check", *targets, "--format", "json", "--static", "-j", "1", cwd=fleet)
    remote = run("check", *targets, "--format", "json", "--static", "--executor", "ray", "--ray-address", head,
                 cwd=fleet)
    assert "Traceback" not in remote.stderr, remote.stderr
    assert remote.returncode == local.returncode == 1
    assert remote.stdout == local.stdout
    assert [r["target"] for r in json.loads(remote.stdout)["results"]] == targets


def test_a_killed_worker_is_retried_once_then_its_target_is_an_error(head, fleet, tmp_path):
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.pipeline.check import Options
    from kvdoctor.fleet.ray_executor import run_on_ray
    from kvdoctor.fleet.runner import check_one

    marks = tmp_path / "marks"
    marks.mkdir()

    def killing(target: str, opts):
        """SIGKILL this Ray worker: the first time for 'once' targets, every time for 'always'."""
        name = Path(target).name
        if name.endswith("zz-broken") or name == REAL_NAMES[0]:
            attempt = marks / f"{name}.{len(list(marks.glob(name + '.*')))}"
            attempt.touch()
            if name == REAL_NAMES[0] or attempt.name.endswith(".0"):
                os.kill(os.getpid(), signal.SIGKILL)
        return check_one(target, opts)

    catalog = builtin_catalog()
    targets = sorted(str(p) for p in (fleet / "models").iterdir())
    work = [(t, Options(catalog=catalog, static=True)) for t in targets]
    results, _ = run_on_ray(work, task=killing)
    assert [r.target for r in results] == targets  # nothing dropped, input order
    by_name = {Path(r.target).name: r for r in results}
    always = by_name[REAL_NAMES[0]]
    assert always.error and "worker checking it died" in always.error
    assert len(list(marks.glob(REAL_NAMES[0] + ".*"))) == 2  # tried, retried once, then given up
    once = by_name["zz-broken"]
    assert once.error is None and [f.code for f in once.findings] == ["CFG001"]  # the retry succeeded
    assert len(list(marks.glob("zz-broken.*"))) == 2
    assert all(r.error is None for name, r in by_name.items() if name != REAL_NAMES[0])


def test_without_ray_the_executor_says_which_extra_to_install(fleet):
    code = ("import sys; sys.modules['ray'] = None; sys.argv = ['kvdoctor', 'check', 'models', '--executor', 'ray']; "
            "from kvdoctor.cli.main import main; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=fleet,
                          env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "kvdoctor: error: --executor ray needs Ray, which is not installed: pip install 'kvdoctor[ray]'"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _without_ray_auth(tmp_path, **extra: str) -> dict[str, str]:
    """This environment less the token settings the head's ray.init left in it, and another home (no
    ~/.ray/auth_token)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    return {**env, "HOME": str(tmp_path), "COLUMNS": "200", **extra}


def test_no_cluster_at_the_address_is_one_line(fleet, tmp_path):
    address = f"127.0.0.1:{_free_port()}"
    proc = run("check", "models", "--static", "--executor", "ray", "--ray-address", address, cwd=fleet,
               env=_without_ray_auth(tmp_path))
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"kvdoctor: error: no Ray cluster answers at {address}") and "ray start --head" in line


@pytest.mark.parametrize("extra, says", [
    ({}, "requires token authentication"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32}, "refused this process's token")])
def test_a_head_that_wants_a_token_is_one_line_naming_the_setting(head, fleet, tmp_path, extra, says):
    assert os.environ.get("RAY_AUTH_MODE") == "token"  # Ray 2.60's head turned token authentication on
    proc = run("check", "models", "--static", "--executor", "ray", "--ray-address", head, cwd=fleet,
               env=_without_ray_auth(tmp_path, **extra))
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"kvdoctor: error: the Ray cluster at {head} {says}") and "RAY_AUTH_TOKEN" in line


def test_a_version_mismatch_names_both_versions():
    from kvdoctor.fleet.ray_executor import join_error

    # The text Ray's _check_version_info raises (ray/_private/utils.py @ 2.60.0), as ray.init chains it.
    cause = RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.59.0\n    Python: 3.12.3\n"
                         "This process on node 127.0.0.1 was started with:\n    Ray: 2.60.0\n    Python: 3.11.7\n")
    try:
        raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:6379") from cause
    except ConnectionError as exc:
        error = join_error("127.0.0.1:6379", exc)
    assert error is not None and str(error) == (
        "the Ray cluster at 127.0.0.1:6379 runs Ray 2.59.0 on Python 3.12.3, this process Ray 2.60.0 on Python 3.11.7: "
        "run kvdoctor where ray==2.59.0 and Python 3.12.3 are installed")
    assert join_error("127.0.0.1:6379", ConnectionError("something else")) is None


@pytest.mark.skipif(not os.environ.get("KVDOCTOR_OTHER_RAY"), reason="set KVDOCTOR_OTHER_RAY to the `ray` command "
                    "of another Ray release (e.g. a venv with ray==2.59.0) to join a real head of that release")
def test_a_real_head_of_another_ray_release_is_one_line(fleet, tmp_path):
    other = os.environ["KVDOCTOR_OTHER_RAY"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    port = "6391"
    subprocess.run([other, "start", "--head", "--port", port, "--num-cpus", "1", "--include-dashboard", "false",
                    "--disable-usage-stats"], check=True, capture_output=True, env=env)
    try:
        proc = run("check", "models", "--static", "--executor", "ray", "--ray-address", f"127.0.0.1:{port}",
                   cwd=fleet, env=env)
    finally:
        subprocess.run([other, "stop"], capture_output=True, env=env)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"kvdoctor: error: the Ray cluster at 127.0.0.1:{port} runs Ray ") and "this process Ray" in line
