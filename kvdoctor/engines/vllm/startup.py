"""vLLM's own start-up up to KV planning, for one config.json and one set of engine arguments.

Runs inside a Python that has a profiled vLLM release, 0.26.0 to 0.34.0 (imported here only; never by
kvdoctor's own process), with VLLM_TARGET_DEVICE=cpu; where the releases' APIs differ it asks which one it
has. Used by `kvdoctor check --engine vllm --dry-run` (a child process: `python startup.py REQUEST.json
RESULT.json`) and by goldens/vllm_check_oracle.py. All of it calls vLLM:
1. `EngineArgs(model=DIR, load_format="dummy", skip_tokenizer_init=True, **args).create_engine_config()`;
2. the model class on the meta device (`initialize_model`), `update_block_size_for_backend`,
   `validate_block_size` and the worker's `get_kv_cache_spec` (every layer's own spec);
3. the engine core's `resolve_kv_cache_layout`, `get_global_kv_cache_groups` and `get_kv_cache_configs`
   (admission check) against the given KV budget.
What it supplies: a single-process gloo group (TP world size faked for TP > 1, rank 0) and one recorded
workaround per CPU-only obstacle (see goldens/README.md). Standard library and vLLM imports only.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# Kimi's model code imports the SM100 fused GEMM+all-reduce kernel (cutlass) at construction unless this
# vLLM flag turns it off; it does not touch KV specs.
os.environ.setdefault("VLLM_KIMI_K3_GEMM_AR", "0")


class Log(logging.Handler):
    """Every WARNING+ record from any logger (vLLM re-applies its dictConfig, so hook Logger.handle)."""

    records: list[dict] = []
    stage = "config"

    @classmethod
    def install(cls) -> None:
        original = logging.Logger.handle

        def handle(self, record):
            if record.levelno >= logging.WARNING:
                row = {"stage": cls.stage, "logger": record.name,
                       "where": f"{Path(record.pathname).name}:{record.lineno}", "message": record.getMessage()}
                if record.exc_info and record.exc_info[1] is not None:  # logger.exception: the error's last line
                    row["exception"] = str(record.exc_info[1]).strip().splitlines()[-1][-500:]
                cls.records.append(row)
            return original(self, record)

        logging.Logger.handle = handle  # type: ignore[method-assign]


def error_row(exc: BaseException, stage: str) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    in_vllm = [f for f in frames if "site-packages/vllm/" in f.filename]

    def where(f):
        return f"{f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name}" if f else None

    row = {"stage": stage, "class": type(exc).__name__, "message": str(exc),
           "raised_at_vllm": where(in_vllm[-1] if in_vllm else None),
           "raised_at": where(frames[-1] if frames else None),
           "through_cpu_platform": any(f.filename.endswith(CPU_PLATFORM) for f in frames)}
    if exc.__cause__ is not None:
        row["cause"] = f"{type(exc.__cause__).__name__}: {exc.__cause__}"
    return row


CPU_PLATFORM = os.path.join("vllm", "platforms", "cpu.py")
CPU_OBSTACLES = (  # an error that only the CPU box raises -> the workaround that lets the point go on
    ("Failed to find a kernel that can implement the ScaledMM linear layer", "drop_quantization_config"),
    ("No MXFP4 MoE backend supports the deployment configuration", "drop_quantization_config"),
    ("Mxfp4 MoE backend 'CPU' does not support the deployment configuration", "drop_quantization_config"),  # 0.28.0
    # NVFP4 (ModelOpt) MoE experts: no CPU backend implements them (fused_moe/oracle/nvfp4.py); CUDA has
    # FlashInfer / CUTLASS / Marlin ones. Weight quantization does not enter KV specs.
    ("No NvFp4 MoE backend supports the deployment configuration.", "drop_quantization_config"),
    ("Marlin FP4 not available", "drop_quantization_config"),  # NVFP4 (ModelOpt) checkpoints' linear layers
    # the same where no NVFP4 linear kernel class is even a candidate on the CPU (an empty list of reasons)
    ("Failed to find a kernel that can implement the NVFP4 linear layer.", "drop_quantization_config"),
    # ModelOpt MIXED_PRECISION checkpoints' MXFP8 linear layers (MiniMax-M3-NVFP4): no CPU kernel class either
    ("Failed to find a kernel that can implement the MXFP8 linear layer.", "drop_quantization_config"),
    # int4 compressed-tensors experts (Kimi-K2.5's WNA16): the CPU has no candidate, CUDA has Marlin ones
    ("No WNA16 MoE backend supports the deployment configuration.", "drop_quantization_config"),
    # CpuPlatform turns prefix caching off for MLA after the Mamba block size was aligned for it
    # (MLA + linear-attention hybrids such as Kimi-Linear): rerun with prefix caching off from the start.
    ("--mamba-block-size can only be set with --enable-prefix-caching", "prefix_caching_off"),
    # Nemotron-3's non-gated (relu2) MoE: FusedMoEConfig accepts it on CUDA / XPU / ROCm only, and no CPU
    # MoE backend is picked for it. The experts are built on the meta device and never run.
    ("is_act_and_mul=False is supported only for CUDA, XPU and ROCm", "moe_on_cpu"),
)
# The same obstacles where a release raises them without a message: (class, the vLLM file that raises it).
# 0.26.0's ModelOpt W4A16 NVFP4 linear method pins the Marlin kernel (modelopt.py:1283), whose base class asserts
# that it is supported (kernels/linear/nvfp4/base.py:35): Marlin FP4 runs on CUDA and not on the CPU box. Later
# releases raise "Marlin FP4 not available" (above).
CPU_OBSTACLE_SITES = (("AssertionError", "vllm/model_executor/kernels/linear/nvfp4/base.py", "drop_quantization_config"),)


def obstacle(exc: BaseException) -> str | None:
    """The workaround for an error only the CPU box raises (CPU_OBSTACLES, CPU_OBSTACLE_SITES), else None."""
    text = str(exc)
    fix = next((w for t, w in CPU_OBSTACLES if t in text), None)
    if fix is not None or text:
        return fix
    where = (error_row(exc, "")["raised_at_vllm"] or "").split(":")[0]
    return next((w for name, site, w in CPU_OBSTACLE_SITES if type(exc).__name__ == name and where == site), None)
# Refusals the CPU box raises where a GPU would not (no workaround): kept, marked `cpu_only`, not compared.
# The Mamba block-size message is one of them here: no point sets --mamba-block-size, so it only comes from
# CpuPlatform turning off the prefix caching the point asked for (MLA + linear-attention hybrids). So is a
# release's multimodal model class asking transformers for the checkpoint's image processor while it is built
# (Qwen2.5-VL in 0.30.0): the directory here holds config.json alone, a served model's its preprocessor_config.json.
# A custom op missing from the CPU build (GPT-2's gelu_new: "'_OpNamespace' '_C' object has no attribute
# 'gelu_new'") is one too: vLLM's CUDA build has its own kernel. So is a model class reading the tokenizer while it is
# built (DeepSeek-VL2 at 0.34.0, deepseek_vl2.py:377 `tokenizer.vocab[...]`): the points run with skip_tokenizer_init
# on config.json alone, a served model has its tokenizer. And a model class importing CUTLASS's Python DSL, which
# vLLM's CUDA wheels bring and the CPU build lacks (MiniMax-M3's sparse attention: "No module named 'cutlass'").
CPU_ONLY = ("on CPU", "No module named 'cutlass'", "No Unquantized MoE backend supports the deployment configuration",
            "--mamba-block-size can only be set with --enable-prefix-caching", "Can't load image processor for",
            "'NoneType' object has no attribute 'vocab'",
            "'_OpNamespace' '_C' object has no attribute",
            # a drafter's buffers allocated in the box's own memory (DeepSeek-V4 with MTP: 32 GiB at once)
            "DefaultCPUAllocator: can't allocate memory")


SKIPPED: list[str] = []  # CPU-only checks skipped during the current point


def _skip_cpu_mla_block_check() -> None:
    """The CPU MLA kernel takes block 16 only, so CpuPlatform refuses the block size the hybrid alignment
    picks for MLA + linear-attention models (Kimi-Linear: 1920); FlashAttention-MLA on CUDA takes any
    multiple of 16. Skip that one refusal (recorded per point in `skipped_cpu_checks`)."""
    from vllm.platforms.cpu import CpuPlatform

    if not hasattr(CpuPlatform, "_check_aligned_block_size"):  # the check is newer than the release (0.33.0 on)
        return
    original = CpuPlatform._check_aligned_block_size.__func__

    def check(cls, vllm_config, backend_classes, pre_block_size):
        try:
            original(cls, vllm_config, backend_classes, pre_block_size)
        except ValueError as exc:
            if not str(exc).endswith("attention backend(s): CPU_MLA."):
                raise
            SKIPPED.append(str(exc))

    CpuPlatform._check_aligned_block_size = classmethod(check)


FP8_KV_ISA = "fp8 KV cache: CPU_ATTN's AVX-512 / AMX requirement (this host has neither)"
BF16_STATE_ISA = ("Mamba state: CpuPlatform's AVX-512 BF16 storage choices (float32 SSM state, SD conv layout), "
                  "answered as on a host without AVX-512 BF16")


@contextlib.contextmanager
def _state_storage_of_any_host():
    """On a host with AVX-512 BF16, CpuPlatform stores a hybrid model's SSM state in float32 and its conv
    state in the "SD" layout for its own kernels; CUDA keeps the model's dtype. Hide the ISA from that
    choice while the engine config is made, so that the goldens do not depend on the machine."""
    import torch

    original = torch.cpu._is_avx512_bf16_supported
    torch.cpu._is_avx512_bf16_supported = lambda: False
    try:
        yield original()
    finally:
        torch.cpu._is_avx512_bf16_supported = original


def _fp8_kv_on_any_host() -> None:
    """CPU_ATTN accepts an fp8 KV cache dtype only on an x86 host with AVX-512 or AMX (its kernels need
    them); FlashAttention on CUDA takes it regardless, and the KV specs do not depend on the host's ISA.
    Answer for the dtype alone, as on such a host (recorded per point in `skipped_cpu_checks`), so that
    the goldens do not depend on the machine that made them."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    if getattr(CPUAttentionBackend, "_kvdoctor_any_host", False):
        return
    original = CPUAttentionBackend.supports_kv_cache_dtype.__func__

    def supports(cls, kv_cache_dtype):  # vLLM caches the backend choice: _run_point records the skip
        return original(cls, kv_cache_dtype) or kv_cache_dtype in cls.supported_kv_cache_dtypes

    CPUAttentionBackend.supports_kv_cache_dtype = classmethod(supports)
    CPUAttentionBackend._kvdoctor_any_host = True


def _fp8_isa_missing() -> bool:
    import torch

    return not (torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_supported())


def _moe_on_cpu() -> None:
    """The `moe_on_cpu` workaround: FusedMoEConfig's platform check sees a platform that answers
    is_xpu() True while it runs, and the unquantized MoE backend choice falls back to vLLM's CPU experts
    class where it finds none (the MoE layers' weights and kernels do not enter KV specs)."""
    from vllm.model_executor.layers.fused_moe import config as moe_config
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method
    from vllm.model_executor.layers.fused_moe.oracle import unquantized

    if getattr(moe_config.FusedMoEConfig, "_kvdoctor_moe_on_cpu", False):
        return  # installed by an earlier point of this process; each point still records it (SKIPPED)

    class _Xpu:
        def __init__(self, real):
            self._real = real

        def is_xpu(self):
            return True

        def __getattr__(self, name):
            return getattr(self._real, name)

    original_post_init = moe_config.FusedMoEConfig.__post_init__

    def post_init(self):
        real = moe_config.current_platform
        if not self.is_act_and_mul and "moe_on_cpu" not in SKIPPED:
            SKIPPED.append("moe_on_cpu")
        moe_config.current_platform = _Xpu(real)
        try:
            original_post_init(self)
        finally:
            moe_config.current_platform = real

    moe_config.FusedMoEConfig.__post_init__ = post_init
    moe_config.FusedMoEConfig._kvdoctor_moe_on_cpu = True
    original_select = method.select_unquantized_moe_backend

    def select(*args, **kwargs):
        try:
            return original_select(*args, **kwargs)
        except NotImplementedError:
            backend = unquantized.UnquantizedMoeBackend.CPU
            return backend, unquantized.backend_to_kernel_cls(backend)[0]

    method.select_unquantized_moe_backend = select


def triton_check_passes() -> None:
    """From 0.34.0 CpuPlatform refuses an x86 host without triton-cpu ("vLLM on x86 CPUs requires Triton
    (triton-cpu).": its CPU model runner is gone). No kernel runs here: that one check, and only while it
    runs, sees Triton (recorded in `stand_ins`). goldens/vllm_oracle.py calls it too."""
    import vllm.triton_utils as triton_utils
    from vllm.platforms import current_platform

    if triton_utils.HAS_TRITON or "_kvdoctor_triton" in vars(current_platform):
        return
    update = current_platform.check_and_update_config

    def with_triton(vllm_config):
        had, triton_utils.HAS_TRITON = triton_utils.HAS_TRITON, True
        try:
            return update(vllm_config)
        finally:
            triton_utils.HAS_TRITON = had

    current_platform.check_and_update_config = with_triton
    current_platform._kvdoctor_triton = True


def _placeholder(name: str):
    def placeholder(*args, **kwargs):
        raise RuntimeError(f"{name} is a kvdoctor placeholder: no kernel runs in a dry run")
    return placeholder


ACTIVATIONS = os.path.join("vllm", "model_executor", "layers", "activation.py")


def _kernel_handles() -> None:
    """Up to 0.32 an activation layer such as SiluAndMul looks its kernel up in `torch.ops._C` while it is built,
    on the CPU platform too; the CUDA wheel's `vllm._C` does not load on the CPU, so the lookup fails before any spec exists.
    A missing `_C` op answers a placeholder that raises if called (the model is built on the meta device and
    never runs; recorded in `stand_ins`)."""
    import torch

    namespace = type(torch.ops._C)
    original = namespace.__getattr__
    if getattr(original, "kvdoctor_placeholders", False):
        return

    def lookup(self, name):
        try:
            return original(self, name)
        except AttributeError:  # only for the activation layers' lookups: a probe (hasattr) must see the truth
            if self.name != "_C" or not sys._getframe(1).f_code.co_filename.endswith(ACTIVATIONS):
                raise

            return _placeholder(f"vllm._C.{name}")

    lookup.kvdoctor_placeholders = True  # type: ignore[attr-defined]
    namespace.__getattr__ = lookup  # type: ignore[method-assign]


def _flash_attn_names() -> None:
    """0.28.0's fa_utils binds `compile_flash_attn_varlen_func_from_specs` on CUDA, and to None on XPU and ROCm,
    but not on the CPU, while the MLA prefill module imports it by name (DeepSeek, Kimi-K2): bind it to None as
    the other non-CUDA branches do, and give that prefill backend, which MLA layers pick without asking whether
    it is available, a placeholder kernel (no attention runs; recorded in `stand_ins`)."""
    try:
        from vllm.v1.attention.backends import fa_utils
    except ImportError:
        return
    if not hasattr(fa_utils, "compile_flash_attn_varlen_func_from_specs"):
        fa_utils.compile_flash_attn_varlen_func_from_specs = None
        # its MLA prefill backend, chosen without asking whether it is available, then wants the kernel function
        from vllm.v1.attention.backends.mla.prefill import flash_attn as prefill

        if prefill.flash_attn_varlen_func is None:
            prefill.flash_attn_varlen_func = _placeholder("flash_attn_varlen_func")


class _NoCudaStream:
    """Stands in for torch.cuda.Stream / Event, which Kimi-Linear's layers create at construction."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _without_quantization(cfg: dict) -> dict:
    """The config without its weight quantization, at the top level and in a VLM's text_config."""
    out = {k: v for k, v in cfg.items() if k != "quantization_config"}
    if isinstance(cfg.get("text_config"), dict):
        out["text_config"] = {k: v for k, v in cfg["text_config"].items() if k != "quantization_config"}
    return out


def _kv_scheme(qc) -> bool:
    """A checkpoint quantization config that quantizes the KV cache (compressed-tensors / ModelOpt)."""
    return isinstance(qc, dict) and any(qc.get(k) or (qc.get("quantization") or {}).get(k)
                                        for k in ("kv_cache_scheme", "kv_cache_quant_algo"))


def engine_config(cfg: dict, kwargs: dict, root: Path):
    from vllm.engine.arg_utils import EngineArgs

    model_dir = Path(tempfile.mkdtemp(dir=root))
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    return EngineArgs(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True,
                      **kwargs).create_engine_config()


def fields(vc) -> dict:
    mc, cc, sc, pc = vc.model_config, vc.cache_config, vc.scheduler_config, vc.parallel_config
    text = mc.hf_text_config
    return {
        "architecture": mc.architecture, "architectures": list(mc.architectures or []),
        "model_type": getattr(mc.hf_config, "model_type", None), "hf_config_class": type(mc.hf_config).__name__,
        "is_hybrid": bool(mc.is_hybrid), "is_attention_free": bool(mc.is_attention_free), "use_mla": bool(mc.use_mla),
        "get_sliding_window": mc.get_sliding_window(), "text_sliding_window": getattr(text, "sliding_window", None),
        "text_layer_types": list(getattr(text, "layer_types", None) or []) or None,
        "attention_chunk_size": mc.attention_chunk_size, "max_model_len": mc.max_model_len,
        "head_size": mc.get_head_size(), "total_num_kv_heads": mc.get_total_num_kv_heads(),
        "num_kv_heads_per_rank": mc.get_num_kv_heads(pc), "num_layers": mc.get_num_layers(pc),
        "dtype": str(mc.dtype).replace("torch.", ""), "tensor_parallel_size": pc.tensor_parallel_size,
        "cache_dtype": cc.cache_dtype, "block_size": cc.block_size, "enable_prefix_caching": cc.enable_prefix_caching,
        "mamba_cache_mode": cc.mamba_cache_mode, "mamba_block_size": cc.mamba_block_size,
        "disable_hybrid_kv_cache_manager": sc.disable_hybrid_kv_cache_manager,
        "max_num_batched_tokens": sc.max_num_batched_tokens, "max_num_seqs": sc.max_num_seqs,
    }


def layer_index(name: str) -> int | None:
    """The decoder layer a KV cache name belongs to: `model.layers.3.self_attn.attn`, GPT-2-style
    `transformer.h.3.attn.attn`, or `3.attn` where a release's model class prefixes its attention layers without
    the stack's name (OLMo-2, GPT-BigCode in 0.30)."""
    match = re.search(r"(?:^|\.)(\d+)\.", name)
    return int(match.group(1)) if match else None


def spec_row(name: str, spec) -> dict:
    row = {"name": name, "index": layer_index(name), "spec": type(spec).__name__,
           "block_size": spec.block_size, "page_size_bytes": spec.page_size_bytes,
           "is_draft": bool(getattr(spec, "is_draft", False))}
    if hasattr(spec, "num_kv_heads"):
        row.update(num_kv_heads=spec.num_kv_heads, head_size=spec.head_size,
                   head_size_v=getattr(spec, "head_size_v", spec.head_size),
                   dtype=str(spec.dtype).replace("torch.", ""),
                   window=getattr(spec, "sliding_window", None),
                   attention_chunk_size=getattr(spec, "attention_chunk_size", None))
    if hasattr(spec, "shapes"):
        row.update(shapes=[list(s) for s in spec.shapes], dtypes=[str(d).replace("torch.", "") for d in spec.dtypes],
                   mamba_type=str(spec.mamba_type.name if hasattr(spec.mamba_type, "name") else spec.mamba_type),
                   mamba_cache_mode=spec.mamba_cache_mode)
    return row


def group_row(group) -> dict:
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    spec = group.kv_cache_spec
    first = next(iter(spec.kv_cache_specs.values())) if isinstance(spec, UniformTypeKVCacheSpecs) else spec
    return {"spec": type(first).__name__, "container": type(spec).__name__,
            "layer_ids": [layer_index(n) for n in group.layer_names], "layer_names": list(group.layer_names),
            "block_size": spec.block_size, "page_bytes": first.page_size_bytes,
            "window": getattr(first, "sliding_window", None),
            "attention_chunk_size": getattr(first, "attention_chunk_size", None)}


def model_specs(vc, tp_fake: int | None) -> dict:
    """Stage 2: the real model class on the meta device, then every layer's own get_kv_cache_spec."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec

    tp = parallel_state.get_tp_group()
    saved = (tp.world_size, tp.rank_in_group)
    if tp_fake:
        tp.world_size, tp.rank_in_group = tp_fake, 0
    # Some model classes move a tower to the platform's current device inside __init__ (Kimi-K2.5's
    # vision tower): on a GPU that is where the model is built; here the build is on meta, so is that.
    current_platform.current_device = lambda: torch.device("meta")
    try:
        with set_current_vllm_config(vc):
            with torch.device("meta"):
                initialize_model(vllm_config=vc)
            current_platform.update_block_size_for_backend(vc)
            vc.validate_block_size()
            return get_kv_cache_spec(vc)
    finally:
        tp.world_size, tp.rank_in_group = saved
        del current_platform.current_device


def _layout(vc, specs: dict) -> str | None:
    """The engine core's KV cache layout (resolve_kv_cache_layout over the backends' layouts, 0.30.0 on);
    up to 0.29 the layout is the process-wide get_kv_cache_layout() and the core resolves none."""
    try:
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    except ImportError:
        from vllm.v1.attention.backends.utils import get_kv_cache_layout

        return str(get_kv_cache_layout())
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends

    layouts = [layout.name for layout in get_supported_kv_cache_layouts(get_current_attn_backends(vc))]
    return resolve_kv_cache_layout(vc, [layouts], list(specs.values())).name


def _grouping():
    """(groups(vc, specs), configs(vc, specs, budget, groups)) through the release's own API: from 0.33.0
    kv_cache_planning's get_global_kv_cache_groups, whose groups get_kv_cache_configs takes; before, in
    kv_cache_utils, get_kv_cache_groups for one worker and get_kv_cache_configs, which groups again itself."""
    try:
        from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs

        return (lambda vc, specs: get_global_kv_cache_groups(vc, [specs]),
                lambda vc, specs, budget, groups: get_kv_cache_configs(vc, [specs], [budget], groups))
    except ImportError:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs as configs
        from vllm.v1.core.kv_cache_utils import get_kv_cache_groups

        return get_kv_cache_groups, lambda vc, specs, budget, groups: configs(vc, [specs], [budget])


def planning(vc, specs: dict, budget: int) -> dict:
    """Stage 3: the engine core's layout resolution, grouping and admission check."""
    from vllm.config import set_current_vllm_config

    out: dict = {}
    groups_of, configs_of = _grouping()
    with set_current_vllm_config(vc):
        out["kv_cache_layout"] = _layout(vc, specs)
        Log.stage = "groups"
        try:  # each call gets its own copy of the specs: the HMA-off promotion rewrites them in place
            groups = groups_of(vc, dict(specs))
        except Exception as exc:  # noqa: BLE001 - what vLLM raises is the golden
            out["error"] = error_row(exc, "groups")
            return out
        out["groups"] = [group_row(g) for g in groups]
        Log.stage = "admission"
        try:
            config = configs_of(vc, dict(specs), budget, groups)[0]
            out["num_blocks"] = config.num_blocks
        except Exception as exc:  # noqa: BLE001
            out["error"] = error_row(exc, "admission")
    return out


def run_point(cfg: dict, kwargs: dict, root: Path, budget: int) -> dict:
    """One point; a refusal is marked `cpu_only` where the CPU box raises it and a GPU would not (its text, or
    an error raised inside CpuPlatform's own code: 0.28.0 asks a copy of Qwen3-VL's config whether it uses
    MLA there), and `environment` where vLLM could not import its model module with the transformers the venv
    resolved (0.28.0 and 0.30.0 admit any newer transformers; 5.25.0 lacks names their pixtral.py imports)."""
    point = _run_point(cfg, kwargs, root, budget)
    outcome = point["outcome"]
    if not outcome["start"]:
        outcome["cpu_only"] = (any(text in outcome["message"] for text in CPU_ONLY)
                               or bool(outcome.pop("through_cpu_platform", False)) or _cpu_blocks_unpromoted(point))
        FAILED_IMPORTS.extend(row["exception"] for row in point["log"] if "cannot import name" in row.get(
            "exception", "") and "from 'transformers" in row["exception"])
        if "failed to be inspected" in outcome["message"] and FAILED_IMPORTS:
            outcome["environment"] = FAILED_IMPORTS[0]
    return point


def _cpu_blocks_unpromoted(point: dict) -> bool:
    """0.26.0 with the hybrid manager off promotes sliding layers to full attention keeping their own block size
    (releases.PROMOTED_TAKE_FULL_BLOCK) and refuses when the blocks then differ. On CUDA every attention layer has
    the default block; on the CPU box sliding layers get 16 and full ones 128, so that refusal is the CPU's."""
    attention = {row["block_size"] for row in point.get("layers") or [] if row["spec"] != "MambaSpec"}
    mamba = any(row["spec"] == "MambaSpec" for row in point.get("layers") or [])
    return "failed to convert the KV cache specs to one unified type" in point["outcome"]["message"] and (
        len(attention) > 1 and not mamba)


FAILED_IMPORTS: list[str] = []  # vLLM inspects a model class once per process and logs why it failed only then


def _run_point(cfg: dict, kwargs: dict, root: Path, budget: int) -> dict:
    workarounds: list[str] = []
    earlier: list[dict] = []
    Log.records = []
    SKIPPED.clear()
    while True:
        Log.stage = "config"
        point: dict = {"workarounds": list(workarounds)}
        try:
            with _state_storage_of_any_host() as host_has_bf16:
                vc = engine_config(cfg, kwargs, root)
        except Exception as exc:  # noqa: BLE001
            fix = obstacle(exc)
            if fix == "prefix_caching_off" and fix not in workarounds and "enable_prefix_caching" not in kwargs:
                earlier.append(error_row(exc, "config"))
                workarounds.append(fix)
                kwargs = {**kwargs, "enable_prefix_caching": False}
                continue
            point["outcome"] = {"start": False, **error_row(exc, "config")}
            break
        point["fields"] = fields(vc)
        Log.stage = "specs"
        try:
            specs = model_specs(vc, kwargs.get("tensor_parallel_size") if kwargs.get("tensor_parallel_size", 1) > 1
                                else None)
        except Exception as exc:  # noqa: BLE001
            fix = obstacle(exc)
            quantization = (cfg.get("quantization_config") or (cfg.get("text_config") or {}).get(
                "quantization_config"))
            if fix == "drop_quantization_config" and fix not in workarounds and quantization:
                earlier.append(error_row(exc, "specs"))
                workarounds.append(fix)
                # the KV cache dtype the checkpoint asked for stays (vLLM made it fp8 for a kv_cache_scheme)
                if vc.cache_config.cache_dtype != kwargs.get("kv_cache_dtype", "auto") or (
                        _kv_scheme(quantization) and kwargs.get("kv_cache_dtype", "auto") == "auto"):
                    workarounds.append("kv_cache_dtype_from_checkpoint")
                    kwargs = {**kwargs, "kv_cache_dtype": vc.cache_config.cache_dtype
                              if vc.cache_config.cache_dtype != "auto" else "fp8"}
                cfg = _without_quantization(cfg)
                continue
            if fix == "moe_on_cpu" and fix not in workarounds:
                earlier.append(error_row(exc, "specs"))
                workarounds.append(fix)
                _moe_on_cpu()
                continue
            point["outcome"] = {"start": False, **error_row(exc, "specs")}
            break
        point["fields_after_specs"] = {"block_size": vc.cache_config.block_size,
                                       "mamba_page_size_padded": vc.cache_config.mamba_page_size_padded}
        try:
            point["layers"] = [spec_row(n, s) for n, s in specs.items()]
        except AssertionError as exc:  # a spec whose page vLLM cannot size (a Mamba page_size_padded below the
            # state's own page, Zamba2 at block 32): vLLM's KV planning asks the same property and stops there
            point["outcome"] = {"start": False, **error_row(exc, "planning")}
            break
        if host_has_bf16 and any(row["spec"] == "MambaSpec" for row in point["layers"]):
            SKIPPED.append(BF16_STATE_ISA)
        plan = planning(vc, specs, budget)
        point["kv_cache_layout"] = plan.get("kv_cache_layout")
        point["groups"] = plan.get("groups")
        point["hma"] = {"on": not vc.scheduler_config.disable_hybrid_kv_cache_manager}
        if "error" in plan:
            point["outcome"] = {"start": False, **plan["error"]}
        else:
            point["outcome"] = {"start": True}
            point["num_blocks"] = plan["num_blocks"]
        break
    point["engine_args_effective"] = kwargs
    if str((point.get("fields") or {}).get("cache_dtype")).startswith("fp8") and _fp8_isa_missing():
        SKIPPED.append(FP8_KV_ISA)
    point["skipped_cpu_checks"] = list(SKIPPED)
    point["earlier_attempt_errors"] = earlier
    point["log"] = Log.records
    return point


def cpu_platform() -> None:
    """VLLM_TARGET_DEVICE=cpu picks CpuPlatform from 0.27.0; 0.26.0 picks it only for a CPU build of vLLM (a
    version with "cpu" in it) or on macOS, so the CUDA wheel on a CPU box resolves no platform there. While the
    platform is resolved, vLLM's own version reads as a CPU build's (recorded in `stand_ins`; later releases
    read the variable and not the version)."""
    if os.environ.get("VLLM_TARGET_DEVICE") != "cpu":
        return
    import importlib.metadata as metadata

    real = metadata.version

    def version(distribution_name: str) -> str:
        found = real(distribution_name)
        return f"{found}+cpu" if distribution_name == "vllm" and "cpu" not in found else found

    metadata.version = version
    try:
        import vllm.platforms

        vllm.platforms.current_platform.device_type  # noqa: B018 - resolved now, under the CPU build's version
    finally:
        metadata.version = real


def setup(root: Path) -> None:
    """Once per process: the log hook, the CPU stand-ins and a world-size-1 gloo group."""
    cpu_platform()
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    Log.install()
    torch.cuda.Stream = torch.cuda.Event = _NoCudaStream  # type: ignore[misc, assignment]
    _skip_cpu_mla_block_check()
    _fp8_kv_on_any_host()
    triton_check_passes()
    _kernel_handles()
    _flash_attn_names()
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"file://{root / 'store'}", backend="gloo")
        initialize_model_parallel(1, 1)


# What every point imports (engine_config, model_specs, planning): a warm child imports them once.
PRELOAD = ("vllm", "vllm.config", "vllm.distributed", "vllm.distributed.parallel_state", "vllm.engine.arg_utils",
           "vllm.model_executor.model_loader.utils", "vllm.platforms", "vllm.v1.worker.gpu.attn_utils",
           "vllm.v1.attention.backends.utils", "vllm.v1.core.kv_cache_utils", "vllm.v1.kv_cache_interface",
           "vllm.distributed.kv_transfer.kv_connector.utils")


def preload(key: dict) -> None:
    """A warm child's imports (kvdoctor/engines/warm_server.py forks per model after them). setup() is
    not run here: its gloo group and stand-ins belong to each model's own fork."""
    cpu_platform()
    for name in PRELOAD:
        importlib.import_module(name)
    with contextlib.suppress(ImportError):  # the planning half of kv_cache_utils, from 0.33.0
        importlib.import_module("vllm.v1.core.kv_cache_planning")


def main() -> None:
    """REQUEST.json {"config": {...}, "engine_args": {...}, "kv_budget_bytes": N} -> RESULT.json."""
    request = json.loads(Path(sys.argv[1]).read_text())
    import vllm

    root = Path(tempfile.mkdtemp(prefix="kvdoctor-vllm-dryrun-"))
    result = {"versions": {"vllm": vllm.__version__}}
    Path(sys.argv[2]).write_text(json.dumps(result))  # how far it got, if the point kills the process
    setup(root)
    result.update(run_point(request["config"], request.get("engine_args") or {}, root,
                            int(request.get("kv_budget_bytes") or 40 << 30)))
    Path(sys.argv[2]).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
