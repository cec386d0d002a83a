"""``altenv bench scale``: what scaling out buys.

Two measurements. :func:`overhead` tunes one operator for the same trials through the
local measurer and through the Ray measurer (``ray: local``, one device, builds as Ray
tasks), interleaved, and reports trials per minute of each. :func:`simulate` runs a
network's real tuning stages (:func:`~altenv.pipeline.model.tune_tasks` and
:func:`~altenv.pipeline.model.hand_out_reserved`: sibling groups tuned at once, the task
scheduler, the one records writer, the cost model retraining) on a
:class:`SimulatedFleet` of N devices, where a build costs ``build_seconds`` of one of the
fleet's CPUs and a device answers after a latency model, and reports trials per minute
against N (from the first answer to the last: planning and the first spaces aside) and
how busy the devices were: where adding devices no longer adds trials and their
utilization falls, the driver (searching, extracting features, retraining the cost model,
writing records, all in one process) or the number of batches in flight (sibling groups
tuning at once x ``top_k``) is the bottleneck.
"""

from __future__ import annotations

import hashlib
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig

from ..config import RunConfig, load_config
from ..costmodel import CostModel
from ..measure import MeasureCandidate, MeasureConfig, MeasureResult, create
from ..measure.measurer import FleetMeasurer
from ..ops import generate
from ..pipeline.checks import check_run, load_user_model, make_job
from ..pipeline.model import ModelRun, hand_out_reserved, plan, tune_tasks
from ..pipeline.rundir import RunDir
from ..records import RecordDB


class SimulatedBuilder:
    """Builds nothing: each build holds one of ``cpus`` CPUs for ``seconds``."""

    def __init__(self, cpus: int, seconds: float) -> None:
        self.pool = ThreadPoolExecutor(cpus)
        self.seconds = seconds

    def build_timed(self, build_inputs: list[BuilderInput]
                    ) -> tuple[list[BuilderResult], list[float]]:
        """One artifact name per input, after its simulated compile."""
        names = list(self.pool.map(self._build, build_inputs))
        return [BuilderResult(name, None) for name in names], [self.seconds] * len(names)

    def _build(self, build_input: BuilderInput) -> str:
        time.sleep(self.seconds)
        return f"/nonexistent/altenv-sim/{tvm_hash(build_input.mod)}"

    def shutdown(self) -> None:
        self.pool.shutdown()


def tvm_hash(mod: Any) -> str:
    """A stable name of a program (its printed form hashed)."""
    return hashlib.sha1(mod.script().encode()).hexdigest()[:16]


class SimulatedFleet(FleetMeasurer):
    """N devices answering after a latency model: a candidate's latency is drawn
    log-normally around ``base_latency`` from its program's hash, and a device is busy
    ``session_seconds`` plus ``repeat`` timings of ``max(min_repeat_ms, number x
    latency)``, as MetaSchedule's evaluator spends it."""

    def __init__(self, devices: int, config: MeasureConfig, cpus_per_device: int = 2,
                 build_seconds: float = 1.0, session_seconds: float = 0.5,
                 base_latency: float = 1e-3) -> None:
        self.count = devices
        self.cpus = devices * cpus_per_device
        self.build_seconds = build_seconds
        self.session_seconds = session_seconds
        self.base_latency = base_latency
        self.busy = 0.0
        self.answered: list[float] = []
        """When each candidate's answer came (``perf_counter``)."""
        self._lock = threading.Lock()
        super().__init__(config)

    def _make_builder(self) -> SimulatedBuilder:
        return SimulatedBuilder(self.cpus, self.build_seconds)

    def _make_runner(self) -> object:
        return object()

    def devices(self) -> int:
        """The simulated devices."""
        return self.count

    def _time_one(self, runner: Any, args_info: list[Any], artifact: str,
                  timing: EvaluatorConfig, evaluator: Any) -> MeasureResult:
        seed = int(artifact.rsplit("/", 1)[-1], 16)
        latency = self.base_latency * float(np.random.default_rng(seed).lognormal(0, 0.5))
        seconds = self.session_seconds + timing.repeat * max(
            timing.min_repeat_ms / 1e3, timing.number * latency)
        time.sleep(seconds)
        with self._lock:
            self.busy += seconds
            self.answered.append(time.perf_counter())
        return MeasureResult(latencies=[latency] * timing.repeat, run_seconds=seconds)

    def _close_runner(self, runner: Any, wait: bool) -> None:
        """Nothing runs."""


def simulate(model: str, devices: Sequence[int], trials: Sequence[int],
             agent: str = "evolution", top_k: int = 8, seed: int = 0,
             **fleet: Any) -> list[dict[str, float]]:
    """Trials per minute of a network's tuning stages on each fleet size (``trials[i]``
    trials on ``devices[i]`` devices, in a temporary run directory)."""
    rows = []
    for count, budget in zip(devices, trials, strict=True):
        with tempfile.TemporaryDirectory(prefix="altenv-sim-") as tmp:
            cfg = load_config(None, RunConfig, name="sim", model=model, output_dir=tmp,
                              seed=seed, agent=agent, **{
                                  "budget.joint": budget * 3 // 10,
                                  "budget.loop_only": budget - budget * 3 // 10,
                                  "search.top_k": top_k, "search.finalists": 0})
            run_dir = RunDir(cfg.run_dir)
            with run_dir.open(cfg, False) as db:
                run = ModelRun(cfg, run_dir, check_run(cfg),
                               load_user_model(cfg.model, cfg.model_options, cfg.seed), db,
                               progress=False)
                plan(run)
                with SimulatedFleet(count, cfg.measure, **fleet) as measurer:
                    start = time.perf_counter()
                    tune_tasks(run, measurer, lambda session: None)
                    hand_out_reserved(run, measurer, lambda session: None)
                    elapsed = time.perf_counter() - start
                    busy, answered = measurer.busy, sorted(measurer.answered)
                driver = {k: sum(s.seconds[k] for s in run.opened.values())
                          for k in ("search", "cost_model")}
            with RecordDB(run_dir.records) as db:
                measured = len(db)
        steady = answered[-1] - answered[0]  # from the first answer to the last
        rows.append({"devices": count, "trials": measured, "seconds": elapsed,
                     "trials_per_min": 60 * (len(answered) - 1) / steady,
                     "device_utilization": busy / (count * steady),
                     **{f"{k}_s_per_trial": v / measured for k, v in driver.items()}})
    base = rows[0]["trials_per_min"] / rows[0]["devices"]
    for row in rows:
        row["of_linear"] = row["trials_per_min"] / (base * row["devices"])
    return rows


def overhead(workload: str, trials: int, rounds: int, seed: int = 0) -> dict[str, Any]:
    """Trials per minute tuning ``workload`` for ``trials`` trials through the local
    measurer and through the Ray measurer on ``ray: local``, ``rounds`` times each,
    interleaved (each run in a fresh records file, its measurer's start-up untimed)."""
    from ..cluster.measurer import RayMeasurer  # Ray only for this bench
    from ..cluster.session import connect
    from ..cluster.settings import RaySettings

    settings = RaySettings(address="local")
    connect(settings)
    cfg = load_config(None, RunConfig, name="overhead", workload=workload, seed=seed,
                      budget=trials)
    job = make_job(cfg.workload, cfg.epilogue, cfg.target, cfg.search, cfg.budget.stages,
                   check_run(cfg), cfg.mapping)
    task = job.task
    warm = generate(task.workload)
    minutes: dict[str, list[float]] = {"local": [], "ray": []}
    for _ in range(rounds):
        for path, make in (("local", lambda: create("local", cfg.measure, task.target)),
                           ("ray", lambda: RayMeasurer(settings, cfg.measure, task.target))):
            with tempfile.TemporaryDirectory() as tmp, make() as measurer, \
                    RecordDB(Path(tmp) / "records.jsonl") as db:
                # workers start (and import TVM) before the clock does
                measurer.measure([MeasureCandidate(warm.func) for _ in range(2)])
                session = job.session(measurer, db, CostModel(seed=seed))
                start = time.perf_counter()
                job.run(session, progress=False)
                minutes[path].append(session.trials / (time.perf_counter() - start) * 60)
    local, ray_ = statistics.median(minutes["local"]), statistics.median(minutes["ray"])
    return {"workload": workload, "trials": trials, "rounds": rounds,
            "trials_per_min": minutes, "ray_over_local": ray_ / local}
