"""Goldens per engine release: one venv per release (cached under goldens/.venv/), built one at a time, then
that release's own oracle writes goldens/<engine>-<version>.json.

    python goldens/releases.py vllm==0.34.0 vllm==0.32.0 sglang==0.5.21
    python goldens/releases.py --drop-venv vllm==0.30.0   # delete the venv once its goldens are written
    python goldens/releases.py --check vllm==0.30.0       # also the start-up grid: goldens/vllm_check-0.30.0.json
    python goldens/releases.py --check-only sglang==0.5.19  # SGLang's: goldens/sglang_check-0.5.19.json
    python goldens/releases.py --check-only --configs goldens/heldout-rel --out /tmp/h.json vllm==0.30.0

The recipe is the pinned release's (kvdoctor/engines/venvs.py, goldens/setup_venvs.sh): torch 2.13.0 (CPU),
the engine with --no-deps, then the light requirements its CPU code imports. Where the release's own
metadata pins one of those requirements differently (transformers, xgrammar, ...), its own pin wins, so an
older release gets the libraries it was released against. Where that pin has no upper bound (vLLM 0.26.0-0.30.0:
`transformers>=5.5.3`, `>=5.10.4`), pip would take the newest transformers, released after the engine; it is
installed as of the release's day instead (pip's --uploaded-prior-to the day after the engine's wheel was built,
read from the wheel's file dates). The venv's `.complete` and the goldens record the transformers they got.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import datetime
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venv"
TORCH = "torch==2.13.0"
LIGHT = {
    "vllm": ["packaging", "numpy", "regex", "pydantic", "cbor2", "psutil", "pyzmq", "urllib3",
             "transformers>=5.16.1,<5.21", "aiohttp", "requests", "openai-harmony", "openai", "pillow", "pybase64",
             "cachetools", "msgspec", "cloudpickle", "uvloop", "py-cpuinfo", "prometheus_client", "xgrammar==0.2.8",
             "fastapi>=0.133,<0.137", "partial-json-parser", "llguidance>=1.7,<1.8", "einops",
             "compressed-tensors==0.17.0", "jsonschema", "tiktoken", "pydantic-extra-types[pycountry]"],
    "sglang": ["packaging", "numpy", "regex", "pydantic", "psutil", "pyzmq", "requests", "msgspec", "pybase64",
               "transformers>=5.16,<5.21", "aiohttp", "orjson", "einops", "pillow", "python-dateutil", "ipython",
               "dill", "sentencepiece", "starlette", "openai", "openai-harmony", "partial-json-parser"],
}
NO_DEPS_AFTER = {"vllm": [], "sglang": ["apache-tvm-ffi==0.1.11", "compressed-tensors", "loguru", "gguf"]}
SGLANG_TRITON = "triton==3.7.1"
ORACLE = {"vllm": ["vllm_oracle.py"], "sglang": ["sglang_oracle.py"]}
OWN_PINS = ("transformers", "xgrammar", "fastapi", "llguidance", "compressed-tensors", "openai-harmony")
DATED = ("transformers",)  # an open-ended pin of these is installed as of the release's day
PIP = "pip==26.3"  # --uploaded-prior-to (the venv module's own pip, 23.2, lacks it)

QUERY = ("import json\nfrom importlib import metadata\n"
         "print(json.dumps(metadata.requires(%r) or []))\n")
VERSION_OF = "from importlib import metadata\nprint(metadata.version(%r))\n"


def name_of(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].split("!")[0] \
        .split("~")[0].strip().lower()


def built_on(wheel: Path) -> datetime.date:
    """The day a release's wheel was built: the newest date among its files (the zip entries' timestamps)."""
    with zipfile.ZipFile(wheel) as z:
        return datetime.date(*max(info.date_time[:3] for info in z.infolist()))


def open_ended(requirement: str) -> bool:
    """No upper bound: `transformers>=5.5.3` would install whatever is newest today."""
    spec = requirement.split(";")[0]
    return not any(op in spec for op in ("<", "==", "~=", "==="))


def build(engine: str, version: str) -> Path:
    venv = VENVS / f"{engine}-{version}"
    python = venv / "bin" / "python"
    if python.exists() and (venv / ".complete").exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, PIP], check=True)
    subprocess.run([*pip, TORCH], check=True)
    with tempfile.TemporaryDirectory(dir=VENVS) as tmp:
        subprocess.run([str(python), "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, f"{engine}=={version}"],
                       check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        released = built_on(wheel)
        subprocess.run([*pip, "--no-deps", str(wheel), *([SGLANG_TRITON] if engine == "sglang" else [])], check=True)
    own = json.loads(subprocess.run([str(python), "-c", QUERY % engine], capture_output=True, text=True,
                                    check=True).stdout)
    own_pins = {name_of(r): r.split(";")[0].strip() for r in own if "extra ==" not in r and name_of(r) in OWN_PINS}
    light = [own_pins.get(name_of(r), r) for r in LIGHT[engine]]
    dated = [r for r in light if name_of(r) in DATED and open_ended(r)]
    prior_to = f"{released + datetime.timedelta(days=1)}T00:00:00Z"
    if dated:  # first, so that the rest finds them satisfied and keeps them
        subprocess.run([*pip, "--uploaded-prior-to", prior_to, *dated], check=True)
    subprocess.run([*pip, *light], check=True)
    # SGLang up to 0.5.19 imports xgrammar while its server arguments load: its own pin, without the GPU stack
    grammar = [own_pins["xgrammar"]] if engine == "sglang" and "xgrammar" in own_pins else []
    if NO_DEPS_AFTER[engine] or grammar:
        subprocess.run([*pip, "--no-deps", *NO_DEPS_AFTER[engine], *grammar], check=True)
    extra = HERE.parent / "goldens" / ".venv-extra" / "vllm"
    if engine == "vllm" and not extra.exists():
        subprocess.run([*pip, "--no-deps", "--target", str(extra), "mistral_common==1.13.1"], check=True)
    got = subprocess.run([str(python), "-c", VERSION_OF % "transformers"], capture_output=True, text=True,
                         check=True).stdout.strip()
    record = {"light": light, "wheel_built": str(released), "dated": {r: f"uploaded prior to {prior_to}" for r in dated},
              "transformers": got}
    (venv / ".complete").write_text(json.dumps(record) + "\n")
    print(f"{engine}=={version}: wheel built {released}; transformers {got}"
          + (f" ({', '.join(dated)} as of {prior_to})" if dated else ""), flush=True)
    return python


def goldens(engine: str, version: str, python: Path) -> None:
    env = {**os.environ, "KVDOCTOR_GOLDEN_NAME": f"{engine}-{version}"}
    if engine == "vllm":
        env["VLLM_TARGET_DEVICE"] = "cpu"
    else:
        env["PYTHONPATH"] = str(HERE / "stubs")
    for script in ORACLE[engine]:
        subprocess.run([str(python), str(HERE / script)], env=env, check=True, cwd=HERE)


def check_goldens(engine: str, version: str, python: Path, configs: Path, out: Path | None) -> None:
    """The start-up oracle's per-release grid (KVDOCTOR_CHECK_GRID=release: vllm_check_oracle.py or
    sglang_check_oracle.py) over `configs` into `out`, by default goldens/<engine>_check-<version>.json."""
    out = (out or HERE / f"{engine}_check-{version}.json").resolve()
    env = {**os.environ, "KVDOCTOR_CHECK_GRID": "release"}
    if engine == "vllm":
        env.update(VLLM_TARGET_DEVICE="cpu", KVDOCTOR_CHECK_CONFIGS=str(configs.resolve()), KVDOCTOR_CHECK_OUT=str(out))
        command = [str(python), str(HERE / "vllm_check_oracle.py")]
    else:
        env["PYTHONPATH"] = str(HERE / "stubs")
        command = [str(python), str(HERE / "sglang_check_oracle.py"), "--configs", str(configs.resolve()), "--out",
                   str(out)]
    subprocess.run(command, env=env, check=True, cwd=HERE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("releases", nargs="+", help="ENGINE==VERSION")
    parser.add_argument("--drop-venv", action="store_true", help="delete each venv once its goldens are written")
    parser.add_argument("--venv-only", action="store_true", help="build the venvs, write no goldens")
    parser.add_argument("--check", action="store_true", help="also the start-up grid (<engine>_check-<release>.json)")
    parser.add_argument("--check-only", action="store_true", help="only the start-up grid")
    parser.add_argument("--configs", type=Path, default=HERE.parent / "fixtures" / "configs" / "real",
                        help="the start-up grid's configs (default: fixtures/configs/real)")
    parser.add_argument("--out", type=Path, help="the start-up grid's file (default: goldens/<engine>_check-<release>.json)")
    args = parser.parse_args()
    for release in args.releases:
        engine, _, version = release.partition("==")
        if engine not in ORACLE or not version:
            parser.error(f"{release!r}: expected vllm==VERSION or sglang==VERSION")
        python = build(engine, version)
        print(f"{release}: venv {python.parent.parent}", flush=True)
        if not (args.venv_only or args.check_only):
            goldens(engine, version, python)
        if (args.check or args.check_only) and not args.venv_only:
            check_goldens(engine, version, python, args.configs, args.out)
        if args.drop_venv:
            shutil.rmtree(python.parent.parent)


if __name__ == "__main__":
    main()
