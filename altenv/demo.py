"""The built-in demo (``make demo``) and a quick tour of the layout primitives.

``run_demo`` is the main job on the built-in default: it tunes ResNet-18 (small input)
with ``configs/demo.yaml``, exports it and prints its speedup over TVM's untuned build and
PyTorch. ``run_layout_demo`` shows ALT §4.1's worked example (``N O/ot H W ot`` and the
overlapped-tiling input of Fig. 2), then builds a ResNet-style convolution under a §5.1
template with TVM and checks it against torch on random inputs.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .config import load_config
from .export import export_run_dir
from .layout import Layout
from .ops import LayoutTemplate, generate, run_numpy
from .pipeline import timing_table, tune_model


def run_layout_demo(spec: str = "c2d:N=1,I=64,O=64,H=56,W=56,KH=3,KW=3,stride=1,pad=1") -> None:
    print("== ALT §4.1: N O/ot H W ot from NOHW (ot = 16)")
    out = Layout((1, 64, 56, 56), "NOHW").split(1, [-1, 16]).reorder([0, 1, 3, 4, 2])
    print(f"   {out}   physical shape {out.shape}")

    print("== ALT Fig. 2: overlapped tiles of the padded input, 2x2 spatial tiles (3x3 kernel)")
    data = (Layout((1, 64, 58, 58), "NIHW").unfold(2, 28 + 2, 28).unfold(4, 28 + 2, 28)
            .reorder([0, 2, 4, 1, 3, 5]))
    x = np.random.default_rng(0).uniform(-1, 1, (1, 64, 58, 58)).astype("float32")
    phys = data.apply(x)
    print(f"   {data}   {x.size} -> {phys.size} elements; round trip exact: "
          f"{np.array_equal(data.invert(phys), x)}")

    template = LayoutTemplate(spec)
    factors = {"ht": 7, "wt": 8, "ot": 16, "it": 16, "it_w": 16, "ot_w": 16}
    layouts = template.layouts(factors)
    print(f"== ALT §5.1 template for {spec}\n   factors {factors}")
    for name, layout in layouts.items():
        print(f"   {name:6s} {layout}")
    program = generate(spec, layouts, epilogue=("bias", "relu"))
    raw = program.random_inputs(0)
    start = time.perf_counter()
    result = run_numpy(program, raw)
    err = float(np.max(np.abs(result - program.reference(raw))))
    print(f"   built with TVM and run in {time.perf_counter() - start:.1f} s "
          f"(untuned schedule); max abs error vs torch: {err:.2e}")
    if err > 1e-3:
        raise SystemExit("demo: the generated convolution does not match torch")


DEMO_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"


def run_demo(output_dir: str = "runs", progress: bool = True) -> None:
    """Tune the default network (resumes an interrupted demo), export it, print the
    speedups."""
    cfg = load_config(DEMO_CONFIG, output_dir=output_dir)
    result = tune_model(cfg, progress)
    # the demo's own export directory, written again each time the demo runs
    out = export_run_dir(result.run_dir, result.run_dir / "export", force=True)
    print(f"\n{cfg.model} ({cfg.model_options}): {result.trials} trials in "
          f"{result.tuning_seconds:.0f} s; outputs match torch (max rel err "
          f"{result.max_rel_err:.1e})")
    print(timing_table(result.timings), end="")
    print(f"exported to {out} (load it with examples/load_exported.py)")
