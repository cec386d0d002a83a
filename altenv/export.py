"""Export a tuned network for deployment with plain TVM (no altenv needed to run it).

An export directory holds:

* ``model.so``: the compiled Relax executable (``export_library``); its ``main`` takes the
  model inputs followed by the weights;
* ``params.npz``: the weights in their physical, pre-transformed layouts, keyed
  ``p00000, p00001, ...`` in ``main``'s argument order (after the inputs);
* ``manifest.json``: input names, shapes and dtypes, the target, the layouts and template
  factors chosen per task, the source model's hash, the param file and argument order.

``examples/load_exported.py`` loads such a directory with ``tvm`` and ``numpy`` only.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.s_tir.meta_schedule.database import Database

from altenv.graph.frontend import ImportedModel
from altenv.graph.network import NetworkBuild, ReadThrough, Scheduled, build_network
from altenv.graph.tasks import extract_tasks

MODEL_FILE, PARAMS_FILE, MANIFEST_FILE = "model.so", "params.npz", "manifest.json"
FORMAT = 1


def param_key(position: int) -> str:
    """Key of the ``position``-th weight in ``params.npz`` (keys sort in argument order)."""
    return f"p{position:05d}"


def manifest(network: NetworkBuild, extras: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of ``network`` (``extras`` are merged in, e.g. the source hash)."""
    main = network.plan.graph.mod["main"]
    plan = network.plan
    tasks = {
        name: {"factors": plan.factors[name],
               "layouts": {k: v.to_json() for k, v in layouts.items()}}
        for name, layouts in plan.layouts.items()}
    data: dict[str, Any] = {
        "format": FORMAT,
        "library": MODEL_FILE,
        "entry": "main",
        "inputs": [{"name": p.name, "shape": [int(d) for d in p.ty.shape],
                    "dtype": str(p.ty.dtype)} for p in main.params],
        "params": {"file": PARAMS_FILE,
                   "order": [{"key": param_key(i), "name": n, "shape": list(v.shape),
                              "dtype": str(v.dtype)}
                             for i, (n, v) in enumerate(zip(network.param_names,
                                                             network.params))]},
        "target": network.target.export(),
        "tasks": tasks,
        "fallbacks": {plan.graph.calls[i].task: reason for i, reason in plan.fallbacks.items()},
        "conversions": len(network.conversions),
        "reads_through": len(network.reads_through),
        "tuned_other_kernels": len(network.tuned_others),
        "tvm_version": tvm.__version__,
    }
    data.update(extras or {})
    return data


def export(network: NetworkBuild, output_dir: str | Path,
           manifest_extras: Mapping[str, Any] | None = None) -> Path:
    """Write ``model.so``, ``params.npz`` and ``manifest.json`` of ``network`` into
    ``output_dir`` (created if needed); returns the directory."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    network.built.executable.export_library(str(out / MODEL_FILE))
    np.savez(out / PARAMS_FILE, **{param_key(i): v for i, v in enumerate(network.params)})
    text = json.dumps(manifest(network, manifest_extras), indent=1, default=_json_default)
    (out / MANIFEST_FILE).write_text(text + "\n")
    return out


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    return str(value)


def export_run(model: ImportedModel, output_dir: str | Path,
               factors: Mapping[str, Mapping[str, int]] | None = None,
               schedules: Mapping[str, Scheduled] | None = None,
               target: str | dict | tvm.target.Target | None = None,
               check_tol: float | None = 1e-4,
               manifest_extras: Mapping[str, Any] | None = None,
               read_through: ReadThrough = None,
               others: Database | None = None,
               fast_math: Collection[str] = ()) -> tuple[Path, NetworkBuild]:
    """Build ``model`` with the tuned ``factors`` and ``schedules`` per task, the calls
    that ``read_through`` their input, the schedules of its other kernels in ``others`` and
    its ``fast_math`` functions (as recorded by a run), check it against the source
    framework on seeded random inputs (relative error at most ``check_tol``; ``None`` skips
    the check; a saved model checks against the outputs recorded with it) and export it.

    Returns the export directory and the built network.
    """
    from altenv.graph.build import max_rel_err

    network = build_network(extract_tasks(model), factors, schedules, target, read_through,
                            others, fast_math)
    extras: dict[str, Any] = {"model": model.name, "source_hash": model.source_hash}
    if check_tol is not None and model.has_reference:
        inputs = model.random_inputs(0)
        err = max_rel_err(network.run(inputs), model.reference(inputs))
        if not err <= check_tol:
            raise RuntimeError(f"export of {model.name}: outputs differ from the source "
                               f"framework by {err:.3g} (relative), more than {check_tol}")
        extras["max_rel_err"] = err
    extras.update(manifest_extras or {})
    return export(network, output_dir, extras), network
