"""A corpus of malformed and hostile inputs, each built on demand into a temporary directory.

Every case starts from a small, healthy model (a real Llama config scaled down, with a real-format
sparse checkpoint) and breaks one thing: config.json, a safetensors header, the shard index, a
deploy file, the file system around them, or the local Hugging Face cache. A case says what the
check must end in: an input error (exit 2) whose one line names `names`, or a named finding.
Catalog cases are separate (`CATALOG_CASES`): user catalogs are loaded by `load_catalog`.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Callable

from badinput_base import (INDEX, ONE, Built, base_model, case, config_case, deploy_case, hf_repo, st_bytes,
                           tiny_config)

from kvdoctor.load.synth import layout_for, write_safetensors


# --- config.json ------------------------------------------------------------------------------------

def _config_edit(id: str, edit: Callable[[dict], None], code: str | None = None) -> None:
    @case("config", id)
    def build(tmp: Path) -> Built:
        m = base_model(tmp)
        cfg = tiny_config()
        edit(cfg)
        (m / "config.json").write_text(json.dumps(cfg, indent=2))
        return Built(str(m), m, None if code else "config.json", code)


def _set(**values: Any) -> Callable[[dict], None]:
    return lambda cfg: cfg.update(values)


def _drop(*keys: str) -> Callable[[dict], None]:
    return lambda cfg: [cfg.pop(k, None) for k in keys]


GOOD_TEXT = json.dumps(tiny_config())
for _id, _text in [
    ("empty", ""), ("whitespace", "   \n"), ("truncated", GOOD_TEXT[: len(GOOD_TEXT) // 2]),
    ("trailing-comma", '{"model_type": "llama", "num_hidden_layers": 2,}'),
    ("single-quotes", "{'model_type': 'llama'}"), ("comment", '{"model_type": "llama" // c\n}'),
    # Python's json (and transformers) reads non-finite numbers; in a size they are input errors.
    ("nan", '{"model_type": "llama", "num_hidden_layers": NaN}'),
    ("infinity", '{"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": Infinity}'),
    ("minus-infinity", '{"model_type": "llama", "num_hidden_layers": 2, "head_dim": -Infinity}'),
    ("float-overflow", '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 1e999}'),
    ("int-5000-digits", '{"model_type": "llama", "num_hidden_layers": ' + "9" * 5000 + "}"),
    ("top-level-list", "[1, 2]"), ("top-level-string", '"llama"'), ("top-level-null", "null"),
    ("top-level-number", "42"), ("two-documents", GOOD_TEXT + GOOD_TEXT),
    ("duplicate-key", '{"model_type": "llama", "num_hidden_layers": 2, "num_hidden_layers": 3}'),
    ("duplicate-nested-key",
     '{"model_type": "llama", "num_hidden_layers": 2, "rope_scaling": {"factor": 1, "factor": 2}}'),
    ("nesting-65", '{"model_type": "llama", "x": ' + "[" * 65 + "]" * 65 + "}"),
    ("nesting-100000", '{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ("lone-surrogate-escape", '{"model_type": "\\ud800"}'),
    ("lone-surrogate-in-value", GOOD_TEXT[:-1] + ', "layer_types": ["\\udcff", "full_attention"]}'),
]:
    config_case("config", _id, _text)
for _id, _bytes in [
    ("bom", b"\xef\xbb\xbf" + GOOD_TEXT.encode()),
    ("latin1", '{"model_type": "llama", "n": "caf\xe9"}'.encode("latin-1")),
    ("utf16", GOOD_TEXT.encode("utf-16")), ("nul-bytes", b"\0" * 64), ("random-binary", bytes(range(256)) * 4),
]:
    config_case("config", _id, _bytes)

for _id, _edit in [
    ("no-model-type", _drop("model_type")), ("model-type-int", _set(model_type=5)),
    ("model-type-list", _set(model_type=["llama"])), ("model-type-path", _set(model_type="../../etc/passwd")),
    ("model-type-dotted", _set(model_type="llama.evil")), ("model-type-long", _set(model_type="a" * 200)),
    ("layers-zero", _set(num_hidden_layers=0)), ("layers-negative", _set(num_hidden_layers=-2)),
    ("layers-absurd", _set(num_hidden_layers=10**9)), ("layers-string", _set(num_hidden_layers="2")),
    ("layers-float", _set(num_hidden_layers=2.5)), ("layers-bool", _set(num_hidden_layers=True)),
    ("layers-missing-unknown-family", lambda c: (c.pop("num_hidden_layers"), c.update(model_type="mystery"))),
    ("heads-zero", _set(num_attention_heads=0)), ("heads-negative", _set(num_attention_heads=-4)),
    ("heads-absurd", _set(num_attention_heads=10**6)), ("heads-string", _set(num_attention_heads="4")),
    ("kv-heads-zero", _set(num_key_value_heads=0)), ("kv-heads-list", _set(num_key_value_heads=[2])),
    ("kv-heads-absurd", _set(num_key_value_heads=1 << 40)),
    ("head-dim-zero", _set(head_dim=0)), ("head-dim-float", _set(head_dim=16.0)),
    ("head-dim-absurd", _set(head_dim=1 << 30)), ("head-dim-derived-zero", _set(hidden_size=2)),
    ("hidden-negative", _set(hidden_size=-64)), ("hidden-object", _set(hidden_size={"x": 1})),
    ("vocab-zero", _set(vocab_size=0)), ("vocab-float", _set(vocab_size=256.0)),
    ("window-zero", _set(model_type="mistral", sliding_window=0)),
    ("window-negative", _set(model_type="mistral", sliding_window=-1)),
    ("window-string", _set(model_type="mistral", sliding_window="4096")),
    ("window-bool", _set(model_type="mistral", sliding_window=True)),
    ("window-absurd", _set(model_type="mistral", sliding_window=1 << 50)),
    ("chunk-string", _set(attention_chunk_size="8192")),
    ("max-positions-negative", _set(max_position_embeddings=-1)),
    ("text-config-list", _set(text_config=[1, 2])), ("text-config-string", _set(text_config="llama")),
    ("text-config-bad-heads", _set(text_config={"model_type": "llama", "num_hidden_layers": 2,
                                                "num_attention_heads": -1})),
    ("kimi-heads-absurd", lambda c: c.update(model_type="kimi_linear", linear_attn_config={
        "num_heads": 10**7, "head_dim": 128, "kda_layers": [1], "full_attn_layers": [2]})),
    ("kimi-head-dim-string", lambda c: c.update(model_type="kimi_linear", linear_attn_config={
        "num_heads": 4, "head_dim": "128", "kda_layers": [1], "full_attn_layers": [2]})),
    ("gdn-heads-zero", _set(model_type="qwen3_next", linear_num_key_heads=0, linear_num_value_heads=4,
                            linear_key_head_dim=16, linear_value_head_dim=16)),
    ("mla-rank-string", _set(model_type="kimi_linear", kv_lora_rank="512")),
    ("mla-rope-negative", _set(model_type="kimi_linear", qk_rope_head_dim=-64)),
    ("conv-kernel-absurd", _set(model_type="qwen3_next", linear_conv_kernel_dim=10**6)),
]:
    _config_edit(_id, _edit)

_config_edit("layer-types-million", _set(layer_types=["x"] * 1_000_000))
_config_edit("kda-layers-million", lambda c: c.update(model_type="kimi_linear", linear_attn_config={
    "num_heads": 4, "head_dim": 16, "kda_layers": [1] * 1_000_000, "full_attn_layers": [2]}))
_config_edit("pattern-string-huge", _set(model_type="nemotron_h", hybrid_override_pattern="M*" * 100_000))

# Structurally odd but well-formed configs: a finding, not an input error.
_config_edit("layer-types-objects", _set(layer_types=[{"x": 1}, {"y": 2}]), code="CFG002")
_config_edit("layer-types-lists", _set(layer_types=[[1], [2]]), code="CFG002")
_config_edit("layer-types-number", _set(layer_types=7), code="CFG002")
_config_edit("layer-types-short", _set(layer_types=["full_attention"]), code="CFG001")
_config_edit("auto-map", _set(auto_map={"AutoModel": "modeling_evil.Evil"}, trust_remote_code=True), code="CFG010")
_config_edit("unknown-model-type", _set(model_type="mystery"), code="CFG009")


@case("config", "huge-file")
def _huge_config(tmp: Path) -> Built:
    m = base_model(tmp)
    with (m / "config.json").open("r+b") as fh:
        fh.truncate(64 * 1024 * 1024)  # sparse: refused by size before a byte is read
    return Built(str(m), m, "config.json")


# --- safetensors headers ----------------------------------------------------------------------------

def _header(id: str, content: bytes) -> None:
    @case("header", id)
    def build(tmp: Path) -> Built:
        m = base_model(tmp, checkpoint=False)
        (m / "model.safetensors").write_bytes(content)
        return Built(str(m), m, "model.safetensors")


def _entry(**fields: Any) -> dict:
    return {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], **fields}}


for _id, _content in [
    ("empty-file", b""), ("three-bytes", b"abc"), ("length-only", struct.pack("<Q", 0)),
    ("length-past-file", struct.pack("<Q", 1000) + b"{}"),
    ("length-past-bound", struct.pack("<Q", 200 * 1024 * 1024) + b"{}"),
    ("length-2-to-63", struct.pack("<Q", 1 << 63) + b"{}"), ("length-max", b"\xff" * 8 + b"{}"),
    ("not-json", st_bytes(None, 8, raw=b"hello world")), ("not-utf8", st_bytes(None, 8, raw=b'{"\xff\xfe": 1}')),
    ("header-list", st_bytes(None, 8, raw=b"[]")), ("header-string", st_bytes(None, 8, raw=b'"x"')),
    ("header-nan", st_bytes(None, 8, raw=b'{"__metadata__": {"a": NaN}}')),
    ("header-deep", st_bytes(None, 8, raw=b"[" * 50_000 + b"]" * 50_000)),
    ("duplicate-name", st_bytes(None, 16, raw=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                           b'"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}')),
    ("unknown-dtype", st_bytes(_entry(dtype="Q7"), 8)), ("dtype-number", st_bytes(_entry(dtype=4), 8)),
    ("dtype-lowercase", st_bytes(_entry(dtype="f32"), 8)),
    ("shape-mismatch", st_bytes(_entry(shape=[3]), 8)), ("shape-negative", st_bytes(_entry(shape=[-2]), 8)),
    ("shape-float", st_bytes(_entry(shape=[2.0]), 8)), ("shape-bool", st_bytes(_entry(shape=[True, True]), 8)),
    ("shape-string", st_bytes(_entry(shape="2"), 8)), ("shape-overflow", st_bytes(_entry(shape=[2**62, 2**62]), 8)),
    ("offsets-reversed", st_bytes(_entry(data_offsets=[8, 0]), 8)),
    ("offsets-three", st_bytes(_entry(data_offsets=[0, 4, 8]), 8)),
    ("offsets-strings", st_bytes(_entry(data_offsets=["0", "8"]), 8)),
    ("offsets-negative", st_bytes(_entry(data_offsets=[-8, 0]), 8)),
    ("offsets-past-end", st_bytes(_entry(), 4)), ("data-past-tensors", st_bytes(_entry(), 16)),
    ("offsets-gap", st_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, 8)),
    ("offsets-overlap", st_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, 16)),
    ("entry-no-offsets", st_bytes({"a": {"dtype": "F32", "shape": [2]}}, 8)),
    ("entry-not-object", st_bytes({"a": [1, 2, 3]}, 8)),
    ("metadata-number-value", st_bytes({"__metadata__": {"format": 1}, **ONE}, 8)),
    ("metadata-list", st_bytes({"__metadata__": ["pt"], **ONE}, 8)),
    ("subbyte-misaligned", st_bytes({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2)),
    ("rank-65", st_bytes(_entry(shape=[1] * 64 + [2]), 8)),
    ("rank-100000", st_bytes(_entry(shape=[2**62] * 100_000), 8)),
    ("name-lone-surrogate", st_bytes(None, 8, raw=b'{"\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')),
]:
    _header(_id, _content)


@case("header", "fifo-shard")
def _fifo_shard(tmp: Path) -> Built:
    m = base_model(tmp, checkpoint=False)
    os.mkfifo(m / "model.safetensors")  # opening it for reading must not block
    return Built(str(m), m, "model.safetensors")


@case("header", "shard-is-directory")
def _dir_shard(tmp: Path) -> Built:
    m = base_model(tmp, checkpoint=False)
    (m / "model.safetensors").mkdir()
    return Built(str(m), m, "model.safetensors")


@case("header", "two-files-same-tensor")
def _two_files(tmp: Path) -> Built:
    m = base_model(tmp, checkpoint=False)
    (m / "a.safetensors").write_bytes(st_bytes(ONE, 8))
    (m / "b.safetensors").write_bytes(st_bytes(ONE, 8))
    return Built(str(m), m, "b.safetensors")


# --- model.safetensors.index.json -------------------------------------------------------------------

def _index(id: str, edit: Callable[[dict, list[str]], Any], code: str | None = None) -> None:
    """`edit(index, shard_names)` changes the index in place, or returns raw text to write instead."""
    @case("index", id)
    def build(tmp: Path) -> Built:
        m = base_model(tmp, shards=2)
        index = json.loads((m / INDEX).read_text())
        shards = sorted(set(index["weight_map"].values()))
        text = edit(index, shards)
        (m / INDEX).write_text(text if isinstance(text, str) else json.dumps(index, indent=1))
        return Built(str(m), m, None if code else INDEX, code)


def _remap(value: Any) -> Callable[[dict, list[str]], None]:
    def edit(index: dict, shards: list[str]) -> None:
        first = next(iter(index["weight_map"]))
        index["weight_map"][first] = value
    return edit


for _id, _edit in [
    ("absolute-path", _remap("/etc/passwd")), ("absolute-safetensors", _remap("/tmp/x.safetensors")),
    ("dotdot", _remap("../model-00001-of-00002.safetensors")), ("dotdot-nested", _remap("sub/../../x.safetensors")),
    ("not-safetensors", _remap("config.json")), ("itself", _remap(INDEX)), ("dot", _remap(".")),
    ("empty-name", _remap("")), ("nul-in-name", _remap("a\0.safetensors")),
    ("newline-in-name", _remap("a\n.safetensors")),
    ("value-int", _remap(1)), ("value-null", _remap(None)), ("value-list", _remap(["a.safetensors"])),
    ("weight-map-list", lambda i, s: i.update(weight_map=list(i["weight_map"]))),
    ("weight-map-missing", lambda i, s: i.pop("weight_map")),
    ("weight-map-empty", lambda i, s: i.update(weight_map={})),  # vLLM: "Cannot find any model weights"
    ("not-an-object", lambda i, s: "[]"), ("not-json", lambda i, s: "{weight_map: }"),
    ("duplicate-name",
     lambda i, s: '{"weight_map": {"model.norm.weight": "%s", "model.norm.weight": "%s"}}' % (s[0], s[1])),
    ("mapped-to-wrong-shard", lambda i, s: i["weight_map"].update({"model.norm.weight": (
        s[1] if i["weight_map"]["model.norm.weight"] == s[0] else s[0])})),
    ("deep", lambda i, s: '{"weight_map": {}, "x": ' + "[" * 5000 + "]" * 5000 + "}"),
    ("lone-surrogate-shard", lambda i, s: '{"weight_map": {"model.norm.weight": "\\udcff.safetensors"}}'),
]:
    _index(_id, _edit)

_index("missing-shard", lambda i, s: i["weight_map"].update({"model.extra.weight": "model-00009-of-00009.safetensors"}),
       code="CKPT005")


@case("index", "shard-in-two-files")
def _shard_twice(tmp: Path) -> Built:
    m = base_model(tmp, shards=2)
    index = json.loads((m / INDEX).read_text())
    first, second = sorted(set(index["weight_map"].values()))
    layout = layout_for(m)
    again = {n: v for n, v in layout.items() if index["weight_map"][n] == second}
    again["model.norm.weight"] = layout["model.norm.weight"]  # stored in the first shard as well
    write_safetensors(m / second, again)
    return Built(str(m), m, second)


@case("index", "shard-is-fifo")
def _index_fifo(tmp: Path) -> Built:
    m = base_model(tmp, shards=2)
    shard = sorted(m.glob("*.safetensors"))[1]
    shard.unlink()
    os.mkfifo(shard)
    return Built(str(m), m, shard.name)


@case("index", "symlink-outside")
def _index_link_out(tmp: Path) -> Built:
    m = base_model(tmp, shards=2)
    outside = tmp / "elsewhere.json"
    outside.write_text((m / INDEX).read_text())
    (m / INDEX).unlink()
    (m / INDEX).symlink_to(outside)
    return Built(str(m), m, INDEX)


@case("index", "shard-symlink-outside")
def _shard_link_out(tmp: Path) -> Built:
    m = base_model(tmp, shards=2)
    shard = sorted(m.glob("*.safetensors"))[0]
    outside = tmp / "stolen.safetensors"
    shard.rename(outside)
    shard.symlink_to(outside)
    return Built(str(m), m, shard.name)


@case("index", "shard-symlink-loop")
def _shard_loop(tmp: Path) -> Built:
    m = base_model(tmp, shards=2)
    shard = sorted(m.glob("*.safetensors"))[0]
    shard.unlink()
    shard.symlink_to(shard.name)
    return Built(str(m), m, shard.name)


# --- deploy files -----------------------------------------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))
for _id, _text in [
    ("unknown-key", "engine: hf\nturbo: true\n"), ("unknown-nested-key", "sglang_mlx:\n  pool_sise: 4\n"),
    ("wrong-type-int", "context_length: lots\n"), ("wrong-type-bool", "sglang_mlx:\n  radix_cache: [1]\n"),
    ("negative-size", "context_length: -5\n"), ("zero-pool", "sglang_mlx:\n  pool_size: 0\n"),
    ("bad-literal", "sglang:\n  mamba_ssm_dtype: float8\n"), ("section-is-list", "sglang_mlx: [1, 2]\n"),
    ("top-level-list", "- engine\n- hf\n"), ("top-level-string", "hf\n"),
    ("python-object", "engine: !!python/object:os.system {}\n"),
    ("python-apply", "engine: !!python/object/apply:os.system ['touch /tmp/kvdoctor-pwned']\n"),
    ("python-name", "engine: !!python/name:os.system\n"), ("custom-tag", "engine: !shell ls\n"),
    ("billion-laughs", BOMB), ("recursive-alias", "a: &a [*a]\n"),
    ("deep", "x: " + "[" * 200 + "]" * 200 + "\n"), ("duplicate-key", "engine: hf\nengine: sglang\n"),
    ("tab-indent", "sglang_mlx:\n\tpool_size: 4\n"), ("unclosed", "engine: [hf\n"),
    ("two-documents", "engine: hf\n---\nengine: sglang\n"),
    ("lone-surrogate", 'engine: "\\ud800"\n'),
]:
    deploy_case(_id, _text)
deploy_case("not-utf8", b"engine: h\xfff\n")
deploy_case("huge", b"# " + b"x" * (2 * 1024 * 1024) + b"\n")


@case("deploy", "missing-file")
def _deploy_missing(tmp: Path) -> Built:
    m = base_model(tmp)
    return Built(str(m), m, "deploy.yaml", args=("--deploy", str(tmp / "deploy.yaml")))


@case("deploy", "directory")
def _deploy_dir(tmp: Path) -> Built:
    m = base_model(tmp)
    (tmp / "deploy.yaml").mkdir()
    return Built(str(m), m, "deploy.yaml", args=("--deploy", str(tmp / "deploy.yaml")))


# --- the file system around the model ---------------------------------------------------------------

@case("fs", "empty-dir")
def _empty(tmp: Path) -> Built:
    m = tmp / "model"
    m.mkdir()
    return Built(str(m), m, "model")


@case("fs", "no-such-dir")
def _nowhere(tmp: Path) -> Built:
    return Built(str(tmp / "absent"), tmp, "absent")


@case("fs", "target-is-file")
def _target_file(tmp: Path) -> Built:
    m = base_model(tmp)
    return Built(str(m / "model.safetensors"), m, "model.safetensors")


@case("fs", "config-is-directory")
def _config_dir(tmp: Path) -> Built:
    m = base_model(tmp)
    (m / "config.json").unlink()
    (m / "config.json").mkdir()
    return Built(str(m), m, "config.json")


@case("fs", "config-fifo")
def _config_fifo(tmp: Path) -> Built:
    m = base_model(tmp)
    (m / "config.json").unlink()
    os.mkfifo(m / "config.json")
    return Built(str(m), m, "config.json")


@case("fs", "config-symlink-loop")
def _config_loop(tmp: Path) -> Built:
    m = base_model(tmp)
    (m / "config.json").unlink()
    (m / "config.json").symlink_to("config.json")
    return Built(str(m), m, "config.json")


@case("fs", "config-symlink-pair-loop")
def _config_pair_loop(tmp: Path) -> Built:
    m = base_model(tmp)
    (m / "config.json").unlink()
    (m / "config.json").symlink_to("other.json")
    (m / "other.json").symlink_to("config.json")
    return Built(str(m), m, "config.json")


@case("fs", "config-dangling-symlink")
def _config_dangling(tmp: Path) -> Built:
    m = base_model(tmp)
    (m / "config.json").unlink()
    (m / "config.json").symlink_to("gone.json")
    return Built(str(m), m, "config.json")


@case("fs", "config-symlink-outside")
def _config_outside(tmp: Path) -> Built:
    m = base_model(tmp)
    outside = tmp / "secret.json"
    (m / "config.json").rename(outside)
    (m / "config.json").symlink_to(outside)
    return Built(str(m), m, "config.json")


@case("fs", "config-symlink-dev-zero")
def _config_dev_zero(tmp: Path) -> Built:
    m = base_model(tmp)
    (m / "config.json").unlink()
    (m / "config.json").symlink_to("/dev/zero")
    return Built(str(m), m, "config.json")


@case("fs", "shard-symlink-dev-urandom")
def _shard_urandom(tmp: Path) -> Built:
    m = base_model(tmp, checkpoint=False)
    (m / "model.safetensors").symlink_to("/dev/urandom")
    return Built(str(m), m, "model.safetensors")


@case("fs", "shard-symlink-loop")
def _single_shard_loop(tmp: Path) -> Built:
    m = base_model(tmp, checkpoint=False)
    (m / "model.safetensors").symlink_to("model.safetensors")
    return Built(str(m), m, "model.safetensors")


@case("fs", "file-name-not-utf8")
def _name_not_utf8(tmp: Path) -> Built:
    m = base_model(tmp)
    (Path(os.fsdecode(os.fsencode(m) + b"/\xff.safetensors"))).write_bytes(st_bytes(ONE, 8))
    return Built(str(m), m, "'\\udcff.safetensors'")


@case("fs", "model-path-not-utf8")
def _path_not_utf8(tmp: Path) -> Built:
    m = base_model(tmp)
    bad = Path(os.fsdecode(os.fsencode(tmp) + b"/model-\xff"))
    m.rename(bad)
    return Built(str(bad), tmp, "model-\\udcff")


@case("fs", "target-symlink-loop")
def _target_loop(tmp: Path) -> Built:
    (tmp / "model").symlink_to("model")
    return Built(str(tmp / "model"), tmp, "model")


# --- the local Hugging Face cache -------------------------------------------------------------------

@case("cache", "ref-escapes")
def _ref_escape(tmp: Path) -> Built:
    cache, repo = hf_repo(tmp)
    (repo / "refs" / "main").write_text("../../../../etc")
    return Built("acme/tiny", repo, "refs/main", env={"HF_HUB_CACHE": str(cache)})


@case("cache", "ref-huge")
def _ref_huge(tmp: Path) -> Built:
    cache, repo = hf_repo(tmp)
    (repo / "refs" / "main").write_text("a" * 100_000)
    return Built("acme/tiny", repo, "refs/main", env={"HF_HUB_CACHE": str(cache)})


@case("cache", "snapshot-link-outside")
def _snap_out(tmp: Path) -> Built:
    cache, repo = hf_repo(tmp)
    snap = next((repo / "snapshots").iterdir())
    outside = tmp / "outside.json"
    outside.write_text(json.dumps(tiny_config()))
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to(outside)
    return Built("acme/tiny", repo, "config.json", env={"HF_HUB_CACHE": str(cache)})


@case("cache", "snapshot-path-link-outside")
def _snap_path_out(tmp: Path) -> Built:
    cache, repo = hf_repo(tmp)
    snap = next((repo / "snapshots").iterdir())
    outside = tmp / "outside.safetensors"
    (snap / "model.safetensors").rename(outside)
    (snap / "model.safetensors").symlink_to(outside)
    return Built(str(snap), repo, "model.safetensors")


@case("cache", "not-cached")
def _not_cached(tmp: Path) -> Built:
    (tmp / "hub").mkdir()
    return Built("acme/absent", tmp, "acme/absent", env={"HF_HUB_CACHE": str(tmp / "hub")})


# --- user catalog entries (loaded by kvdoctor.catalog.load_catalog) ---------------------------------

GOOD_ENTRY = """code: USR001
name: user-rule
severity: warning
summary: a user rule
engines:
  - {name: hf, versions: ">=4.45"}
meaning: A rule from a user's own catalog.
triggers: [something]
fixes:
  - summary: Fix it.
"""
CATALOG_CASES: list[tuple[str, str, bytes | str]] = [
    ("not-yaml", "USR001.yaml", "code: [USR001\n"),
    ("not-a-mapping", "USR001.yaml", "- code\n- USR001\n"),
    ("missing-fixes", "USR001.yaml", GOOD_ENTRY.replace("fixes:\n  - summary: Fix it.\n", "")),
    ("unknown-field", "USR001.yaml", GOOD_ENTRY + "run: rm -rf /\n"),
    ("bad-severity", "USR001.yaml", GOOD_ENTRY.replace("severity: warning", "severity: fatal")),
    ("bad-code", "usr1.yaml", GOOD_ENTRY.replace("USR001", "usr1")),
    ("name-not-kebab", "USR001.yaml", GOOD_ENTRY.replace("user-rule", "User Rule")),
    ("file-name-mismatch", "USR002.yaml", GOOD_ENTRY),
    ("duplicate-builtin-code", "CFG001.yaml", GOOD_ENTRY.replace("USR001", "CFG001")),
    ("python-tag", "USR001.yaml",
     GOOD_ENTRY.replace("summary: a user rule", "summary: !!python/object/apply:os.getcwd []")),
    ("pattern-does-not-compile", "USR001.yaml",
     GOOD_ENTRY + 'error: {class: E, message: m, pattern: "(", source: "x:1 @ 1"}\n'),
    ("billion-laughs", "USR001.yaml", GOOD_ENTRY.replace("triggers: [something]\n", "triggers:\n" + "".join(
        f"  {line}\n" for line in BOMB.splitlines()))),
    ("duplicate-key", "USR001.yaml", GOOD_ENTRY + "severity: error\n"),
    ("deep", "USR001.yaml", GOOD_ENTRY.replace("[something]", "[" * 100 + "]" * 100)),
    ("not-utf8", "USR001.yaml", GOOD_ENTRY.encode().replace(b"a user rule", b"a \xff rule")),
    ("huge", "USR001.yaml", GOOD_ENTRY + "#" + "x" * (300 * 1024) + "\n"),
    ("lone-surrogate", "USR001.yaml", GOOD_ENTRY.replace("summary: a user rule", 'summary: "\\udcff"')),
]
