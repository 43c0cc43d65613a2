"""Property tests (hypothesis): generated malformed configs, headers, index files, deploy files and
catalog entries end in exit 2 with one line naming the file, or in a normal result; never another
exit code, never a traceback, never a write to the model directory.

Most properties run in-process (the real CLI entry point, or the loading functions) because a
subprocess per example would be too slow on a shared 2-core box; a few examples go through the
real CLI in a subprocess.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest
import yaml
from badinput_base import tiny_config, tree_state
from badinput_gen import GOOD_ENTRY
from helpers import REAL, REAL_NAMES, run
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from kvdoctor.catalog import load_entry
from kvdoctor.load.checkpoint import DTYPE_BITS, INDEX_NAME, load_checkpoint
from kvdoctor.engines.deploy import load_deploy
from kvdoctor.errors import InputError
from kvdoctor.load.families import BY_MODEL_TYPE
from kvdoctor.load.synth import layout_for, write_checkpoint, write_safetensors

SETTINGS = settings(max_examples=40, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# --- values ----------------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.sampled_from([0, -1, 1, 2**31, 2**40, 2**63])
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
CONFIG_KEYS = ["model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "hidden_size", "vocab_size", "sliding_window", "layer_types", "sliding_window_pattern",
               "use_sliding_window", "max_window_layers", "text_config", "linear_attn_config",
               "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
               "linear_value_head_dim", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
               "hybrid_override_pattern", "layers_block_type", "attn_layer_period", "attn_layer_offset",
               "attention_chunk_size", "torch_dtype", "auto_map", "num_nextn_predict_layers", "window_size",
               "tie_word_embeddings", "rope_scaling", "max_position_embeddings"]
LAC_KEYS = ["num_heads", "head_dim", "kda_layers", "full_attn_layers", "short_conv_kernel_size"]
model_types = st.sampled_from(sorted(BY_MODEL_TYPE)) | st.text(max_size=10)
key_values = st.one_of(
    st.tuples(st.sampled_from(CONFIG_KEYS) | st.text(max_size=10), values),
    st.tuples(st.just("model_type"), model_types),
    st.tuples(st.just("layer_types"), st.lists(st.sampled_from(
        ["full_attention", "sliding_attention", "linear_attention", "chunked_attention", "mamba", "x"]) | values,
        max_size=70)),
    st.tuples(st.just("linear_attn_config"), st.dictionaries(st.sampled_from(LAC_KEYS), values | st.lists(
        st.integers(-3, 70), max_size=30), max_size=5)),
    st.tuples(st.sampled_from(["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                               "sliding_window", "hidden_size"]), st.integers(-5, 70_000)),
)
edits = st.lists(key_values, min_size=1, max_size=6)


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`kvdoctor ARGS` through the real entry point, in this process."""
    from kvdoctor.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["kvdoctor", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
        rc = 0
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        sys.argv = saved
    return rc, out.getvalue(), err.getvalue()


def assert_clean_outcome(rc: int, out: str, err: str, names: str) -> None:
    assert "Traceback" not in out + err
    assert rc in (0, 1, 2), (rc, err)
    event(f"exit {rc}")
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and names in lines[0], err
    else:
        json.loads(out)  # a complete report


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A model dir with a sparse checkpoint for every real config, built once; examples hard-link
    its files into a fresh dir (inside that dir: no symlinks leading out)."""
    root = tmp_path_factory.mktemp("bases")
    out = {}
    for name in REAL_NAMES:
        d = root / name
        d.mkdir()
        shutil.copy(REAL / name / "config.json", d / "config.json")
        write_checkpoint(d, layout_for(d))
        out[name] = d
    return out


def fresh_copy(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "config.json":
            os.link(f, dst / f.name)
    return dst


# --- config.json ------------------------------------------------------------------------------------

@SETTINGS
@given(base=st.sampled_from(REAL_NAMES), changes=edits, nested=st.booleans())
def test_generated_configs(base, changes, nested, checkpoints, tmp_path):
    m = fresh_copy(checkpoints[base], tmp_path / "m")
    cfg = json.loads((REAL / base / "config.json").read_text())
    target = cfg["text_config"] if nested and isinstance(cfg.get("text_config"), dict) else cfg
    for key, value in changes:
        target[key] = value
    (m / "config.json").write_text(json.dumps(cfg, indent=2))  # NaN / Infinity tokens included
    before = tree_state(m)
    assert_clean_outcome(*cli("check", "--format", "json", str(m)), names="config.json")
    assert tree_state(m) == before


@SETTINGS
@given(cut=st.integers(0, 4000), insert=st.binary(max_size=8), flip=st.integers(0, 4000))
def test_corrupted_config_bytes(cut, insert, flip, checkpoints, tmp_path):
    m = fresh_copy(checkpoints["openai__gpt-oss-20b"], tmp_path / "m")
    text = bytearray((REAL / "openai__gpt-oss-20b" / "config.json").read_bytes())
    if flip < len(text):
        text[flip] ^= 0x5A
    text = text[:cut] + insert + text[cut:] if cut < len(text) else text
    (m / "config.json").write_bytes(bytes(text))
    before = tree_state(m)
    assert_clean_outcome(*cli("check", "--format", "json", str(m)), names="config.json")
    assert tree_state(m) == before


# --- safetensors headers ----------------------------------------------------------------------------

dtypes = st.sampled_from(sorted(DTYPE_BITS)) | st.sampled_from(["f32", "Q7", "", "F8"]) | values
shapes = st.lists(st.integers(0, 6), max_size=3) | st.lists(st.integers(-2, 2**62), max_size=3) | values


@st.composite
def headers(draw):
    """Near-valid headers: entries with real dtypes and shapes whose offsets are right, or nudged."""
    header: dict = {}
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2) | values)
    offset = 0
    for i in range(draw(st.integers(0, 5))):
        dtype, shape = draw(dtypes), draw(shapes)
        if (isinstance(dtype, str) and dtype in DTYPE_BITS and isinstance(shape, list)
                and all(type(d) is int for d in shape)):
            size = math.prod(shape) * DTYPE_BITS[dtype] // 8
        else:
            size = draw(st.integers(0, 16))
        begin = offset + draw(st.sampled_from([0, 0, 0, -1, 1]))
        end = begin + size + draw(st.sampled_from([0, 0, 0, -1, 1]))
        offsets = draw(st.sampled_from([[begin, end], [end, begin], [begin], "x", [begin, end, 0]]))
        entry = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        if draw(st.integers(0, 9)) == 0:
            entry.pop(draw(st.sampled_from(sorted(entry))))
        header[draw(st.text(max_size=6)) if draw(st.booleans()) else f"t{i}"] = entry
        offset = max(offset, end if isinstance(end, int) else offset)
    return header, max(0, offset + draw(st.sampled_from([0, 0, -1, 3])))


@SETTINGS
@given(spec=headers())
def test_generated_headers(spec, tmp_path):
    header, data = spec
    d = tmp_path / "m"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    raw = json.dumps(header).encode()
    assume(data < 1 << 20)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data)
    before = tree_state(d)
    try:
        ckpt = load_checkpoint(d)
    except InputError as exc:
        event("refused")
        assert "\n" not in str(exc) and "model.safetensors" in str(exc)
    else:
        event("accepted")
        # Accepted: then the safetensors library reads exactly the same tensors.
        from safetensors import safe_open

        with safe_open(str(d / "model.safetensors"), framework="np") as f:
            assert sorted(f.keys()) == sorted(ckpt.tensors)
            for name, info in ckpt.tensors.items():
                assert tuple(f.get_slice(name).get_shape()) == info.shape
                assert f.get_slice(name).get_dtype() == info.dtype
    assert tree_state(d) == before


@SETTINGS
@given(cut=st.integers(0, 600), flips=st.lists(st.tuples(st.integers(0, 600), st.integers(1, 255)), max_size=3),
       prefix=st.none() | st.integers(0, 2**64 - 1))
def test_corrupted_header_bytes(cut, flips, prefix, tmp_path):
    d = tmp_path / "m"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    write_safetensors(d / "model.safetensors", {"a.weight": ("BF16", [4, 8]), "b.bias": ("F32", [3])})
    data = bytearray((d / "model.safetensors").read_bytes())
    if prefix is not None:
        data[:8] = struct.pack("<Q", prefix)
    for at, mask in flips:
        if at < len(data):
            data[at] ^= mask
    (d / "model.safetensors").write_bytes(bytes(data[:cut]) if cut < len(data) else bytes(data))
    before = tree_state(d)
    try:
        load_checkpoint(d)
        event("accepted")
    except InputError as exc:
        event("refused")
        assert "\n" not in str(exc) and "model.safetensors" in str(exc)
    assert tree_state(d) == before


# --- model.safetensors.index.json -------------------------------------------------------------------

shard_names = st.sampled_from(["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                               "model-00009-of-00009.safetensors", "../model-00001-of-00002.safetensors",
                               "/etc/passwd", "config.json", "sub/x.safetensors", "", "."]) | values


@SETTINGS
@given(entries=st.dictionaries(st.sampled_from(["model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"])
                               | st.text(max_size=8), shard_names, max_size=6),
       shape=st.sampled_from(["object", "list", "missing", "extra-keys"]))
def test_generated_index(entries, shape, tmp_path):
    d = tmp_path / "m"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    (d / "config.json").write_text(json.dumps(tiny_config()))
    write_checkpoint(d, layout_for(d), shards=2)
    index = {"object": {"weight_map": entries}, "list": [entries], "missing": {"metadata": entries},
             "extra-keys": {"metadata": {"total_size": 1}, "weight_map": entries, "x": entries}}[shape]
    (d / INDEX_NAME).write_text(json.dumps(index))
    before = tree_state(d)
    try:
        ckpt = load_checkpoint(d)
    except InputError as exc:
        event("refused")
        assert "\n" not in str(exc) and ".safetensors" in str(exc)
    else:
        event("accepted")
        assert set(ckpt.missing_shards) <= set(entries.values())
        assert all((d / f).is_file() and (d / f).resolve().parent == d.resolve() for f in ckpt.files)
    assert tree_state(d) == before


# --- deploy files and catalog entries ---------------------------------------------------------------

DEPLOY_KEYS = ["engine", "context_length", "sglang_mlx", "sglang", "chunked_prefill_size", "radix_cache",
               "pool_size", "full_kv_pool_index_by_layer", "tp_size", "mamba_ssm_dtype", "kda_recipe"]
yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(DEPLOY_KEYS) | st.text(max_size=6),
                                                                inner, max_size=3), max_leaves=10)
yaml_noise = st.sampled_from(["", "!!python/object/apply:os.system ['true']\n", "&a [1]\n", "*a\n", "\t", "---\n",
                              "!!binary aGVsbG8=\n", "? [a, b]\n: 1\n", "<<: *x\n", "- [\n", "{a: 1, a: 2}\n"])


@SETTINGS
@given(data=yaml_values, noise=yaml_noise, at=st.integers(0, 200))
def test_generated_deploy_files(data, noise, at, tmp_path):
    text = yaml.safe_dump(data, sort_keys=False)
    text = text[:at] + noise + text[at:]
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    try:
        load_deploy(str(path))
        event("accepted")
    except InputError as exc:
        event("refused")
        assert "\n" not in str(exc) and "deploy.yaml" in str(exc)


@SETTINGS
@given(changes=st.dictionaries(st.sampled_from(["code", "name", "severity", "summary", "engines", "error",
                                                "meaning", "triggers", "fixes", "check", "tags", "extra"]),
                               yaml_values, max_size=3),
       noise=yaml_noise, at=st.integers(0, 400))
def test_generated_catalog_entries(changes, noise, at, tmp_path):
    entry = yaml.safe_load(GOOD_ENTRY)
    entry.update(changes)
    text = yaml.safe_dump(entry, sort_keys=False)
    text = text[:at] + noise + text[at:]
    path = tmp_path / "USR001.yaml"
    path.write_text(text)
    try:
        load_entry(path)
        event("accepted")
    except InputError as exc:
        event("refused")
        assert "\n" not in str(exc) and "USR001.yaml" in str(exc)


# --- strict settings and command-line values ----------------------------------------------------------

# (dotted key, type, lowest, highest, optional): a value is accepted exactly when it has this type
# (a bool is no int, an int is no bool) and lies in the range, and it is then read back unchanged.
STRICT_FIELDS = [("context_length", int, 1, 1 << 26, True), ("sglang_mlx.chunked_prefill_size", int, 1, 1 << 26, True),
                 ("sglang_mlx.pool_size", int, 1, 1 << 24, True), ("sglang.tp_size", int, 1, 1024, True),
                 ("sglang.linear_replayssm_cache_len", int, -(1 << 40), 1 << 16, False),  # KDA062 reports < 1
                 ("sglang_mlx.radix_cache", bool, None, None, False),
                 ("sglang.enable_linear_replayssm", bool, None, None, False)]
strict_values = (st.none() | st.booleans() | st.integers(-2**40, 2**40)
                 | st.sampled_from([0, 1, 1024, 1025, 1 << 24, 1 << 26, (1 << 26) + 1])
                 | st.floats(allow_nan=True, allow_infinity=True) | st.text(alphabet="abxyz -", max_size=6))


@SETTINGS
@given(field=st.sampled_from(STRICT_FIELDS), value=strict_values)
def test_strict_deploy_values(field, value, tmp_path):
    dotted, kind, lo, hi, optional = field
    section, _, key = dotted.rpartition(".")
    data = {section: {key: value}} if section else {key: value}
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(data))
    right = (value is None and optional) or (type(value) is kind and (lo is None or lo <= value <= hi))
    try:
        deploy = load_deploy(str(path))
    except InputError as exc:
        event("refused")
        assert not right, str(exc)
        assert "\n" not in str(exc) and "deploy.yaml:" in str(exc) and f"'{dotted}'" in str(exc)
    else:
        event("accepted")
        assert right, value
        got = getattr(deploy.settings(section.replace("_", "-")), key) if section else getattr(deploy, key)
        assert got == value and type(got) is type(value)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(["--jobs", "--dry-run-timeout", "--dry-run-budget"]),
       value=st.text(max_size=8) | st.sampled_from(["0", "-1", "nan", "inf", "1e400", "1", "2.5", "1024", "86400"]))
def test_command_line_values(option, value, tmp_path_factory):
    """Whatever the value, one line and exit 2, or a normal run; a number is taken exactly when it is
    finite and in range (--jobs: a whole number from 1 to 1024; seconds: from 1 to 86,400)."""
    m = tmp_path_factory.getbasetemp() / "cli-model"
    if not m.exists():
        m.mkdir()
        (m / "config.json").write_text(json.dumps(tiny_config()))
    assume("\0" not in value)  # no argv can carry a NUL
    rc, out, err = cli("check", "--static", "--format", "json", option, value, str(m))
    assert "Traceback" not in out + err
    try:
        number = int(value) if option == "--jobs" else float(value)
        right = (1 <= number <= 1024) if option == "--jobs" else (math.isfinite(number) and 1 <= number <= 86400)
    except ValueError:
        right = False
    if option == "--jobs" and right:
        right = value.strip().lstrip("+-").isdigit()  # "1_0" is int() to Python, not a count to us
    if right:
        assert rc in (0, 1), err
    else:
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"kvdoctor: error: {option} "), err


# --- a few through the real CLI, in a subprocess ----------------------------------------------------

@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=edits)
def test_generated_configs_through_the_real_cli(changes, checkpoints, tmp_path):
    m = fresh_copy(checkpoints["google__gemma-3-1b-it"], tmp_path / "m")
    cfg = json.loads((REAL / "google__gemma-3-1b-it" / "config.json").read_text())
    cfg.update(dict(changes))
    (m / "config.json").write_text(json.dumps(cfg))
    before = tree_state(m)
    proc = run("check", "--format", "json", str(m))
    assert_clean_outcome(proc.returncode, proc.stdout, proc.stderr, names="config.json")
    assert tree_state(m) == before
