"""Export a tuned network for deployment with plain TVM (no altenv needed to run it).

An export directory holds:

* ``model.so``: the compiled Relax executable (``export_library``); its ``main`` takes the
  model inputs followed by the weights;
* ``params.npz``: the weights in their physical, pre-transformed layouts, keyed
  ``p00000, p00001, ...`` in ``main``'s argument order (after the inputs);
* ``manifest.json``: input names, shapes and dtypes, the target, the layouts and template
  factors chosen per task, the source model's hash, the param file and argument order.

``examples/load_exported.py`` loads such a directory with ``tvm`` and ``numpy`` only.

``altenv export RUN`` (:func:`export_run_dir`) writes one from a finished run directory,
read as data: the network is built from the model the run kept and the recorded best
replayed (:mod:`altenv.pipeline.replay`); an operator run exports its tuned operator
(``model.so`` and a manifest of its arguments' physical layouts).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.database import Database

from altenv.config import ConfigError, RunConfig
from altenv.files import read_json
from altenv.graph.build import max_rel_err
from altenv.graph.frontend import ImportedModel, load_saved_model
from altenv.graph.network import NetworkBuild, build_network
from altenv.graph.rewriter import ReadThrough
from altenv.graph.scheduler import Scheduled
from altenv.graph.tasks import extract_tasks
from altenv.ops import EPILOGUE_INPUTS
from altenv.pipeline.replay import best_schedules, replay_best
from altenv.pipeline.rundir import RunDir
from altenv.target import make_target
from altenv.tuning import OpTask
from altenv.tuning.task import Factors

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


class _BestEntry(BaseModel):
    """What export reads of a tuned operator in ``best.json`` (other keys are kept there
    for people)."""

    model_config = ConfigDict(strict=True)
    factors: dict[str, int]
    decisions: list[Any]


class _BestOperator(_BestEntry):
    latency_s: float = Field(gt=0)


class _BestTask(_BestEntry):
    spec: str
    epilogue: list[str]


class _BestNetwork(BaseModel):
    model_config = ConfigDict(strict=True)
    tasks: dict[str, _BestTask]
    read_through: dict[str, int] | list[int] | str = "measure"


def _read_run(run: RunDir) -> tuple[RunConfig, dict[str, Any]]:
    """A finished run's config and ``best.json``, both validated as data (one-line errors
    naming the file)."""
    try:
        cfg = RunConfig.model_validate(run.saved_config())
        best = read_json(run.best)
        (_BestNetwork if cfg.model is not None else _BestOperator).model_validate(best)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        path = run.best if err.title.startswith("_Best") else run.config
        raise ConfigError(f"export: {path}: {where}: "
                          f"{' '.join(first['msg'].removeprefix('Value error, ').split())}"
                          ) from None
    return cfg, best


def export_run_dir(run_dir: str | Path, output: str | Path, force: bool = False) -> Path:
    """``altenv export RUN --output DIR``: the tuned network (``model.so``, ``params.npz``,
    ``manifest.json``, loadable with plain TVM), or for an operator run the tuned operator
    (``model.so`` and a manifest of its arguments' physical layouts).

    The run directory is read as data: the network is built from the model the run kept
    (``model/``, :func:`~altenv.graph.frontend.load_saved_model`) and checked against the
    outputs recorded with it; nothing the config names is imported. ``output`` must be
    empty or new unless ``force``."""
    run, output = RunDir(run_dir), Path(output)
    run.check()  # read as data: no links out of it, only files and folders
    if not run.config.exists() or not run.best.exists():
        raise ConfigError(f"export: {run.path} is not a finished run (no config.yaml/best.json)")
    if output.exists() and not output.is_dir():
        raise ConfigError(f"export: --output {output} is a file; give a directory")
    if output.is_symlink() and not output.exists():
        raise ConfigError(f"export: --output {output} is a link to nothing; give a directory")
    held = sorted(p.name for p in output.iterdir()) if output.exists() else []
    if held and not force:
        raise ConfigError(f"export: --output {output} is not empty ({', '.join(held[:3])}"
                          f"{', ...' if len(held) > 3 else ''}); give a new or empty directory, "
                          "or --force to write over it")
    cfg, best = _read_run(run)
    model = None
    if cfg.model is not None:
        if not run.model.is_dir():
            raise ConfigError(
                f"export: {run.path} keeps no imported model ({run.model}); it was "
                "tuned by an older altenv. Export never runs a run's model code: tune the run "
                "again with this version (it resumes and keeps the model), then export")
        try:
            model = load_saved_model(run.model)
        except Exception as err:  # noqa: BLE001 (missing or damaged data: JSON, npz, TVM JSON)
            reason = " ".join(str(err).split())[:200]
            raise ConfigError(f"export: {run.model}: not a kept model "
                              f"({type(err).__name__}: {reason})") from None
    try:
        if model is not None:
            factors, schedules, read_through = best_schedules(cfg.target, best)
        else:
            task, factors, schedule = replay_best(cfg.workload, list(cfg.epilogue),
                                                  cfg.target, best, cfg.mapping)
    except ValueError as err:  # a best that this version's spaces cannot replay
        raise ConfigError(f"export: {run.best}: {' '.join(str(err).split())}") from None
    for name in (MODEL_FILE, PARAMS_FILE, MANIFEST_FILE) if force else ():
        (output / name).unlink(missing_ok=True)
    if model is not None:
        out, _ = export_run(model, output, factors, schedules, cfg.target,
                            manifest_extras={"run": str(run.path)}, read_through=read_through,
                            others=run.others_database(), fast_math=cfg.fast_math)
        return out
    return _export_operator(output, task, factors, schedule, cfg.target,
                            {"latency_s": best["latency_s"], "run": str(run.path)})


def _export_operator(output: Path, task: OpTask, factors: Factors, schedule: Schedule,
                     target: Any, extras: Mapping[str, Any]) -> Path:
    """``model.so`` and ``manifest.json`` of a tuned operator: its function ``main`` and the
    shape, dtype and physical layout of each argument (``extras`` merged in)."""
    program = task.program(factors)
    output.mkdir(parents=True, exist_ok=True)
    tvm.compile(schedule.mod, make_target(target)).export_library(str(output / MODEL_FILE))
    shapes = {name: (list(lay.shape), str(program.op.out_dtype if name in ("out", *EPILOGUE_INPUTS)
                                          else program.op.input_dtype(name)))
              for name, lay in program.layouts.items()}
    manifest = {"workload": task.key, "target": str(make_target(target)),
                "function": "main", "arguments": [
                    {"name": n, "shape": shapes[n][0], "dtype": shapes[n][1],
                     "layout": program.layouts[n].to_json()} for n in program.arg_names],
                **extras}
    (output / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return output
