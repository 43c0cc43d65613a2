"""Code-execution bait: a model that ships code, or pickles, that would record having run by creating
a marker file outside the model directory. kvdoctor must never run any of it.

transformers imports `auto_map` modules only with `trust_remote_code=True`; mlx-lm imports a
config's `model_file` when it loads the model; `torch.load` without `weights_only=True` unpickles a
`.bin` and so runs whatever its pickle calls; Python imports a `json.py` or `sitecustomize.py` from a
folder on `sys.path`. kvdoctor reads config.json and safetensors headers only, so each case must end
in its normal outcome (CFG010 where the config asks for remote code) with the marker absent and no
module loaded from the model directory, under every engine profile that is installed.
"""
from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

from badinput_base import Built, base_model, case, tiny_config

from kvdoctor.engines import check_engines


INSTALLED_ENGINES = sorted(check_engines())


def payload(marker: Path) -> str:
    return f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"


class _Exec:
    """Pickles to a call of exec(payload): unpickling it runs the payload."""

    def __init__(self, code: str):
        self.code = code

    def __reduce__(self):
        return (exec, (self.code,))


def _marker(tmp: Path) -> Path:
    (tmp / "markers").mkdir(exist_ok=True)
    return tmp / "markers" / "ran"


def _remote_code(engine: str, *flags: str) -> None:
    @case("bait", f"auto-map-{engine}{''.join(flags).replace('--', '-')}")
    def build(tmp: Path) -> Built:
        marker = _marker(tmp)
        m = base_model(tmp)
        cfg = tiny_config()
        cfg.update(auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                             "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"},
                   trust_remote_code=True, architectures=["EvilForCausalLM"])
        (m / "config.json").write_text(json.dumps(cfg, indent=2))
        for name in ("configuration_evil.py", "modeling_evil.py"):
            (m / name).write_text(payload(marker))
        return Built(str(m), m, None, code="CFG010", args=("--engine", engine, *flags), marker=marker)


for _engine in INSTALLED_ENGINES:
    _remote_code(_engine)
    _remote_code(_engine, "--static")
_remote_code("hf", "--trust-remote-code")  # the flag is for the dry run's child process only


def _planted(id: str, files: dict[str, str], config: dict | None = None) -> None:
    """Files whose import would run the payload; `{marker}` in a text is replaced by the payload."""
    @case("bait", id)
    def build(tmp: Path) -> Built:
        marker = _marker(tmp)
        m = base_model(tmp)
        if config:
            cfg = tiny_config()
            cfg.update(config)
            (m / "config.json").write_text(json.dumps(cfg, indent=2))
        for name, text in files.items():
            (m / name).parent.mkdir(parents=True, exist_ok=True)
            (m / name).write_text(text.replace("{marker}", payload(marker)).replace("{marker_path}", str(marker)))
        return Built(str(m), m, None, marker=marker, accepted=True)


# Modules Python (or kvdoctor's own imports) would pick up from a folder on sys.path.
for _name in ("json", "typing", "enum", "struct", "re", "abc", "os", "io", "stat", "pathlib", "dataclasses",
              "sitecustomize", "usercustomize", "__init__", "__main__", "conftest", "setup", "kvdoctor", "torch",
              "safetensors", "pydantic", "yaml", "typer", "rich", "click", "numpy", "transformers",
              "huggingface_hub", "mlx_lm"):
    _planted(f"shadow-{_name.strip('_') or _name}", {f"{_name}.py": "{marker}"})
_planted("shadow-package-collections", {"collections/__init__.py": "{marker}"})
_planted("shadow-package-encodings", {"encodings/__init__.py": "{marker}"})
_planted("shadow-package-mlx", {"mlx/__init__.py": "{marker}", "mlx/core.py": "{marker}"})
_planted("pth-file", {"evil.pth": "import pathlib; pathlib.Path('{marker_path}').write_text('ran')\n"})  # site runs it
_planted("mlx-model-file", {"evil_model.py": "{marker}"}, config={"model_file": "evil_model.py"})  # mlx-lm
_planted("tokenizer-auto-map", {"tokenization_evil.py": "{marker}", "tokenizer_config.json": json.dumps(
    {"auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}})})
_planted("custom-generate", {"custom_generate/generate.py": "{marker}"})  # transformers' hub generate()
_planted("processor-auto-map", {"processing_evil.py": "{marker}", "preprocessor_config.json": json.dumps(
    {"auto_map": {"AutoProcessor": "processing_evil.EvilProcessor"}})})
_planted("quant-method-unknown", {}, config={"quantization_config": {"quant_method": "evil", "module": "os"}})


def _pickled(id: str, name: str, keep_safetensors: bool = True, wrap: str = "raw") -> None:
    """A pickle that runs the payload when loaded (torch.load without weights_only, np.load with
    allow_pickle, pickle.load)."""
    @case("bait", id)
    def build(tmp: Path) -> Built:
        marker = _marker(tmp)
        m = base_model(tmp, checkpoint=keep_safetensors)
        data = pickle.dumps(_Exec(payload(marker)), protocol=2)
        if wrap == "zip":  # torch.save's zip layout: archive/data.pkl
            with zipfile.ZipFile(m / name, "w") as z:
                z.writestr("archive/data.pkl", data)
                z.writestr("archive/version", "3\n")
        elif wrap == "npy":  # an object array: np.load(allow_pickle=True) unpickles it
            header = b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
            header += b" " * (118 - len(header)) + b"\n"
            (m / name).write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data)
        else:
            (m / name).write_bytes(data)
        if name.endswith(".index.json"):
            (m / name).write_text(json.dumps({"weight_map": {"model.norm.weight": "pytorch_model-00001.bin"}}))
            (m / "pytorch_model-00001.bin").write_bytes(data)
        return Built(str(m), m, None, marker=marker, accepted=True)


for _name in ("pytorch_model.bin", "training_args.bin", "optimizer.pt", "rng_state.pth", "scheduler.pt",
              "model.ckpt", "consolidated.00.pth", "data.pkl", "adapter_model.bin"):
    _pickled(f"pickle-{_name}", _name)
_pickled("pickle-only-checkpoint", "pytorch_model.bin", keep_safetensors=False)  # no safetensors at all
_pickled("pickle-torch-zip", "pytorch_model.bin", wrap="zip")
_pickled("pickle-torch-zip-only", "pytorch_model.bin", keep_safetensors=False, wrap="zip")
_pickled("pickle-numpy-object-array", "embeddings.npy", wrap="npy")
_pickled("pickle-bin-index", "pytorch_model.bin.index.json", keep_safetensors=False)
_pickled("pickle-named-safetensors", "extra.safetensors")  # beside model.safetensors: read by nobody


@case("bait", "pickle-as-the-shard")
def _(tmp: Path) -> Built:
    """model.safetensors that is really a pickle: refused as a header, never unpickled."""
    marker = _marker(tmp)
    m = base_model(tmp, checkpoint=False)
    (m / "model.safetensors").write_bytes(pickle.dumps(_Exec(payload(marker)), protocol=2))
    return Built(str(m), m, "model.safetensors", marker=marker)
