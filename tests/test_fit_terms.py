"""The fit terms read from the engines' code: SGLang's default mem_fraction_static and chunked prefill by
release, GPU memory and layout, vLLM's MXFP4 expert padding by GPU class and its CUDA graph capture sizes."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import make_model

from kvdoctor.engines.budget.fit import gpu
from kvdoctor.engines.sglang import reserve
from kvdoctor.engines.vllm import fit as vfit
from kvdoctor.engines.vllm import weights as vw

H100_MIB = 79.18 * 1024


def test_sglang_prefill_graph_sizes_follow_the_step_table() -> None:
    # 4..32 by 4 (8), 48..256 by 16 (14), 288..512 by 32 (8), 576..1024 by 64 (8), 1280..4096 by 256 (12),
    # 4608..8192 by 512 (8)
    assert reserve.prefill_graph_sizes(8192) == 8 + 14 + 8 + 8 + 12 + 8
    assert reserve.prefill_graph_sizes(32) == 8
    assert reserve.prefill_graph_sizes(2) == 0


def test_sglang_default_fraction_of_the_reserve_releases() -> None:
    d = reserve.defaults(H100_MIB, tp=1, release="0.5.23")
    expected = 512 + 8192 * 1.5 + 1024 / 8 + 256 * 2 + reserve.prefill_graph_sizes(8192) * 8
    assert d.chunked_prefill_size == 8192 and d.cuda_graph_max_bs == 256
    assert d.reserved_mib == pytest.approx(expected)
    assert d.mem_fraction_static == round((H100_MIB - expected) / H100_MIB, 3)
    # from 0.5.15 the breakable prefill graphs are CUDA's default and reserved (0.5.21 held to its own resolution:
    # goldens/sglang_fraction-0.5.21.json); the releases before, not read one by one, are priced without them
    assert reserve.defaults(H100_MIB, tp=1, release="0.5.15").reserved_mib == pytest.approx(expected)
    assert reserve.defaults(H100_MIB, tp=1, release="0.5.14").reserved_mib == pytest.approx(expected - 58 * 8)
    # TP 4 doubles the decode batch and adds the TP term
    tp4 = reserve.defaults(H100_MIB, tp=4, release="0.5.23")
    assert tp4.cuda_graph_max_bs == 512 and tp4.mem_fraction_static < d.mem_fraction_static
    # an MLA backend's prefill graphs are priced at 1.5 GiB; attention DP adds padding per DP rank
    assert reserve.defaults(H100_MIB, tp=8, mla=True).reserved_mib > tp4.reserved_mib
    dpa = reserve.defaults(H100_MIB, tp=8, dp=8, dp_attention=True, mla=True)
    assert dpa.reserved_mib - reserve.defaults(H100_MIB, tp=8, mla=True).reserved_mib == pytest.approx(
        512 * 8 * 3 + 512 * 8 * 1.5)


def test_sglang_reserve_floor_and_small_gpus() -> None:
    no_graphs = reserve.defaults(H100_MIB, tp=1, chunked=2048, cuda_graph=False)  # 512 + 3072 + 128 MiB
    assert no_graphs.reserved_mib == 10 * 1024  # the 10 GiB floor above 60 GiB
    small = reserve.defaults(23.64 * 1024, tp=1)  # an RTX 4090: 4k chunks, 48 decode graphs, no floor
    assert small.chunked_prefill_size == 4096 and small.cuda_graph_max_bs == 48
    assert small.reserved_mib < 10 * 1024
    assert reserve.defaults(H100_MIB, tp=1, max_running=32).cuda_graph_max_bs == 32
    assert reserve.defaults(H100_MIB, tp=1, chunked=2048).chunked_prefill_size == 2048


@pytest.mark.parametrize(("tp", "fraction"), [(1, 0.88), (2, 0.87), (4, 0.85), (8, 0.81), (16, 0.79)])
def test_sglang_before_0_5_takes_the_tp_table(tp: int, fraction: float) -> None:
    d = reserve.defaults(H100_MIB, tp=tp, release="0.4.9")
    assert d.mem_fraction_static == fraction and d.reserved_mib == 0
    assert d.chunked_prefill_size == 8192
    assert reserve.defaults(23.64 * 1024, tp=tp, release="0.4.9").chunked_prefill_size == 2048


GPT_OSS = {"hidden_size": 2880, "intermediate_size": 2880, "quantization_config": {"quant_method": "mxfp4"}}


@pytest.mark.parametrize(("name", "tp", "version", "factor"), [
    ("A100-80GB", 1, "0.33.0", (3072 * 2944) / (2880 * 2880)),  # Marlin: hidden to 256, intermediate to 128
    ("A100-80GB", 4, "0.33.0", (3072 * 768) / (2880 * 720)),  # 720 per rank to 768
    ("H100-80GB", 1, "0.33.0", 1.0),  # Triton: 2880 is a multiple of 64 already
    ("H100-80GB", 1, "0.11.0", 3072 / 2880),
    ("B200", 2, "0.33.0", (3072 * 1536) / (2880 * 1440)),
])
def test_mxfp4_expert_padding_by_gpu_class(name: str, tp: int, version: str, factor: float) -> None:
    experts = 1 << 30
    extra, source = vw.mxfp4_padding(GPT_OSS, experts, gpu(name).sm, tp, False, version)
    assert extra == pytest.approx(experts * (factor - 1), abs=2)
    assert source  # every alignment names where it was read or fitted


def test_mxfp4_padding_only_for_mxfp4_checkpoints() -> None:
    assert vw.mxfp4_padding({**GPT_OSS, "quantization_config": {"quant_method": "fp8"}}, 1 << 30, 80, 1, False,
                            "0.33.0") == (0, "")
    assert vw.mxfp4_padding(GPT_OSS, 1 << 30, 0, 1, False, "0.33.0") == (0, "")  # a GPU of unknown class


def test_vllm_capture_sizes() -> None:
    h100 = gpu("H100-80GB")
    # 1, 2, 4, 8..248 by 8, 256..512 by 16: 51 sizes; FULL decode graphs up to 256 sequences: 35
    assert vfit.capture_sizes(256, 8192, h100) == (51, 35)
    assert vfit.capture_sizes(1024, 8192, h100) == (51, 51)
    assert vfit.capture_sizes(8, 8192, h100) == (5, 4)  # up to 2 x 8 tokens: 1, 2, 4, 8, 16; FULL up to 8
    assert vfit.capture_sizes(1024, 8192, gpu("B200"))[0] == 51 + 32  # 1024 on datacenter Blackwell


def test_pipeline_stage_without_cache_layers_is_priced(tmp_path) -> None:
    """Nemotron-NAS (Llama-3.3-Nemotron-Super-49B) has attention-free blocks: at PP 8 a stage may hold no KV
    cache at all; fit prices the others instead of failing on the empty one."""
    import json

    from kvdoctor import api
    from kvdoctor.load.synth import layout_for, write_checkpoint

    d = tmp_path / "nemotron"
    d.mkdir()
    src = Path(__file__).resolve().parent.parent / "fixtures/configs/real/nvidia__Llama-3_3-Nemotron-Super-49B-v1.json"
    (d / "config.json").write_text(src.read_text())
    write_checkpoint(d, layout_for(d))
    doc = api.fit(d, gpu="H100-80GB", gpus=8, context=32768)
    pp8 = next(r for r in doc["rows"] if r["layout"]["pp"] == 8)
    assert pp8["kv_tokens"] and pp8["refusal"] is None
    assert json.loads((d / "config.json").read_text())["block_configs"]  # the attention-free blocks are there


def test_qwen3_5_family_keeps_its_ssm_state_in_the_config_dtype(tmp_path) -> None:
    """vLLM sets mamba_ssm_cache_dtype from mamba_ssm_dtype (float32) for the Qwen3.5/3.6 architectures, so the
    GDN layers' SSM state is twice the bf16 figure; an architecture outside that family keeps the model dtype."""
    import json

    from kvdoctor.engines import profile
    from kvdoctor.engines.vllm import budget as vb
    from kvdoctor.load.loader import load_model

    src = Path(__file__).resolve().parent.parent / "fixtures/configs/real/Qwen__Qwen3.6-35B-A3B.json"
    config = json.loads(src.read_text())
    assert config["text_config"]["mamba_ssm_dtype"] == "float32"
    states = {}
    for name, arch in (("qwen36", config["architectures"]), ("other", ["SomeOtherGdnForCausalLM"])):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**config, "architectures": arch}))
        facts = profile("vllm").budget_facts(load_model(str(d)))
        _, tensors = vb.state_bytes(facts, vb.Mode(max_model_len=4096, kv_budget_bytes=1 << 30))
        states[name] = {t.tensor: t for t in tensors}
    assert states["qwen36"]["ssm"].dtype_bytes == 4 and states["other"]["ssm"].dtype_bytes == 2
    assert states["qwen36"]["ssm"].bytes == 2 * states["other"]["ssm"].bytes
    assert states["qwen36"]["conv"].bytes == states["other"]["conv"].bytes  # the conv state keeps the model dtype


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_tp_that_does_not_divide_the_heads_is_refused_not_launched(tmp_path, engine: str) -> None:
    """Qwen2.5-7B has 28 attention heads: TP 8 does not divide them. vLLM refuses in its config
    (tools/launch_check.py found fit emitting that command), SGLang's attention class asserts; the row carries
    the refusal and no launch command, and the recommendation takes another layout."""
    from kvdoctor import api

    model = make_model(tmp_path, "qwen2.5-7b")
    doc = api.fit(model, engine=engine, gpu="H100-80GB", gpus=8, context=32768)
    tp8 = next(r for r in doc["rows"] if r["layout"]["tp"] == 8 and r["layout"]["pp"] == 1)
    assert tp8["refusal"] is not None and not tp8["launch"] and not tp8["fits"]
    if engine == "vllm":
        assert tp8["refusal"]["message"] == ("Total number of attention heads (28) must be divisible by tensor "
                                             "parallel size (8).")
    tp4 = next(r for r in doc["rows"] if r["layout"]["tp"] == 4 and r["layout"]["pp"] == 2)
    assert tp4["refusal"] is None and tp4["launch"]
    assert doc["recommendation"]["layout"]["tp"] in (1, 2, 4)


def test_sglang_stage_of_linear_attention_alone_does_not_crash(tmp_path) -> None:
    """Kimi-Linear at PP 8 leaves a stage of KDA layers only: SGLang's pool sizing has no token pool to divide
    by there (a ZeroDivisionError before); the stages with attention decide and a note names the rest."""
    from kvdoctor import api

    doc = api.fit(make_model(tmp_path, "kimi-linear"), engine="sglang", gpu="H100-80GB", gpus=8, context=32768)
    pp8 = next(r for r in doc["rows"] if r["layout"]["pp"] == 8)
    assert pp8["kv_tokens"] and any("only linear-attention state" in n for n in pp8["notes"])


def test_vllm_non_torch_memory_by_release_and_rank() -> None:
    # 0.19 prints it: a TP group's all-reduce workspaces dwarf a lone rank's, a PP rank with TP 1 holds least;
    # before 0.19 one figure stands for any rank with others beside it
    group, alone, stage = (vfit.non_torch_memory("0.19.0", 2, 1), vfit.non_torch_memory("0.19.0", 1, 1),
                           vfit.non_torch_memory("0.19.0", 1, 2))
    assert group > 2 * 1024 ** 3 > alone > stage
    assert vfit.non_torch_memory("0.11.0", 1, 2) == vfit.non_torch_memory("0.11.0", 2, 1) > vfit.non_torch_memory(
        "0.11.0", 1, 1)


def test_vllm_moe_workspace_follows_the_triton_expert_shapes() -> None:
    qwen3_moe = {"hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8}
    m, topk, k, n = 8192, 8, 2048, 2 * 768
    expected = (max(m * topk * max(n // 2, k), m * k) + m * topk * max(n, k)) * 2
    assert vfit.moe_workspace(qwen3_moe, 1, m, False, 2) == expected
    # TP splits the gate-and-up width per rank, expert parallelism keeps it whole; a dense model has none
    mixtral = {"hidden_size": 4096, "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2}
    assert vfit.moe_workspace(mixtral, 2, m, False, 2) < vfit.moe_workspace(mixtral, 2, m, True, 2)
    assert vfit.moe_workspace({"hidden_size": 4096, "intermediate_size": 14336}, 1, m, False, 2) == 0


def test_vllm_moe_workspace_is_held_at_the_sampler_peak_from_0_14(tmp_path) -> None:
    from kvdoctor.engines import profile
    from kvdoctor.load.loader import load_model

    d = make_model(tmp_path, {"hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 128,
                              "num_experts_per_tok": 8, "vocab_size": 151936, "num_hidden_layers": 4,
                              "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                              "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"})
    spec = load_model(str(d))
    facts = profile("vllm").budget_facts(spec)
    workspace = vfit.moe_workspace(spec.config, 1, 8192, False, 2)
    new = vfit.activation_peak(facts, spec.config, 1, 8192, 1024, "0.19.0", vocab=151936)
    old = vfit.activation_peak(facts, spec.config, 1, 8192, 1024, "0.11.0", vocab=151936)
    assert new == int(1024 * 151936 * 4 * 3.5) + workspace  # the sampler's peak with the workspaces still held
    assert old == int(1024 * 151936 * 4 * 9.7)  # freed after the forward pass, below the sort-based sampler



def test_vllm_sampler_runs_in_place_from_0_17() -> None:
    # the Triton top-k/top-p kernel first ships in 0.17.0 (topk_topp_sampler.py:245-255 @ 0.17.0): the dummy
    # sampler run's peak drops from the sort-based 9.7 copies of the fp32 logits to 3.5 between 0.16 and 0.17
    assert (vfit.sampler_copies("0.16.0"), vfit.sampler_copies("0.17.0"), vfit.sampler_copies("0.19.0")) == (9.7, 3.5, 3.5)
    assert vfit.sampler_copies("0.7.2") == 10.3

def test_sglang_preload_without_custom_all_reduce_on_pcie_cards() -> None:
    l4, h100 = gpu("L4"), gpu("H100-80GB")
    assert l4.pcie_only and not h100.pcie_only
    assert reserve.preload_kind(4, 1, l4.pcie_only) == "nccl"  # custom all-reduce off beyond two PCIe GPUs
    assert reserve.preload_kind(2, 1, l4.pcie_only) == "group"
    assert reserve.preload_kind(4, 1, h100.pcie_only) == "group" and reserve.preload_kind(1, 1, True) == "alone"
    weights = 15 * 1024 ** 3
    pcie = reserve.pool(l4.memory_bytes, weights, tp=4, release="0.4.3", pcie_only=True)
    nvlink = reserve.pool(l4.memory_bytes, weights, tp=4, release="0.4.3", pcie_only=False)
    assert pcie.preload == reserve.PRELOAD["nccl"] < nvlink.preload and pcie.kv > nvlink.kv


def test_float_weights_are_priced_in_the_serving_dtype(tmp_path) -> None:
    """Both engines cast a float32 checkpoint's weights to the serving dtype as they load them (bfloat16 under
    dtype=auto); scales of quantized tensors keep their dtype; mlx-lm (no float_bytes) keeps what is stored."""
    from kvdoctor.engines.budget.weights import Parallel, weights_per_rank
    from kvdoctor.load.loader import load_model

    def to_f32(layout: dict) -> None:
        for name, (_dt, shape) in list(layout.items()):
            layout[name] = ("F32", shape)
        layout["model.layers.0.mlp.down_proj.weight_scale_inv"] = ("F32", [4, 4])

    spec = load_model(str(make_model(tmp_path, "llama-3.1-8b", tensors=to_f32)))
    assert spec.checkpoint is not None
    stored = weights_per_rank(spec.checkpoint, spec.config, vw.RULES, Parallel(), spec.num_hidden_layers)
    served = weights_per_rank(spec.checkpoint, spec.config, vw.RULES, Parallel(), spec.num_hidden_layers, 2)
    assert served.bytes_per_rank == (stored.bytes_per_rank - 64) // 2 + 64  # the 4 x 4 F32 scale stays 64 B


def test_vllm_dtype_setting_prices_weights_and_kv_in_that_dtype(tmp_path) -> None:
    from kvdoctor.engines import profile
    from kvdoctor.engines.budget.fit import Request
    from kvdoctor.load.loader import load_model

    spec = load_model(str(make_model(tmp_path, "llama-3.1-8b")))
    facts = profile("vllm").budget_facts(spec)
    card, layout, request = gpu("H100-80GB"), {"tp": 1}, Request(context=8192)
    auto = vfit.fit(spec, facts, card, layout, request, {"version": "0.19.0", "kv_budget": 40 << 30})
    fp32 = vfit.fit(spec, facts, card, layout, request, {"version": "0.19.0", "kv_budget": 40 << 30, "dtype": "float32"})
    assert fp32.weights.bytes_per_rank == 2 * auto.weights.bytes_per_rank
    assert auto.kv_tokens is not None and fp32.kv_tokens is not None
    assert abs(fp32.kv_tokens * 2 - auto.kv_tokens) <= 16  # a float32 KV cache: half the tokens, to the block
    assert "--dtype" in fp32.launch and "--dtype" not in auto.launch


def test_sglang_mxfp4_padding_by_gpu_class() -> None:
    from kvdoctor.engines.sglang import weights as sw

    gpt_oss = {"hidden_size": 2880, "intermediate_size": 2880, "quantization_config": {"quant_method": "mxfp4"}}
    experts = 10 << 30
    # datacenter Blackwell (FlashInfer's MXFP4 runner): both sizes to 256, 2880 -> 3072
    assert sw.mxfp4_padding(gpt_oss, experts, 100, 1, 1) == experts * 3072 * 3072 // (2880 * 2880) - experts
    # Hopper (Triton kernels): the per-rank intermediate size to 32 only: 2880 is a multiple, 720 (TP 4) is not
    assert sw.mxfp4_padding(gpt_oss, experts, 90, 1, 1) == 0
    assert sw.mxfp4_padding(gpt_oss, experts, 90, 4, 1) == experts * 736 // 720 - experts
    assert sw.mxfp4_padding(gpt_oss, experts, 90, 8, 1) == experts * 384 // 360 - experts  # 360 -> 384
    assert sw.mxfp4_padding({**gpt_oss, "quantization_config": {}}, experts, 100, 1, 1) == 0


def test_vllm_online_fp8_stores_the_linear_layers_in_one_byte(tmp_path) -> None:
    """--quantization fp8 on a bfloat16 checkpoint: vLLM keeps its linear layers (and experts) in FP8 once loaded;
    the embeddings, head and norms stay bfloat16. A checkpoint already quantized is priced as stored."""
    from kvdoctor.engines import profile
    from kvdoctor.engines.budget.fit import Request
    from kvdoctor.load.loader import load_model

    spec = load_model(str(make_model(tmp_path, "llama-3.1-8b")))
    assert spec.checkpoint is not None
    facts = profile("vllm").budget_facts(spec)
    card, request = gpu("H100-80GB"), Request(context=8192)
    bf16 = vfit.fit(spec, facts, card, {"tp": 1}, request, {"version": "0.19.0"})
    fp8 = vfit.fit(spec, facts, card, {"tp": 1}, request, {"version": "0.19.0", "quantization": "fp8"})
    linear = sum(2 * n for n in _numels(spec, ("proj.weight",)))
    assert linear > 0 and bf16.weights.bytes_per_rank - fp8.weights.bytes_per_rank == linear // 2
    assert fp8.kv_bytes - bf16.kv_bytes == linear // 2  # the memory freed goes to the KV cache
    assert "Fp8OnlineLinearMethod" in fp8.weights.source
    assert vw.online_quantization({"quantization_config": {"quant_method": "fp8"}}, "fp8") is None
    assert vw.online_quantization({}, None) is None


def _numels(spec, suffixes: tuple[str, ...]) -> list[int]:
    out = []
    for name, _dtype, shape, _file in spec.checkpoint.tensors.values():
        if name.endswith(suffixes) and ".layers." in name:
            n = 1
            for d in shape:
                n *= d
            out.append(n)
    return out


def test_vllm_refuses_tp_that_does_not_divide_the_vocabulary_or_the_kv_heads(tmp_path) -> None:
    """Qwen3-14B's shapes on a Qwen2 config (40 heads, 8 KV heads, 151936 tokens) at TP 5: the heads divide, the embedding's rows
    do not, and vLLM stops on that assertion building the model (the fresh2 log's text); with 10 KV heads, TP 4
    divides the heads and the vocabulary but not the KV heads."""
    from helpers import real_config

    from kvdoctor.engines import profile
    from kvdoctor.engines.budget.fit import Request
    from kvdoctor.load.loader import load_model

    base = {**real_config("qwen2.5-7b"), "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 8,
            "num_hidden_layers": 2, "intermediate_size": 17408, "vocab_size": 151936}
    rows = {}
    for kv, tp in ((8, 5), (8, 4), (10, 4)):
        spec = load_model(str(make_model(tmp_path, {**base, "num_key_value_heads": kv}, dirname=f"kv{kv}-tp{tp}")))
        facts = profile("vllm").budget_facts(spec)
        rows[kv, tp] = vfit.fit(spec, facts, gpu("H100-80GB"), {"tp": tp}, Request(context=8192), {"version": "0.19.0"})
    assert rows[8, 5].refusal is not None and rows[8, 5].refusal.message == "151936 is not divisible by 5"
    assert rows[8, 5].refusal.cls == "AssertionError" and not rows[8, 5].launch
    assert rows[8, 4].refusal is None and rows[8, 4].launch
    assert rows[10, 4].refusal is not None and rows[10, 4].refusal.message == "10 is not divisible by 4"
