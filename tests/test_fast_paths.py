"""The fast paths agree with the careful ones they stand in for: the column-wise header check with
the per-entry one, the no-file defaults with the pydantic models' defaults, the fewer-heads dry-run
shrink with the engine's signature. A static check without deploy file, config file or baseline
builds no pydantic model and imports no rich and no YAML parser."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kvdoctor.load import checkpoint
from kvdoctor.errors import InputError

DTYPES = sorted(checkpoint.DTYPE_BITS)


def careful(text: str, data_size: int):
    """What the per-entry path says of a header: its tensors, or the error message."""
    try:
        header = json.loads(text, object_pairs_hook=checkpoint._reject_duplicates,
                            parse_constant=checkpoint.reject_constant)
        if not isinstance(header, dict):
            return "not an object"
        return checkpoint._entries(Path("f"), header, data_start=8, data_size=data_size, label="f")
    except (InputError, ValueError, RecursionError) as exc:
        return f"error: {exc}"


entry = st.fixed_dictionaries({
    "dtype": st.one_of(st.sampled_from(DTYPES), st.sampled_from(["F17", 3, None])),
    "shape": st.one_of(st.lists(st.integers(0, 5), max_size=3), st.just([1.0]), st.just([True]), st.just([-1]),
                       st.just("2")),
    "data_offsets": st.one_of(st.just(None), st.lists(st.integers(-2, 40), min_size=2, max_size=2), st.just([0]),
                              st.just([0.0, 2])),
})


@st.composite
def headers(draw):
    """Mostly valid headers (contiguous spans), with a drawn fault now and then."""
    names = draw(st.lists(st.text("ab.\n\"", min_size=1, max_size=4), min_size=0, max_size=6))
    out, position = [], 0
    for name in names:
        dtype = draw(st.sampled_from(["F32", "BF16", "U8", "F4"]))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        numel = 1
        for d in shape:
            numel *= d
        size = numel * checkpoint.DTYPE_BITS[dtype] // 8
        item = {"dtype": dtype, "shape": shape, "data_offsets": [position, position + size]}
        position += size
        if draw(st.integers(0, 9)) == 0:
            item = draw(entry)
        out.append((name, item))
    if draw(st.booleans()):
        out.insert(draw(st.integers(0, len(out))), ("__metadata__", draw(st.sampled_from([{"a": "b"}, {"a": 1}, []]))))
    text = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in out) + "}"
    if draw(st.integers(0, 7)) == 0:
        text = draw(st.sampled_from(["[]", "{", '{"a": NaN}', text.replace("{", '{"k": 1, "k": 2, ', 1)]))
    return text, position + draw(st.sampled_from([0, 0, 0, 1]))


@settings(max_examples=400, deadline=None)
@given(headers())
def test_the_columnwise_check_accepts_exactly_what_the_per_entry_check_accepts(header):
    text, data_size = header
    fast = checkpoint._valid_entries(text.encode(), 8, data_size, "f")
    slow = careful(text, data_size)
    if fast is None:  # refused: the per-entry path then says why, as before, or takes an escaped name,
        # or metadata where safetensors' own writer does not put it
        assert isinstance(slow, str) or "\\" in text or (text.find('"__metadata__"') > 1)
    else:
        assert fast == slow


GOOD = '"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'


@pytest.mark.parametrize("text", [
    "{" + GOOD + "," + GOOD + "}",  # the same tensor twice
    '{"w":5,' + GOOD + "}",  # a name twice, the first not an entry
    '{"w":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}',  # a key twice inside an entry
    '{"w":{"dtype":"F32","shape":[9],"shape":[2],"data_offsets":[0,8]}}',
    '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,9],"data_offsets":[0,8]}}',
    '{"__metadata__":{"a":"b","a":"c"},' + GOOD + "}",  # a metadata key twice
    '{"__metadata__":{},"__metadata__":{},' + GOOD + "}",
    '{"\\u0077":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' + GOOD + "}",  # one name, two spellings
])
def test_a_name_given_twice_never_passes_the_columnwise_check(text):
    assert checkpoint._valid_entries(text.encode(), 8, 8, "f") is None
    assert careful(text, 8).startswith("error: ") and "twice" in careful(text, 8)


@pytest.mark.parametrize("text, data_size, readable", [
    ('{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}',
     16, False),  # an empty span inside another
    ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
     12, False),  # overlapping spans
    ('{"__metadata__":{"a":1},' + GOOD + "}", 8, False),  # metadata that is not all strings
    ('{"__metadata__":{"a":"}"},' + GOOD + "}", 8, True),  # a brace inside the metadata
    ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":"y"}}', 8, True),  # a key the format lacks
])
def test_what_the_per_entry_check_refuses_or_reads_itself_stays_off_the_fast_path(text, data_size, readable):
    assert checkpoint._valid_entries(text.encode(), 8, data_size, "f") is None
    assert isinstance(careful(text, data_size), dict) == readable


@pytest.mark.parametrize("text, data_size", [
    ('{"__metadata__":{"format":"pt"},' + GOOD + "}   ", 8),  # padded to 8 bytes with spaces, as safetensors does
    ('{"__metadata__":{"format":"pt"}}', 0), ("{" + GOOD + "}", 8),
    ('{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},' + GOOD + "}", 8),  # an empty tensor
])
def test_headers_as_safetensors_writes_them_take_the_fast_path(text, data_size):
    fast = checkpoint._valid_entries(text.encode(), 8, data_size, "f")
    assert fast is not None and fast == careful(text, data_size)


def test_a_real_layout_takes_the_columnwise_path(tmp_path):
    from helpers import make_model

    d = make_model(tmp_path, "gpt-oss-20b", shards=2)
    for f in sorted(d.glob("*.safetensors")):
        with f.open("rb") as fh:  # the header only: the data region is a hole of many GB
            (n,) = struct.unpack("<Q", fh.read(8))
            text = fh.read(n).decode()
        size = f.stat().st_size - 8 - n
        fast = checkpoint._valid_entries(text.encode(), 8 + n, size, "f")
        assert fast is not None and len(fast) > 10
        assert fast == careful(text, size)
    from kvdoctor.load.jsonfile import _plain_value

    index = (d / "model.safetensors.index.json").read_bytes()
    assert _plain_value(index) == (json.loads(index),)


def test_no_file_defaults_are_the_models_defaults():
    from kvdoctor.engines.deploy import Deploy
    from kvdoctor.engines.nodeploy import NoDeployFile
    from kvdoctor.cli.settings import NO_FILE
    from kvdoctor.cli.settings_file import FileSettings

    assert vars(NO_FILE) == FileSettings().model_dump()
    from kvdoctor.engines import check_engines

    real, light = Deploy(), NoDeployFile()
    for name in ("path", "engine", "context_length", "budget", "lines", "aliases", "warnings"):
        assert getattr(light, name) == getattr(real, name), name
    assert light.source("sglang_mlx.radix_cache") == real.source("sglang_mlx.radix_cache")
    for engine in check_engines():  # each section built on first read, with the profile's defaults
        section, expected = light.settings(engine), real.settings(engine)
        assert isinstance(section, type(expected)) and section.model_dump() == expected.model_dump(), engine


@pytest.mark.parametrize("extra, loaded", [((), set()), (("-j", "2"), set()),
                                           (("--deploy", "deploy.yaml"), {"pydantic", "yaml"})])
def test_static_check_builds_no_pydantic_model_without_a_deploy_file(tmp_path, extra, loaded):
    from helpers import make_model
    from import_probe import SIZING, probe

    d = make_model(tmp_path, "kimi-linear", shards=2, edit=lambda c: c.update(auto_map={"AutoModel": "m.M"}))
    (tmp_path / "deploy.yaml").write_text("context_length: 4096\n")
    run = probe(["check", str(d), "--static", "--format", "json", *extra],
                ("pydantic", "rich", "numpy", "yaml", *SIZING), cwd=tmp_path)
    assert "CFG010" in run.stdout  # a finding was reported, its catalog entry read without pydantic or YAML
    assert run.loaded == loaded  # nor any engine's budget model


@pytest.mark.parametrize("output_format", ["sarif", "junit", "gitlab", "github"])
def test_ci_formats_describe_their_rules_without_pydantic_or_yaml(tmp_path, output_format):
    """SARIF's rule descriptors (every checked rule's texts, fixes and references) and JUnit's test
    names come from the catalog's indexes, so a CI gate's report loads neither pydantic nor a YAML
    parser, as the JSON report does not."""
    from helpers import make_model
    from import_probe import probe

    d = make_model(tmp_path, "kimi-linear", shards=2, edit=lambda c: c.update(auto_map={"AutoModel": "m.M"}))
    run = probe(["check", str(d), "--static", "--format", output_format], ("pydantic", "yaml", "rich"), cwd=tmp_path)
    assert "CFG010" in run.stdout
    assert run.loaded == set()


def test_terminal_report_of_the_default_profile_looks_up_no_installed_version(tmp_path):
    """The rich report (the default format) compares the versions a profile describes with the installed
    ones (test_extras.py); hf, the default profile, describes none, so its report never loads
    importlib.metadata (16-34 ms of import)."""
    from helpers import make_model
    from import_probe import probe

    d = make_model(tmp_path, "gemma-2-2b", checkpoint=False)
    run = probe(["check", str(d), "--static"], ("importlib.metadata", "pydantic", "yaml"), cwd=tmp_path)
    assert "1 model(s)" in run.stdout and "engine      hf" in run.stdout
    assert run.loaded == set(), run.stderr[-2000:]


@pytest.mark.parametrize("value", ["0", "1025", "02", "+2", "two", "\u0662"])
def test_jobs_outside_the_plain_spelling_are_judged_by_the_strict_type(value):
    from typer.testing import CliRunner

    from kvdoctor.cli.app import app

    run = CliRunner().invoke(app, ["check", "x", "--static", "-j", value])
    if value in ("02", "+2"):  # what the strict type reads as 2: same as before the fast path
        assert "Invalid value for '--jobs'" not in run.output
    else:
        assert run.exit_code == 2 and "Invalid value for '--jobs'" in run.output, run.output


def test_help_imports_no_budget_model_and_budget_does():
    from import_probe import SIZING, probe

    assert probe(["--help"], SIZING).loaded == set()
    assert probe(["budget", "--help"], SIZING).loaded == set()  # the command's options, not its models
    model = str(Path(__file__).resolve().parents[1] / "fixtures" / "models" / "openai__gpt-oss-20b")
    run = probe(["budget", model, "--kv-budget", "40GiB", "--format", "json"], SIZING)
    assert run.returncode == 0 and run.loaded == set(SIZING)  # the probe sees these modules when they load


def test_rules_name_the_profile_constants_they_no_longer_import():
    from kvdoctor.checks import DRY_RUN, all_checks, pool, refusals, swa
    from kvdoctor.engines import PROFILES, dry_run_engines, profile_class
    from kvdoctor.engines.sglang_mlx.profile import POOL_MAP_SETTING, MaskRoutingProbe, PoolProbe

    assert swa.RULE.probes == (MaskRoutingProbe.name,)
    assert pool.RULE.probes == (PoolProbe.name,) and pool.SETTING == POOL_MAP_SETTING
    assert set(refusals.RULE.codes) == {code for name in PROFILES for code in profile_class(name).refusal_codes}
    readers = {name for check in all_checks() if DRY_RUN in check.rule.needs for name in PROFILES
               if check.rule.codes_for(name)}
    assert readers == set(dry_run_engines())  # every dry run is read by a rule, and no rule waits for a missing one


def test_fewer_heads_keeps_the_ratio_and_pins_the_head_dim():
    from kvdoctor.engines.sglang_mlx.dryrun import compact

    cfg = {"hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8}
    assert compact.head_factor(cfg) == 8
    assert compact.fewer_heads(cfg, 8) == {"hidden_size": 2880, "num_attention_heads": 8, "num_key_value_heads": 1,
                                          "head_dim": 45}
    assert compact.head_factor({"num_attention_heads": 12, "num_key_value_heads": 5}) == 1  # heads not in groups
    nested = {"num_attention_heads": 8, "num_key_value_heads": 4, "text_config": {"num_attention_heads": 8,
                                                                                  "num_key_value_heads": 2}}
    assert compact.head_factor(nested) == 1  # two sections that would need different factors


def test_fewer_heads_of_block_configs_keeps_the_group_sizes():
    """DeciLM's block_configs (Nemotron-NAS): the KV count of a block is heads / n_heads_in_group and
    num_key_value_heads is null; dividing the query heads by that count leaves one KV head a block."""
    from kvdoctor.engines.sglang_mlx.dryrun import compact

    def nas(*groups):
        return {"hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": None,
                "block_configs": [{"attention": {"n_heads_in_group": g, "no_op": g is None}} for g in groups]}

    assert compact.head_factor(nas(8, None, 8)) == 8
    assert compact.fewer_heads(nas(8, None), 8) == {**nas(8, None), "num_attention_heads": 8, "head_dim": 128}
    assert compact.head_factor(nas(8, 4)) == 1  # two KV counts: no one factor
    assert compact.head_factor(nas(None, None)) == 1  # no attention block
    assert compact.head_factor(nas(6)) == 1  # 64 heads are not in groups of 6


def _sig(heads, kv, window=128, other=None):
    mixers = [{"attr": "self_attn", "class": "Attention", "heads": heads, "kv_heads": kv, "head_dim": 64,
               "q_width": heads * 64, "k_width": kv * 64, "v_width": kv * 64}]
    if other:
        mixers.append(other)
    return {"num_layers": 1, "discovery_error": None, "window_map": {"0": window}, "container_window": None,
            "layers": [{"layer_class": "Block", "attention_attr": "self_attn", "sliding_flag": True, "mixers": mixers}]}


def test_the_scaled_signature_must_match_exactly():
    from kvdoctor.engines.sglang_mlx.dryrun.compact import matches_scaled

    linear = {"attr": "linear_attn", "class": "GDN", "heads": 32, "kv_heads": None, "head_dim": 128,
              "q_width": None, "k_width": None, "v_width": None}
    assert matches_scaled(_sig(64, 8, other=linear), _sig(8, 1, other=linear), 8)
    assert not matches_scaled(_sig(64, 8), _sig(64, 8), 8)  # nothing was scaled
    assert not matches_scaled(_sig(64, 8), _sig(16, 1), 8)  # the ratio changed
    assert not matches_scaled(_sig(64, 8), _sig(8, 1, window=64), 8)  # the engine's window moved
    assert not matches_scaled(_sig(64, 8, other=linear), _sig(8, 1, other={**linear, "heads": 16}), 8)  # 32 -> 16


def _pattern_sig(windows):
    """A signature whose layers differ only by window: None for full attention."""
    rows = [{"layer_class": "Block", "attention_attr": "self_attn", "sliding_flag": w is not None,
             "mixers": [{"attr": "self_attn", "heads": 40, "kv_heads": 8}]} for w in windows]
    return {"num_layers": len(rows), "discovery_error": None, "container_window": None, "layers": rows,
            "window_map": {str(i): w for i, w in enumerate(windows) if w is not None}}


def test_the_cut_copy_keeps_every_layer_kind_twice():
    from kvdoctor.engines.sglang_mlx.dryrun.compact import first_layers, layer_period

    full = _pattern_sig([4096, 4096, 4096, None] * 16)
    assert layer_period(full) == 8 and layer_period(full, repeats=1) == 4
    assert layer_period(_pattern_sig([None] * 8)) == 2
    assert layer_period(_pattern_sig([None] * 7 + [128])) == 8  # the one odd layer is last: nothing to cut
    assert layer_period(_pattern_sig([128] + [None] * 7)) == 3  # a kind the model has once is kept once
    dense = _pattern_sig([None] * 4)
    dense["layers"][0] = {**dense["layers"][0], "modules": ["mlp: MLP"]}  # a dense first layer, then experts
    for row in dense["layers"][1:]:
        row["modules"] = ["mlp: MoE", "mlp.switch_mlp: SwitchGLU"]
    assert layer_period(dense) == 3
    cut = first_layers(full, 8)
    assert cut["num_layers"] == 8 and cut["layers"] == full["layers"][:8]
    assert cut["window_map"] == {str(i): 4096 for i in range(8) if i % 4 != 3} and full["num_layers"] == 64


def test_the_cut_config_keeps_the_first_entry_of_every_per_layer_list():
    from kvdoctor.engines.sglang_mlx.dryrun.compact import fewer_layers

    cfg = {"num_hidden_layers": 64, "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "hidden_size": 64,
           "text_config": {"num_hidden_layers": 64, "layer_types": list(range(64))}, "mlp_only_layers": [0, 5]}
    cfg["layer_types"] = cfg["layer_types"] * 16
    cut = fewer_layers(cfg, 4)
    assert cut["num_hidden_layers"] == 4 and cut["layer_types"] == cfg["layer_types"][:4]
    assert cut["mlp_only_layers"] == [0, 5]  # not one entry a layer: left as it is
    assert cut["text_config"] == {"num_hidden_layers": 4, "layer_types": [0, 1, 2, 3]} and cfg["num_hidden_layers"] == 64
    assert fewer_layers({"num_hidden_layers": 4}, 4) is None


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**40, 10**40), st.floats(allow_nan=False),
              st.text("ab\"\\é", max_size=3)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text("ab", max_size=2), inner, max_size=3)),
    max_leaves=12)


@st.composite
def json_texts(draw):
    """JSON text, now and then with a key given twice, a NaN, deep nesting or an escape."""
    text = json.dumps(draw(json_values), ensure_ascii=draw(st.booleans()))
    fault = draw(st.integers(0, 5))
    if fault == 0:
        text = '{"k": 1, "k": ' + text + "}"
    elif fault == 1:
        text = "[" * draw(st.integers(60, 70)) + text + "]" * draw(st.integers(60, 70))
    elif fault == 2:
        text = '{"n": NaN, "v": ' + text + "}"
    return text


@settings(max_examples=300, deadline=None)
@given(json_texts())
def test_a_large_index_read_by_msgspec_is_what_the_careful_reading_gives(text):
    import tempfile

    from kvdoctor.load import jsonfile

    def read(path: Path) -> object:
        try:
            return jsonfile.load_json(path, "JSON", with_lines=False)[0]
        except InputError as exc:
            return str(exc)

    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        path = Path(folder) / "index.json"
        path.write_text(text, encoding="utf-8")
        fast = jsonfile._plain_value(text.encode("utf-8"))
        either = read(path)
        patch.setattr(jsonfile, "_plain_value", lambda data: None)
        careful_value = read(path)
    if fast is not None:
        assert fast[0] == careful_value == either
    else:  # the careful path decided both times
        assert repr(either) == repr(careful_value)


_NAME_PARTS = st.sampled_from(["model.", "language_model.model.", "backbone.", "transformer.", "lm_head.",
                               "layers.", "h.", "mlp.", "7.", "12.", "x", "\n", ".", ""])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_NAME_PARTS, max_size=6).map("".join), max_size=30))
def test_one_pass_over_all_names_finds_the_layer_numbers_one_match_a_name_finds(names):
    """CKPT002's layer numbers come from one regex pass over the joined names; each name matched on its
    own must give the same numbers, in the same order (names holding a newline included)."""
    from kvdoctor.checks.ckpt import LAYER_RE, _layer_numbers

    assert _layer_numbers(names) == [m.group(1) for name in names if (m := LAYER_RE.match(name))]


@pytest.mark.parametrize("args, said", [(["check", "{model}", "--static", "--format", "json"], '"model_type": "kimi_linear"'),
                                        (["check", "{model}", "--static", "--format", "nope"], "--format 'nope'"),
                                        (["rules"], "CKPT001"), (["--version"], "kvdoctor")])
def test_the_modules_a_command_loads_are_frozen_and_the_collector_is_back_on(tmp_path, args, said):
    """The collector is paused while a command's modules load (collector.py); whichever way the command
    ends, and through argv.py or typer, it is on again and what loaded is frozen."""
    from helpers import make_model
    from import_probe import probe

    d = make_model(tmp_path, "kimi-linear", shards=2)
    run = probe([a.format(model=d) for a in args], (), cwd=tmp_path)
    assert said in run.stdout + run.stderr
    assert run.collector_on and run.frozen > 10_000


@pytest.mark.parametrize("args, loaded_last", [(["check", "{model}", "--static", "--format", "json"], "kvdoctor.fleet.runner"),
                                               (["rules"], "kvdoctor.cli.app")])
def test_the_collector_runs_only_once_the_commands_modules_are_loaded(tmp_path, args, loaded_last):
    """No collection while the modules load (the last one run_check or typer's tree needs), and the
    collector is on for the work itself."""
    from helpers import make_model
    from import_probe import probe

    d = make_model(tmp_path, "kimi-linear", shards=2)
    run = probe([a.format(model=d) for a in args], (loaded_last,), cwd=tmp_path)
    assert run.collections and all(loaded == [loaded_last] for loaded in run.collections), run.collections


def test_a_healthy_models_static_check_loads_no_hash_traceback_or_copy_module(tmp_path):
    """hashlib (OpenSSL) is loaded only where used: for a finding's fingerprint (traceback, copy,
    inspect and typing_extensions come with typer, which reads every command line)."""
    from helpers import make_model
    from import_probe import probe

    d = make_model(tmp_path, "llama-3.1-8b", shards=2)
    watched = ("hashlib",)
    run = probe(["check", str(d), "--static", "--format", "json"], watched, cwd=tmp_path)
    assert json.loads(run.stdout)["results"][0]["findings"] == []
    assert run.loaded == set()


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_fingerprints_and_the_workers_warm_up_load_no_openssl(tmp_path, jobs):
    """A model with findings gets its fingerprints from CPython's own SHA-256, in the checking
    process (-j 1) and in forked workers, whose parent loads it before the fork (-j 2): hashlib,
    and OpenSSL with it, stays unloaded."""
    from helpers import make_model
    from import_probe import probe

    for name in ("llama-3.1-8b", "qwen2.5-7b"):
        make_model(tmp_path, name, edit=lambda cfg: cfg.update(num_key_value_heads=2), dirname=f"fleet/{name}")
    run = probe(["check", str(tmp_path / "fleet"), "--static", "--format", "json", "-j", jobs], ("hashlib",),
                cwd=tmp_path)
    results = json.loads(run.stdout)["results"]
    assert len(results) == 2 and all(r["findings"] and r["findings"][0]["fingerprint"] for r in results)
    assert run.loaded == set()


def test_the_builtin_sha256_gives_hashlibs_digests():
    import hashlib

    from kvdoctor.report.fingerprint import fingerprint, sha256

    for data in (b"", b"abc", "CKPT001\x1fmodels/llama\x1fhf\x1fmodel\x1fk_proj".encode() * 100):
        assert sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()
    parts = {"code": "CKPT001", "model": "models/llama", "engine": "hf", "group": "full", "key": "k"}
    text = "\x1f".join(parts[k] for k in ("code", "model", "engine", "group", "key"))
    assert fingerprint(parts) == hashlib.sha256(text.encode()).hexdigest()[:24]


HEADERS = [b'{"w": {"dtype": "BF16", "shape": [4, 2], "data_offsets": [0, 16]}}',
           b'{"w": {"dtype": "BF17", "shape": [4], "data_offsets": [0, 8]}}',
           b'{"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}',
           b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "extra": 1}}',
           b'{"w": {"dtype": "F32", "shape": [' + b",".join([b"1"] * 65) + b'], "data_offsets": [0, 4]}}',
           b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}']


def _decoded(header: bytes) -> str:
    import msgspec

    try:
        return repr(checkpoint._HEADER.decode(header))
    except msgspec.ValidationError as exc:
        return f"ValidationError: {exc}"


def test_a_tensor_in_two_shards_and_one_mapped_elsewhere_are_named_with_their_files(tmp_path):
    """The shard-level checks that run in C on the usual path still name the tensor and both files."""
    from helpers import make_model

    from kvdoctor.load.synth import layout_for, write_safetensors

    d = make_model(tmp_path, "llama-3.1-8b", shards=2)
    index_path = d / checkpoint.INDEX_NAME
    index = json.loads(index_path.read_text())
    first, second = sorted(set(index["weight_map"].values()))
    name = next(n for n, s in index["weight_map"].items() if s == first)

    moved = {**index, "weight_map": {**index["weight_map"], name: second}}
    index_path.write_text(json.dumps(moved))
    with pytest.raises(InputError, match=f"tensor '?{name}'? is mapped to {second} but stored in {first}"):
        checkpoint.load_checkpoint(d, library_check=False)

    index_path.write_text(json.dumps(index))
    layout = layout_for(d)
    write_safetensors(d / second, {**{n: v for n, v in layout.items() if index["weight_map"][n] == second},
                                   name: layout[name]})
    with pytest.raises(InputError, match=f"{second}: tensor '?{name}'? is also stored in {first}"):
        checkpoint.load_checkpoint(d, library_check=False)


ENTRY = """
import atexit, os, sys
class Marker:  # freed only as the interpreter is torn down
    def __del__(self, write=os.write):
        write(2, b"torn down\\n")
sys.teardown_marker = Marker()
if sys.argv[1] == "hook":
    atexit.register(lambda: os.write(2, b"hook ran\\n"))
sys.argv = ["kvdoctor", *sys.argv[2:]]
from kvdoctor.cli.main import entry
entry()
"""


@pytest.mark.parametrize("hook", [False, True])
def test_the_command_skips_the_teardown_only_where_nothing_waits_for_the_exit(tmp_path, hook):
    """`kvdoctor` ends with os._exit once its output is flushed, unless an exit hook is registered:
    then the usual exit runs it (and tears down). The exit code and the whole output are the same."""
    import subprocess
    import sys

    from helpers import make_model

    d = make_model(tmp_path, "kimi-linear", shards=2)
    out = tmp_path / "out.json"
    with out.open("w") as fh:
        proc = subprocess.run([sys.executable, "-c", ENTRY, "hook" if hook else "-", "check", str(d), "--static",
                               "--format", "json", "--fail-on", "info"], stdout=fh, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 1  # CFG010 (info) fails at --fail-on info
    assert json.loads(out.read_text())["results"][0]["findings"][0]["code"] == "CFG010"
    assert ("hook ran" in proc.stderr) == hook and ("torn down" in proc.stderr) == hook


def test_a_profiler_of_the_command_still_writes_its_results(tmp_path):
    """Under `python -m cProfile -o FILE -m kvdoctor`, the profile is written after the command
    returns: the command must return to it rather than leave through os._exit."""
    import pstats
    import subprocess
    import sys

    from helpers import make_model

    d = make_model(tmp_path, "kimi-linear", shards=2)
    profile = tmp_path / "check.prof"
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "kvdoctor", "check", str(d),
                    "--static", "--format", "json"], capture_output=True, check=True)
    functions = {name for _, _, name in pstats.Stats(str(profile)).stats}
    assert "run_check" in functions
