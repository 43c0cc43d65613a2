"""Run by an SGLang venv's Python (tests/test_fit_cli.py, tools/launch_check.py --engine sglang): parse each
`python -m sglang.launch_server ...` command kvdoctor fit emitted with SGLang's own parser and build its
ServerArgs (prepare_server_args: the parser, then ServerArgs and its checks). argv[1]: a JSON file holding a
list of commands. Prints one JSON object per command, in order: the resolved figures, or where it failed."""
import json
import sys

from sglang.srt.server_args import prepare_server_args

with open(sys.argv[1]) as f:
    commands = json.load(f)
for argv in commands:
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
                      "mem_fraction_static": args.mem_fraction_static, "kv_cache_dtype": args.kv_cache_dtype}),
          flush=True)
