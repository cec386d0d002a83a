"""An operator run (``altenv tune`` of a ``workload:``): one operator tuned, its best checked
against torch, then timed against TVM's untuned build and PyTorch eager.

Each candidate's tensors are stored in the layouts its template factors give, and the
operator is timed with its input already in that layout, as a producer writes it after
propagation in a network (ALT Fig. 5b).
"""

from __future__ import annotations

import time

import numpy as np
from tvm.ir import IRModule

from ..baselines import (
    compare,
    compiled_baseline,
    torch_operator_baseline,
    untuned_tir_baseline,
)
from ..config import RunConfig
from ..costmodel import CostModel
from ..files import write_json
from ..measure.timing import summaries
from ..ops import OpProgram, generate, run_numpy
from ..records import plain_json
from ..tuning import OpTask
from .checks import check_run, make_job
from .devices import open_measurer
from .report import RunResult, speedups
from .rundir import RunDir
from .tensorboard import TensorBoardLog


def tune_workload(cfg: RunConfig, progress: bool = True, repair: bool = False) -> RunResult:
    """Tune ``cfg.workload`` (an operator spec) as configured; resumes a killed run
    (``repair``: bad lines of its records are moved aside, :class:`RecordDB`)."""
    run_dir = RunDir(cfg.run_dir)
    agent = check_run(cfg, tensorboard_log=str(run_dir.tensorboard))
    job = make_job(cfg.workload, cfg.epilogue, cfg.target, cfg.search, cfg.budget.stages,
                   agent, cfg.mapping)
    task = job.task
    with run_dir.open(cfg, repair) as db, \
            open_measurer(cfg.ray, cfg.measure, task.target) as measurer:
        db.keep_only({task.key}, f"run {cfg.name}")
        previous = len(db)
        start = time.perf_counter()
        session = job.session(measurer, db, CostModel(seed=cfg.seed))
        log = TensorBoardLog(run_dir.tensorboard)
        job.run(session, progress, callbacks=[log])
        log.close()
        run_dir.save_agent(agent)
        session.cost_model.save(run_dir.cost_model)
        cand, latency = session.best
        if cand is None:
            raise session.nothing_measured(f"run {cfg.name}")
        schedule = session.schedule(cand)
        program = task.program(cand.factors)
        raw = program.random_inputs(cfg.seed + 1)
        out = run_numpy(program, raw, task.target, func=schedule.mod)
        ref = program.reference(raw)
        err = float(np.max(np.abs(out.astype(np.float64) - ref))
                    / max(float(np.max(np.abs(ref))), 1e-30))
        if not err <= program.op.tolerance():
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
        write_json(run_dir.best, best)
        timings = compare_with_baselines(task, program, schedule.mod, cfg.seed)
        result = RunResult(cfg.run_dir, latency, session.trials, previous,
                           time.perf_counter() - start, err, timings)
        summary = {"name": cfg.name, "workload": task.key,
                   "best_latency_s": result.best_latency, "trials": result.trials,
                   "resumed_records": previous, "tuning_seconds": result.tuning_seconds,
                   "max_rel_err_vs_torch": err, "best_factors": dict(cand.factors),
                   "agent": agent.summary(),
                   "seconds_per_trial": session.seconds_per_trial(),
                   "timings": timings, "speedup": speedups(timings)}
        write_json(run_dir.summary, summary)
    return result


def compare_with_baselines(task: OpTask, program: OpProgram, mod: IRModule, seed: int
                           ) -> dict[str, dict[str, float]]:
    """Time altenv's best program against TVM's untuned default and PyTorch eager on the
    same random inputs, interleaved, each checked against torch first. The operator's
    input arrives in its chosen layout, as a producer writes it after propagation (ALT
    Fig. 5b); the untuned TVM program takes padded NCHW, torch takes plain NCHW."""
    plain = generate(task.workload, epilogue=task.epilogue)
    raw = program.random_inputs(seed + 2)
    runs = [compiled_baseline("altenv", program, mod, target=task.target, raw=raw),
            untuned_tir_baseline(plain, target=task.target, raw=raw)]
    if plain.op.dtype == "float32":
        runs.append(torch_operator_baseline(plain, target=task.target, raw=raw))
    stats = compare(runs, [program.reference(raw)], rtol=plain.op.tolerance())
    return summaries(stats)
