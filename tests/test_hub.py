"""Models on a Hub, read through huggingface_hub from a real HTTP server on 127.0.0.1 (tests/hub_server.py)
that serves Hub-shaped repos built from real configs and synthetic checkpoints. Every run is the real
CLI in a subprocess with HF_ENDPOINT pointing at the server and HF_HOME in a temporary folder."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from helpers import make_model, real_config, run
from hub_server import HubServer, Repo

KIB = 1024
SHARDS = 20
TARGET_FIELDS = ("target", "model_dir", "source")  # what names where the files came from


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Model folders: Kimi Linear in 20 shards (21,128 tensors), Llama 3.1 8B in one file, and bad ones."""
    tmp = tmp_path_factory.mktemp("models")
    out = {"kimi": make_model(tmp, "kimi-linear", shards=SHARDS), "llama": make_model(tmp, "llama-3.1-8b")}
    huge = tmp / "huge-header"
    huge.mkdir()
    (huge / "config.json").write_text(json.dumps(real_config("llama-3.1-8b")))
    (huge / "model.safetensors").write_bytes(struct.pack("<Q", 33 * 1024 * KIB) + b"{" + b" " * 4096)
    for name, weights in (("gguf", "model-Q4_K_M.gguf"), ("bin", "pytorch_model.bin")):
        folder = tmp / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(real_config("llama-3.1-8b")))
        (folder / weights).write_bytes(b"\0" * 64)
        out[name] = folder
    out["huge-header"] = huge
    automap = make_model(tmp, "llama-3.1-8b", dirname="automap",
                         edit=lambda cfg: cfg.update(auto_map={"AutoConfig": "configuration_evil.EvilConfig"}))
    (automap / "configuration_evil.py").write_text("raise SystemExit('shipped code ran')\n")
    out["automap"] = automap
    return out


@pytest.fixture(scope="module")
def hub(models) -> Any:
    repos = {
        "moonshotai/Kimi-Linear": Repo.from_dir(models["kimi"]),
        "meta-llama/Llama-3.1-8B": Repo.from_dir(models["llama"], branches=("main", "v1")),
        "acme/gated": Repo.from_dir(models["llama"], gated=True),
        "acme/private": Repo.from_dir(models["llama"], private=True),
        "acme/rate-limited": Repo.from_dir(models["llama"], fault="429"),
        "acme/truncated": Repo.from_dir(models["llama"], fault="truncate"),
        "acme/huge-header": Repo.from_dir(models["huge-header"]),
        "acme/gguf-only": Repo.from_dir(models["gguf"]),
        "acme/bin-only": Repo.from_dir(models["bin"]),
        "acme/automap": Repo.from_dir(models["automap"]),
    }
    with HubServer(repos) as server:
        yield server


def hub_env(server: HubServer, home: Path, offline: bool = False) -> dict[str, str]:
    return {"HF_ENDPOINT": server.endpoint, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1" if offline else "0",
            "HF_HUB_CACHE": str(home / "hub")}


def check(env: dict[str, str], *args: str) -> tuple[int, dict, str]:
    proc = run("check", "--format", "json", *args, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


def without_source(doc: dict) -> dict:
    """The document less what names the target and where its files came from."""
    doc = json.loads(json.dumps(doc))
    for result in doc["results"]:
        for key in TARGET_FIELDS:
            result.pop(key, None)
        result.get("info", {}).pop("hf_id", None)
        for finding in result["findings"]:
            finding.pop("fingerprint")  # made from the target's name
    return doc


def header_bytes(folder: Path) -> int:
    """What the checkpoint's headers hold: each shard's 8-byte length and header."""
    total = 0
    for path in folder.glob("*.safetensors"):
        with path.open("rb") as fh:
            total += 8 + struct.unpack("<Q", fh.read(8))[0]
    return total


def test_hub_id_gives_the_local_folders_json_within_the_byte_bound_and_then_offline(hub, models, tmp_path):
    folder = models["kimi"]
    code, local, _ = check({}, "--static", str(folder))
    assert code in (0, 1) and local["results"][0]["info"]["checkpoint"]["tensors"] >= 20_000
    assert local["results"][0]["source"] == {"kind": "directory"}

    hub.reset()
    env = hub_env(hub, tmp_path / "home")
    code_hub, remote, _ = check(env, "--static", "moonshotai/Kimi-Linear")
    assert code_hub == code and remote["results"][0].get("error") is None, remote
    assert without_source(remote) == without_source(local)
    source = remote["results"][0]["source"]
    commit = hub.repos["moonshotai/Kimi-Linear"].commit
    assert source["kind"] == "hub" and source["commit"] == commit and source["revision"] == "main"
    assert source["cached"] is False and source["seconds"] >= 0

    small = [(folder / name).stat().st_size for name in ("config.json", "model.safetensors.index.json")]
    needed = sum(small) + header_bytes(folder)
    assert needed <= source["bytes_fetched"] <= hub.bytes_sent
    assert hub.bytes_sent <= needed * 1.05 + 128 * KIB * SHARDS, (hub.bytes_sent, needed)
    assert not [r for r in hub.requests if r[0] == "GET" and r[1].endswith(".safetensors") and r[2] is None]

    hub.reset()
    code_again, offline, _ = check(hub_env(hub, tmp_path / "home", offline=True), "--static", "moonshotai/Kimi-Linear")
    assert hub.requests == [] and code_again == code
    assert without_source(offline) == without_source(remote)
    again = offline["results"][0]["source"]
    assert again["commit"] == commit and again["cached"] is True and again["bytes_fetched"] == 0


def test_fetched_metadata_sits_in_its_own_cache_in_the_hub_layout_without_weight_files(hub, tmp_path):
    home = tmp_path / "home"
    code, doc, _ = check(hub_env(hub, home), "--static", "meta-llama/Llama-3.1-8B")
    assert doc["results"][0].get("error") is None, doc
    commit = hub.repos["meta-llama/Llama-3.1-8B"].commit
    repo = home / "kvdoctor" / "models--meta-llama--Llama-3.1-8B"
    snapshot = repo / "snapshots" / commit
    assert (repo / "refs" / "main").read_text() == commit
    assert (snapshot / "config.json").is_symlink() and (snapshot / "config.json").resolve().parent == repo / "blobs"
    assert (snapshot / "model.safetensors.header").is_file()
    assert list(home.rglob("*.safetensors")) == []  # nothing a tool could take for the weights
    assert not (home / "hub").exists()  # the user's Hugging Face cache is left alone
    kept = (snapshot / "model.safetensors.header").read_bytes()
    with hub.repos["meta-llama/Llama-3.1-8B"].files["model.safetensors"].open("rb") as shard:
        prefix = shard.read(8)
        header = shard.read(struct.unpack("<Q", prefix)[0])
    assert kept == prefix + header  # the shard's first bytes, no more


def test_a_full_check_and_the_budget_of_a_hub_id_match_the_folders(hub, models, tmp_path):
    env = hub_env(hub, tmp_path / "home")
    code, local, _ = check({}, str(models["llama"]))
    code_hub, remote, _ = check(env, "meta-llama/Llama-3.1-8B")
    assert (code_hub, without_source(remote)) == (code, without_source(local))
    budgets = []
    for target, where in ((str(models["llama"]), {}), ("meta-llama/Llama-3.1-8B", env)):
        proc = run("budget", "--format", "json", "--gpu-memory", "80GiB", target, env=where)
        assert proc.returncode == 0, proc.stderr
        budgets.append(json.loads(proc.stdout))
    sources = [doc["model"].pop("source") for doc in budgets]
    assert sources[0] == {"kind": "directory"} and sources[1]["kind"] == "hub" and sources[1]["cached"] is True
    for doc in budgets:
        doc["model"].pop("target")
        doc["model"].pop("id")
    assert budgets[0] == budgets[1]


def test_a_revision_is_resolved_to_its_commit(hub, tmp_path):
    env = hub_env(hub, tmp_path / "home")
    code, doc, _ = check(env, "--static", "meta-llama/Llama-3.1-8B@v1")
    source = doc["results"][0]["source"]
    assert source["revision"] == "v1" and source["commit"] == hub.repos["meta-llama/Llama-3.1-8B"].commit
    assert (tmp_path / "home" / "kvdoctor" / "models--meta-llama--Llama-3.1-8B" / "refs" / "v1").is_file()
    hub.reset()
    code, doc, _ = check({**env, "HF_HUB_OFFLINE": "1"}, "--static", "meta-llama/Llama-3.1-8B@v1")
    assert code != 2 and doc["results"][0]["source"]["cached"] is True and hub.requests == []
    commit = source["commit"]
    code, doc, _ = check(env, "--static", f"meta-llama/Llama-3.1-8B@{commit}")  # online: a commit never changes
    assert code != 2 and doc["results"][0]["source"]["commit"] == commit and hub.requests == []


def test_an_unreachable_hub_is_one_line_and_exit_2(tmp_path):
    code, doc, _ = check({"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "0"},
                         "--static", "acme/anything")
    error = doc["results"][0]["error"]
    assert code == 2 and error.startswith("acme/anything: no such directory, and as a Hugging Face id: cannot read the "
                                          "repository from http://127.0.0.1:9")


@pytest.mark.parametrize("target, words", [
    ("acme/gated", "gated"),
    ("acme/private", "no such repository"),
    ("acme/nowhere", "no such repository"),
    ("meta-llama/Llama-3.1-8B@no-such-branch", "no such revision"),
    ("acme/rate-limited", "429 Too Many Requests"),
    ("acme/huge-header", "exceeds the 33554432-byte bound"),
    ("acme/truncated", "truncated range"),
    ("acme/gguf-only", "no safetensors files on the Hub (weights: model-Q4_K_M.gguf)"),
    ("acme/bin-only", "no safetensors files on the Hub (weights: pytorch_model.bin)"),
])
def test_each_bad_answer_is_one_line_and_exit_2(hub, tmp_path, target, words):
    code, doc, stderr = check(hub_env(hub, tmp_path / "home"), "--static", target)
    error = doc["results"][0]["error"]
    assert code == 2 and words in error and "\n" not in error, error
    assert error.startswith(target.partition("@")[0]), error


def test_budget_says_a_bad_answer_in_one_line(hub, tmp_path):
    proc = run("budget", "acme/gated", env=hub_env(hub, tmp_path / "home"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("kvdoctor: error: acme/gated: ")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_offline_fetches_nothing(hub, tmp_path, how):
    env = hub_env(hub, tmp_path / "home", offline=how == "env")
    hub.reset()
    code, doc, _ = check(env, "--static", *(["--offline"] if how == "flag" else []), "meta-llama/Llama-3.1-8B")
    assert code == 2 and "offline" in doc["results"][0]["error"] and hub.requests == []


def test_auto_map_is_never_fetched_nor_run(hub, tmp_path):
    hub.reset()
    code, doc, stderr = check(hub_env(hub, tmp_path / "home"), "--static", "acme/automap")
    assert doc["results"][0].get("error") is None and "shipped code ran" not in stderr
    assert not [r for r in hub.requests if r[1].endswith(".py")]


def test_a_fleet_of_hub_ids_keeps_its_order_and_fetches_at_most_jobs_at_once(hub, models, tmp_path):
    targets = ["meta-llama/Llama-3.1-8B", "acme/gated", "moonshotai/Kimi-Linear", "acme/automap",
               "meta-llama/Llama-3.1-8B@v1"]
    hub.reset()
    code, doc, _ = check(hub_env(hub, tmp_path / "home"), "--static", "-j", "2", *targets)
    assert [r["target"] for r in doc["results"]] == targets
    assert [bool(r.get("error")) for r in doc["results"]] == [False, True, False, False, False]
    assert 1 <= hub.most_in_flight <= 2


def test_the_rich_report_names_the_source(hub, models, tmp_path):
    proc = run("check", "--static", "meta-llama/Llama-3.1-8B", env=hub_env(hub, tmp_path / "home"))
    assert proc.returncode != 2, proc.stderr
    assert "Hub, main at commit" in proc.stdout and "fetched in" in proc.stdout
    again = run("check", "--static", "meta-llama/Llama-3.1-8B", env=hub_env(hub, tmp_path / "home"))
    assert "metadata fetched before: nothing fetched now" in again.stdout
    local = run("check", "--static", str(models["llama"]))
    assert local.returncode != 2 and "source" not in local.stdout  # a directory: its panel's title says it


def test_the_local_hugging_face_cache_comes_before_the_hub(hub, models, tmp_path):
    """A revision the local cache holds is read there without a request; one it lacks, from the Hub."""
    home = tmp_path / "home"
    repo = home / "hub" / "models--meta-llama--Llama-3.1-8B"
    snapshot = repo / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    (repo / "blobs").mkdir()
    for path in models["llama"].iterdir():  # as the client lays it out: snapshot links into blobs/
        os.link(path, repo / "blobs" / path.name)
        (snapshot / path.name).symlink_to(Path("../../blobs") / path.name)
    hub.reset()
    code, doc, _ = check(hub_env(hub, home), "--static", "meta-llama/Llama-3.1-8B")
    assert doc["results"][0]["source"] == {"kind": "hf-cache", "commit": "c" * 40} and hub.requests == []
    code, doc, _ = check(hub_env(hub, home), "--static", "meta-llama/Llama-3.1-8B@v1")
    assert doc["results"][0]["source"]["kind"] == "hub" and hub.requests != []


def test_fit_reads_a_hub_id_as_it_reads_the_same_files(hub, models, tmp_path):
    """`kvdoctor fit` prices the weights from the headers it fetched: the answer equals the folder's."""
    env = hub_env(hub, tmp_path)
    args = ("--gpu", "H100-80GB", "--gpus", "2", "--format", "json")
    local = run("fit", str(models["llama"]), *args, env=env)
    remote = run("fit", "meta-llama/Llama-3.1-8B", *args, env=env)
    assert local.returncode == remote.returncode == 0, remote.stderr
    mine, theirs = json.loads(local.stdout), json.loads(remote.stdout)
    for doc in (mine, theirs):
        doc["model"] = {k: v for k, v in doc["model"].items() if k not in ("id", "target", "source")}
    for doc, served in ((mine, str(models["llama"])), (theirs, "meta-llama/Llama-3.1-8B")):
        for row in (*doc["rows"], doc["recommendation"]):  # `vllm serve MODEL`: the id, or the folder
            assert row["launch"][2] == served
            row["launch"][2] = "MODEL"
    assert theirs == mine
    offline = run("fit", "meta-llama/Llama-3.1-8B", *args, "--offline", env=env)
    assert offline.returncode == 0 and json.loads(offline.stdout)["model"]["target"] == "meta-llama/Llama-3.1-8B"
