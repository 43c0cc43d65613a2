"""Run by an SGLang venv's Python (tests/test_fit_cli.py, tools/launch_check.py --engine sglang): parse each
`python -m sglang.launch_server ...` command kvdoctor fit emitted with SGLang's own parser and build its
ServerArgs (prepare_server_args: the parser, then ServerArgs and its checks). argv[1]: a JSON file holding a
list of commands. Prints one JSON object per command, in order: the resolved figures, or where it failed."""
import json
import os
import sys

with open(sys.argv[1]) as f:
    commands = json.load(f)
if any(argv[0] == "env" for argv in commands):
    # sglang-mlx's commands: `env SGLANG_USE_MLX=1 python -m sglang.launch_server ...`. MLX and MPS are not on this
    # box, so the MLX gate (use_mlx) answers as a Mac with them would; the arguments are SGLang's to parse.
    import sglang.srt.hardware_backend.mlx.runtime  # noqa: F401
    import sglang.srt.server_args  # noqa: F401

    for module in [m for name, m in sys.modules.items() if name.startswith("sglang")]:
        if callable(getattr(module, "use_mlx", None)):
            module.use_mlx = lambda: True

from sglang.srt.server_args import prepare_server_args  # noqa: E402

for argv in commands:
    while argv[0] == "env" or "=" in argv[0]:  # `env NAME=VALUE ...`: the environment the command sets
        if "=" in argv[0]:
            name, _, value = argv[0].partition("=")
            os.environ[name] = value
        argv = argv[1:]
    assert argv[:3] == ["python", "-m", "sglang.launch_server"], argv
    try:
        args = prepare_server_args(argv[3:])
    except SystemExit as exc:  # argparse's rejection of a flag or a value
        print(json.dumps({"stage": "parse", "error": f"argparse exit {exc.code}"}), flush=True)
        continue
    except Exception as exc:  # noqa: BLE001 - every failure is reported with its command
        print(json.dumps({"stage": "config", "error": f"{type(exc).__name__}: {exc}"[:500]}), flush=True)
        continue
    print(json.dumps({"tp": args.tp_size, "pp": args.pp_size, "dp": args.dp_size, "ep": args.ep_size,
                      "dp_attention": bool(args.enable_dp_attention), "context_length": args.context_length,
                      "mem_fraction_static": args.mem_fraction_static, "kv_cache_dtype": args.kv_cache_dtype,
                      "max_total_tokens": args.max_total_tokens, "max_running_requests": args.max_running_requests}),
          flush=True)
