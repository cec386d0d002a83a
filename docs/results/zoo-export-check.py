"""Every zoo network, tuned briefly, exported, reloaded in a fresh process, against torch.

Usage (from the checkout, after ``make setup``)::

    .venv/bin/python docs/results/zoo-export-check.py runs/zoo-check \
        > docs/results/zoo-export-check.csv

Each network at ``size: small`` gets a short ``altenv tune`` (16 measured trials), then
``altenv export``; ``examples/load_exported.py`` runs the export in a fresh process that
imports only TVM and numpy, on random inputs, and its outputs are compared with the torch
module's. Prints one CSV row per network: complex calls tuned with layouts, trials, and
the largest relative error against torch; exits with status 1, naming them, if any
network is off by more than 1e-4.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from altenv.graph import load_model, max_rel_err
from altenv.graph.tasks import extract_tasks
from altenv.graph.zoo import ZOO

ROOT = Path(__file__).resolve().parents[2]
ALTENV = str(Path(sys.executable).parent / "altenv")
TOLERANCE = 1e-4


def check(name: str, out: Path) -> tuple[str, float]:
    run = out / name
    config = out / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "name": name, "output_dir": str(out), "model": name, "model_options": {"size": "small"},
        "budget": {"joint": 8, "loop_only": 8}, "search": {"batch": 16, "top_k": 2},
        "measure": {"number": 1, "repeat": 2, "min_repeat_ms": 5}}))
    subprocess.run([ALTENV, "tune", str(config), "--quiet"], check=True, capture_output=True)
    subprocess.run([ALTENV, "export", str(run), "--output", str(run / "export")], check=True,
                   capture_output=True)
    model = load_model(name, size="small")
    x = model.random_inputs(7)
    np.savez(run / "in.npz", **{i.name: v for i, v in zip(model.inputs, x)})
    subprocess.run([sys.executable, str(ROOT / "examples" / "load_exported.py"),
                    str(run / "export"), "--inputs", str(run / "in.npz"),
                    "--save", str(run / "out.npz")],
                   check=True, capture_output=True, env={"PATH": "/usr/bin:/bin"}, cwd=run)
    saved = np.load(run / "out.npz")
    got = [saved[f"out{i}"] for i in range(len(saved.files))]
    err = max_rel_err(got, model.reference(x))
    graph = extract_tasks(model)
    manifest = json.loads((run / "export" / "manifest.json").read_text())
    tuned = len(manifest["tasks"])
    summary = json.loads((run / "summary.json").read_text())
    return f"{name},{len(graph.complex_tasks())},{tuned},{summary['trials']},{err:.2e}", err


def main() -> None:
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print("network,complex_tasks,tasks_with_layouts,trials,max_rel_err_vs_torch")
    wrong = []
    for name in ZOO:
        row, err = check(name, out)
        print(row, flush=True)
        if not err <= TOLERANCE:
            wrong.append(name)
    if wrong:
        sys.exit(f"off by more than {TOLERANCE} against torch: {', '.join(wrong)}")


if __name__ == "__main__":
    main()
