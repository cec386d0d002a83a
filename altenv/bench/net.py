"""``altenv bench net``: whole networks, altenv against MetaSchedule's ``tune_relax``.

Each (model, tuner, seed) is a cell like in ``bench ops``: the ``altenv`` tuner (and any
agent) is an ordinary ``altenv tune`` run of the model in ``DIR/<model>/<tuner>-seed<k>/``
(resumable from its records), ``metaschedule`` a ``tune_relax`` run with the same total
budget (restarted if cut short). When a model's cells are finished, the tuned networks,
TVM's untuned build and PyTorch eager are checked against torch and timed interleaved;
the share of altenv's latency spent in inserted layout conversions is measured by timing
the network next to the same network with its conversions emptied.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from ..baselines import (
    check_baseline,
    compare,
    network_baseline,
    torch_module_baseline,
    tune_relax_baseline,
    tuned_relax_baseline,
    untuned_relax_baseline,
)
from ..config import OTHERS_SHARE, BudgetConfig, RunConfig
from ..files import read_json, read_mapping, write_json
from ..graph import load_model
from ..graph.kernels import profile_kernels
from ..graph.network import build_network
from ..graph.tasks import extract_tasks
from ..measure import MeasureConfig
from ..measure.timing import summaries, time_interleaved
from ..pipeline import RunDir, best_schedules, tune_model
from ..pipeline.devices import SharedMeasurer
from ..suites import BenchSuite, NetEntry
from ..target import make_target
from .ops import METASCHEDULE, cell_dir, cell_lock
from .profile import write_profile


def _run_config(suite: BenchSuite, entry: NetEntry, tuner: str, seed: int, path: Path,
                budget: int, measure: MeasureConfig) -> RunConfig:
    agent = suite.agent(tuner).model_dump()
    return RunConfig(name=path.name, model=entry.model, model_options=entry.options,
                     target=suite.target, agent=agent, seed=seed, measure=measure,
                     budget=BudgetConfig.split(budget, OTHERS_SHARE),
                     output_dir=str(path.parent), ray=suite.ray)


def tune_net_cell(suite: BenchSuite, entry: NetEntry, tuner: str, seed: int, output: Path,
                  budget: int, measurers: SharedMeasurer, progress: bool = True,
                  repair: bool = False) -> dict[str, Any]:
    """Tune one network cell unless its ``cell.json`` says it is finished (locked while it
    is tuned, :func:`~altenv.bench.ops.cell_lock`), on the bench's shared measurer."""
    path = cell_dir(output, entry, tuner, seed)
    with cell_lock(path):
        return _tune_net_cell(suite, entry, tuner, seed, path, budget, measurers, progress,
                              repair)


def _tune_net_cell(suite: BenchSuite, entry: NetEntry, tuner: str, seed: int, path: Path,
                   budget: int, measurers: SharedMeasurer, progress: bool, repair: bool
                   ) -> dict[str, Any]:
    done = path / "cell.json"
    summary = read_mapping(done)
    if summary is not None and summary.get("budget") == budget:
        return summary
    start = time.perf_counter()
    if tuner == METASCHEDULE:
        if path.exists():
            shutil.rmtree(path)
        model = load_model(entry.model, seed=0, **entry.options)
        measurer = measurers.get()
        baseline = tune_relax_baseline(model.mod, model.params, model.random_inputs(0),
                                       path, budget, target=suite.target,
                                       config=measurer.config, seed=seed, measurer=measurer)
        summary = {"trials": baseline.tuning.trials, "valid": baseline.tuning.valid,
                   "tuning_seconds": time.perf_counter() - start, "history": []}
    else:
        measurer = measurers.get()
        result = tune_model(_run_config(suite, entry, tuner, seed, path, budget,
                                        measurer.config), progress, repair, measurer)
        summary = {"trials": result.trials, "tuning_seconds": result.tuning_seconds,
                   "history": []}
    summary.update(workload=entry.name, model=entry.model, tuner=tuner, seed=seed,
                   budget=budget)
    write_json(done, summary)
    return summary


def conversion_cost(network: Any, inputs: list[Any], rounds: int = 10) -> tuple[float, float]:
    """``(conversion seconds, network seconds)``: ``network`` timed interleaved with its twin
    whose conversions do nothing (:meth:`~altenv.graph.network.NetworkBuild.without_conversions`);
    the conversions' cost is the median over rounds of the paired difference (a difference
    of two timings: within noise it can come out slightly negative)."""
    runs = {"network": network_baseline("network", network, inputs).run,
            "without": network_baseline("without", network.without_conversions(), inputs).run}
    stats = time_interleaved(runs, rounds=rounds)
    paired = [a - b for a, b in zip(stats["network"].samples, stats["without"].samples)]
    return statistics.median(paired), stats["network"].median


def _cell_program(suite: BenchSuite, entry: NetEntry, cell: dict[str, Any], output: Path,
                  model: Any, inputs: list[Any]) -> tuple[Any, Any]:
    """A finished cell's network as a baseline named ``tuner#seed``, and for an altenv
    cell its :class:`~altenv.graph.network.NetworkBuild` (``None`` for MetaSchedule)."""
    label = f"{cell['tuner']}#{cell['seed']}"
    path = cell_dir(output, entry, cell["tuner"], cell["seed"])
    if cell["tuner"] == METASCHEDULE:
        run = tuned_relax_baseline(model.mod, model.params, inputs, path, target=suite.target)
        run.name = label
        return run, None
    run_dir = RunDir(path)
    cfg = RunConfig.model_validate(run_dir.saved_config())
    factors, schedules, read_through = best_schedules(
        cfg.target, read_json(run_dir.best))
    network = build_network(extract_tasks(model), factors, schedules, suite.target,
                            read_through, run_dir.others_database(), cfg.fast_math)
    return network_baseline(label, network, inputs), network


def _built(suite: BenchSuite, entry: NetEntry, cells: list[dict[str, Any]], output: Path
           ) -> tuple[Any, list[Any], Any, list[tuple[Any, Any]]]:
    """The entry's model, its timing inputs and torch's outputs on them, and every finished
    cell's network (:func:`_cell_program`)."""
    model = load_model(entry.model, seed=0, **entry.options)
    inputs = model.random_inputs(12345)
    built = [_cell_program(suite, entry, cell, output, model, inputs) for cell in cells]
    return model, inputs, model.reference(inputs), built


def _retime(suite: BenchSuite, entry: NetEntry, cells: list[dict[str, Any]], output: Path,
            baselines: list[str], rounds: int, model: Any, inputs: list[Any], expected: Any,
            built: list[tuple[Any, Any]]) -> dict[str, Any]:
    runs, extras = [], {}
    for run, network in built:
        if network is not None:
            conv, total = conversion_cost(network, inputs)
            extras[run.name] = {"conversions": len(network.conversions),
                                "reads_through": len(network.reads_through),
                                "conversion_ms": conv * 1e3, "conversion_share": conv / total}
        runs.append(run)
    if "tvm-default" in baselines:
        runs.append(untuned_relax_baseline(model.mod, model.params, inputs, target=suite.target))
    if "torch" in baselines and model.torch_module is not None:
        runs.append(torch_module_baseline(model.torch_module, inputs, target=suite.target))
    stats = compare(runs, expected, rtol=1e-4, rounds=rounds)
    timing = {"workload": entry.name, "model": entry.model, "options": entry.options,
              "target": str(make_target(suite.target)),
              "programs": summaries(stats),
              "cells": {f"{c['tuner']}#{c['seed']}": {
                  "tuner": c["tuner"], "seed": c["seed"], "budget": c["budget"],
                  "trials": c["trials"],
                  "tuning_seconds": c["tuning_seconds"], "history": c["history"],
                  "extra": extras.get(f"{c['tuner']}#{c['seed']}", {})} for c in cells}}
    write_json(output / entry.name / "timing.json", timing)
    return timing


def _profile(entry: NetEntry, built: list[tuple[Any, Any]], timing: dict[str, Any],
             output: Path, rounds: int) -> str:
    latency = {label: prog["median_s"] for label, prog in timing.get("programs", {}).items()}
    sources = {run.name: run.kernels for run, _ in built}
    return write_profile(entry.name, profile_kernels(sources, rounds), latency,
                         output / entry.name)


def retime_net(suite: BenchSuite, entry: NetEntry, cells: list[dict[str, Any]], output: Path,
               baselines: list[str], rounds: int = 10) -> dict[str, Any]:
    """Rebuild every finished cell's network and the baselines, check them against torch,
    time them interleaved; writes and returns ``timing.json``."""
    return _retime(suite, entry, cells, output, baselines, rounds,
                   *_built(suite, entry, cells, output))


def profile_net(suite: BenchSuite, entry: NetEntry, cells: list[dict[str, Any]], output: Path,
                rounds: int = 5) -> str:
    """Every finished cell's network rebuilt, checked against torch and profiled per kernel,
    all kernels interleaved (:func:`~altenv.graph.kernels.profile_kernels`); writes
    ``profile.csv`` and ``profile.png`` next to the entry's ``timing.json`` and returns the
    printed summary."""
    _, _, expected, built = _built(suite, entry, cells, output)
    for run, _ in built:
        check_baseline(run, expected, rtol=1e-4)
    timing_file = output / entry.name / "timing.json"
    timing = read_mapping(timing_file) or {}
    return _profile(entry, built, timing, output, rounds)


def retime_and_profile_net(suite: BenchSuite, entry: NetEntry, cells: list[dict[str, Any]],
                           output: Path, baselines: list[str], rounds: int = 10,
                           profile_rounds: int = 5) -> tuple[dict[str, Any], str]:
    """:func:`retime_net`, then :func:`profile_net` on the networks it built and checked
    (each network is built once: for a large model that is most of the profile's time)."""
    model, inputs, expected, built = _built(suite, entry, cells, output)
    timing = _retime(suite, entry, cells, output, baselines, rounds, model, inputs, expected,
                     built)
    return timing, _profile(entry, built, timing, output, profile_rounds)
