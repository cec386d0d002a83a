"""Run a network exported by ``altenv export`` with plain TVM and numpy (no altenv import).

Usage::

    python examples/load_exported.py EXPORT_DIR [--inputs in.npz] [--save out.npz]

``--inputs`` is an ``.npz`` with one array per model input (keys = input names, as listed
in ``manifest.json``); without it, seeded random inputs are used. ``--save`` writes the
outputs as ``out0, out1, ...``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import tvm
from tvm import relax


def load(export_dir: Path) -> tuple[relax.VirtualMachine, list[tvm.runtime.Tensor], dict]:
    """The VM, the weights on the CPU (in ``main``'s argument order) and the manifest."""
    manifest = json.loads((export_dir / "manifest.json").read_text())
    lib = tvm.runtime.load_module(str(export_dir / manifest["library"]))
    dev = tvm.cpu()
    vm = relax.VirtualMachine(lib, dev)
    stored = np.load(export_dir / manifest["params"]["file"])
    params = [tvm.runtime.tensor(stored[p["key"]], dev) for p in manifest["params"]["order"]]
    return vm, params, manifest


def random_inputs(manifest: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs matching the manifest (integers in [0, 100) for id inputs)."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in manifest["inputs"]:
        dtype = np.dtype(spec["dtype"])
        if np.issubdtype(dtype, np.integer):
            out[spec["name"]] = rng.integers(0, 100, spec["shape"]).astype(dtype)
        else:
            out[spec["name"]] = rng.standard_normal(spec["shape"]).astype(dtype)
    return out


def run(vm: relax.VirtualMachine, params: list[tvm.runtime.Tensor], manifest: dict,
        inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``main`` on ``inputs`` (by input name), flattened to a list."""
    args = [tvm.runtime.tensor(inputs[spec["name"]], tvm.cpu()) for spec in manifest["inputs"]]
    result = vm[manifest["entry"]](*args, *params)
    flat: list[np.ndarray] = []
    stack = [result]
    while stack:
        item = stack.pop(0)
        if isinstance(item, tvm.runtime.Tensor):
            flat.append(item.numpy())
        else:
            stack = list(item) + stack
    return flat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--inputs", type=Path, help=".npz of inputs keyed by input name")
    parser.add_argument("--save", type=Path, help="write the outputs to this .npz")
    args = parser.parse_args()
    vm, params, manifest = load(args.export_dir)
    inputs = dict(np.load(args.inputs)) if args.inputs else random_inputs(manifest)
    outputs = run(vm, params, manifest, inputs)
    for i, out in enumerate(outputs):
        print(f"output {i}: shape {out.shape}, dtype {out.dtype}, mean {out.mean():.6g}")
    if args.save:
        np.savez(args.save, **{f"out{i}": o for i, o in enumerate(outputs)})


if __name__ == "__main__":
    main()
