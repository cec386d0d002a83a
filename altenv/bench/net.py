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

import json
import shutil
import time
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..measure import MeasureConfig
from ..target import make_target
from .ops import METASCHEDULE, cell_dir
from .suite import BenchSuite, NetEntry


def _run_config(suite: BenchSuite, entry: NetEntry, tuner: str, seed: int, path: Path,
                budget: int, measure: MeasureConfig) -> RunConfig:
    agent = suite.agent(tuner).model_dump()
    joint = round(budget * 0.3)
    return RunConfig(name=path.name, model=entry.model, model_options=entry.options,
                     target=suite.target, agent=agent, seed=seed, measure=measure,
                     budget={"joint": joint, "loop_only": budget - joint},
                     output_dir=str(path.parent))


def tune_net_cell(suite: BenchSuite, entry: NetEntry, tuner: str, seed: int, output: Path,
                  budget: int, measure: MeasureConfig, progress: bool = True
                  ) -> dict[str, Any]:
    """Tune one network cell unless its ``cell.json`` says it is finished."""
    path = cell_dir(output, entry, tuner, seed)
    done = path / "cell.json"
    if done.exists() and json.loads(done.read_text()).get("budget") == budget:
        return json.loads(done.read_text())
    start = time.perf_counter()
    if tuner == METASCHEDULE:
        from ..baselines import tune_relax_baseline
        from ..graph import load_model

        if path.exists():
            shutil.rmtree(path)
        model = load_model(entry.model, seed=0, **entry.options)
        baseline = tune_relax_baseline(model.mod, model.params, model.random_inputs(0),
                                       path, budget, target=suite.target, config=measure,
                                       seed=seed)
        summary = {"trials": baseline.tuning.trials, "valid": baseline.tuning.valid,
                   "tuning_seconds": time.perf_counter() - start, "history": []}
    else:
        from ..run import tune_model

        result = tune_model(_run_config(suite, entry, tuner, seed, path, budget, measure),
                            progress)
        summary = {"trials": result.trials, "tuning_seconds": result.tuning_seconds,
                   "history": []}
    summary.update(workload=entry.name, model=entry.model, tuner=tuner, seed=seed,
                   budget=budget)
    done.write_text(json.dumps(summary, indent=1))
    return summary


def conversion_cost(network: Any, inputs: list[Any], rounds: int = 10) -> tuple[float, float]:
    """``(conversion seconds, network seconds)``: ``network`` timed interleaved with its twin
    whose conversions do nothing (:meth:`~altenv.graph.network.NetworkBuild.without_conversions`);
    the conversions' cost is the median over rounds of the paired difference (a difference
    of two timings: within noise it can come out slightly negative)."""
    import statistics

    from ..baselines import network_baseline
    from ..baselines.timing import time_interleaved

    runs = {"network": network_baseline("network", network, inputs).run,
            "without": network_baseline("without", network.without_conversions(), inputs).run}
    stats = time_interleaved(runs, rounds=rounds)
    paired = [a - b for a, b in zip(stats["network"].samples, stats["without"].samples)]
    return statistics.median(paired), stats["network"].median


def retime_net(suite: BenchSuite, entry: NetEntry, cells: list[dict[str, Any]], output: Path,
               baselines: list[str], rounds: int = 10) -> dict[str, Any]:
    """Rebuild every finished cell's network and the baselines, check them against torch,
    time them interleaved; writes and returns ``timing.json``."""
    import yaml

    from ..baselines import (
        compare,
        network_baseline,
        torch_module_baseline,
        tuned_relax_baseline,
        untuned_relax_baseline,
    )
    from ..graph import load_model
    from ..graph.network import build_network
    from ..graph.tasks import extract_tasks
    from ..run import best_schedules

    model = load_model(entry.model, seed=0, **entry.options)
    inputs = model.random_inputs(12345)
    expected = model.reference(inputs)
    runs, extras = [], {}
    for cell in cells:
        label = f"{cell['tuner']}#{cell['seed']}"
        path = cell_dir(output, entry, cell["tuner"], cell["seed"])
        if cell["tuner"] == METASCHEDULE:
            run = tuned_relax_baseline(model.mod, model.params, inputs, path,
                                       target=suite.target)
            run.name = label
        else:
            cfg = RunConfig.model_validate(yaml.safe_load((path / "config.yaml").read_text()))
            factors, schedules, read_through = best_schedules(
                cfg, json.loads((path / "best.json").read_text()))
            network = build_network(extract_tasks(model), factors, schedules, suite.target,
                                    read_through)
            conv, total = conversion_cost(network, inputs)
            extras[label] = {"conversions": len(network.conversions),
                             "reads_through": len(network.reads_through),
                             "conversion_ms": conv * 1e3, "conversion_share": conv / total}
            run = network_baseline(label, network, inputs)
        runs.append(run)
    if "tvm-default" in baselines:
        runs.append(untuned_relax_baseline(model.mod, model.params, inputs, target=suite.target))
    if "torch" in baselines and model.torch_module is not None:
        runs.append(torch_module_baseline(model.torch_module, inputs, target=suite.target))
    stats = compare(runs, expected, rtol=1e-4, rounds=rounds)
    timing = {"workload": entry.name, "model": entry.model, "options": entry.options,
              "budget": cells[0]["budget"], "target": str(make_target(suite.target)),
              "programs": {name: {"median_s": st.median, "min_s": st.min, "max_s": st.max,
                                  "spread": st.spread} for name, st in stats.items()},
              "cells": {f"{c['tuner']}#{c['seed']}": {
                  "tuner": c["tuner"], "seed": c["seed"], "trials": c["trials"],
                  "tuning_seconds": c["tuning_seconds"], "history": c["history"],
                  "extra": extras.get(f"{c['tuner']}#{c['seed']}", {})} for c in cells}}
    (output / entry.name / "timing.json").write_text(json.dumps(timing, indent=1))
    return timing

