"""A tuning run on disk: ``runs/<name>/`` holds everything needed to resume or export it.

Layout of a run directory::

    config.yaml       the resolved configuration
    records.jsonl     every measurement (durable; a killed run resumes from it)
    costmodel.npz     the cost model after the run
    best.json         the best candidate: layout factors, tensor layouts, schedule trace
    summary.json      latency, trials, tuning time, baselines and speedups
    tb/               TensorBoard logs (best latency vs trials)
    others/           a network run's MetaSchedule database of its other kernels
    model/            a network run's imported model, kept as data (what export builds)
    .lock             held by the process running it (one writer per run directory)

Everything a run needs is checked before its directory is made (:func:`check_run`, and
the model imported for a network run), so bad input leaves nothing behind. Export reads
a run directory as data only: it never imports the model or agent a config names.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .config import AgentConfig, ConfigError, RunConfig, TrainConfig
from .lock import LOCK_FILE, DirLock
from .records import RecordDB, plain_json
from .tuning.loop import Budget
from .tuning.others import OTHERS_DIR

if TYPE_CHECKING:
    from .tuning import TuningSession


@dataclass
class RunResult:
    """What a finished run reports."""

    run_dir: Path
    best_latency: float
    trials: int
    resumed_records: int
    tuning_seconds: float
    max_rel_err: float
    timings: dict[str, dict[str, float]]


IDENTITY = {"workload": None, "workloads": None, "model": None, "epilogue": None,
            "target": None, "mapping": "none"}
"""Config keys a resumed run must share with the run on disk, with the value a config
written before the key existed means."""


MODEL_DIR = "model"
"""Where a network run keeps its imported model (:func:`altenv.graph.frontend.save_model`)."""


def _saved_config(path: Path) -> dict[str, Any]:
    """A run directory's ``config.yaml`` as a mapping (a one-line error if it is not one)."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a run config (the top level is not a mapping)")
    return data


@contextlib.contextmanager
def _open_run(cfg: RunConfig | TrainConfig, repair: bool = False) -> Iterator[RecordDB]:
    """Create or reopen the run directory and hold its lock (a second process is refused,
    naming this one) while the run goes on; yields its records (validated; ``repair``
    moves bad lines aside, :class:`~altenv.records.RecordDB`). Refuses to mix a different
    run into it."""
    saved = cfg.run_dir / "config.yaml"
    mine = cfg.model_dump(mode="json")
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    with DirLock(cfg.run_dir / LOCK_FILE, f"run directory {cfg.run_dir}"):
        if saved.exists():  # before its records are read (or repaired)
            old = _saved_config(saved)
            for key, default in IDENTITY.items():
                if old.get(key, default) != mine.get(key, default):
                    raise ConfigError(f"config: {cfg.run_dir} holds a run with {key}="
                                      f"{old.get(key, default)!r}, not "
                                      f"{mine.get(key, default)!r}; pick another name or "
                                      "output_dir")
        with RecordDB(cfg.run_dir / "records.jsonl", repair) as db:
            saved.write_text(yaml.safe_dump(mine, sort_keys=False))
            print(f"{'resuming' if len(db) else 'new'} run {cfg.run_dir}"
                  + (f" ({len(db)} records)" if len(db) else ""))
            yield db


def check_device(target: Any) -> None:
    """A :class:`ConfigError` of one line unless the device of ``target`` (a config's
    target) is present on this host."""
    from .target import check_device as present
    from .target import make_target

    try:
        present(make_target(target))
    except ValueError as err:
        raise ConfigError(f"target: {err}") from None


def make_agent(agent: AgentConfig, defaults: dict[str, Any]) -> Any:
    """The agent ``agent`` names, built by :func:`agents.build` (its options typed and
    checked; ``defaults`` fill those it takes and were not given); whatever is wrong (a
    module that does not import, an option of the wrong type or value) is a
    :class:`ConfigError` of one line."""
    import agents

    try:
        return agents.build(agent.name, agent.options, defaults)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"agent: {' '.join(str(err).removeprefix('agent: ').split())}"
                          ) from None


def check_run(cfg: RunConfig | TrainConfig, **defaults: Any) -> Any:
    """What a run needs beyond its config, checked before its directory is made: the
    target's device is present (:func:`check_device`) and the agent is built
    (:func:`make_agent`; ``seed``, the run's own checkpoint when resuming and ``defaults``
    fill options it takes). Returns the agent; a :class:`ConfigError` of one line
    otherwise."""
    check_device(cfg.target)
    own = cfg.run_dir / "checkpoint"
    if own.exists():
        defaults.setdefault("checkpoint", str(own))
    agent = make_agent(cfg.agent, {"seed": cfg.seed, **defaults})
    if isinstance(cfg, TrainConfig) and not hasattr(agent, "save"):
        raise ConfigError(f"agent: {cfg.agent.name!r} has nothing to train (no save()); use an "
                          "agent such as 'ppo'")
    return agent


def op_task(cfg: RunConfig | TrainConfig, spec: str, mapping: str = "none") -> Any:
    """The :class:`~altenv.tuning.OpTask` of an operator run or of a workload to train on;
    a template the workload cannot have (e.g. no intrinsic mapping of it) is a
    :class:`ConfigError` of one line."""
    from .tuning import OpTask

    try:
        return OpTask(spec, cfg.target, cfg.epilogue, cfg.search.levels, mapping=mapping)
    except ValueError as err:
        raise ConfigError(f"workload {spec!r}: {' '.join(str(err).split())}") from None


def load_user_model(source: str, options: dict[str, Any], seed: int) -> Any:
    """Import a user's model (:func:`altenv.graph.load_model`; a ``file.py:factory`` or zoo
    model runs Python); anything that goes wrong is a :class:`ConfigError` of one line
    naming the model (a missing or unreadable file, an operator the frontend cannot
    convert, a bad ``model_options`` value, whatever the factory raises)."""
    from .graph import load_model

    try:
        return load_model(source, seed=seed, **options)
    except Exception as err:  # noqa: BLE001 (a user's factory may raise anything)
        lines = [line for line in str(err).splitlines() if line.strip()]
        reason = " ".join(lines[0].split()) + (" (...)" if len(lines) > 1 else "") \
            if lines else ""
        raise ConfigError(f"model {source!r}"
                          + (f" with model_options {options}" if options else "")
                          + f": cannot import it ({type(err).__name__}: {reason})") from err


def _save_agent(agent: Any, cfg: RunConfig) -> None:
    """Trainable agents (with ``save``) keep their models in ``<run>/checkpoint``."""
    if hasattr(agent, "save"):
        agent.save(cfg.run_dir / "checkpoint")


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


def tune_workload(cfg: RunConfig, progress: bool = True, repair: bool = False) -> RunResult:
    """Tune ``cfg.workload`` (an operator spec) as configured; resumes a killed run
    (``repair``: bad lines of its records are moved aside, :class:`RecordDB`)."""
    from .costmodel import CostModel
    from .measure import create
    from .ops import run_numpy
    from .tuning import TuningSession, tune

    agent = check_run(cfg, tensorboard_log=str(cfg.run_dir / "tb"))
    task = op_task(cfg, cfg.workload, cfg.mapping)
    budget = Budget(cfg.budget.joint, cfg.budget.loop_only)
    with _open_run(cfg, repair) as db, create(None, cfg.measure, task.target) as measurer:
        previous = len(db)
        start = time.perf_counter()
        session = TuningSession(task, measurer, db, CostModel(seed=cfg.seed),
                                check=cfg.search.check)
        log = TensorBoardLog(cfg.run_dir / "tb")
        tune(session, agent, budget, **cfg.search.loop_options(),
             progress=progress, callbacks=[log])
        log.close()
        _save_agent(agent, cfg)
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
        (cfg.run_dir / "best.json").write_text(json.dumps(best, indent=1))
        timings = compare_with_baselines(task, program, schedule.mod, cfg.seed)
        result = RunResult(cfg.run_dir, latency, session.trials, previous,
                           time.perf_counter() - start, err, timings)
        summary = {"name": cfg.name, "workload": task.key,
                   "best_latency_s": result.best_latency, "trials": result.trials,
                   "resumed_records": previous, "tuning_seconds": result.tuning_seconds,
                   "max_rel_err_vs_torch": err, "best_factors": dict(cand.factors),
                   "agent": agent.summary(),
                   "seconds_per_trial": {k: v / max(session.trials - previous, 1)
                                         for k, v in session.seconds.items()},
                   "timings": timings, "speedup": speedups(timings)}
        (cfg.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return result


# measured batches every task of a model gets before the rest is split by FLOPs: split by
# FLOPs alone, ResNet-18's 1x1 downsample convolutions got 13 trials and its classifier 8,
# and lost to MetaSchedule's, whose task scheduler gives every task at least 64
TASK_FLOOR_BATCHES = 4
RIDGE_FLOPS_PER_BYTE = 5.0
"""Where tuned kernels turn memory-bound: about 200 GFLOP/s of the best convolutions over
about 40 GB/s of the best depthwise ones, measured on ResNet-18 and MobileNet-V2 runs on
the 2-core CI CPU (docs/tuning.md). Sizes a task's share of the budget."""


def _task_weight(spec: str, calls: int) -> float:
    """A task's share of the budget, in proportion to a roofline estimate of its latency:
    ``max(FLOPs, RIDGE x bytes moved) x calls``. FLOPs alone starve memory-bound tasks
    (MobileNet-V2's depthwise convolutions, the classifier GEMV)."""
    from .ops import operator_for, parse_workload

    op = operator_for(parse_workload(spec))
    return max(float(op.flops()), RIDGE_FLOPS_PER_BYTE * op.traffic_bytes()) * calls


def _task_budgets(weights: dict[str, float], total: int, minimum: int) -> dict[str, int]:
    """Split ``total`` trials over tasks: each gets ``minimum`` (when the total allows),
    the rest goes in proportion to ``weights`` (:func:`_task_weight`)."""
    floor = min(minimum, total // max(len(weights), 1))
    rest = total - floor * len(weights)
    norm = sum(weights.values()) or 1.0
    shares = {t: floor + int(rest * w / norm) for t, w in weights.items()}
    leftover = total - sum(shares.values())
    for t in sorted(weights, key=weights.get, reverse=True)[:leftover]:
        shares[t] += 1
    return shares


def _similarity_group(spec: str) -> str:
    """Tasks whose throughputs the task scheduler compares: the operator kind with its
    kernel window, stride, dilation and groups (shapes aside)."""
    from .ops import parse_workload

    workload = parse_workload(spec)
    kept = [f"{k}={v}" for k, v in workload.params.items()
            if k.startswith("K") or k in ("stride", "dilation", "groups")]
    return f"{workload.kind}:{','.join(kept)}"


def _hand_out_reserved(cfg: RunConfig, agent: Any, sessions: dict[str, TuningSession],
                       shares: dict[str, Budget], budgets: dict[str, int], reserved: int,
                       groups: dict[str, str], weights: dict[str, float],
                       calls: dict[str, int], progress: bool, log: Any) -> set[str]:
    """The task scheduler's trials (:mod:`altenv.tuning.scheduler`): ``reserved`` of them,
    a batch at a time, each to the task it picks (loop search on the task's best layout,
    :class:`~altenv.tuning.loop.Budget` ``extra``), at most its own share again to one
    task (one stuck far below its peers' throughput would otherwise take them all).
    Trials a task measured past its share count as handed out, so a resumed run goes on
    with what is left. Returns the tasks that got some in this call."""
    from tqdm.auto import tqdm

    from .tuning import tune
    from .tuning.scheduler import TaskProgress, handed_out, next_task

    spent = sum(handed_out({t: s.trials for t, s in sessions.items()}, budgets).values())
    cap = {t: 2 * budgets[t] for t in sessions}  # its share, and as much again at most
    open_tasks = {t: s for t, s in sessions.items() if s.trials < cap[t]}
    rescued: set[str] = set()
    batch = cfg.search.loop_options(model=True) | {"finalists": 0}
    bar = tqdm(total=reserved, initial=min(spent, reserved), desc="task scheduler",
               unit="trial", disable=not progress or spent >= reserved)
    while spent < reserved and open_tasks:
        name = next_task({t: TaskProgress(calls[t], weights[t] / calls[t], groups[t],
                                          s.history) for t, s in open_tasks.items()},
                         cfg.search.top_k)
        session, share = open_tasks[name], shares[name]
        before = session.trials
        extra = before - share.joint - share.loop_only + min(
            cfg.search.top_k, reserved - spent, cap[name] - before)
        tune(session, agent, Budget(share.joint, share.loop_only + min(extra, 0),
                                    max(extra, 0)),
             **batch, progress=False, callbacks=[log])
        if session.trials == before:
            del open_tasks[name]  # nothing new to measure there
            continue
        if session.trials >= cap[name]:
            del open_tasks[name]
        rescued.add(name)
        spent += session.trials - before
        bar.update(session.trials - before)
        bar.set_postfix(task=name, best_ms=f"{session.best[1] * 1e3:.4g}")
    bar.close()
    _save_agent(agent, cfg)
    return rescued


def _best_entry(session: TuningSession, spec: str, calls: int, cand: Any, latency: float
                ) -> dict[str, Any]:
    """A network task's entry in ``best.json``: its workload, layouts and loop decisions."""
    task = session.task
    return {"workload": task.key, "spec": spec, "epilogue": list(task.epilogue),
            "calls": calls, "latency_s": latency, "factors": dict(cand.factors),
            "decisions": task.space(cand.factors).to_vector(cand.point).tolist(),
            "layouts": task.layouts_json(cand.factors)}


IN_NETWORK_FILE = "in_network.json"
"""The layout choices a model run made inside the network (:mod:`altenv.graph.in_network`),
by task: kept across a resumed run."""


def _choose_in_network(cfg: RunConfig, graph: Any, factors: dict[str, dict[str, int]],
                       schedules: dict[str, Any], options: dict[str, list[Any]]
                       ) -> dict[str, Any]:
    """Re-time each task's contenders inside the network (:func:`choose_layouts`); the
    contender kept by each task that kept another than its fastest alone. Like the final
    pick, this re-times
    candidates already measured: it costs seconds, not trials."""
    from .graph.in_network import Choice, choose_layouts

    path = cfg.run_dir / IN_NETWORK_FILE
    known = {t: Choice.from_json(c) for t, c in json.loads(path.read_text()).items()} \
        if path.exists() else {}
    recorded = {t: c.to_json() for t, c in known.items()}

    def save(task: str, choice: Choice) -> None:
        recorded[task] = choice.to_json()
        path.write_text(json.dumps(recorded, indent=1))
        first, kept = choice.seconds[0], choice.seconds[choice.chosen]
        print(f"task {task}: {first * 1e6:.0f} us per network run on the layout fastest "
              f"alone, {kept * 1e6:.0f} us on the one kept (contender {choice.chosen} of "
              f"{len(choice.seconds)})")

    choices = choose_layouts(graph, factors, schedules, options, cfg.target, known, save,
                             seed=cfg.seed)
    return {task: options[task][choice.chosen] for task, choice in choices.items()
            if choice.chosen}


def tune_model(cfg: RunConfig, progress: bool = True, repair: bool = False) -> RunResult:
    """Tune every complex task of ``cfg.model`` (in topological order, ALT §6; each starts
    from its tuned siblings' best, and the earlier siblings measure the later ones' best
    at the end, :mod:`altenv.tuning.transfer`), build the network with
    the best layouts and schedules (layouts propagated, ALT Alg. 1), check it against the
    source framework and time it against TVM's untuned build and PyTorch. The imported
    model is kept in the run directory as data (``model/``, what export builds);
    ``repair`` moves bad lines of the records aside (:class:`RecordDB`)."""
    from .baselines import compare, network_baseline, torch_module_baseline, untuned_relax_baseline
    from .costmodel import CostModel
    from .graph.build import max_rel_err
    from .graph.frontend import save_model
    from .graph.in_network import contenders
    from .graph.network import build_plan, other_kernels, plan_network
    from .graph.tasks import extract_tasks
    from .measure import create
    from .target import make_target
    from .tuning import OpTask, TuningSession, tune
    from .tuning.others import tune_others
    from .tuning.scheduler import handed_out
    from .tuning.transfer import TunedTask, carry_back, tuned_task, warm_start

    agent = check_run(cfg, tensorboard_log=str(cfg.run_dir / "tb"))
    model = load_user_model(cfg.model, cfg.model_options, cfg.seed)
    with _open_run(cfg, repair) as db:
        previous = len(db)
        start = time.perf_counter()
        save_model(model, cfg.run_dir / MODEL_DIR)
        graph = extract_tasks(model)
        plan = plan_network(graph)
        lowering_of = {graph.calls[i].task: low for i, low in sorted(plan.lowerings.items())}
        calls = {t: sum(1 for c in graph.calls if c.task == t) for t in lowering_of}
        weights = {t: _task_weight(low.spec, calls[t]) for t, low in lowering_of.items()}
        reserved = round(cfg.budget.searched * cfg.search.task_scheduler)
        budgets = _task_budgets(weights, cfg.budget.searched - reserved,
                                TASK_FLOOR_BATCHES * cfg.search.top_k)
        joint_fraction = cfg.budget.joint / max(cfg.budget.searched, 1)
        print(f"{cfg.model}: {len(lowering_of)} tuned tasks, {len(plan.fallbacks)} calls on "
              f"default schedules; {cfg.budget.total} trials ({cfg.budget.others} for the "
              "other kernels)")
        log = TensorBoardLog(cfg.run_dir / "tb")
        best: dict[str, dict[str, Any]] = {}
        factors: dict[str, dict[str, int]] = {}
        schedules: dict[str, Any] = {}
        sessions: dict[str, TuningSession] = {}
        cost_model = CostModel(seed=cfg.seed)
        opened: dict[str, TuningSession] = {}
        shares: dict[str, Budget] = {}  # each task's share, as its stages were sized
        siblings: dict[str, list[TunedTask]] = {}  # by operator spec, for warm starts
        pending: dict[str, list[tuple[str, TuningSession]]] = {}  # sessions, by spec
        last_of_spec = {low.spec: name for name, low in lowering_of.items()}
        options = cfg.search.loop_options(model=True)

        def settle(name: str, session: TuningSession) -> None:
            """Keep a tuned task's best layout and schedule."""
            cand = session.best[0]
            if cand is None:
                print(f"task {name}: nothing measured successfully; default layout and schedule")
                return
            factors[name] = dict(cand.factors)
            schedules[name] = session.schedule(cand)
            sessions[name] = session
            best[name] = _best_entry(session, lowering_of[name].spec, calls[name], *session.best)

        with create(None, cfg.measure, cfg.target) as measurer:
            for name, lowering in lowering_of.items():
                task = OpTask(lowering.spec, cfg.target, lowering.epilogue, cfg.search.levels)
                session = TuningSession(task, measurer, db, cost_model, check=cfg.search.check)
                last = last_of_spec[lowering.spec] == name
                reserve = 0 if last else cfg.search.warm_start  # for carry_back
                budget = Budget.split(budgets[name] - reserve, joint_fraction)
                opened[name], shares[name] = session, budget
                session.limit = budget.total
                session.measure(warm_start(task, siblings.get(lowering.spec, []),
                                           cfg.search.warm_start))
                tune(session, agent, budget, **options, progress=progress, callbacks=[log])
                group = siblings.setdefault(lowering.spec, [])
                group.append(tuned_task(session, cfg.search.warm_start))
                pending.setdefault(lowering.spec, []).append((name, session))
                _save_agent(agent, cfg)
                if not last:
                    continue
                done = pending.pop(lowering.spec)
                for k, (earlier, earlier_session) in enumerate(done[:-1]):
                    before = earlier_session.best[1]
                    carried = carry_back(earlier_session, group[k + 1:], cfg.search.warm_start,
                                         budgets[earlier], options["finalists"],
                                         options["finalist_rounds"], options["finalists_cold"])
                    cand, after = earlier_session.best
                    if cand in carried:
                        print(f"task {earlier}: {before * 1e3:.4g} -> {after * 1e3:.4g} ms with "
                              "a candidate carried back from a later sibling")
                for earlier, earlier_session in done:
                    settle(earlier, earlier_session)
            rescued = _hand_out_reserved(cfg, agent, opened, shares, budgets, reserved,
                                         {t: _similarity_group(low.spec)
                                          for t, low in lowering_of.items()},
                                         weights, calls, progress, log)
            for name in rescued:
                opened[name].finalize(options["finalists"], options["finalist_rounds"],
                                      options["finalists_cold"])
                settle(name, opened[name])
            trials = sum(session.trials for session in opened.values())
            handed = handed_out({t: s.trials for t, s in opened.items()}, budgets)
            log.close()
            cost_model.save(cfg.run_dir / "costmodel.npz")
        options = {t: contenders(sessions[t], cfg.search.in_network, cfg.search.in_network_slack)
                   for t in lowering_of if t in sessions}  # in graph order: producers first
        for name, kept in _choose_in_network(cfg, graph, factors, schedules, options).items():
            factors[name], schedules[name] = dict(kept.factors), kept.schedule
            best[name] = _best_entry(sessions[name], lowering_of[name].spec, calls[name],
                                     kept.candidate, kept.latency)
        plan = plan_network(graph, factors)
        read_through: Any = "measure"
        if cfg.budget.others:
            kernels, read_through = other_kernels(plan, schedules, cfg.target, read_through,
                                                  cfg.fast_math)
            print(f"{cfg.model}: {len(kernels)} other kernels, MetaSchedule for "
                  f"{cfg.budget.others} trials")
            trials += tune_others(kernels, cfg.budget.others, cfg.run_dir / OTHERS_DIR,
                                  make_target(cfg.target), cfg.measure, cfg.seed)
        network = build_plan(plan, schedules, cfg.target, read_through,
                             others_database(cfg.run_dir), cfg.fast_math)
        (cfg.run_dir / "best.json").write_text(json.dumps(
            {"model": cfg.model, "tasks": {t: best[t] for t in lowering_of if t in best},
             "read_through": {str(i): how for i, how in network.reads_through.items()}},
            indent=1))
        inputs = model.random_inputs(cfg.seed + 1)
        expected = model.reference(inputs)
        err = max_rel_err(network.run(inputs), expected)
        if not err <= 1e-4:
            raise RuntimeError(f"run {cfg.name}: the tuned network differs from torch by {err:.3g}")
        runs = [network_baseline("altenv", network, inputs),
                untuned_relax_baseline(model.mod, model.params, inputs, target=cfg.target)]
        if model.torch_module is not None:
            runs.append(torch_module_baseline(model.torch_module, inputs, target=cfg.target))
        stats = compare(runs, expected, rtol=1e-4)
        timings = {n: st.summary() for n, st in stats.items()}
        elapsed = time.perf_counter() - start
        summary = {"name": cfg.name, "model": cfg.model, "trials": trials,
                   "resumed_records": previous, "tuning_seconds": elapsed,
                   "max_rel_err_vs_torch": err, "conversions": len(network.conversions),
                   "reads_through": len(network.reads_through),
                   "tuned_other_kernels": len(network.tuned_others),
                   "fallback_calls": len(plan.fallbacks), "task_scheduler": handed,
                   "timings": timings, "speedup": speedups(timings)}
        (cfg.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        return RunResult(cfg.run_dir, timings["altenv"]["median_s"], trials, previous, elapsed,
                         err, timings)


def compare_with_baselines(task: Any, program: Any, mod: Any, seed: int
                           ) -> dict[str, dict[str, float]]:
    """Time altenv's best program against TVM's untuned default and PyTorch eager on the
    same random inputs, interleaved, each checked against torch first. The operator's
    input arrives in its chosen layout, as a producer writes it after propagation (ALT
    Fig. 5b); the untuned TVM program takes padded NCHW, torch takes plain NCHW."""
    from .baselines import (
        compare,
        compiled_baseline,
        torch_operator_baseline,
        untuned_tir_baseline,
    )
    from .ops import generate

    plain = generate(task.workload, epilogue=task.epilogue)
    raw = program.random_inputs(seed + 2)
    runs = [compiled_baseline("altenv", program, mod, target=task.target, raw=raw),
            untuned_tir_baseline(plain, target=task.target, raw=raw)]
    if plain.op.dtype == "float32":
        runs.append(torch_operator_baseline(plain, target=task.target, raw=raw))
    stats = compare(runs, [program.reference(raw)], rtol=plain.op.tolerance())
    return {name: st.summary() for name, st in stats.items()}


def speedups(timings: dict[str, dict[str, Any]]) -> dict[str, float]:
    """altenv's speedup over each other contender of ``timings`` (median over median);
    where either is ``noisy`` (:data:`~altenv.baselines.timing.NOISY_SPREAD`) the ratio is
    not to be trusted (:func:`timing_table` marks it)."""
    ours = timings["altenv"]["median_s"]
    return {name: t["median_s"] / ours for name, t in timings.items() if name != "altenv"}


def timing_table(timings: dict[str, dict[str, Any]]) -> str:
    """A run's timings as printed: median, [min .. max] and spread of altenv and each
    baseline, and altenv's speedup; a timing too spread to trust is flagged and a speedup
    built on it marked unreliable."""
    from .baselines.timing import NOISY_SPREAD

    speedup = speedups(timings)
    lines = []
    for name, t in timings.items():
        unsure = t["noisy"] or timings["altenv"]["noisy"]
        lines.append(f"  {name:14s} median {t['median_s'] * 1e3:9.4f} ms  "
                     f"[{t['min_s'] * 1e3:.4f} .. {t['max_s'] * 1e3:.4f}]  "
                     f"spread {t['spread']:.2f}{' (too spread)' if t['noisy'] else ''}"
                     + ("" if name == "altenv" else f"  altenv speedup {speedup[name]:.2f}x"
                        + (" (unreliable)" if unsure else "")))
    if any(t["noisy"] for t in timings.values()):
        lines.append(f"  (spread: interquartile range / median of the rounds; above "
                     f"{NOISY_SPREAD} a timing is too spread to trust and speedups built on it "
                     "are unreliable: time again on a quieter host)")
    return "\n".join(lines) + "\n"


def _schedule_of(spec: str, epilogue: list[str], target: Any, entry: dict[str, Any],
                 mapping: str = "none") -> Any:
    """Replay a recorded best candidate (factors + loop decisions) into its schedule."""
    from .space import StaleRecordError
    from .tuning import OpTask, freeze

    task = OpTask(spec, target, epilogue, mapping=mapping)
    factors = freeze(entry["factors"])
    space = task.space(factors)
    try:
        point = space.from_vector(entry["decisions"])
    except StaleRecordError as err:
        raise StaleRecordError(f"{spec}: the recorded best (layout {dict(factors)}): {err}; "
                               "tune it again with this version") from err
    schedule = space.decode(point)
    if schedule is None:
        raise StaleRecordError(f"{spec}: the recorded best (layout {dict(factors)}) no longer "
                               "decodes to a valid schedule; tune it again with this version")
    return task, factors, schedule


def best_schedules(cfg: RunConfig, best: dict[str, Any]
                   ) -> tuple[dict, dict, dict[str, int] | list[int] | str]:
    """The best template factors and schedules of each task of a finished network run and
    the calls that read their input as stored, and how (from its ``best.json``; a list of
    calls that read guarded from a run recorded before staged variants; ``"measure"``, to
    choose them again, for a run recorded before the build could read through)."""
    factors, schedules = {}, {}
    for name, entry in best["tasks"].items():
        _, f, schedule = _schedule_of(entry["spec"], entry["epilogue"], cfg.target, entry)
        factors[name], schedules[name] = dict(f), schedule
    return factors, schedules, best.get("read_through", "measure")


def others_database(run_dir: str | Path) -> Any:
    """The MetaSchedule database of a network run's other kernels
    (:mod:`altenv.tuning.others`), ``None`` for a run without one."""
    path = Path(run_dir) / OTHERS_DIR
    if not (path / "database_tuning_record.json").exists():
        return None
    from .tuning.others import open_database

    return open_database(path)


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


EXPORT_FILES = ("model.so", "params.npz", "manifest.json")
"""What an export writes (``--force`` removes these first, so no file of an earlier export
is left beside a new one)."""


def _read_run(cfg_path: Path, best_path: Path) -> tuple[RunConfig, dict[str, Any]]:
    """A finished run's config and ``best.json``, both validated as data (one-line errors
    naming the file)."""
    try:
        cfg = RunConfig.model_validate(_saved_config(cfg_path))
        best = json.loads(best_path.read_text())
        (_BestNetwork if cfg.model is not None else _BestOperator).model_validate(best)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        path = best_path if err.title.startswith("_Best") else cfg_path
        raise ConfigError(f"export: {path}: {where}: "
                          f"{' '.join(first['msg'].removeprefix('Value error, ').split())}"
                          ) from None
    except ValueError as err:
        raise ConfigError(f"export: {best_path}: not JSON ({err})") from None
    return cfg, best


def export_run_dir(run_dir: str | Path, output: str | Path, force: bool = False) -> Path:
    """``altenv export RUN --output DIR``: the tuned network (``model.so``, ``params.npz``,
    ``manifest.json``, loadable with plain TVM), or for an operator run the tuned operator
    (``model.so`` and a manifest of its arguments' physical layouts).

    The run directory is read as data: the network is built from the model the run kept
    (``model/``, :func:`~altenv.graph.frontend.load_saved_model`) and checked against the
    outputs recorded with it; nothing the config names is imported. ``output`` must be
    empty or new unless ``force``."""
    from .graph.frontend import load_saved_model

    run_dir, output = Path(run_dir), Path(output)
    cfg_path, best_path = run_dir / "config.yaml", run_dir / "best.json"
    if not cfg_path.exists() or not best_path.exists():
        raise ConfigError(f"export: {run_dir} is not a finished run (no config.yaml/best.json)")
    if output.exists() and not output.is_dir():
        raise ConfigError(f"export: --output {output} is a file; give a directory")
    held = sorted(p.name for p in output.iterdir()) if output.exists() else []
    if held and not force:
        raise ConfigError(f"export: --output {output} is not empty ({', '.join(held[:3])}"
                          f"{', ...' if len(held) > 3 else ''}); give a new or empty directory, "
                          "or --force to write over it")
    cfg, best = _read_run(cfg_path, best_path)
    model = None
    if cfg.model is not None:
        if not (run_dir / MODEL_DIR).is_dir():
            raise ConfigError(
                f"export: {run_dir} keeps no imported model ({run_dir / MODEL_DIR}); it was "
                "tuned by an older altenv. Export never runs a run's model code: tune the run "
                "again with this version (it resumes and keeps the model), then export")
        try:
            model = load_saved_model(run_dir / MODEL_DIR)
        except Exception as err:  # noqa: BLE001 (missing or damaged data: JSON, npz, TVM JSON)
            reason = " ".join(str(err).split())[:200]
            raise ConfigError(f"export: {run_dir / MODEL_DIR}: not a kept model "
                              f"({type(err).__name__}: {reason})") from None
    try:
        if model is not None:
            factors, schedules, read_through = best_schedules(cfg, best)
        else:
            task, factors, schedule = _schedule_of(cfg.workload, list(cfg.epilogue),
                                                   cfg.target, best, cfg.mapping)
    except ValueError as err:  # a best that this version's spaces cannot replay
        raise ConfigError(f"export: {best_path}: {' '.join(str(err).split())}") from None
    for name in EXPORT_FILES if force else ():
        (output / name).unlink(missing_ok=True)
    if model is not None:
        from .export import export_run

        out, _ = export_run(model, output, factors, schedules, cfg.target,
                            manifest_extras={"run": str(run_dir)}, read_through=read_through,
                            others=others_database(run_dir), fast_math=cfg.fast_math)
        return out
    return _export_operator(run_dir, output, cfg, best, task, factors, schedule)


def _export_operator(run_dir: Path, output: Path, cfg: RunConfig, best: dict[str, Any],
                     task: Any, factors: Any, schedule: Any) -> Path:
    """``model.so`` and ``manifest.json`` of a tuned operator."""
    import tvm

    from .target import make_target

    program = task.program(factors)
    output.mkdir(parents=True, exist_ok=True)
    tvm.compile(schedule.mod, make_target(cfg.target)).export_library(str(output / "model.so"))
    shapes = {name: (list(lay.shape), str(program.op.out_dtype if name in ("out", "bias",
              "residual") else program.op.input_dtype(name)))
              for name, lay in program.layouts.items()}
    manifest = {"workload": task.key, "target": str(make_target(cfg.target)),
                "function": "main", "arguments": [
                    {"name": n, "shape": shapes[n][0], "dtype": shapes[n][1],
                     "layout": program.layouts[n].to_json()} for n in program.arg_names],
                "latency_s": best["latency_s"], "run": str(run_dir)}
    (output / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return output
