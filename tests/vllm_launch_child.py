"""Run by the vLLM venv's Python (tests/test_fit_cli.py, tools/launch_check.py): parse each `vllm serve ...`
command kvdoctor fit emitted with vLLM's own argument parser, validate it as `vllm serve` does, and create
the engine config. argv[1]: a JSON file holding a list of commands. Prints one JSON object per command, in
order: the config's figures, or where it failed ("stage": parse or config) and vLLM's message."""
import json
import sys

from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser



def _triton_check_passes() -> None:
    """From 0.34.0 the CPU platform (VLLM_TARGET_DEVICE=cpu, the only one here) refuses an x86 host without triton-cpu
    in its config check; kvdoctor's stand-in (kvdoctor/engines/vllm/startup.py, loaded by path: standard library and
    vLLM imports only) lets that one check see Triton. No kernel runs in a config."""
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    if tuple(int(p) for p in importlib.metadata.version("vllm").split(".")[:2]) < (0, 34):
        return
    path = Path(__file__).resolve().parent.parent / "kvdoctor" / "engines" / "vllm" / "startup.py"
    spec = importlib.util.spec_from_file_location("kvdoctor_vllm_startup", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.triton_check_passes()


_triton_check_passes()
with open(sys.argv[1]) as f:
    commands = json.load(f)
for argv in commands:
    assert argv[:2] == ["vllm", "serve"], argv
    try:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[2:])
    except SystemExit as exc:  # argparse's rejection of a flag or a value
        print(json.dumps({"stage": "parse", "error": f"argparse exit {exc.code}"}), flush=True)
        continue
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    try:
        validate_parsed_serve_args(args)
        config = EngineArgs.from_cli_args(args).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - every failure is reported with its command
        print(json.dumps({"stage": "config", "error": f"{type(exc).__name__}: {exc}"[:500]}), flush=True)
        continue
    par = config.parallel_config
    print(json.dumps({"tp": par.tensor_parallel_size, "pp": par.pipeline_parallel_size,
                      "dp": par.data_parallel_size, "expert_parallel": par.enable_expert_parallel,
                      "max_model_len": config.model_config.max_model_len,
                      "kv_cache_dtype": config.cache_config.cache_dtype,
                      "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
                      "max_num_seqs": config.scheduler_config.max_num_seqs,
                      "enforce_eager": config.model_config.enforce_eager,
                      # 0.34.0 on; None where the release has no extensible KV cache
                      "enable_extensible_kv_cache": getattr(config.cache_config, "enable_extensible_kv_cache", None)}),
          flush=True)
