"""A model run (``altenv tune`` of a ``model:``), one function per stage over a shared state.

:func:`tune_model` runs the stages in order, each reading and filling a :class:`ModelRun`:

1. :func:`plan`: the model's complex tasks and each task's share of the trials;
2. :func:`tune_tasks`: each task tuned in topological order (ALT §6), starting from its
   tuned siblings' best and, after the last sibling, measuring theirs
   (:mod:`altenv.tuning.transfer`);
3. :func:`hand_out_reserved`: the trials held back, a batch at a time, to the task the
   task scheduler picks (:mod:`altenv.tuning.scheduler`);
4. :func:`choose_in_network`: each task's fastest layouts re-timed with the conversions the
   network runs before them (:mod:`altenv.graph.in_network`), on the device that measured
   (:meth:`~altenv.measure.Measurer.chain_timer`), as are the read-through choices of 5-6;
5. :func:`tune_other_kernels`: MetaSchedule on the kernels the layout search does not
   cover (:mod:`altenv.tuning.others`);
6. :func:`build`: the network with the chosen layouts (propagated, ALT Alg. 1) and
   schedules, and ``best.json``;
7. :func:`verify`: the network checked against the source framework and timed against
   TVM's untuned build and PyTorch (``summary.json``), on the device that measured.

Every stage resumes from what the run directory holds, so a killed run goes on where it
stopped without measuring a candidate twice.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from ..baselines import compare, network_baseline, torch_module_baseline, untuned_relax_baseline
from ..config import ConfigError, RunConfig
from ..costmodel import CostModel
from ..files import check_file, read_json, write_json
from ..graph import ImportedModel, TaskGraph, extract_tasks
from ..graph.build import max_rel_err
from ..graph.frontend import save_model
from ..graph.in_network import Choice, Contender, choose_layouts, contenders
from ..graph.lowering import ComplexLowering
from ..graph.network import NetworkBuild, build_plan, other_kernels
from ..graph.plan import NetworkPlan, plan_network
from ..measure import Measurer
from ..measure.chains import ChainTimer
from ..measure.measurer import FleetMeasurer
from ..measure.timing import summaries
from ..ops import operator_for
from ..records import RecordDB
from ..target import make_target
from ..tuning import Budget, TuningJob, TuningSession
from ..tuning.budget import TASK_FLOOR_BATCHES, task_budgets, task_weight
from ..tuning.others import tune_others
from ..tuning.scheduler import TaskProgress, handed_out, next_task, similarity_group
from ..tuning.task import Candidate
from ..tuning.transfer import TunedTask, carry_back, tuned_task, warm_start
from .checks import check_run, load_user_model, make_job
from .devices import open_measurer
from .report import RunResult, speedups
from .rundir import RunDir
from .tensorboard import TensorBoardLog


@dataclass
class ModelRun:
    """What the stages of a model run share: its inputs, the plan and budgets
    (:func:`plan`), each task's session and share (:func:`tune_tasks`), the layouts and
    schedules kept (:meth:`settle`, :func:`choose_in_network`) and the network
    (:func:`build`)."""

    cfg: RunConfig
    run_dir: RunDir
    agent: Any
    model: ImportedModel
    db: RecordDB
    progress: bool
    previous: int = 0
    """Records the run directory held when this run began (resumed ones)."""
    start: float = field(default_factory=time.perf_counter)
    graph: TaskGraph | None = None
    lowering_of: dict[str, ComplexLowering] = field(default_factory=dict)
    """The complex tasks, by name, in topological order."""
    calls: dict[str, int] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    budgets: dict[str, int] = field(default_factory=dict)
    """Each task's share of the searched trials (:func:`~altenv.tuning.budget.task_budgets`)."""
    reserved: int = 0
    """Searched trials held back for the task scheduler."""
    others: int = 0
    """The trials MetaSchedule gets for the other kernels (``budget.others``; the search
    gets them when the network has none)."""
    cost_model: CostModel | None = None
    opened: dict[str, TuningSession] = field(default_factory=dict)
    """Every task's session."""
    shares: dict[str, Budget] = field(default_factory=dict)
    """Each task's stages, as they were sized."""
    sessions: dict[str, TuningSession] = field(default_factory=dict)
    """The sessions of the tasks that measured a candidate successfully."""
    factors: dict[str, dict[str, int]] = field(default_factory=dict)
    schedules: dict[str, Any] = field(default_factory=dict)
    best: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each task's entry in ``best.json`` (:meth:`best_entry`)."""
    trials: int = 0
    handed: dict[str, int] = field(default_factory=dict)
    """The reserved trials each task got."""
    timer: ChainTimer | None = None
    """How the in-network and read-through choices time kernels: on the measurer's device."""
    plan: NetworkPlan | None = None
    read_through: Any = "measure"
    network: NetworkBuild | None = None
    pristine: Any = None
    """A copy of the agent before it tuned (:meth:`agents`)."""
    copies: list[Any] = field(default_factory=list)
    """The agents of tasks that tune beside the run's own (:meth:`agents`)."""

    def best_entry(self, name: str, cand: Candidate, latency: float) -> dict[str, Any]:
        """A task's entry in ``best.json``: its workload, layouts and loop decisions."""
        task = self.opened[name].task
        return {"workload": task.key, "spec": self.lowering_of[name].spec,
                "epilogue": list(task.epilogue), "calls": self.calls[name],
                "latency_s": latency, "factors": dict(cand.factors),
                "decisions": task.space(cand.factors).to_vector(cand.point).tolist(),
                "layouts": task.layouts_json(cand.factors)}

    def agents(self, count: int) -> list[Any]:
        """``count`` agents for tasks that tune at once: the run's own (the one saved),
        then copies of it as it was before it tuned (kept across stages)."""
        if count == 1:
            return [self.agent]
        if self.pristine is None:
            self.pristine = copy.deepcopy(self.agent)
        while len(self.copies) < count - 1:
            self.copies.append(copy.deepcopy(self.pristine))
        return [self.agent, *self.copies[:count - 1]]

    def settle(self, name: str) -> None:
        """Keep a tuned task's best layout and schedule."""
        session = self.opened[name]
        cand = session.best[0]
        if cand is None:
            print(f"task {name}: nothing measured successfully; default layout and schedule")
            return
        self.factors[name] = dict(cand.factors)
        self.schedules[name] = session.schedule(cand)
        self.sessions[name] = session
        self.best[name] = self.best_entry(name, *session.best)


def plan(run: ModelRun) -> None:
    """The model's complex tasks and calls, and each task's share of the searched trials:
    ``task_scheduler`` of them held back, of the rest a floor of a few batches per task,
    then shares by a roofline estimate of its latency."""
    cfg = run.cfg
    run.graph = graph = extract_tasks(run.model)
    network_plan = plan_network(graph, fast_math=cfg.fast_math)
    run.lowering_of = {graph.calls[i].task: low
                       for i, low in sorted(network_plan.lowerings.items())}
    run.calls = {t: sum(1 for c in graph.calls if c.task == t) for t in run.lowering_of}
    run.weights = {t: task_weight(operator_for(low.workload), run.calls[t])
                   for t, low in run.lowering_of.items()}
    # on a CPU the other kernels are the tasks kept as fused; with none, their share searches
    no_others = not network_plan.kept and make_target(cfg.target).kind.name == "llvm"
    run.others = 0 if no_others else cfg.budget.others
    searched = cfg.budget.total - run.others
    run.reserved = round(searched * cfg.search.task_scheduler)
    run.budgets = task_budgets(run.weights, searched - run.reserved,
                               TASK_FLOOR_BATCHES * cfg.search.top_k)
    print(f"{cfg.model}: {len(run.lowering_of)} tuned tasks, {len(network_plan.fallbacks)} "
          f"calls on default schedules; {cfg.budget.total} trials ({run.others} for the "
          f"other kernels{', which this network has none of' if no_others else ''})")


def concurrency(measurer: Measurer, top_k: int) -> int:
    """How many of a network's tasks tune at once: one without a fleet; with one, enough
    batches of ``top_k`` to keep every device busy, and one more to measure while another
    task searches."""
    if not isinstance(measurer, FleetMeasurer):
        return 1
    devices = measurer.devices()
    return 1 if devices <= 1 else math.ceil(devices / top_k) + 1


def in_parallel(agents: list[Any], jobs: list[Callable[[Any], None]]) -> None:
    """Run ``jobs`` (each takes an agent), as many at once as there are ``agents``, each
    with an agent no other running job has; one agent: one after another, in order."""
    if len(agents) == 1:
        for job in jobs:
            job(agents[0])
        return
    idle: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for agent in agents:
        idle.put(agent)

    def with_agent(job: Callable[[Any], None]) -> None:
        agent = idle.get()
        try:
            job(agent)
        finally:
            idle.put(agent)

    with ThreadPoolExecutor(len(agents)) as pool:
        for future in [pool.submit(with_agent, job) for job in jobs]:
            future.result()


def tune_tasks(run: ModelRun, measurer: Measurer, log: TensorBoardLog) -> None:
    """Tune each task on its share, in topological order. A task first measures the best of
    its siblings tuned before it (the same operator, other epilogues) and keeps
    ``warm_start`` trials back; once the last sibling of an operator is tuned, each earlier
    one measures the best of those tuned after it and re-times its finalists. With a fleet
    of devices (:func:`concurrency`), the operators' sibling groups tune at once, each with
    an agent of its own."""
    cfg = run.cfg
    run.cost_model = CostModel(seed=cfg.seed)
    siblings: dict[str, list[TunedTask]] = {}  # by operator spec, for warm starts
    pending: dict[str, list[tuple[str, TuningSession]]] = {}  # sessions, by spec
    last_of_spec = {low.spec: name for name, low in run.lowering_of.items()}

    def tune_one(name: str, agent: Any) -> None:
        lowering = run.lowering_of[name]
        last = last_of_spec[lowering.spec] == name
        reserve = 0 if last else cfg.search.warm_start  # for carry_back
        budget = Budget.split(run.budgets[name] - reserve, joint_fraction)
        job = make_job(lowering.workload, lowering.epilogue, cfg.target, cfg.search, budget, agent,
                       model=True)
        task = job.task
        session = job.session(measurer, run.db, run.cost_model)
        run.opened[name], run.shares[name] = session, budget
        session.limit = budget.total
        session.measure(warm_start(task, siblings.get(lowering.spec, []),
                                   cfg.search.warm_start))
        job.run(session, run.progress, callbacks=[log])
        group = siblings.setdefault(lowering.spec, [])
        group.append(tuned_task(session, cfg.search.warm_start))
        pending.setdefault(lowering.spec, []).append((name, session))
        if agent is run.agent:
            run.run_dir.save_agent(agent)
        if not last:
            return
        done = pending.pop(lowering.spec)
        for k, (earlier, earlier_session) in enumerate(done[:-1]):
            before = earlier_session.best[1]
            carried = carry_back(earlier_session, group[k + 1:], cfg.search.warm_start,
                                 run.budgets[earlier], options.finalists,
                                 options.finalist_rounds, options.finalists_cold)
            cand, after = earlier_session.best
            if cand in carried:
                print(f"task {earlier}: {before * 1e3:.4g} -> {after * 1e3:.4g} ms with "
                      "a candidate carried back from a later sibling")
        for earlier, _ in done:
            run.settle(earlier)

    options = cfg.search.options(model=True)
    joint_fraction = cfg.budget.joint / max(cfg.budget.searched, 1)
    agents = run.agents(concurrency(measurer, cfg.search.top_k))
    if len(agents) == 1:
        jobs = [functools.partial(tune_one, name) for name in run.lowering_of]
    else:
        groups: dict[str, list[str]] = {}
        for name, low in run.lowering_of.items():
            groups.setdefault(low.spec, []).append(name)
        def tune_group(names: list[str], agent: Any) -> None:
            for name in names:
                tune_one(name, agent)

        jobs = [functools.partial(tune_group, names) for names in groups.values()]
    in_parallel(agents, jobs)


def hand_out_reserved(run: ModelRun, measurer: Measurer, log: TensorBoardLog) -> None:
    """The task scheduler's trials: ``reserved`` of them, a batch at a time, each to the
    task it picks (loop search on the task's best layout, :class:`~altenv.tuning.Budget`
    ``extra``), at most its own share again to one task (one stuck far below its peers'
    throughput would otherwise take them all). Trials a task measured past its share count
    as handed out, so a resumed run goes on with what is left. With a fleet of devices
    (:func:`concurrency`) several tasks measure at once; the scheduler picks each next one
    among the tasks not measuring. The tasks that got some re-time their finalists and are
    settled again."""
    cfg, sessions, budgets = run.cfg, run.opened, run.budgets
    groups = {t: similarity_group(low.workload) for t, low in run.lowering_of.items()}
    spent = sum(handed_out({t: s.trials for t, s in sessions.items()}, budgets).values())
    cap = {t: 2 * budgets[t] for t in sessions}  # its share, and as much again at most
    open_tasks = {t: s for t, s in sessions.items() if s.trials < cap[t]}
    busy: dict[str, int] = {}  # tasks measuring now, and the trials each may take
    rescued: set[str] = set()
    search = dataclasses.replace(cfg.search.options(model=True), finalists=0)
    bar = tqdm(total=run.reserved, initial=min(spent, run.reserved), desc="task scheduler",
               unit="trial", disable=not run.progress or spent >= run.reserved)
    lock = threading.Lock()

    def pick() -> tuple[str, int] | None:
        with lock:
            left = run.reserved - spent - sum(busy.values())
            idle = {t: TaskProgress(run.calls[t], run.weights[t] / run.calls[t], groups[t],
                                    s.history)
                    for t, s in open_tasks.items() if t not in busy}
            name = next_task(idle, cfg.search.top_k) if left > 0 else None
            if name is None:
                return None
            busy[name] = min(cfg.search.top_k, left, cap[name] - open_tasks[name].trials)
            return name, busy[name]

    def serve(agent: Any) -> None:
        nonlocal spent
        while (picked := pick()) is not None:
            name, quota = picked
            session, share = open_tasks[name], run.shares[name]
            before = session.trials
            extra = before - share.joint - share.loop_only + quota
            try:
                TuningJob(session.task, agent, Budget(share.joint, share.loop_only + min(extra, 0),
                                                      max(extra, 0)),
                          search).run(session, progress=False, callbacks=[log])
            finally:
                with lock:
                    del busy[name]
                    got = session.trials - before
                    if got == 0 or session.trials >= cap[name]:
                        del open_tasks[name]  # nothing new to measure there, or its cap
                    if got:
                        rescued.add(name)
                        spent += got
                        bar.update(got)
                        bar.set_postfix(task=name, best_ms=f"{session.best[1] * 1e3:.4g}")

    agents = run.agents(concurrency(measurer, cfg.search.top_k))
    in_parallel(agents, [serve] * len(agents))
    bar.close()
    run.run_dir.save_agent(run.agent)
    options = cfg.search.options(model=True)
    for name in rescued:
        sessions[name].finalize(options.finalists, options.finalist_rounds,
                                options.finalists_cold)
        run.settle(name)
    run.trials = sum(session.trials for session in sessions.values())
    run.handed = handed_out({t: s.trials for t, s in sessions.items()}, budgets)


def choose_in_network(run: ModelRun) -> None:
    """Re-time each task's contenders inside the network (:func:`choose_layouts`) and keep
    the one fastest there. Like the final pick, this re-times candidates already measured:
    it costs seconds, not trials. The choices are kept in ``in_network.json``, so a resumed
    run does not time them again."""
    cfg, path = run.cfg, run.run_dir.in_network
    options = {t: contenders(run.sessions[t], cfg.search.in_network, cfg.search.in_network_slack)
               for t in run.lowering_of if t in run.sessions}  # in graph order: producers first
    try:
        known = {t: Choice.from_json(c) for t, c in read_json(path).items()} \
            if check_file(path) else {}
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{path}: not the layout choices altenv writes ({type(err).__name__}: "
                          f"{err}); delete it to choose again") from None
    recorded = {t: c.to_json() for t, c in known.items()}

    def save(task: str, choice: Choice) -> None:
        recorded[task] = choice.to_json()
        write_json(path, recorded)
        first, kept = choice.seconds[0], choice.seconds[choice.chosen]
        print(f"task {task}: {first * 1e6:.0f} us per network run on the layout fastest "
              f"alone, {kept * 1e6:.0f} us on the one kept (contender {choice.chosen} of "
              f"{len(choice.seconds)})")

    choices = choose_layouts(run.graph, run.factors, run.schedules, options, cfg.target,
                             known, save, seed=cfg.seed, timer=run.timer,
                             fast_math=cfg.fast_math)
    for name, choice in choices.items():
        if choice.chosen:
            kept: Contender = options[name][choice.chosen]
            run.factors[name], run.schedules[name] = dict(kept.factors), kept.schedule
            run.best[name] = run.best_entry(name, kept.candidate, kept.latency)


def tune_other_kernels(run: ModelRun, measurer: Measurer) -> None:
    """Plan the network with the chosen layouts (propagated, ALT Alg. 1); with
    ``budget.others``, MetaSchedule tunes the kernels the layout search does not cover
    (softmax, norms, pools, fallbacks) on ``measurer``'s workers, and the calls that read an
    input as stored are chosen here, as the build will make them."""
    cfg = run.cfg
    run.plan = plan_network(run.graph, run.factors, cfg.fast_math)
    if run.others:
        kernels, run.read_through = other_kernels(run.plan, run.schedules, cfg.target,
                                                  run.read_through, run.timer)
        print(f"{cfg.model}: {len(kernels)} other kernels, MetaSchedule for "
              f"{run.others} trials")
        run.trials += tune_others(kernels, run.others, run.run_dir.others,
                                  make_target(cfg.target), cfg.measure, cfg.seed, measurer)


def build(run: ModelRun) -> None:
    """Build the network (main rewritten, weights transformed once, conversions inserted or
    read through where faster) and write ``best.json``: per task its factors, layouts and
    loop decisions, and the calls that read through."""
    cfg = run.cfg
    run.network = build_plan(run.plan, run.schedules, cfg.target, run.read_through,
                             run.run_dir.others_database(), run.timer)
    write_json(run.run_dir.best, {
        "model": cfg.model,
        "tasks": {t: run.best[t] for t in run.lowering_of if t in run.best},
        "read_through": {str(i): how for i, how in run.network.reads_through.items()}})


def verify(run: ModelRun, session: Any = None) -> RunResult:
    """Check the network against the source framework (1e-4 relative), time it interleaved
    with TVM's untuned build and PyTorch, and write ``summary.json``. With ``session`` (a
    TVM RPC session on the device the run measured on) the network and TVM's build are
    checked and timed there; PyTorch, which runs on this host only, is left out."""
    cfg, model, network = run.cfg, run.model, run.network
    inputs = model.random_inputs(cfg.seed + 1)
    expected = model.reference(inputs)
    ours = network_baseline("altenv", network, inputs, session=session)
    ours.run()
    err = max_rel_err(ours.outputs(), expected)
    if not err <= 1e-4:
        raise RuntimeError(f"run {cfg.name}: the tuned network differs from torch by {err:.3g}")
    runs = [ours, untuned_relax_baseline(model.mod, model.params, inputs, target=cfg.target,
                                         session=session)]
    if model.torch_module is not None and session is None:
        runs.append(torch_module_baseline(model.torch_module, inputs, target=cfg.target))
    stats = compare(runs, expected, rtol=1e-4)
    timings = summaries(stats)
    elapsed = time.perf_counter() - run.start
    summary = {"name": cfg.name, "model": cfg.model, "trials": run.trials,
               "resumed_records": run.previous, "tuning_seconds": elapsed,
               "max_rel_err_vs_torch": err, "conversions": len(network.conversions),
               "reads_through": len(network.reads_through),
               "tuned_other_kernels": len(network.tuned_others),
               "fallback_calls": len(run.plan.fallbacks), "task_scheduler": run.handed,
               "timed_on": "host" if session is None else "rpc device",
               "timings": timings, "speedup": speedups(timings)}
    write_json(run.run_dir.summary, summary)
    return RunResult(cfg.run_dir, timings["altenv"]["median_s"], run.trials, run.previous,
                     elapsed, err, timings)


def tune_model(cfg: RunConfig, progress: bool = True, repair: bool = False,
               measurer: Measurer | None = None) -> RunResult:
    """Tune every complex task of ``cfg.model``, build the network with the best layouts
    and schedules, check it against the source framework and time it against TVM's
    untuned build and PyTorch (the stages: see the module docstring). The imported model is
    kept in the run directory as data (``model/``, what export builds); ``repair`` moves
    bad lines of the records aside (:class:`RecordDB`). ``measurer``: an open one with
    ``cfg``'s settings, lent by the caller and left open (by default the run opens its own
    and closes it at the end)."""
    run_dir = RunDir(cfg.run_dir)
    agent = check_run(cfg, tensorboard_log=str(run_dir.tensorboard))
    model = load_user_model(cfg.model, cfg.model_options, cfg.seed)
    with run_dir.open(cfg, repair) as db:
        run = ModelRun(cfg, run_dir, agent, model, db, progress, previous=len(db))
        save_model(model, run_dir.model)
        plan(run)
        log = TensorBoardLog(run_dir.tensorboard)
        with contextlib.nullcontext(measurer) if measurer is not None else \
                open_measurer(cfg.ray, cfg.measure, cfg.target) as measurer:
            tune_tasks(run, measurer, log)
            hand_out_reserved(run, measurer, log)
            log.close()
            run.cost_model.save(run_dir.cost_model)
            run.timer = measurer.chain_timer()
            choose_in_network(run)
            tune_other_kernels(run, measurer)
            build(run)
            return verify(run, measurer.device_session())
