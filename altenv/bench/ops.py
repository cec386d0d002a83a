"""``altenv bench ops``: every tuner on every operator at the same measured-trial budget.

Each (workload, tuner, seed) is a *cell* tuned in its own directory::

    DIR/<workload>/<tuner>-seed<k>/   records.jsonl + progress.json (agents; resumable)
                                      or MetaSchedule's work dir (restarted if cut short)
                                      cell.json once finished: trials, seconds, history
    DIR/<workload>/<tuner>-seed<k>.lock   held while the cell is tuned (one writer)
    DIR/<workload>/timing.json        the interleaved re-timing of all finished cells

When every cell of a workload is finished, its final programs are rebuilt in this
process, checked against torch on random inputs, and timed interleaved with the
baselines (TVM untuned, PyTorch eager). ``results.csv``, the table and the plots are
made from the ``timing.json`` files, so a suite run in chunks reports as one.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..baselines import (
    compare,
    compiled_baseline,
    torch_operator_baseline,
    tune_tir_baseline,
    tuned_tir_baseline,
    untuned_tir_baseline,
)
from ..baselines.base import mean_run_seconds
from ..costmodel import CostModel
from ..files import as_written, read_mapping, write_json
from ..lock import DirLock
from ..measure import Measurer
from ..measure.timing import summaries
from ..ops import generate
from ..pipeline.checks import make_agent, make_job
from ..pipeline.devices import SharedMeasurer
from ..pipeline.replay import replay_best
from ..records import RecordDB
from ..space.loop_space import StaleRecordError
from ..suites import BenchSuite, OpEntry
from ..target import make_target
from ..tuning import Budget, TuningJob

METASCHEDULE = "metaschedule"


def cell_dir(output: Path, entry: OpEntry, tuner: str, seed: int) -> Path:
    """Where one (workload, tuner, seed) is tuned; ``module:Class`` tuners get a safe name."""
    return output / entry.name / f"{tuner.replace(':', '.')}-seed{seed}"


@contextlib.contextmanager
def cell_lock(path: Path) -> Iterator[None]:
    """Hold the lock of the cell tuned in ``path`` (``<cell>.lock`` beside it, since a
    MetaSchedule cell's directory is replaced): a second process is refused, naming this
    one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with DirLock(path.with_name(path.name + ".lock"), f"bench cell {path}"):
        yield


def cell_job(suite: BenchSuite, entry: OpEntry, tuner: str, seed: int, budget: int
             ) -> TuningJob:
    """The job of an agent's cell: what ``altenv tune`` of the entry would run with the
    suite's target, search settings and the tuner's agent at ``budget`` trials."""
    agent = make_agent(suite.agent(tuner), {"seed": seed})
    plan = Budget.split(budget)
    if suite.seconds is not None:  # trials past the plan go to the best layout
        plan = Budget(plan.joint, plan.loop_only, suite.trial_cap(tuner) - budget)
    job = make_job(entry.spec, entry.epilogue, suite.target, suite.search, plan, agent)
    job.seconds = suite.seconds
    return job


def _tune_agent_cell(suite: BenchSuite, entry: OpEntry, tuner: str, seed: int, path: Path,
                     budget: int, measurer: Measurer, progress: bool, repair: bool
                     ) -> dict[str, Any]:
    """Tune one cell with an altenv agent on ``measurer``; resumes from its records (no
    trial repeated) and keeps the tuning seconds of earlier attempts in ``progress.json``."""
    path.mkdir(parents=True, exist_ok=True)
    progress_file = path / "progress.json"
    with as_written(progress_file):
        before = float((read_mapping(progress_file) or {"seconds": 0.0})["seconds"])
    start = time.perf_counter()

    def save_progress(_: Any) -> None:
        write_json(progress_file, {"seconds": before + time.perf_counter() - start})

    job = cell_job(suite, entry, tuner, seed, budget)
    task, agent = job.task, job.agent
    with RecordDB(path / "records.jsonl", repair) as db:
        session = job.session(measurer, db, CostModel(seed=seed))
        job.run(session, progress, callbacks=[save_progress], spent=before)
        save_progress(None)
        cand, latency = session.best
        if cand is None:
            raise session.nothing_measured(f"{entry.name}/{tuner}")
        return {"trials": session.trials, "tuning_seconds": before + time.perf_counter() - start,
                "seconds_per_trial": session.seconds_per_trial(),
                "best_tuning_latency_s": latency, "history": session.history,
                "factors": dict(cand.factors), "agent": agent.summary(),
                "decisions": task.space(cand.factors).to_vector(cand.point).tolist()}


def metaschedule_history(work_dir: Path) -> list[float]:
    """Best latency after each trial of a MetaSchedule run, from its JSON database in
    measurement order (failed trials count, at the previous best)."""
    best, history = math.inf, []
    record_file = work_dir / "database_tuning_record.json"
    for line in record_file.read_text().splitlines():
        if line.strip():
            best = min(best, mean_run_seconds(json.loads(line)[1][1]))
            history.append(best)
    return history


def _tune_metaschedule_cell(suite: BenchSuite, entry: OpEntry, seed: int, path: Path,
                            measurer: Measurer) -> dict[str, Any]:
    """Tune one cell with MetaSchedule's ``tune_tir`` on the operator in its framework
    layout (NCHW/OIHW, padding fused), on ``measurer``'s workers where it lends them; a run
    cut short starts over."""
    if path.exists():
        shutil.rmtree(path)
    program = generate(entry.spec, epilogue=entry.epilogue)
    start = time.perf_counter()
    baseline = tune_tir_baseline(program, path, suite.trial_cap(METASCHEDULE),
                                 target=suite.target, config=measurer.config, seed=seed,
                                 measurer=measurer, seconds=suite.seconds)
    history = metaschedule_history(path)
    return {"trials": baseline.tuning.trials, "valid": baseline.tuning.valid,
            "tuning_seconds": time.perf_counter() - start,
            "best_tuning_latency_s": baseline.tuning.best_seconds, "history": history}


def _set_aside(path: Path, err: StaleRecordError) -> None:
    """Move a cell whose records this version cannot replay to ``<cell>-stale`` (replacing
    an older one there), so that the cell is tuned again from scratch."""
    stale = path.with_name(path.name + "-stale")
    print(f"[bench] {path}: {err}; moved to {stale.name}, tuning the cell again")
    if stale.exists():
        shutil.rmtree(stale)
    path.rename(stale)


def _best_decodes(suite: BenchSuite, entry: OpEntry, summary: dict[str, Any], path: Path
                  ) -> bool:
    """Whether a finished agent cell's best still replays in this version's design space
    (otherwise the cell is set aside)."""
    try:
        replay_best(entry.spec, entry.epilogue, suite.target, summary)
    except StaleRecordError as err:
        _set_aside(path, err)
        return False
    return True


def tune_cell(suite: BenchSuite, entry: OpEntry, tuner: str, seed: int, output: Path,
              budget: int, measurers: SharedMeasurer, progress: bool = True,
              repair: bool = False) -> dict[str, Any]:
    """Tune one cell unless its ``cell.json`` says it is finished; returns that summary.
    The cell is locked while it is tuned (:func:`cell_lock`); it measures on the bench's
    shared measurer."""
    path = cell_dir(output, entry, tuner, seed)
    with cell_lock(path):
        done = path / "cell.json"
        summary = read_mapping(done)
        if summary is not None:
            with as_written(done):
                finished = summary.get("budget") == budget and summary.get(
                    "seconds") == suite.seconds and (
                    tuner == METASCHEDULE or _best_decodes(suite, entry, summary, path))
            if finished:
                return summary
        if tuner == METASCHEDULE:
            summary = _tune_metaschedule_cell(suite, entry, seed, path, measurers.get())
        else:
            try:
                summary = _tune_agent_cell(suite, entry, tuner, seed, path, budget,
                                           measurers.get(), progress, repair)
            except StaleRecordError as err:
                _set_aside(path, err)
                summary = _tune_agent_cell(suite, entry, tuner, seed, path, budget,
                                           measurers.get(), progress, repair)
        summary.update(workload=entry.name, spec=str(entry.spec), tuner=tuner, seed=seed,
                       budget=budget, seconds=suite.seconds)
        write_json(done, summary)
        return summary


def _program_of(suite: BenchSuite, entry: OpEntry, summary: dict[str, Any], path: Path,
                raw: Any, label: str) -> Any:
    """The finished cell's best program as a :class:`~altenv.baselines.Baseline`."""
    if summary["tuner"] == METASCHEDULE:
        baseline = tuned_tir_baseline(generate(entry.spec, epilogue=entry.epilogue), path,
                                      target=suite.target, raw=raw)
        baseline.name = label
        return baseline
    task, factors, schedule = replay_best(entry.spec, entry.epilogue, suite.target, summary)
    return compiled_baseline(label, task.program(factors), schedule.mod, target=suite.target,
                             raw=raw)


def retime_workload(suite: BenchSuite, entry: OpEntry, cells: list[dict[str, Any]],
                    output: Path, baselines: list[str], rounds: int = 15) -> dict[str, Any]:
    """Rebuild every finished cell's program and the baselines, check all against torch on
    the same random inputs, time them interleaved; writes and returns ``timing.json``."""
    plain = generate(entry.spec, epilogue=entry.epilogue)
    raw = plain.random_inputs(12345)
    runs = []
    for summary in cells:
        label = f"{summary['tuner']}#{summary['seed']}"
        path = cell_dir(output, entry, summary["tuner"], summary["seed"])
        runs.append(_program_of(suite, entry, summary, path, raw, label))
    if "tvm-default" in baselines:
        runs.append(untuned_tir_baseline(plain, target=suite.target, raw=raw))
    if "torch" in baselines and plain.op.dtype == "float32":
        runs.append(torch_operator_baseline(plain, target=suite.target, raw=raw))
    stats = compare(runs, [plain.reference(raw)], rtol=plain.op.tolerance(), rounds=rounds)
    timing = {"workload": entry.name, "spec": str(entry.spec), "epilogue": entry.epilogue,
              "target": str(make_target(suite.target)),
              "programs": summaries(stats),
              "cells": {f"{c['tuner']}#{c['seed']}": {k: c.get(k) for k in
                        ("tuner", "seed", "budget", "seconds", "trials", "tuning_seconds",
                         "seconds_per_trial", "history")}
                        for c in cells}}
    write_json(output / entry.name / "timing.json", timing)
    return timing

