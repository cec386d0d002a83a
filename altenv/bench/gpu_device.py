"""The GPU side of the CUDA check: run with ``python3 gpu_device.py BUNDLE OUT`` on a machine
that has PyTorch with CUDA and no TVM compiler.

It loads TVM's runtime libraries from the bundle (``gpu.py`` built it on the CPU host, the
kernels' cubins included, handed to the runtime when it loads a library's source), runs
every candidate on the bundle's physical-layout inputs with a random-filled output (so a
kernel that skips a write is caught), compares with the expected output, times it with CUDA
events beside PyTorch's kernel for the same operator (TF32 off: both compute in float32),
and writes ``gpu_check.json`` and ``gpu_check.csv`` to OUT. A candidate that fails is
recorded and the check goes on. Imports only the standard library, numpy, torch and tvm_ffi.
"""

from __future__ import annotations

import csv
import ctypes
import glob
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch


def _load_runtime(bundle: Path) -> None:
    """libcudart from the CUDA toolkit or PyTorch's wheels, then TVM's runtime libraries."""
    candidates = ["libcudart.so.13", *sorted(glob.glob("/usr/local/cuda*/lib*/libcudart.so.13*")),
                  *sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia",
                                                 "*", "lib", "libcudart.so.13*")))]
    for path in candidates:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            break
        except OSError:
            continue
    import tvm_ffi  # loads libtvm_ffi.so, which the runtime links against

    for name in ("libtvm_runtime.so", "libtvm_runtime_cuda.so"):
        ctypes.CDLL(str(bundle / "lib" / name), mode=ctypes.RTLD_GLOBAL)

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _cubin(source: str) -> bytes:
        """The runtime loads a library's CUDA source through this: the cubin built with it."""
        path = bundle / "cubin" / f"{hashlib.sha256(source.encode()).hexdigest()}.cubin"
        return path.read_bytes()


def _time_ms(fn, min_ms: float = 20.0, repeat: int = 5) -> tuple[float, float]:
    """Median and (max - min) / median of ``repeat`` CUDA-event timings, each of enough
    calls to last ``min_ms``."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    number = 1
    while True:
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        if start.elapsed_time(end) >= min_ms or number >= 1 << 16:
            break
        number *= 4
    runs = []
    for _ in range(repeat):
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / number)
    med = statistics.median(runs)
    return med, (max(runs) - min(runs)) / med


def _torch_fn(entry: dict):
    data, weight = (torch.rand(entry["shapes"][k], device="cuda") + 0.5 for k in ("data", "weight"))
    call = entry["torch"]
    if call["fn"] == "matmul":
        return lambda: torch.matmul(data, weight)
    fn = getattr(torch.nn.functional, call["fn"])
    return lambda: fn(data, weight, **call["kwargs"])


def _candidate(cand: dict, wdir: Path, rtol: float, rng: np.random.Generator) -> dict:
    import tvm_ffi

    row: dict = {"lib": cand["lib"], "factors": json.dumps(cand["factors"], sort_keys=True)}
    try:
        func = tvm_ffi.load_module(str(wdir / cand["lib"]))["main"]
        args = [torch.from_numpy(np.load(wdir / a)).cuda() for a in cand["args"]]
        args[-1].copy_(torch.from_numpy(
            rng.uniform(-1, 1, tuple(args[-1].shape)).astype(np.float32)))
        expected = np.load(wdir / cand["expected"])
        func(*args)
        torch.cuda.synchronize()
        actual = args[-1].cpu().numpy()
        scale = max(float(np.max(np.abs(expected))), 1e-30)
        row["max_rel_err"] = float(np.max(np.abs(actual.astype(np.float64) - expected))) / scale
        row["correct"] = row["max_rel_err"] <= rtol
        if row["correct"]:
            row["ms"], row["spread"] = _time_ms(lambda: func(*args))
    except Exception as err:  # noqa: BLE001 (a failing candidate is recorded, never fatal)
        row["error"] = " ".join(str(err).split())[:300]
        row["correct"] = False
    return row


def main(bundle: Path, out: Path) -> int:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.time()
    _load_runtime(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    rng = np.random.default_rng(manifest["seed"])
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "target": manifest["target"], "workloads": []}
    rows = []
    for entry in manifest["workloads"]:
        wdir = bundle / entry["name"]
        torch_ms, torch_spread = _time_ms(_torch_fn(entry))
        cands = [_candidate(c, wdir, entry["rtol"], rng) for c in entry["candidates"]]
        timed = [c for c in cands if "ms" in c]
        best = min(timed, key=lambda c: c["ms"]) if timed else None
        summary = {"name": entry["name"], "spec": entry["spec"], "candidates": len(cands),
                   "correct": sum(c["correct"] for c in cands),
                   "failed": sum("error" in c for c in cands),
                   "wrong": sum("max_rel_err" in c and not c["correct"] for c in cands),
                   "torch_ms": torch_ms, "torch_spread": torch_spread,
                   "best_ms": best["ms"] if best else None,
                   "best_lib": best["lib"] if best else None,
                   "best_over_torch": torch_ms / best["ms"] if best else None}
        report["workloads"].append(summary)
        print(json.dumps(summary), flush=True)
        rows += [{"workload": entry["name"], **c} for c in cands]
    report["seconds"] = time.time() - t0
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    fields = ["workload", "lib", "correct", "max_rel_err", "ms", "spread", "error", "factors"]
    with open(out / "gpu_check.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    bad = sum(w["wrong"] for w in report["workloads"])
    return 1 if bad or not any(w["correct"] for w in report["workloads"]) else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
