"""A CUDA check bundle: candidates built here, timed on a GPU machine with TVM's runtime alone.

The lent GPU machines reach no package registry and take at most 64 MiB per call, less than
TVM's compiler. nvcc is on the CPU host, so every candidate (a layout from the operator's
template, a loop schedule drawn from MetaSchedule's CUDA design space) is exported here (the
PyPI build keeps CUDA source in it) and its kernels compiled here to cubins; the GPU machine
only loads it with ``libtvm_runtime``, which asks for the source's binary at load time,
runs it on the physical-layout inputs built here and compares with the reference computed
here (random inputs, never zeros), and times it beside PyTorch's own kernel for the same
operator. ``gpu_device.py`` is the GPU side; it imports neither altenv nor TVM's compiler.

The bundle is data: a manifest (JSON), ``.npy`` arrays and libraries built by this command.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from ..ops import LayoutTemplate, generate
from ..ops.operators import Conv, MatMul
from ..ops.workload import Workload
from ..space.loop_space import LoopSpace
from ..target import host_cpu_target, make_target

RUNTIME_LIBS = ("libtvm_runtime.so", "libtvm_runtime_cuda.so")
FFI_WHEEL = "apache-tvm-ffi==0.1.14.post0"
DEVICE_PYTHON = "3.12"
DEFAULT_WORKLOADS = ("gmm_512", "c2d_resnet_3x3", "dep_mbv2_144_s2")


def torch_call(program: Any) -> dict[str, Any]:
    """How PyTorch computes the operator (a function name and its keyword arguments), so
    the GPU side times the framework's kernel without importing altenv."""
    op = program.op
    if isinstance(op, MatMul):
        return {"fn": "matmul", "kwargs": {}}
    if isinstance(op, Conv):
        return {"fn": f"conv{op.rank}d", "kwargs": {
            "stride": list(op.stride), "padding": list(op.pad),
            "dilation": list(op.dilation), "groups": op.groups}}
    raise ValueError(f"{program.workload.kind}: the GPU check times convolutions and GEMMs")


def _layout_choices(template: LayoutTemplate, count: int, rng: np.random.Generator
                    ) -> list[dict[str, int]]:
    """The untiled layout, the blocked one (4 lanes: a float4 load) and random draws."""
    chosen = [template.default_factors(), template.blocked_factors(4)]
    nvec = template.action_nvec()
    while len(chosen) < count:
        factors = template.factors_from_indices([int(rng.integers(n)) for n in nvec])
        if factors not in chosen:
            chosen.append(factors)
    return chosen[:count]


def _compile(sch: tvm.s_tir.Schedule, target: tvm.target.Target, cubins: Path
             ) -> tvm.runtime.Module:
    """The candidate's library; its kernels' source, compiled by nvcc for the target's
    ``arch``, goes to ``cubins`` under the source's hash (what the GPU side hands TVM's
    runtime when it asks its ``tvm_callback_cuda_compile`` for that source)."""
    from tvm.support.nvcc import compile_cuda

    lib = tvm.compile(sch.mod, target=tvm.target.Target(target, host=host_cpu_target())).mod
    for cuda in (m for m in lib.imports if m.kind == "cuda"):
        source = cuda.inspect_source("cuda")
        path = cubins / f"{hashlib.sha256(source.encode()).hexdigest()}.cubin"
        if not path.exists():
            with target:
                path.write_bytes(bytes(compile_cuda(source, target_format="cubin",
                                                    arch=str(target.attrs["arch"]),
                                                    compiler="nvcc")))
    return lib


def build_bundle(workloads: dict[str, str | Workload], output: Path, layouts: int = 3,
                 loops: int = 6, seed: int = 0, log: Any = print) -> dict[str, Any]:
    """Build ``layouts x loops`` candidates of each workload (name -> spec or workload) into
    ``output`` with everything the GPU side needs: libraries, arrays, runtime libraries,
    manifest."""
    if shutil.which("nvcc") is None:
        raise RuntimeError("nvcc is not on PATH: the bundle's CUDA kernels are compiled here")
    target = make_target("cuda")
    (output / "cubin").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    manifest: dict[str, Any] = {"target": str(target.export()), "seed": seed, "workloads": []}
    for name, spec in workloads.items():
        template = LayoutTemplate(spec)
        plain = generate(template.workload)
        raw = plain.random_inputs(seed)
        entry: dict[str, Any] = {"name": name, "spec": str(template.workload), "candidates": [],
                                 "rtol": template.op.tolerance(), "torch": torch_call(plain),
                                 "shapes": {k: list(raw[k].shape) for k in ("data", "weight")}}
        wdir = output / name
        wdir.mkdir(exist_ok=True)
        for li, factors in enumerate(_layout_choices(template, layouts, rng)):
            program = template.generate(factors)
            args = program.physical_args(raw)
            expected = program.layouts["out"].apply(program.reference(raw))
            arrays = [f"L{li}_arg{i}.npy" for i in range(len(args))]
            for path, arr in zip(arrays, args):
                np.save(wdir / path, arr)
            np.save(wdir / f"L{li}_expected.npy", expected)
            space = LoopSpace(program.func, target)
            for ci, point in enumerate(space.sample(loops, seed=seed + li, max_tries=256)):
                lib = f"L{li}_C{ci}.so"
                try:
                    lib_module = _compile(space.decode(point), target, output / "cubin")
                    lib_module.export_library(str(wdir / lib))
                except Exception as err:  # noqa: BLE001 (a candidate that fails to build is recorded)
                    log(f"[gpu] {name} layout {li} candidate {ci}: build failed: "
                        f"{' '.join(str(err).split())[:200]}")
                    continue
                entry["candidates"].append({"lib": lib, "args": arrays,
                                            "expected": f"L{li}_expected.npy",
                                            "factors": dict(factors),
                                            "point": [list(v) for v in point.values]})
            log(f"[gpu] {name}: layout {li} {factors}: {len(entry['candidates'])} built")
        manifest["workloads"].append(entry)
    _runtime(output)
    (output / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _runtime(output: Path) -> None:
    """TVM's runtime libraries and tvm-ffi's wheel for the GPU machine's Python."""
    libdir = Path(tvm.__file__).parent / "lib"
    (output / "lib").mkdir(exist_ok=True)
    for name in RUNTIME_LIBS:
        shutil.copy2(libdir / name, output / "lib" / name)
    wheels = output / "whl"
    if not any(wheels.glob("*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--python-version", DEVICE_PYTHON,
                        "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                        "-d", str(wheels), FFI_WHEEL], check=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m altenv.bench.gpu OUTPUT [NAME ...]``: a bundle of alt9's NAMEs."""
    from ..suites import load_suite

    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m altenv.bench.gpu OUTPUT [ALT9_WORKLOAD ...]", file=sys.stderr)
        return 2
    specs = {e.name: e.spec for e in load_suite("alt9").workloads}
    names = args[1:] or list(DEFAULT_WORKLOADS)
    unknown = [n for n in names if n not in specs]
    if unknown:
        print(f"altenv: workload {unknown[0]!r}: not in alt9; allowed: {', '.join(specs)}",
              file=sys.stderr)
        return 2
    build_bundle({n: specs[n] for n in names}, Path(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
