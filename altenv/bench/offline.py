"""``altenv bench offline``: agents on a dataset's workloads, many seeds, replayed.

The cells are ``bench ops``' own (:func:`altenv.bench.ops.tune_cell`: the same agent
construction, session, budget split and records), tuned on a
:class:`~altenv.dataset.measurer.ReplayMeasurer` instead of a device: nothing is built,
a program the dataset holds is timed by one of its own timings, any other by the
dataset's program surrogate (its point surrogate where it has none). Each budget is
tuned as its own cell (a 200-trial run splits its joint and loop stages as a 200-trial
run does, not as the first 200 trials of a longer one).

A cell's **regret** at its budget: the program it would report (the fastest it measured)
is valued at its dataset latency (the median of its measured timings; the surrogate's
where the dataset does not hold it), over the workload's best program in the dataset,
minus one. The report gives, per tuner and budget, the median regret over workloads and
seeds with a 95 % bootstrap interval of that median, and a plot of the curves.
"""

from __future__ import annotations

import csv
import math
import multiprocessing
import re
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..config import AgentConfig
from ..dataset import Dataset
from ..dataset.measurer import ReplayMeasurer, json_target
from ..dataset.surrogate import Surrogate, load_or_fit, load_program
from ..records import RecordDB
from ..suites import BenchSuite, OpEntry
from .ops import METASCHEDULE, cell_dir, tune_cell


class _Lend:
    """What ``tune_cell`` asks its measurers for: one measurer, lent."""

    def __init__(self, measurer: ReplayMeasurer):
        self.measurer = measurer

    def get(self) -> ReplayMeasurer:
        return self.measurer


def offline_suite(data: Dataset, tuners: Sequence[str], seeds: int, pattern: str | None,
                  agents: dict[str, AgentConfig] | None = None) -> BenchSuite:
    """The dataset's workloads (those ``pattern`` matches) as an operator suite."""
    if METASCHEDULE in tuners:
        raise ValueError("tuners: metaschedule has no replay (its search runs on its own "
                         "builder and runner); offline tuners are altenv's agents")
    names = [n for n in data.workloads() if pattern is None or re.search(pattern, n)]
    if not names:
        raise ValueError(f"--filter {pattern!r}: no workload of dataset {data.name} matches; "
                         f"it has {', '.join(data.workloads()) or 'none'}")
    return BenchSuite(name=f"offline-{data.name}", kind="ops", seeds=seeds,
                      tuners=list(tuners), baselines=[], versus=[tuners[0]],
                      target=json_target(data.card["target"]), agents=agents or {},
                      workloads=[OpEntry(name=n, spec=data.spec_of(n)) for n in names])


def cell_regret(measurer: ReplayMeasurer, entry: OpEntry, path: Path
                ) -> tuple[float, int, str]:
    """Regret of a finished cell (module docstring), how many layouts it measured, and the
    layout of the program it reports (``knob=factor`` pairs): a search that loses on a
    workload has most often judged, or never tried, the layout that wins."""
    replay = measurer.workload(str(entry.spec))
    best_measured, value, best_layout = math.inf, math.inf, ""
    layouts: set[tuple[tuple[str, int], ...]] = set()
    with RecordDB(path / "records.jsonl") as db:
        for record in db.records():
            factors = {k: int(v) for k, v in record.layouts["factors"].items()}
            layouts.add(tuple(sorted(factors.items())))
            if record.median >= best_measured:
                continue
            best_measured = record.median
            best_layout = " ".join(f"{k}={v}" for k, v in factors.items())
            layout = replay.layout_of(factors)
            row = None if layout is None else layout.points.get(
                layout.canonical(layout.split(tuple(record.decisions))))
            value = float(replay.data.latency[row]) if row is not None else record.median
    return value / replay.best - 1.0, len(layouts), best_layout


def run_offline(data: Dataset, tuners: Sequence[str], seeds: int, budgets: Sequence[int],
                output: Path, pattern: str | None = None,
                agents: dict[str, AgentConfig] | None = None, progress: bool = False,
                jobs: int = 1) -> list[dict[str, Any]]:
    """Tune every (workload, tuner, seed, budget) cell not finished yet under ``output``;
    one row per cell (its regret, trials, seconds, how many of its trials the dataset
    answered by replay, how many layouts it measured and the layout of its best), also
    written to ``output/results.csv``. With ``jobs`` > 1 the
    cells run in that many processes at once (a replayed cell times nothing, so cells
    side by side do not disturb each other's results, only their own ``seconds``)."""
    suite = offline_suite(data, tuners, seeds, pattern, agents)
    surrogates = (load_or_fit(data), load_program(data))
    cells = [(entry, tuner, seed, budget) for budget in sorted(budgets)
             for entry in suite.workloads for tuner in tuners for seed in range(seeds)]
    if jobs <= 1:
        rows = [_cell_row(data, surrogates, suite, *cell, output, progress) for cell in cells]
    else:
        rows = _in_processes(data, surrogates, suite, cells, output, progress, jobs)
    output.mkdir(parents=True, exist_ok=True)
    with (output / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows


Surrogates = tuple[Surrogate, Surrogate | None]
"""A dataset's point surrogate and its program surrogate (if it has one)."""


def _cell_row(data: Dataset, surrogates: Surrogates, suite: BenchSuite, entry: OpEntry,
              tuner: str, seed: int, budget: int, output: Path, progress: bool
              ) -> dict[str, Any]:
    """Tune one cell (or read it, finished) and give its row."""
    draws = zlib.crc32(f"{entry.name}/{tuner}/{seed}".encode())
    measurer = ReplayMeasurer(data, seed=draws, surrogate=surrogates[0],
                              program_surrogate=surrogates[1])
    out = output / f"b{budget}"
    start = time.perf_counter()
    summary = tune_cell(suite, entry, tuner, seed, out, budget, _Lend(measurer),
                        progress=progress)
    regret, layouts, best_layout = cell_regret(measurer, entry,
                                               cell_dir(out, entry, tuner, seed))
    return {"workload": entry.name, "tuner": tuner, "seed": seed, "budget": budget,
            "regret": regret, "trials": summary["trials"],
            "tuning_seconds": summary["tuning_seconds"],
            "replayed": measurer.replayed, "predicted": measurer.predicted,
            "layouts": layouts, "best_layout": best_layout,
            "wall_seconds": time.perf_counter() - start}


def _in_processes(data: Dataset, surrogates: Surrogates, suite: BenchSuite,
                  cells: Sequence[tuple[OpEntry, str, int, int]], output: Path,
                  progress: bool, jobs: int) -> list[dict[str, Any]]:
    """The cells' rows, tuned ``jobs`` at a time in processes of their own. If this
    process is interrupted (Ctrl-C, or a signal sent to it alone) or a cell fails, queued
    cells are dropped and running ones stopped: their records hold what they measured,
    and the next run resumes them."""
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(str(data.path), surrogates))
    try:
        futures = [pool.submit(_worker_cell, suite, *cell, output) for cell in cells]
        return [f.result() for f in tqdm(futures, desc="offline cells", unit="cell",
                                         disable=not progress)]
    except BaseException:
        workers = list((pool._processes or {}).values())  # noqa: SLF001 (no public handle)
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join()
        raise
    finally:
        pool.shutdown()


_WORKER: dict[str, Any] = {}
"""A worker process's dataset and surrogates (:func:`_start_worker`)."""


def _start_worker(path: str, surrogates: Surrogates) -> None:
    """Open the dataset once per worker (its replay searches on one thread,
    ``ReplayMeasurer.search_threads``)."""
    _WORKER.update(data=Dataset.open(path), surrogates=surrogates)


def _worker_cell(suite: BenchSuite, entry: OpEntry, tuner: str, seed: int, budget: int,
                 output: Path) -> dict[str, Any]:
    return _cell_row(_WORKER["data"], _WORKER["surrogates"], suite, entry, tuner, seed,
                     budget, output, False)


def summarize(rows: Sequence[dict[str, Any]], seed: int = 0, resamples: int = 2000
              ) -> list[dict[str, Any]]:
    """Per tuner and budget: the median regret over workloads and seeds, its 95 %
    bootstrap interval, and the 90th-percentile cell."""
    rng = np.random.default_rng(seed)
    out = []
    keys = sorted({(r["tuner"], r["budget"]) for r in rows}, key=lambda k: (k[1], k[0]))
    for tuner, budget in keys:
        values = np.array([r["regret"] for r in rows
                           if r["tuner"] == tuner and r["budget"] == budget])
        boot = np.median(rng.choice(values, (resamples, len(values))), axis=1)
        out.append({"tuner": tuner, "budget": budget, "cells": len(values),
                    "median": float(np.median(values)),
                    "low": float(np.percentile(boot, 2.5)),
                    "high": float(np.percentile(boot, 97.5)),
                    "p90": float(np.percentile(values, 90))})
    return out


def format_summary(summary: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'tuner':14s} {'budget':>6s} {'cells':>5s} {'median regret':>13s} "
             f"{'95% interval':>17s} {'90th pct':>8s}"]
    for s in summary:
        lines.append(f"{s['tuner']:14s} {s['budget']:6d} {s['cells']:5d} {s['median']:13.3f} "
                     f"[{s['low']:6.3f}, {s['high']:6.3f}] {s['p90']:8.3f}")
    return "\n".join(lines) + "\n"


def plot_summary(summary: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Regret against budget, one line per tuner with its 95 % band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6, 4))
    for tuner in sorted({s["tuner"] for s in summary}):
        points = [s for s in summary if s["tuner"] == tuner]
        x = [s["budget"] for s in points]
        ax.plot(x, [s["median"] for s in points], marker="o", label=tuner)
        ax.fill_between(x, [s["low"] for s in points], [s["high"] for s in points], alpha=0.2)
    ax.set_xscale("log")
    budgets = sorted({s["budget"] for s in summary})
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("measured trials (replayed)")
    ax.set_ylabel("regret (latency / dataset best - 1)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
