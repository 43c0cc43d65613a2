"""Run by the vLLM venv's Python (tests/test_fit_cli.py): parse each `vllm serve ...` command kvdoctor fit
emitted with vLLM's own argument parser, validate it as `vllm serve` does, and create the engine config.
argv[1]: a JSON list of commands. Prints one JSON object per command."""
import json
import sys

from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

for argv in json.loads(sys.argv[1]):
    assert argv[:2] == ["vllm", "serve"], argv
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[2:])
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    validate_parsed_serve_args(args)
    config = EngineArgs.from_cli_args(args).create_engine_config()
    print(json.dumps({"tp": config.parallel_config.tensor_parallel_size,
                      "pp": config.parallel_config.pipeline_parallel_size,
                      "max_model_len": config.model_config.max_model_len,
                      "kv_cache_dtype": config.cache_config.cache_dtype,
                      "gpu_memory_utilization": config.cache_config.gpu_memory_utilization}))
