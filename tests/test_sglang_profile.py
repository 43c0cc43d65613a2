"""`kvdoctor check MODEL --engine sglang` end to end: the CUDA pool plan of every layer in the JSON, the KDA
state kept, the SGL findings (refusals, window, layer kinds) and the pool probe skipped without SGLang."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import check_json, codes, make_model

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"
NO_SGLANG = {"KVDOCTOR_SGLANG_PYTHON": "/nonexistent/python"}
SGLANG_PYTHON = os.environ.get("KVDOCTOR_SGLANG_PYTHON") or str(
    Path(__file__).resolve().parent.parent / "goldens" / ".venv" / "sglang" / "bin" / "python")


def deploy(tmp_path: Path, **settings) -> str:
    path = tmp_path / "deploy.yaml"
    path.write_text("sglang:\n" + "".join(f"  {k}: {v}\n" for k, v in settings.items()))
    return str(path)


def result(*args: str, env=NO_SGLANG) -> tuple[int, dict]:
    rc, doc = check_json(*args, "--engine", "sglang", env=env)
    assert doc["results"][0].get("error") is None
    return rc, doc["results"][0]


def dense(rows: list[dict]) -> dict[str, list[int]]:
    by_pool: dict[str, list[int]] = {}
    for row in rows:
        by_pool.setdefault(row["pool"], []).append(row["pool_index"])
    return {pool: sorted(ix) for pool, ix in by_pool.items()}


def test_gpt_oss_layers_live_in_the_swa_and_full_pools(tmp_path):
    rc, res = result(str(make_model(tmp_path, "gpt-oss-20b")))
    assert rc == 0 and not [f for f in res["findings"] if f["severity"] == "error"]
    rows = res["layers"]
    assert {r["cache"] for r in rows if r["kind"] == "sliding_attention"} == {"swa"}
    assert {r["cache"] for r in rows if r["kind"] == "full_attention"} == {"full"}
    assert all(r["engine_window"] == r["window"] for r in rows)  # gpt-oss masks the config's own window
    assert all(ix == list(range(len(ix))) for ix in dense(rows).values())
    info = res["info"]["sglang"]
    assert info["hybrid_swa"]["on"] is True and info["architecture"] == "GptOssForCausalLM"
    assert info["swa_layer_ids"] == [r["index"] for r in rows if r["cache"] == "swa"]
    assert info["pool_probe"] == {"skipped": "no SGLang 0.5.23 Python: set KVDOCTOR_SGLANG_PYTHON to one"}


def test_kimi_linear_keeps_its_kda_state_beside_the_mla_pool(tmp_path):
    rc, res = result(str(make_model(tmp_path, "kimi-linear")))
    assert rc == 0
    kda = [r for r in res["layers"] if r["kind"] == "kda"]
    assert kda and all(r["cache"] == "kda-replayssm" and r["pool"] == "mamba" for r in kda)
    assert sorted(kda[0]["state"], key=int) == ["1", "2", "4", "8"]  # the KDA plan's state, at every TP size
    assert {r["cache"] for r in res["layers"] if r["kind"] == "mla"} == {"mla"}
    assert "kda_replayssm" in res["info"] and res["info"]["sglang"]["attention_arch"] == "MLA"


def test_mistral_window_is_not_masked_past_it_and_quiet_within_it(tmp_path):
    model = str(FIXTURES / "mistralai__Mistral-7B-v0.1")
    rc, res = result(model)
    found = [f for f in res["findings"] if f["code"] == "SGL004"]
    assert rc == 1 and len(found) == 1 and found[0]["severity"] == "error"
    assert found[0]["evidence"]["window"] == 4096 and found[0]["evidence"]["engine_window"] is None
    rc, res = result(model, "--deploy", deploy(tmp_path, context_length=4096))
    assert rc == 0 and "SGL004" not in codes({"results": [res]})


def test_context_length_past_the_derived_one_is_a_startup_refusal(tmp_path):
    rc, res = result(str(make_model(tmp_path, "gemma-3-1b-it")), "--deploy", deploy(tmp_path, context_length=65536))
    refusal = next(f for f in res["findings"] if f["code"] == "SGL001")
    assert rc == 1 and refusal["engine_error"]["class"] == "ValueError" and refusal["engine_error"]["stage"] == "startup"
    assert "User-specified context_length (65536) is greater than the derived context_length (32768)" in \
        refusal["engine_error"]["message"]


def test_qwen3_next_layer_types_shifted_are_not_what_sglang_builds(tmp_path):
    def shift(cfg: dict) -> None:  # attention one layer early: SGLang keeps (i + 1) % interval == 0
        every = cfg["full_attention_interval"]
        cfg["layer_types"] = ["full_attention" if (i + 2) % every == 0 else "linear_attention"
                              for i in range(cfg["num_hidden_layers"])]

    rc, res = result(str(make_model(tmp_path, "qwen3-next", checkpoint=False)))
    assert "SGL006" not in codes({"results": [res]})
    gdn = [r for r in res["layers"] if r["cache"] == "mamba"]
    assert gdn and all("state" in r for r in gdn)
    rc, res = result(str(make_model(tmp_path, "qwen3-next", shift, checkpoint=False, dirname="shifted")))
    found = [f for f in res["findings"] if f["code"] == "SGL006"]
    assert rc == 1 and found and all(f["severity"] == "error" for f in found)


@pytest.mark.skipif(not Path(SGLANG_PYTHON).exists(), reason="no SGLang 0.5.23 Python (goldens/README.md builds one)")
def test_pool_probe_on_sglangs_own_pools(tmp_path):
    rc, res = result(str(make_model(tmp_path, "gemma-3-1b-it", checkpoint=False)),
                     env={"KVDOCTOR_SGLANG_PYTHON": SGLANG_PYTHON})
    probe = res["info"]["sglang"]["pool_probe"]
    assert probe["startup"]["agree"] is True, probe
    assert probe["invariants"] and not any(probe["invariants"].values()), probe
    assert not [f for f in res["findings"] if f["code"] in ("SGL007", "SGL008")]


def _pool_context(tmp_path: Path, seen: dict, refusals: tuple = ()):
    """A Context whose pool-probe observation is what `seen` (the probe child's record) gives against the plan."""
    from kvdoctor.checks.context import Context
    from kvdoctor.engines.deploy import Deploy
    from kvdoctor.engines import profile
    from kvdoctor.engines.sglang.profile import PoolsRun
    from kvdoctor.engines.sglang import probe
    from kvdoctor.load.loader import load_model

    spec = load_model(str(make_model(tmp_path, "gpt-oss-20b", checkpoint=False)))
    deploy = Deploy()
    plan = profile("sglang").plan(spec, deploy.settings("sglang"))
    observed = PoolsRun(invariants=probe.invariants(seen, plan.layers), startup=probe.startup_agreement(seen, refusals))
    return Context(spec=spec, engine="sglang", deploy=deploy, plan=plan, observations={"sglang_pools": observed}), plan


def _faithful(plan) -> dict:
    """The record SGLang's pools give when every layer's canary lands where the plan says, in its own buffer."""
    return {"ok": True, "layers": {str(l.index): {"hits": [[l.extra["pool"], l.extra["pool_index"]]], "ptr": 1000 + l.index}
                                   for l in plan.layers if "pool" in l.extra}}


def test_pool_rule_fires_on_a_broken_invariant_and_stays_quiet_on_a_faithful_pool(tmp_path):
    from kvdoctor.checks import sglang_pools

    ctx, plan = _pool_context(tmp_path / "a", {"ok": True, "layers": {}})
    seen = _faithful(plan)
    ctx, _ = _pool_context(tmp_path / "b", seen)
    assert not list(sglang_pools.run(ctx))
    shared = dict(seen["layers"])
    shared["1"] = {**shared["1"], "ptr": shared["0"]["ptr"]}  # layer 1's accessor returns layer 0's buffer
    ctx, _ = _pool_context(tmp_path / "c", {**seen, "layers": shared})
    found = list(sglang_pools.run(ctx))
    assert [f.code for f in found] == ["SGL007"] and found[0].evidence["invariant"] == "aliasing"


def test_pool_rule_reports_a_startup_the_plan_did_not_predict(tmp_path):
    from kvdoctor.checks import sglang_pools

    ctx, plan = _pool_context(tmp_path / "a", {"ok": True, "layers": {}})
    refused = {"ok": False, "error": {"class": "ValueError", "message": "context_length is too large"},
               "layers": _faithful(plan)["layers"]}
    ctx, _ = _pool_context(tmp_path / "b", refused)
    found = list(sglang_pools.run(ctx))
    assert [f.code for f in found] == ["SGL008"]
    assert found[0].engine_error == {"class": "ValueError", "message": "context_length is too large", "stage": "startup"}


def test_text_keys_a_composite_config_ignores_are_an_error_with_a_quiet_twin(tmp_path):
    """Megatron-Bridge's Gemma-3 4B fixture states 34 layers at the top level of a `gemma3` (composite) config:
    SGLang served the class's default 26-layer text config (goldens/measured/sglang_check-set9.json). Moving the
    keys into text_config is quiet."""
    import json

    cfg = json.loads((Path(__file__).resolve().parent.parent / "fixtures" / "configs" / "fresh"
                      / "sgl9__google__gemma-3-4b-pt.json").read_text())
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "config.json").write_text(json.dumps(cfg, indent=2))
    rc, res = result(str(tmp_path / "flat"))
    [found] = [f for f in res["findings"] if f["code"] == "SGL251"]
    assert rc == 1 and found["severity"] == "error" and found["evidence"]["served"]["num_hidden_layers"] == 26
    assert found["evidence"]["stated"] == {"num_hidden_layers": 34} and found["line"] > 1
    nested = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
              "text_config": {**{k: v for k, v in cfg.items() if k not in ("architectures",)}, "model_type": "gemma3_text"}}
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "config.json").write_text(json.dumps(nested, indent=2))
    _, res = result(str(tmp_path / "nested"))
    assert "SGL251" not in codes({"results": [res]})
