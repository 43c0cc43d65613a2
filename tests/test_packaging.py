"""The wheel a user installs: built from the checkout, installed into a fresh venv outside it without
torch or mlx, and run from another directory, with the documented exit codes (0 clean, 1 findings,
2 input error). The sdist and wheel pass `twine check`.

Packages come from the machine's local package index only (`pip --isolated` with the file:// indexes
and find-links of the pip configuration, or KVDOCTOR_WHEELHOUSE): no network, no big downloads.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from helpers import REAL, ROOT


def _local_sources() -> list[str]:
    """pip arguments naming the local package sources of this machine, or [] when there are none."""
    if os.environ.get("KVDOCTOR_WHEELHOUSE"):
        return ["--no-index", "--find-links", os.environ["KVDOCTOR_WHEELHOUSE"]]
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    indexes, links = [], []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        for item in value.strip().strip("'\"").split():
            local = item.startswith("file://") or item.startswith("/")
            if local and key.endswith("index-url"):
                indexes.append(item)
            elif local and key.endswith("find-links"):
                links.append(item)
    if not indexes and not links:
        return []
    args = ["--index-url", indexes[0]] if indexes else ["--no-index"]
    for extra in indexes[1:]:
        args += ["--extra-index-url", extra]
    for link in links:
        args += ["--find-links", link]
    return args


SOURCES = _local_sources()
pytestmark = pytest.mark.skipif(not SOURCES, reason="no local package index (set KVDOCTOR_WHEELHOUSE)")


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> Path:
    """sdist and wheel built by `python -m build` (the wheel from the sdist, as a release is)."""
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def installed(dists, tmp_path_factory) -> Path:
    """A fresh venv with the wheel and its base requirements; returns its bin directory."""
    where = tmp_path_factory.mktemp("venv")
    assert not where.resolve().is_relative_to(ROOT)
    venv.create(where, with_pip=True)
    bin_dir = where / "bin"
    wheel = next(dists.glob("kvdoctor-*.whl"))
    pip = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "--isolated", "-q", *SOURCES,
                          str(wheel)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    return bin_dir


def _run(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["COLUMNS"] = "80"
    return subprocess.run([str(bin_dir / "kvdoctor"), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def test_sdist_and_wheel_pass_twine_check(dists):
    files = sorted(dists.iterdir())
    assert sorted(f.suffix for f in files) == [".gz", ".whl"]
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("PASSED") == 2


def test_wheel_carries_the_catalog_and_data(dists):
    import zipfile

    names = zipfile.ZipFile(next(dists.glob("*.whl"))).namelist()
    shipped = sorted(Path(n).name for n in names if n.startswith("kvdoctor/rules/"))
    assert shipped == sorted([p.name for p in (ROOT / "rules").glob("*.yaml")] + ["briefs.json", "descriptions.json"])
    assert "kvdoctor/data/recipes/sglang-0.5.23.yaml" in names
    assert "kvdoctor/data/report.schema.json" in names  # the JSON document's schema, published
    assert "kvdoctor/engines/vllm/model_types.json" in names  # VLM138's table of readable model types
    assert "kvdoctor/data/mlx_lm_models.json" in names  # the pinned mlx-lm's model list, for the base install


def test_base_install_has_neither_torch_nor_mlx(installed, tmp_path):
    probe = subprocess.run([str(installed / "python"), "-c", "import importlib.util as u, kvdoctor; "
                            "print([m for m in ('torch', 'mlx', 'mlx_lm', 'sglang') if u.find_spec(m)]); "
                            "print(kvdoctor.__file__)"], capture_output=True, text=True, cwd=tmp_path,
                           env={"PATH": os.environ["PATH"]})
    found, location = probe.stdout.splitlines()
    assert found == "[]"
    assert Path(location).is_relative_to(installed.parent)  # the installed copy, not the checkout


def test_rules_and_explain_from_another_directory(installed, tmp_path):
    rules = _run(installed, tmp_path, "rules", "--format", "json")
    assert rules.returncode == 0, rules.stderr
    codes = sorted(e["code"] for e in json.loads(rules.stdout))
    assert codes == sorted(p.stem for p in (ROOT / "rules").glob("*.yaml"))
    explain = _run(installed, tmp_path, "explain", "SWA001")
    assert explain.returncode == 0, explain.stderr
    assert "window-overflow-full-mask" in explain.stdout
    unknown = _run(installed, tmp_path, "explain", "NOPE999")
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1


def test_static_check_of_real_configs(installed, tmp_path):
    healthy = shutil.copytree(REAL / "google__gemma-2-2b", tmp_path / "gemma-2-2b")
    broken = shutil.copytree(ROOT / "fixtures" / "demo" / "gpt-oss-20b-broken", tmp_path / "broken")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    clean = _run(installed, elsewhere, "check", "--static", str(healthy), "--format", "json")
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["summary"]["errors"] == 0
    found = _run(installed, elsewhere, "check", "--static", str(broken), "--format", "concise")
    assert found.returncode == 1 and "CFG001 [error]" in found.stdout
    missing = _run(installed, elsewhere, "check", "--static", str(tmp_path / "no-such-model"))
    assert missing.returncode == 2
    unknown = tmp_path / "minimax-m3"
    unknown.mkdir()
    shutil.copy(ROOT / "fixtures" / "configs" / "real" / "MiniMaxAI__MiniMax-M3.json", unknown / "config.json")
    vllm = _run(installed, elsewhere, "check", "--static", "--engine", "vllm", str(unknown), "--format", "json")
    assert vllm.returncode in (0, 1), vllm.stderr  # the installed copy reads its model-type table
    assert "VLM138" in [f["code"] for f in json.loads(vllm.stdout)["results"][0]["findings"]]


def test_base_install_reads_sglang_mlx_layouts_from_shipped_data(installed, tmp_path):
    """No mlx-lm here: DeepSeek-V3 gets the ENG003 the full install gives (not ENG001), and a model type
    only mlx-lm's class can tell gets a note, no error."""
    for name in ("deepseek-ai__DeepSeek-V3", "Qwen__Qwen3-8B"):
        (tmp_path / name).mkdir()
        shutil.copy(ROOT / "fixtures" / "configs" / "real" / f"{name}.json", tmp_path / name / "config.json")
    out = _run(installed, tmp_path, "check", "--static", "--engine", "sglang-mlx", "deepseek-ai__DeepSeek-V3",
               "Qwen__Qwen3-8B", "--format", "json")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    deepseek, qwen = json.loads(out.stdout)["results"]
    assert [f["code"] for f in deepseek["findings"] if f["severity"] == "error"] == ["ENG003"]
    assert [f for f in qwen["findings"] if f["severity"] != "info"] == []
    assert "mlx-lm is not installed" in " ".join(qwen["info"]["engine_notes"])
    assert "installed mlx-lm" not in out.stdout


def test_missing_extra_is_one_line_naming_it(installed, tmp_path):
    model = shutil.copytree(REAL / "google__gemma-3-1b-it", tmp_path / "gemma-3")
    for args, extra in ((["--engine", "sglang-mlx"], "mlx"), (["--engine", "sglang-mlx", "--dry-run"], "sglang"),
                        (["--engine", "sglang"], "torch")):
        out = _run(installed, tmp_path, "check", str(model), *args)
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1 and f"pip install 'kvdoctor[{extra}]'" in out.stderr
    static = _run(installed, tmp_path, "check", str(model), "--engine", "sglang-mlx", "--static", "--format", "json")
    assert static.returncode in (0, 1), static.stderr  # the static path works without mlx


def test_triage_from_another_directory(installed, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO: starting\nRuntimeError: WindowedAttentionKVCache holds only the trailing window and "
                   "cannot serve a full-context attention mask\n")
    hit = _run(installed, tmp_path, "triage", str(log), "--format", "json")
    assert hit.returncode == 1, hit.stderr
    assert [m["code"] for m in json.loads(hit.stdout)["matches"]] == ["SWA001"]
    log.write_text("INFO: all good\n")
    assert _run(installed, tmp_path, "triage", str(log)).returncode == 0


def test_extras_are_ranges_that_hold_the_versions_the_profiles_describe(dists):
    """torch, mlx and the engines are extras, never base requirements, and each range admits the
    version kvdoctor's profiles and Makefile name (so `kvdoctor[mlx,torch]` brings back the full check)."""
    import zipfile

    from packaging.requirements import Requirement

    from kvdoctor.engines.sglang_mlx.profile import MLX_LM_VERSION, SGLANG_VERSION

    wheel = zipfile.ZipFile(next(dists.glob("*.whl")))
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    reqs = [Requirement(line.partition(":")[2].strip()) for line in metadata.splitlines()
            if line.startswith("Requires-Dist:")]
    heavy = {"torch", "mlx", "mlx-lm", "sglang"}
    base = [r for r in reqs if r.marker is None or "extra" not in str(r.marker)]
    assert base and not heavy & {r.name for r in base}
    described = {"torch": "2.13.0", "mlx": "0.32.4", "mlx-lm": MLX_LM_VERSION, "sglang": SGLANG_VERSION}
    for extra, names in (("torch", {"torch"}), ("mlx", {"mlx", "mlx-lm"}), ("sglang", heavy), ("all", heavy)):
        chosen = [r for r in reqs if r.marker is not None
                  and r.marker.evaluate({"extra": extra, "sys_platform": "linux"}) and r.name in heavy]
        assert {r.name for r in chosen} == names, extra
        for r in chosen:
            assert "==" not in str(r.specifier) and r.specifier.contains(described[r.name]), r
