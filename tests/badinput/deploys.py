"""Deploy files: every setting with values of the wrong type or out of the engine's range, YAML tags,
aliases, depth, duplicate keys and the YAML 1.1 spellings that YAML 1.2 reads as strings.

The engines take these settings as command-line flags parsed by argparse (`type=int`, `type=float`,
`store_true`): `int("true")`, `int("1.5")` and `float("abc")` raise, a flag is on or off, and each
engine then range-checks some values itself (cited in kvdoctor/load/strict.py). A deploy file must be
refused where the engine would refuse the flag, or where kvdoctor would otherwise guess: a boolean
read as 1, NaN passing every comparison, `yes` read as true by YAML 1.1 but as a string by YAML 1.2.
"""
from __future__ import annotations

from badinput_base import deploy_case

MAX_CONTEXT = 1 << 26


def _yaml(dotted: str, value: str) -> str:
    """`a.b.c: value` as nested block YAML; a budget section also gets the KV budget it needs."""
    parts = dotted.split(".")
    lines = [f"{'  ' * i}{p}:" for i, p in enumerate(parts[:-1])] + [f"{'  ' * (len(parts) - 1)}{parts[-1]}: {value}"]
    if parts[0] == "budget" and parts[1] not in ("kv_budget", "gpu_memory"):
        lines.insert(1, "  kv_budget: 40GiB")
    return "\n".join(lines) + "\n"


def _field(dotted: str, bad: list[str], good: list[str] = ()) -> None:
    """Each bad spelling refused with the file, its line and the key path; each good one accepted."""
    for value in bad:
        deploy_case(f"{dotted}={value[:24]}", _yaml(dotted, value), names=f"'{dotted}")
    for value in good:
        deploy_case(f"{dotted}={value[:24]}-ok", _yaml(dotted, value), accepted=True)


# argparse `type=int` refuses all of these; YAML gives kvdoctor a bool, a float or a string instead.
NOT_AN_INT = ["true", "false", "1.5", "8192.0", '"8192"', "1_024", ".nan", ".inf", "1e30", "[8192]", "{a: 1}", "0b1010"]
# A `store_true` flag has no value: anything but true/false is a typo (YAML 1.1 read `yes`/`on` as true).
NOT_A_BOOL = ["1", "0", '"true"', "yes", "on", "off", "no", "y", "1.0", "[]"]
NOT_A_NAME = ['""', '"   "', '"a\\nb"', "5", "true", "[hf]", '"\\t"']

# Tokens (context, chunk sizes): the engines take any positive int; past 2^24 it is a typo.
for _field_name in ("context_length", "sglang_mlx.chunked_prefill_size", "budget.context"):
    _field(_field_name, NOT_AN_INT[:9] + ["0", "-1", str(MAX_CONTEXT + 1), "99999999999999999999"],
           good=["1", str(MAX_CONTEXT), "0x2000", "0o20000"])  # YAML 1.2 core integers
_field("sglang_mlx.radix_cache", NOT_A_BOOL, good=["true", "False", "TRUE"])
_field("sglang_mlx.use_custom_rope", NOT_A_BOOL[:5])
_field("sglang.enable_linear_replayssm", NOT_A_BOOL[:5] + ["null"])  # not optional: null is no bool
_field("budget.vllm.hma", NOT_A_BOOL[:5])
_field("budget.sglang.radix_cache", ["1", "yes"])
_field("sglang_mlx.pool_size", NOT_AN_INT[:6] + ["0", "-4"], good=["1", "null"])
# SGLang refuses "--linear-replayssm-cache-len must be >= 1" (attention_hook.py#L434): kvdoctor reports
# that as KDA062 with the engine's message (tests/test_kda_cli.py), so 0 reaches the rule; a wrong type
# or an absurd length does not.
_field("sglang.linear_replayssm_cache_len", ["true", "16.0", "null", ".nan", str(1 << 17)], good=["1", "0", "65536"])
_field("sglang.tp_size", ["0", "-2", "true", "2.0", '"8"', "2048"], good=["1", "1024", "null"])
_field("sglang.max_mamba_cache_size", ["-1", "true", "1.5", ".inf"], good=["0"])
_field("sglang.kda_recipe", NOT_A_NAME + ["null"])
_field("engine", NOT_A_NAME)
_field("sglang.mamba_ssm_dtype", ["float8", "FLOAT32", "true", "32", '""'])
_field("sglang.linear_attn_decode_backend", ["cuda", "1", "null"])
# vLLM: tensor_parallel_size ge=1, max_num_seqs / max_num_batched_tokens ge=1, block_size gt=0
# (vllm/config/parallel.py#L142, scheduler.py#L48 and #L62, cache.py#L187 at v0.33.0).
_field("budget.vllm.tp", ["0", "-1", "true", "1.0", "1025"], good=["8"])
_field("budget.vllm.max_num_seqs", ["0", "false", ".nan", "256.5"], good=["256"])
_field("budget.vllm.max_num_batched_tokens", ["0", "true", "1e4"])
_field("budget.vllm.block_size", ["0", "-16", "16.0", "true", str(1 << 17)], good=["16", "null"])
_field("budget.vllm.num_speculative_tokens", ["-1", "65", "true", "2.0"], good=["0", "64"])
_field("budget.vllm.kv_cache_dtype", ['""', "8", "true"])
_field("budget.vllm.prefix_caching", ["yes", "1"])
# SGLang: "--swa-full-tokens-ratio should be in range (0, 1.0]." (kv_cache_hook.py#L427).
_field("budget.sglang.swa_full_tokens_ratio", ["0", "-0.5", "1.01", ".nan", ".inf", "true", '"0.5"', "2"],
       good=["1", "0.000001", "0.5"])
_field("budget.sglang.mamba_full_memory_ratio", ["0", "-1", ".nan", "-.inf", "false"], good=["0.9"])
_field("budget.sglang.page_size", ["0", "true", "1.0", "-64"], good=["64"])
_field("budget.sglang.max_running_requests", ["0", "true"], good=["null", "128"])
_field("budget.sglang.max_total_tokens", ["0", ".nan"])
_field("budget.sglang.mamba_ssm_dtype", ["fp32", "true"], good=["null", "bfloat16"])
# mlx 0.32.4's mx.quantize: "The supported bits are 1, 2, 3, 4, 5, 6 and 8." and "The supported
# group sizes are 32, 64, and 128." (mlx/ops.cpp); mlx-lm passes --kv-bits and --kv-group-size there.
_field("budget.mlx_lm.kv_bits", ["0", "7", "9", "16", "4.0", "true", '"4"'], good=["1", "8", "null"])
_field("budget.mlx_lm.kv_group_size", ["16", "256", "0", "64.0", "true"], good=["32", "128"])
_field("budget.mlx_lm.quantized_kv_start", ["-1", "true", "1.5"], good=["0"])
_field("budget.mlx_lm.max_kv_size", ["0", "true", "-1"], good=["null", "4096"])
_field("budget.mlx_lm.prefill_step_size", ["0", "false"])
# Sizes: a whole number of bytes, from 1 B to 1 PiB, written with a unit or as an integer.
_field("budget.kv_budget", ["true", "1.5", "0", "-1", "lots", "1e3GiB", "1.5B", "nanGiB", "-1GiB", "0GiB", "2PiB",
                            ".inf", "[40GiB]", '"40 GiB extra"', "40GiBs"],
       good=["40GiB", "1B", "1PiB", "42949672960", '"80 GB"', "1.5TiB", "0x10000000"])
_field("budget.gpu_memory", ["true", "0.5", "141GiB141", "-141GiB"], good=["141GiB", str(141 << 30)])
_field("budget.engines", ["[vllm, tgi]", "vllm", "[1]", "[null]"], good=["[vllm]", "[]"])

# --- YAML tags: none is resolved; the safe loader would build bytes, sets, dates or refuse ------------
for _id, _value in [("binary", "!!binary aGVsbG8="), ("set", "!!set {a, b}"), ("omap", "!!omap [a: 1]"),
                    ("timestamp", "!!timestamp 2024-01-01"), ("int", '!!int "8192"'), ("float", "!!float 1"),
                    ("bool", '!!bool "true"'), ("null", "!!null ''"), ("str", "!!str 8192"), ("map", "!!map {}"),
                    ("seq", "!!seq []"), ("local", "!local x"), ("verbatim", "!<tag:yaml.org,2002:str> x"),
                    ("non-specific", '! "x"'), ("python-module", "!!python/module:os"),
                    ("python-new", "!!python/object/new:os.system [true]"),
                    ("python-tuple", "!!python/tuple [1, 2]"), ("python-bytes", "!!python/bytes aGk=")]:
    deploy_case(f"tag-{_id}", f"context_length: {_value}\n", names="tag")
deploy_case("tag-directive", "%TAG !e! tag:example.com,2000:\n---\ncontext_length: !e!n 8192\n", names="tag")
deploy_case("tag-on-key", "!!str context_length: 8192\n", names="tag")
deploy_case("tag-in-nested-list", "budget:\n  engines: [!!str vllm]\n", names="budget.engines")
deploy_case("tag-on-section", "sglang_mlx: !!map\n  radix_cache: true\n", names="sglang_mlx")

# --- aliases: expanded only within the bound --------------------------------------------------------------
deploy_case("alias-reused-scalar",
        "sglang_mlx:\n  chunked_prefill_size: &n 8192\nbudget:\n  kv_budget: 40GiB\n  context: *n\n", accepted=True)
deploy_case("alias-reused-section", "budget:\n  vllm: &v {hma: true}\n  sglang: *v\n", names="budget.sglang.hma")
deploy_case("alias-cycle-mapping", "a: &a {b: *a}\n")
deploy_case("alias-undefined", "context_length: *nowhere\n")
deploy_case("alias-bomb-in-list", "budget:\n  engines: &a [vllm, vllm, vllm, vllm, vllm, vllm, vllm, vllm, vllm, vllm]\n"
        + "".join(f"x{i}: &x{i} [{', '.join(['*' + ('a' if i == 0 else f'x{i - 1}')] * 10)}]\n" for i in range(6)))
deploy_case("alias-bomb-mappings", "a: &a {k0: 1, k1: 1, k2: 1, k3: 1, k4: 1, k5: 1, k6: 1, k7: 1, k8: 1, k9: 1}\n"
        + "".join(f"b{i}: &b{i} {{{', '.join(f'm{j}: *' + ('a' if i == 0 else f'b{i - 1}') for j in range(10))}}}\n"
                  for i in range(6)))
deploy_case("merge-key", "base: &b {tp: 2}\nbudget:\n  vllm:\n    <<: *b\n")  # no merge keys in YAML 1.2: '<<' is a key

# --- depth ------------------------------------------------------------------------------------------------
deploy_case("depth-65-flow-maps", "x: " + "{a: " * 65 + "1" + "}" * 65 + "\n", names="nests")
deploy_case("depth-65-block", "".join("  " * i + "a:\n" for i in range(65)) + "  " * 65 + "b: 1\n", names="nests")
deploy_case("depth-64-sequences-in-known-key", "budget:\n  engines: " + "[" * 62 + "]" * 62 + "\n", names="budget.engines")

# --- duplicate keys, by the value the key spells (Python would keep one silently) -------------------------
deploy_case("dup-plain-and-quoted", 'engine: hf\n"engine": hf\n', names="twice")
deploy_case("dup-nested", "budget:\n  vllm:\n    tp: 1\n    tp: 2\n", names="budget.vllm.tp")
deploy_case("dup-int-spellings", "sglang_mlx:\n  full_kv_pool_index_by_layer: {1: 0, 0x1: 1}\n", names="twice")
deploy_case("dup-true-spellings", "x: {true: 1, True: 2}\n", names="twice")
deploy_case("dup-null-spellings", "x: {null: 1, ~: 2}\n", names="twice")
deploy_case("dup-int-and-float", "x: {1: a, 1.0: b}\n", names="twice")
deploy_case("dup-in-flow-and-block", "budget: {context: 8}\nbudget:\n  context: 9\n", names="twice")
deploy_case("not-dup-string-and-int", "sglang_mlx:\n  full_kv_pool_index_by_layer: {1: 0, '1': 1}\n",
        names="full_kv_pool_index_by_layer")  # distinct keys; the string one is no layer number

# --- YAML 1.1 spellings, read the YAML 1.2 way (strings) ---------------------------------------------------
deploy_case("yaml11-sexagesimal", "context_length: 1:30\n", names="context_length")  # 1.1: 90
deploy_case("yaml11-date", "sglang_mlx:\n  chunked_prefill_size: 2024-01-01\n", names="chunked_prefill_size")
deploy_case("yaml11-norway", "engine: no\n", names="deploy")  # 1.1: false; here the engine 'no', unknown
deploy_case("yaml11-octal", "context_length: 010\n", accepted=True)  # 1.2: decimal 10 (1.1 read 8)

# --- encodings and framing ----------------------------------------------------------------------------------
deploy_case("empty-file", b"", accepted=True)  # every setting at the engine's default
deploy_case("comments-only", "# nothing set\n# yet\n", accepted=True)
deploy_case("document-marker-only", "---\n", accepted=True)
deploy_case("null-document", "~\n", accepted=True)
deploy_case("crlf", "engine: hf\r\ncontext_length: 4096\r\n", accepted=True)
deploy_case("utf8-bom", b"\xef\xbb\xbfcontext_length: 4096\n", accepted=True)  # YAML allows a leading BOM
deploy_case("utf16-bom", "context_length: 4096\n".encode("utf-16"))  # YAML allows it; kvdoctor reads UTF-8 only
deploy_case("nul-byte", b"context_length: 40\x0096\n")  # not printable: YAML refuses
deploy_case("bel-control", b"engine: h\x07f\n")
deploy_case("document-end-then-more", "context_length: 4096\n...\nengine: hf\n")
deploy_case("huge-comment-under-bound", "# " + "x" * 900_000 + "\ncontext_length: 4096\n", accepted=True)
# kda_recipe is read by --engine sglang only:
deploy_case("huge-string-value", 'sglang:\n  kda_recipe: "' + "x" * 900_000 + '"\n', accepted=True)
deploy_case("unicode-unknown-key", "c\u00f6ntext_length: 4096\n", names="c\u00f6ntext_length")
deploy_case("key-is-list", "? [a, b]\n: 1\n")
deploy_case("key-is-null", "~: 1\n")
deploy_case("anchor-on-key-name-typo", "&a context_lenght: 4096\n", names="context_lenght")
deploy_case("healthy-full", """engine: hf
context_length: 8192
sglang_mlx: {chunked_prefill_size: 4096, radix_cache: true, use_custom_rope: false, pool_size: 8}
sglang: {tp_size: 2, enable_linear_replayssm: false, linear_replayssm_cache_len: 16, mamba_ssm_dtype: bfloat16}
budget:
  kv_budget: 40GiB
  context: 8192
  vllm: {hma: true, kv_cache_dtype: auto, tp: 1, max_num_seqs: 256, block_size: 16}
  sglang: {page_size: 1, swa_full_tokens_ratio: 0.8}
  mlx_lm: {kv_bits: 4, kv_group_size: 64}
""", accepted=True)
