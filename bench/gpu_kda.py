"""GPU verification of sglang 0.5.23's KDA ReplaySSM kernels against kvdoctor's caches and reference.

On a CUDA machine whose Python already has a CUDA torch and triton (kvdoctor itself needs only
torch, pyyaml and pydantic here), from the repository root:

    pip install --no-deps --target /tmp/site sglang==0.5.23 helion==1.4.0 filecheck
    PYTHONPATH=/tmp/site:$PWD python bench/gpu_kda.py [--recipe NAME_OR_PATH] [--json results.json]

(docs/kda.md records the run on an H200 and its figures; bench/results/ keeps its output.)

Without a GPU, `--interpret` runs only the Triton twin on CPU under TRITON_INTERPRET=1 (fp32 and fp16
activations; slow, minutes): it needs sglang and triton on the path, not helion.

Part 1 (contract): builds caches from correct and mis-sized recipes and calls the real Helion wrapper
and Triton twin; the message each raises must be the one kvdoctor's emulation predicts.
Part 2 (numerics): drives each kernel for 2L + 3 steps (two slots, a padded row, one forced flush)
with caches from kvdoctor's builder and prints the max relative error against the fp32 recurrence.
Exits 0 with one line when CUDA or a package is missing; 1 when any case fails.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from kvdoctor.engines.sglang.kda import gpu  # noqa: E402
from kvdoctor.engines.sglang.kda.dims import PROBE, Geometry  # noqa: E402
from kvdoctor.engines.sglang.kda.recipe import DEFAULT_RECIPE, load_recipe  # noqa: E402

# (H, HV, K, V, L), activation dtype, state dtype, lower bound: the memo's cases, Kimi-Linear-48B at
# TP 8 (4 heads, K = V = 128, L = 16) and the latent probe's distinct geometry.
CASES = [
    ((4, 4, 128, 128, 4), "float32", "float32", None),
    ((4, 4, 128, 128, 4), "bfloat16", "float32", None),
    ((4, 4, 128, 128, 4), "bfloat16", "float32", -5.0),
    ((4, 4, 128, 128, 4), "bfloat16", "bfloat16", None),
    ((2, 4, 64, 128, 4), "bfloat16", "float32", None),
    ((4, 4, 128, 128, 16), "bfloat16", "float32", None),
    ((4, 4, 128, 128, 16), "float32", "float32", None),
    ((PROBE["H"], PROBE["HV"], PROBE["K"], PROBE["V"], PROBE["L"]), "float32", "float32", None),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=DEFAULT_RECIPE)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--interpret", action="store_true", help="the Triton twin on CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    reason = gpu.unavailable_reason(interpret=args.interpret)
    if reason:
        print(f"gpu_kda: skipped: {reason}")
        return 0
    import torch

    device, cases = "cuda", CASES
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
        _patch_interpreter_masks()
        device = "cpu"
        # The interpreter mishandles bf16 tensors (numpy has no bf16): fp32 and fp16 activations only.
        cases = [c for c in CASES if c[1] == "float32"] + [((2, 4, 32, 64, 3), "float16", "float32", None)]
    kernels = gpu.load_kernels(("triton",) if args.interpret else ("helion", "triton"))
    recipe = load_recipe(args.recipe)
    name = "CPU (Triton interpreter)" if args.interpret else torch.cuda.get_device_name()
    print(f"device {name}, torch {torch.__version__}, recipe {recipe.name}")
    failed = 0
    report: dict = {"contract": [], "numerics": []}

    print("\ncontract (H=2 HV=4 K=32 V=64 L=3): message predicted by kvdoctor vs raised by the kernel wrapper")
    probe = Geometry.consistent(**PROBE)
    for label, change in gpu.CONTRACT_VARIANTS.items():
        for backend, kernel in kernels.items():
            predicted, raised = gpu.contract_check(kernel, backend, gpu.variant(recipe, change), probe,
                                                   device=device)
            same = predicted == raised
            failed += not same
            report["contract"].append({"variant": label, "backend": backend, "predicted": predicted,
                                       "raised": raised, "match": same})
            print(f"  {'ok ' if same else 'BAD'} {backend:6} {label:30} {raised or '(no error)'}")
            if not same:
                print(f"      predicted: {predicted}")

    print(f"\n{'backend':7} {'case':62} {'out err':>9} {'state err':>9} {'tol':>7}  padded untouched")
    for (H, HV, K, V, L), act, state, lower_bound in cases:
        for backend, kernel in kernels.items():
            if backend == "triton" and lower_bound is not None:
                continue  # the Triton twin has no bounded gate
            case = gpu.GpuCase(backend=backend, geometry=Geometry.consistent(H, HV, K, V, L), act_dtype=act,
                               state_dtype=state, lower_bound=lower_bound)
            gpu.run_case(case, kernel, recipe, device=device)
            failed += not case.ok
            report["numerics"].append({"backend": backend, "case": case.label(), "output_rel_error": case.output_error,
                                       "state_rel_error": case.state_error, "tolerance": case.tolerance,
                                       "padded_rows_zero": case.padded_rows_zero,
                                       "untouched_slots_intact": case.untouched_slots_intact,
                                       "raised": case.raised, "ok": case.ok})
            if case.raised:
                print(f"{backend:7} {case.label():62} raised {case.raised}")
                continue
            print(f"{backend:7} {case.label():62} {case.output_error:9.2e} {case.state_error:9.2e} "
                  f"{case.tolerance:7.1e}  {str(case.padded_rows_zero):6} {case.untouched_slots_intact}"
                  f"{'' if case.ok else '  FAIL'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    print(f"\n{failed} failing case(s)")
    return 1 if failed else 0


def _patch_interpreter_masks() -> None:
    """Triton 3.9's interpreter refuses a store mask that `&` of a tensor and a scalar comparison turned
    into a non-bool array (the compiled kernel accepts it); cast such masks to bool."""
    import numpy as np
    import triton.runtime.interpreter as interpreter

    store = interpreter.InterpreterBuilder.create_masked_store

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        if mask.data.dtype != np.bool_:
            mask = interpreter.TensorHandle(mask.data.astype(np.bool_), mask.dtype)
        return store(self, ptrs, value, mask, cache_policy)

    interpreter.InterpreterBuilder.create_masked_store = create_masked_store


if __name__ == "__main__":
    sys.exit(main())
