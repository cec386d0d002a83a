"""A tuning run on disk: ``runs/<name>/`` holds everything needed to resume or export it.

Layout of a run directory::

    config.yaml       the resolved configuration
    records.jsonl     every measurement (durable; a killed run resumes from it)
    costmodel.npz     the cost model after the run
    best.json         the best candidate: layout factors, tensor layouts, schedule trace
    summary.json      latency, trials, tuning time, baselines and speedups
    tb/               TensorBoard logs (best latency vs trials)
"""

from __future__ import annotations

import inspect
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .config import ConfigError, RunConfig
from .records import RecordDB, plain_json


@dataclass
class RunResult:
    """What a finished run reports."""

    run_dir: Path
    best_latency: float
    trials: int
    resumed_records: int
    tuning_seconds: float
    max_rel_err: float


def _check_same_run(cfg: RunConfig) -> int:
    """Records already in the run directory (0 for a new run); refuses to mix runs."""
    saved = cfg.run_dir / "config.yaml"
    if not saved.exists():
        return 0
    old = yaml.safe_load(saved.read_text()) or {}
    for key in ("workload", "model", "epilogue", "target"):
        mine = cfg.model_dump(mode="json")[key]
        if old.get(key) != mine:
            raise ConfigError(f"config: {cfg.run_dir} holds a run with {key}={old.get(key)!r}, "
                              f"not {mine!r}; pick another name or output_dir")
    records = cfg.run_dir / "records.jsonl"
    return sum(1 for _ in records.open()) if records.exists() else 0


def _make_agent(cfg: RunConfig) -> Any:
    import agents

    options = dict(cfg.agent.options)
    cls = agents.agent_class(cfg.agent.name)
    if "seed" in inspect.signature(cls).parameters:
        options.setdefault("seed", cfg.seed)
    return cls(**options)


class TensorBoardLog:
    """Tuning-loop callback: best latency (ms) against measured trials."""

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir))

    def __call__(self, session: Any) -> None:
        best = session.history[-1] if session.history else math.inf
        if math.isfinite(best):
            self.writer.add_scalar("tuning/best_latency_ms", best * 1e3, session.trials)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def tune_workload(cfg: RunConfig, progress: bool = True) -> RunResult:
    """Tune ``cfg.workload`` (an operator spec) as configured; resumes a killed run."""
    from .costmodel import CostModel
    from .measure import create
    from .ops import run_numpy
    from .tuning import Budget, OpTask, TuningSession, tune

    previous = _check_same_run(cfg)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    (cfg.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"),
                                                            sort_keys=False))
    print(f"{'resuming' if previous else 'new'} run {cfg.run_dir}"
          + (f" ({previous} records)" if previous else ""))
    task = OpTask(cfg.workload, cfg.target, cfg.epilogue, cfg.search.levels)
    budget = Budget(cfg.budget.joint, cfg.budget.loop_only)
    start = time.perf_counter()
    log = TensorBoardLog(cfg.run_dir / "tb")
    with create(None, cfg.measure, task.target) as measurer, \
            RecordDB(cfg.run_dir / "records.jsonl") as db:
        session = TuningSession(task, measurer, db, CostModel(seed=cfg.seed),
                                check=cfg.search.check)
        tune(session, _make_agent(cfg), budget, batch=cfg.search.batch, top_k=cfg.search.top_k,
             progress=progress, callbacks=[log])
        log.close()
        session.cost_model.save(cfg.run_dir / "costmodel.npz")
        cand, latency = session.best
        if cand is None:
            raise RuntimeError(f"run {cfg.name}: no candidate was measured successfully; "
                               f"see the errors in {cfg.run_dir / 'records.jsonl'}")
        schedule = session.schedule(cand)
        program = task.program(cand.factors)
        raw = program.random_inputs(cfg.seed + 1)
        out = run_numpy(program, raw, task.target, func=schedule.mod)
        ref = program.reference(raw)
        err = float(np.max(np.abs(out - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
        if not err <= 1e-3:
            raise RuntimeError(f"run {cfg.name}: the best program is wrong (max rel err {err})")
        best = {
            "workload": task.key,
            "latency_s": latency,
            "factors": dict(cand.factors),
            "layouts": task.layouts_json(cand.factors),
            "decisions": task.space(cand.factors).to_vector(cand.point).tolist(),
            "trace": plain_json(schedule.trace.as_json()),
            "max_rel_err_vs_torch": err,
        }
        (cfg.run_dir / "best.json").write_text(json.dumps(best, indent=1))
        result = RunResult(cfg.run_dir, latency, session.trials, previous,
                           time.perf_counter() - start, err)
    summary = {"name": cfg.name, "workload": task.key, "best_latency_s": result.best_latency,
               "trials": result.trials, "resumed_records": previous,
               "tuning_seconds": result.tuning_seconds, "max_rel_err_vs_torch": err,
               "best_factors": dict(cand.factors),
               "seconds_per_trial": {k: v / max(session.trials - previous, 1)
                                     for k, v in session.seconds.items()}}
    (cfg.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return result
