"""Semantically impossible configs: each one gets exit 2 (an input error naming the file) or an error
finding with file:line, never a clean pass. Each case says what transformers 5.24 or the engine does."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import check_json, run

LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
         "num_key_value_heads": 2, "vocab_size": 1000}
GEMMA3 = {"model_type": "gemma3_text", "num_hidden_layers": 8, "hidden_size": 256, "num_attention_heads": 4,
          "num_key_value_heads": 1, "head_dim": 64, "sliding_window": 512, "vocab_size": 1000}
DEEPSEEK = {"model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
            "num_key_value_heads": 8, "kv_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32,
            "v_head_dim": 32, "vocab_size": 1000}
NEMOTRON_H = {"model_type": "nemotron_h", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 32, "hybrid_override_pattern": "M*M-", "vocab_size": 1000}
KIMI = {"model_type": "kimi_linear", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
        "num_key_value_heads": 8, "kv_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32,
        "v_head_dim": 32, "vocab_size": 1000,
        "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 8, "head_dim": 32,
                               "short_conv_kernel_size": 4}}


LLAMA4 = {"model_type": "llama4_text", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
          "num_key_value_heads": 2, "head_dim": 32, "attention_chunk_size": 8192, "vocab_size": 1000,
          "layer_types": ["chunked_attention", "chunked_attention", "chunked_attention", "full_attention"]}
QWEN3_NEXT = {"model_type": "qwen3_next", "num_hidden_layers": 8, "hidden_size": 256, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 64, "full_attention_interval": 4, "vocab_size": 1000,
              "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 32,
              "linear_value_head_dim": 32}
JAMBA = {"model_type": "jamba", "num_hidden_layers": 16, "hidden_size": 256, "num_attention_heads": 4,
         "num_key_value_heads": 2, "attn_layer_period": 8, "attn_layer_offset": 4, "vocab_size": 1000}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def edit(base, **changes):
    cfg = json.loads(json.dumps(base))
    for key, value in changes.items():
        if value is DROP:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


DROP = object()

# (id, config, expected: a finding code at error level, or "exit2")
CASES = [
    # vLLM asserts "num_heads (8) is not divisible by num_kv_heads (3)" building the attention layer;
    # transformers' LlamaConfig accepts it.
    ("kv-heads-do-not-divide", edit(LLAMA, num_key_value_heads=3), "CFG013"),
    # vLLM's same assertion: num_heads (8) is not divisible by num_kv_heads (16).
    ("kv-heads-above-heads", edit(LLAMA, num_key_value_heads=16), "CFG013"),
    # transformers' LlamaConfig.validate_architecture: "The hidden size (250) is not a multiple of the
    # number of attention heads (8)."
    ("heads-do-not-divide-hidden", edit(LLAMA, hidden_size=250), "CFG015"),
    # Gemma3TextConfig.__post_init__ computes (i + 1) % 0: ZeroDivisionError "integer modulo by zero".
    ("pattern-period-zero", edit(GEMMA3, sliding_window_pattern=0), "CFG016"),
    # transformers accepts -2 and derives alternate sliding/full layers: no period means that.
    ("pattern-period-negative", edit(GEMMA3, sliding_window_pattern=-2), "CFG016"),
    # transformers accepts 2.5 and derives full layers at 4, 9, ...: not a period.
    ("pattern-period-float", edit(GEMMA3, sliding_window_pattern=2.5), "CFG016"),
    # Qwen3NextConfig: (i + 1) % 0 -> ZeroDivisionError.
    ("interval-zero", {"model_type": "qwen3_next", "num_hidden_layers": 8, "hidden_size": 256,
                       "num_attention_heads": 4, "num_key_value_heads": 2, "full_attention_interval": 0,
                       "vocab_size": 1000}, "CFG016"),
    # JambaConfig.validate: "attention layer offset (9) must be smaller than attention layer period (8)".
    ("jamba-offset-past-period", {"model_type": "jamba", "num_hidden_layers": 16, "hidden_size": 256,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "attn_layer_period": 8,
                                  "attn_layer_offset": 9, "vocab_size": 1000}, "CFG016"),
    # NemotronHConfig maps each character through its table: KeyError 'X'.
    ("nemotron-pattern-unknown-char", edit(NEMOTRON_H, hybrid_override_pattern="M*X-"), "CFG017"),
    # Exaone4Config: (i + 1) % "LLXG" -> TypeError "unsupported operand type(s) for %: 'int' and 'str'".
    ("exaone-pattern-unknown-char", {"model_type": "exaone4", "num_hidden_layers": 8, "hidden_size": 256,
                                     "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 512,
                                     "sliding_window_pattern": "LLXG", "vocab_size": 1000}, "CFG017"),
    # The same TypeError even for a valid "LLLG" string when layer_types is absent.
    ("exaone-pattern-string-without-layer-types",
     {"model_type": "exaone4", "num_hidden_layers": 8, "hidden_size": 256, "num_attention_heads": 4,
      "num_key_value_heads": 2, "sliding_window": 512, "sliding_window_pattern": "LLLG", "vocab_size": 1000},
     "CFG017"),
    # vLLM's KimiLinearConfig: every layer MLA; transformers: a default 1-in-4 KDA pattern.
    ("kimi-without-linear-config", edit(KIMI, linear_attn_config=DROP), "CFG018"),
    # transformers' KimiLinearConfig: AttributeError "'NoneType' object has no attribute 'get'".
    ("kimi-linear-config-null", edit(KIMI, linear_attn_config=None), "CFG018"),
    # DeepseekV3Config strict field: TypeError "Field 'kv_lora_rank' expected int, got NoneType (value: None)".
    ("mla-latent-null", edit(DEEPSEEK, kv_lora_rank=None), "CFG019"),
    ("mla-rope-null", edit(DEEPSEEK, qk_rope_head_dim=None), "CFG019"),
    # GptOssConfig validate_layer_type: "`num_hidden_layers` (4) must be equal to the number of
    # `layer_types` (3)"; kvdoctor's CFG001.
    ("layer-types-short", {"model_type": "gpt_oss", "num_hidden_layers": 4, "hidden_size": 256,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                           "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                           "vocab_size": 1000}, "CFG001"),
    # Not a transformers string: transformers raises "The `layer_types` entries must be in (...)".
    ("layer-types-typo", edit(GEMMA3, layer_types=["sliding_atention"] * 7 + ["full_attention"]), "CFG002"),
    # A type only transformers knows (step3p7): its validator rejects the string, quoted as CFG012.
    ("transformers-rejects-layer-type",
     {"model_type": "step3p7", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 64, "layer_types": ["full_attention", "global"], "vocab_size": 1000},
     "CFG012"),
    # A type only transformers knows, hidden size not divisible: Mixtral's class accepts it, but the
    # heads still do not divide: vLLM's assertion.
    ("transformers-family-kv-heads", {"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 256,
                                      "num_attention_heads": 8, "num_key_value_heads": 3, "vocab_size": 1000},
     "CFG013"),
    # --- issue 43: each passed as clean before ---
    # LlamaConfig's strict field: TypeError "Field 'num_attention_heads' expected int, got NoneType".
    ("heads-null", edit(LLAMA, num_attention_heads=None), "CFG021"),
    # LlamaConfig.validate_architecture refuses hidden 1000 with 3 heads (CFG015); Qwen2's class does not,
    # and the head_dim it derives (333) is odd: validate_rope's "RoPE requires an even rotary dimension".
    ("hidden-1000-three-heads", edit(LLAMA, hidden_size=1000, num_attention_heads=3, num_key_value_heads=1),
     "CFG015"),
    ("hidden-1000-three-heads-qwen2", edit(LLAMA, model_type="qwen2", hidden_size=1000, num_attention_heads=3,
                                           num_key_value_heads=1), "CFG022"),
    ("odd-head-dim", edit(LLAMA, head_dim=63, rope_theta=500000.0), "CFG022"),
    # DeepseekV3Config sets head_dim = qk_rope_head_dim, so validate_rope refuses an odd rope width.
    ("odd-mla-rope-dim", edit(DEEPSEEK, qk_rope_head_dim=15), "CFG022"),
    # transformers, vLLM and SGLang build text_config's layers; the top level says another count.
    ("text-config-layers-conflict", {"model_type": "llava", "num_hidden_layers": 3, "text_config": LLAMA}, "CFG024"),
    # transformers' chunked mask: "Could not find an `attention_chunk_size` argument in the config".
    ("chunked-without-chunk-size", edit(LLAMA4, attention_chunk_size=None), "CFG003"),
    # LlamaDecoderLayer always builds attention: linear_attention layers have nowhere to load.
    ("linear-types-in-llama", edit(LLAMA, layer_types=["linear_attention"] + ["full_attention"] * 3), "CFG025"),
    # gated delta-net repeats key heads num_v // num_k times: 6 // 4 leaves value heads without keys.
    ("linear-heads-do-not-divide", edit(QWEN3_NEXT, linear_num_value_heads=6), "CFG026"),
    # NemotronHConfig._pattern_to_list iterates the pattern: TypeError "'int' object is not iterable";
    # a list of words hits its character table: KeyError 'mamba'.
    ("nemotron-pattern-number", edit(NEMOTRON_H, hybrid_override_pattern=4), "CFG017"),
    ("nemotron-pattern-list-of-words", edit(NEMOTRON_H, hybrid_override_pattern=["mamba", "attention", "mamba",
                                                                                  "mlp"]), "CFG017"),
    # JambaConfig checks offset < period only: i % 8 == -1 never holds, so no layer is attention.
    ("jamba-negative-offset", edit(JAMBA, attn_layer_offset=-1), "CFG016"),
    ("rope-factor-zero", edit(LLAMA, rope_scaling={"rope_type": "linear", "factor": 0}), "CFG023"),
    ("rope-factor-negative", edit(LLAMA, rope_scaling={"rope_type": "linear", "factor": -2.0}), "CFG023"),
    ("rope-factor-string", edit(LLAMA, rope_scaling={"rope_type": "linear", "factor": "4"}), "CFG023"),
    ("rope-type-missing", edit(LLAMA, rope_scaling={"factor": 4.0}), "CFG023"),
    # vLLM's get_rope: ValueError "Unknown RoPE scaling type spiral".
    ("rope-type-unknown", edit(LLAMA, rope_scaling={"rope_type": "spiral", "factor": 4.0}), "CFG023"),
    ("llama3-factors-inverted", edit(LLAMA, rope_scaling=dict(LLAMA3_ROPE, low_freq_factor=4.0, high_freq_factor=1.0)),
     "CFG023"),
    ("rope-scaling-list", edit(LLAMA, rope_scaling=[{"rope_type": "linear", "factor": 2.0}]), "CFG023"),
    ("rope-theta-zero", edit(LLAMA, rope_theta=0), "CFG023"),
    ("rope-theta-negative", edit(LLAMA, rope_theta=-10000.0), "CFG023"),
    ("rope-parameters-theta-zero", edit(LLAMA, rope_parameters={"rope_type": "default", "rope_theta": 0.0}), "CFG023"),
    # NaN in a RoPE parameter: an input error, as before.
    ("rope-factor-nan", edit(LLAMA, rope_scaling={"rope_type": "linear", "factor": float("nan")}), "exit2"),
    # Sizes that cannot be a count: one-line input errors (exit 2), as before.
    ("heads-zero", edit(LLAMA, num_attention_heads=0), "exit2"),
    ("layers-infinity", edit(LLAMA, num_hidden_layers=float("inf")), "exit2"),
    ("heads-nan", edit(LLAMA, num_attention_heads=float("nan")), "exit2"),
    ("layers-missing-no-list", edit(NEMOTRON_H, num_hidden_layers=DROP, hybrid_override_pattern=DROP), "exit2"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("impossible")
    for case_id, cfg, _ in CASES:
        (root / case_id).mkdir()
        (root / case_id / "config.json").write_text(json.dumps(cfg, indent=2))  # NaN / Infinity as Python writes them
    code, doc = check_json("--static", *(str(root / case_id) for case_id, _, _ in CASES))
    assert code in (1, 2)
    return {Path(r["target"]).name: r for r in doc["results"]}


@pytest.mark.parametrize("case_id,expected", [(c[0], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_never_a_clean_pass(results, case_id, expected):
    result = results[case_id]
    if expected == "exit2":
        assert result.get("error"), result
        assert "config.json" in result["error"]
        return
    assert result.get("error") is None, result["error"]
    hits = [f for f in result["findings"] if f["code"] == expected]
    assert hits, [f["code"] for f in result["findings"]]
    assert hits[0]["severity"] == "error"
    assert hits[0]["file"] == "config.json" and isinstance(hits[0]["line"], int), hits[0]


def test_a_refusal_is_reported_once_without_what_transformers_logs(tmp_path):
    """MambaConfig cannot take `layer_types` (a property without a setter): transformers logs the whole
    config at error level as it refuses; the refusal is CFG012, and stderr stays empty."""
    (tmp_path / "config.json").write_text(json.dumps(edit(LLAMA, model_type="mamba", layer_types=[])))
    proc = run("check", "--static", "--format", "json", str(tmp_path))
    assert proc.stderr == ""
    codes = [f["code"] for f in json.loads(proc.stdout)["results"][0]["findings"]]
    assert "CFG012" in codes


def test_healthy_bases_are_quiet(tmp_path):
    """The bases the cases edit draw no error: each case's finding comes from its edit."""
    for i, base in enumerate((LLAMA, GEMMA3, DEEPSEEK, NEMOTRON_H, KIMI)):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "config.json").write_text(json.dumps(base))
    code, doc = check_json("--static", *(str(tmp_path / str(i)) for i in range(5)))
    assert code == 0, [(r["target"], [f["code"] for f in r["findings"] if f["severity"] == "error"])
                       for r in doc["results"]]


# The healthy twin of each issue-43 case: the same base with the value an engine takes.
HEALTHY_TWINS = [
    ("kv-heads-null-defaults-to-heads", edit(LLAMA, num_key_value_heads=None)),
    ("even-head-dim", edit(LLAMA, head_dim=64, rope_theta=500000.0)),
    ("odd-head-dim-half-rotated", edit(LLAMA, model_type="qwen2", head_dim=63, partial_rotary_factor=0.5)),
    ("text-config-layers-agree", {"model_type": "llava", "num_hidden_layers": 4, "text_config": LLAMA}),
    ("chunked-with-chunk-size", LLAMA4),
    ("linear-types-in-qwen3-next", edit(QWEN3_NEXT, layer_types=["linear_attention"] * 3 + ["full_attention"]
                                        + ["linear_attention"] * 3 + ["full_attention"])),
    ("linear-heads-divide", QWEN3_NEXT),
    ("nemotron-pattern-list-of-characters", edit(NEMOTRON_H, hybrid_override_pattern=["M", "*", "M", "-"])),
    ("jamba-offset-in-period", JAMBA),
    ("llama3-rope", edit(LLAMA, rope_scaling=LLAMA3_ROPE)),
    # Llama 4 ships equal factors; both transformers and vLLM scale the same way then.
    ("llama3-factors-equal", edit(LLAMA, rope_scaling=dict(LLAMA3_ROPE, low_freq_factor=1.0, high_freq_factor=1.0))),
    ("legacy-type-key", edit(LLAMA, rope_scaling={"type": "linear", "factor": 2.0})),
    ("mrope-legacy-type", edit(LLAMA, model_type="qwen2", rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]})),
    ("rope-parameters-per-layer-type", edit(GEMMA3, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
]


def test_healthy_twins_are_quiet(tmp_path):
    for name, cfg in HEALTHY_TWINS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg, indent=2))
    code, doc = check_json("--static", *(str(tmp_path / name) for name, _ in HEALTHY_TWINS))
    loud = [(Path(r["target"]).name, r.get("error"), [f["code"] for f in r["findings"] if f["severity"] == "error"])
            for r in doc["results"] if r.get("error") or any(f["severity"] == "error" for f in r["findings"])]
    assert code == 0 and not loud, loud


def test_non_finite_number_outside_a_size_or_rope_is_a_warning_with_its_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,\n'
                                          ' "num_attention_heads": 4, "rms_norm_eps": NaN}')
    code, doc = check_json("--static", str(tmp_path))
    hits = [f for f in doc["results"][0]["findings"] if f["code"] == "CFG020"]
    assert code == 0 and hits and hits[0]["severity"] == "warning" and hits[0]["line"] == 2


@pytest.mark.parametrize("text, key, line", [
    ('"rope_theta": NaN', "rope_theta", 2),
    ('"rope_scaling": {"rope_type": "yarn",\n "factor": Infinity}', "rope_scaling.factor", 3),
    ('"text_config": {"model_type": "llama", "rope_theta": -Infinity}', "text_config.rope_theta", 2)])
def test_a_non_finite_rope_parameter_is_an_input_error_with_file_and_line(tmp_path, text, key, line):
    """Every engine would rotate queries and keys by nan or inf: the config is refused, not warned about."""
    (tmp_path / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,\n'
                                          ' "num_attention_heads": 4, ' + text + "}")
    proc = run("check", "--static", str(tmp_path))
    assert proc.returncode == 2
    [message] = proc.stderr.strip().splitlines()
    assert message.startswith(f"kvdoctor: error: {tmp_path / 'config.json'}:{line}: {key} = ")
    assert "is not a finite number" in message


def test_an_unknown_model_type_never_draws_an_error(tmp_path):
    """A guessed spec: the same contradiction that is an error for llama is a warning that says so."""
    (tmp_path / "config.json").write_text(json.dumps(edit(LLAMA, model_type="brand_new", num_key_value_heads=3)))
    code, doc = check_json("--static", str(tmp_path))
    findings = doc["results"][0]["findings"]
    assert code == 0
    assert {f["severity"] for f in findings} <= {"warning", "info"}
    hit = next(f for f in findings if f["code"] == "CFG013")
    assert "guessed" in hit["message"] and hit["evidence"]["guessed"] is True


def test_rope_parameters_are_checked_for_a_family_transformers_reads(tmp_path):
    """Mixtral has no kvdoctor family (transformers' class reads it) and that class only warns about a
    zero factor: CFG023 still says so."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
        "num_key_value_heads": 2, "vocab_size": 1000, "rope_scaling": {"rope_type": "linear", "factor": 0}}))
    code, doc = check_json("--static", str(tmp_path))
    hits = [f for f in doc["results"][0]["findings"] if f["code"] == "CFG023"]
    assert code == 1 and hits and hits[0]["severity"] == "error" and isinstance(hits[0]["line"], int)


def test_a_nemotron_pattern_list_of_characters_reads_as_the_string():
    """NemotronHConfig maps each item of the pattern through its table, a list as a string."""
    from kvdoctor.load.families import Lookup, family_for
    from kvdoctor.model import Source

    family = family_for("nemotron_h")
    as_string = family.rule(Lookup(edit(NEMOTRON_H), {}, lambda k: Source("key", k, "config.json", 1)), 4)
    as_list = family.rule(Lookup(edit(NEMOTRON_H, hybrid_override_pattern=list("M*M-")), {},
                                 lambda k: Source("key", k, "config.json", 1)), 4)
    assert [kind for kind, _ in as_list] == [kind for kind, _ in as_string] == ["mamba", "full_attention", "mamba",
                                                                               "none"]
