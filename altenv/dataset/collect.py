"""Collecting a measured-program dataset: many workloads, many layouts each, programs
from slow to fast, every one checked against torch and timed several times interleaved.

Each workload is collected in one pass over its layouts (:func:`layout_plan`): per layout,
``samples`` points drawn by MetaSchedule's own sampling of the layout's design space, then
``searched`` mutants of the fastest of them (one step of an evolutionary search), so the
data spans the slow programs a random policy meets. Those alone miss the fast ones (on
the device, 200-trial searches beat such a dataset's best on four workloads of five, by up
to 1.7x), so with ``search_trials`` a real search (a tuning job of the collection's agent,
run as a user runs it) follows: its ``bests`` fastest new programs join the data timed as
the rest are (origin ``best``), its other trials with their one timing (origin ``trial``),
on whatever layout it found them. A batch is built once and timed
``rounds`` times, the order rotating each round, so every program carries its own noise.
A fixed reference kernel is re-timed every
``reference_every`` seconds, and each program row keeps the latest of its timings, so a
host that drifts shows it in the data.

A collection resumes: measured programs are journaled as they come (one records file per
workload, flushed and synced), a finished workload becomes its Parquet file, and a killed
collection starts again at the program after the last one journaled; the plan (layouts,
sampled points, mutants) is drawn from a seed per workload, so it is the same plan. The
search journals its trials too (``journal/<workload>.search.jsonl``) and resumes from
them. A workload collected without a search gets one when a later collection asks for it:
its rows are read back and the search's bests added.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import platform
import subprocess
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from ..costmodel import extract_features, feature_bytes
from ..errors import UserError
from ..files import check_tree, make_dir, write_text
from ..lock import DirLock
from ..measure import MeasureCandidate, MeasureConfig, Measurer, MeasureResult
from ..ops import parse_workload
from ..ops.features import workload_features
from ..ops.operators import operator_for
from ..ops.workload import Workload
from ..records import Record, RecordDB, target_string
from ..space import LoopPoint, LoopSpace
from ..target import make_target, vector_bits
from ..tuning import OpTask, freeze
from ..tuning.budget import Budget
from ..tuning.job import SearchOptions, TuningJob
from ..tuning.loop import Agent
from ..tuning.task import Factors
from .layouts import layout_plan
from .store import (
    CARD,
    PROGRAMS,
    REFERENCE_SCHEMA,
    Dataset,
    WorkloadData,
    program_table,
    write_atomic,
    write_json_atomic,
)

REFERENCE_SPEC = "gmm:M=256,N=256,K=256"
"""The fixed kernel re-timed through a collection: its framework layout and the loop
point MetaSchedule's sampling draws with seed 0 (the same program in every process)."""
ELITES = 4
"""Sampled programs of a layout whose mutants make its searched programs."""
QUIET = 0.5
"""Cores other processes may use while a batch is timed (a test run or a build elsewhere
takes a core or more; the kernel's own threads take a little)."""
RETRIES = 5
"""Times a batch that other work disturbed is timed again before it is kept."""
SEARCH_SEED = 1_000_000
"""Added to a workload's search seed, so that it is not the seed of a benchmark cell (0, 1,
2, ...): a dataset holding the very programs a benchmark's search finds would replay that
search exactly."""
DRIFT_RETRIES = 2
"""Times a workload whose reference drifted past :attr:`Plan.drift` is collected again."""


@dataclass
class Plan:
    """How much of each workload is measured."""

    layouts: int = 12
    samples: int = 17
    searched: int = 8
    rounds: int = 5
    reference_every: float = 180.0
    seed: int = 0
    quiet_host: bool = True
    """Time a batch only once other processes leave the host's cores idle (when the
    measurer times on this host: :attr:`~altenv.measure.Measurer.timed_on`)."""
    drift: float = 1.3
    """The most the reference kernel's timings may move (max / min) within one workload's
    collection: more, and the host changed under it; the workload is collected again."""
    search_trials: int = 0
    """Trials of the real search that follows a workload's sampling (0: none)."""
    bests: int = 8
    """The search's fastest new programs that join the data."""
    search_agent: str = ""
    """The searching agent's name (for the card; :func:`collect` is given the agent)."""


@dataclass
class Progress:
    """What a collection did (for the card and the command's last line)."""

    workloads: int = 0
    programs: int = 0
    failed: int = 0
    seconds: float = 0.0
    per_workload: dict[str, float] = field(default_factory=dict)


class ReferenceTimer:
    """Re-times :data:`REFERENCE_SPEC` every ``every`` seconds, journaling each timing.
    Its history is the dataset's ``reference.parquet`` (what a clone of a shipped dataset
    has: the journal is not shipped) and the journal's timings since."""

    def __init__(self, measurer: Measurer, target: Any, journal: Path, every: float,
                 rounds: int, history: Path | None = None):
        task = OpTask(REFERENCE_SPEC, target)
        factors = task.default_factors()
        space = task.space(factors)
        point = space.canonical(space.sample(1, seed=0)[0])  # the same program in any process
        self.decisions = space.to_vector(point).tolist()
        self._candidate = MeasureCandidate(space.decode(point).mod, task.check(factors))
        self._measurer, self._journal, self._every, self._rounds = (
            measurer, journal, every, rounds)
        self._last = -math.inf
        journal.parent.mkdir(parents=True, exist_ok=True)
        kept = ([] if history is None or not history.is_file() else
                pq.read_table(history).to_pylist())
        self.timings: list[tuple[float, float]] = sorted(
            {(float(row["timestamp"]), float(row["latency"])) for row in [*kept, *self._rows()]})

    def maybe(self) -> None:
        """Time the reference if ``every`` seconds passed since the last timing."""
        if time.monotonic() - self._last < self._every:
            return
        (rounds,) = self._measurer.retime([self._candidate], self._rounds)
        result = combine(rounds)
        self._last = time.monotonic()
        row = {"timestamp": time.time(), "latency": result.median,
               "latencies": result.latencies}
        with self._journal.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.timings.append((row["timestamp"], row["latency"]))

    def at(self, timestamp: float) -> float:
        """The reference's latest timing at ``timestamp`` (``nan`` before the first)."""
        i = bisect.bisect_right(self.timings, (timestamp, math.inf))
        return self.timings[i - 1][1] if i else math.nan

    def _rows(self) -> list[dict[str, float]]:
        if not self._journal.exists():
            return []
        rows = []
        for line in self._journal.read_text().splitlines():
            try:
                row = json.loads(line)
                rows.append({"timestamp": float(row["timestamp"]),
                             "latency": float(row["latency"])})
            except (ValueError, KeyError, TypeError):  # a line cut short by a kill
                continue
        return rows

    def table(self) -> pa.Table:
        return pa.Table.from_pylist(
            [{"timestamp": t, "latency": lat} for t, lat in self.timings],
            schema=REFERENCE_SCHEMA)


class OtherLoad:
    """The cores the rest of the host keeps busy: the machine's busy CPU time less this
    process tree's (a collection's own builders and runner are inside it). Processes that
    come and go between two readings are counted too."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()

    def reading(self) -> tuple[float, float, dict[int, tuple[float, float]]]:
        """(wall seconds, the machine's busy CPU seconds, per process of this tree its own
        and its ended children's CPU seconds) now."""
        t = self._psutil.cpu_times()
        busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + \
            getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)
        tree: dict[int, tuple[float, float]] = {}
        for proc in [self._me, *self._me.children(recursive=True)]:
            try:
                c = proc.cpu_times()
            except self._psutil.Error:  # it ended between the listing and the reading
                continue
            tree[proc.pid] = (c.user + c.system, c.children_user + c.children_system)
        return time.monotonic(), busy, tree

    def since(self, before: tuple[float, float, dict[int, tuple[float, float]]]) -> float:
        """Cores others used on average since the reading ``before``. A process of the tree
        that ended in between counts with what it had used by ``before`` taken off its
        parent's ended-children time, so its whole life is not counted as this window's."""
        now = self.reading()
        own = reaped = 0.0
        for pid, (cpu, ended) in now[2].items():
            old_cpu, old_ended = before[2].get(pid, (0.0, ended))
            own += cpu - old_cpu
            reaped += ended - old_ended
        gone = sum(cpu for pid, (cpu, _) in before[2].items() if pid not in now[2])
        own += max(reaped - gone, 0.0)
        return max(now[1] - before[1] - own, 0.0) / max(now[0] - before[0], 1e-3)


def others_busy(window: float = 0.5) -> float:
    """Cores used over ``window`` seconds outside this process tree."""
    load = OtherLoad()
    start = load.reading()
    time.sleep(window)
    return load.since(start)


def wait_for_quiet_host(limit: float = QUIET, patience: float = 1800.0,
                        log: Callable[[str], None] = print) -> float:
    """Wait until other processes use under ``limit`` cores (timing may not overlap other
    work), at most ``patience`` seconds; the seconds waited."""
    start = time.monotonic()
    warned = False
    while (busy := others_busy()) >= limit and time.monotonic() - start < patience:
        if not warned:
            log(f"dataset: other processes use {busy:.1f} cores; waiting for a quiet host "
                "before timing")
            warned = True
        time.sleep(5.0)
    return time.monotonic() - start


def reference_drift(rows: Sequence[dict[str, Any]]) -> float:
    """Max over min of the reference timings a workload's rows carry (1 if none)."""
    refs = [r["reference"] for r in rows if math.isfinite(r["reference"])]
    return max(refs) / min(refs) if refs else 1.0


def combine(rounds: Sequence[MeasureResult]) -> MeasureResult:
    """One result of a program timed in several interleaved rounds: one latency per round
    (the median of that round's repeats); failed if any round failed."""
    error = next((r.error for r in rounds if r.error), None)
    latencies = [] if error else [float(np.median(r.latencies)) for r in rounds]
    return MeasureResult(latencies=latencies, error=error,
                         build_seconds=sum(r.build_seconds for r in rounds),
                         run_seconds=sum(r.run_seconds for r in rounds))


class QuietTrials:
    """A collector's measurer as its search's session sees it: each batch of trials is
    timed as the collector times its own batches (:meth:`WorkloadCollector._quietly`),
    since the trials become rows too."""

    def __init__(self, measurer: Measurer, collector: WorkloadCollector):
        self._measurer, self._collector = measurer, collector

    def measure(self, candidates: Sequence[MeasureCandidate]) -> list[MeasureResult]:
        return self._collector._quietly(lambda: self._measurer.measure(candidates))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._measurer, name)


class WorkloadCollector:
    """Collects one workload: its layouts, programs, checks and timings, journaled."""

    def __init__(self, name: str, workload: Workload, target: Any, measurer: Measurer,
                 journal: RecordDB, plan: Plan, index: int,
                 reference: ReferenceTimer | None, collected: WorkloadData | None = None):
        self.name, self.workload, self.plan = name, workload, plan
        self.task = OpTask(workload, target)
        self.measurer, self.journal, self.reference = measurer, journal, reference
        self.rng = np.random.default_rng([plan.seed, index])
        self._known = {(freeze(r.layouts["factors"]), tuple(r.decisions)): r
                       for r in journal.records(self.task.key)}
        #: a workload collected earlier (``collected``) keeps its rows and layouts
        self.rows: list[dict[str, Any]] = [] if collected is None else collected.table.to_pylist()
        self.layouts: list[dict[str, Any]] = [] if collected is None else collected.layouts
        self.kept = len(self.rows)
        self.searched: dict[str, Any] | None = None
        self.waited = 0.0
        #: this host's other work disturbs only timings made on this host
        self.quiet = plan.quiet_host and measurer.timed_on is None

    def run(self, progress: Callable[[int], None] = lambda n: None,
            agent: Agent | None = None, search_db: RecordDB | None = None) -> None:
        """Sample and mutate every layout of the plan (unless the workload was collected
        before), then, given an ``agent``, add the bests of its search (:meth:`search`)
        journaled in ``search_db``."""
        if not self.kept:
            self.sample(progress)
        if agent is not None and self.plan.search_trials:
            if search_db is None:
                raise ValueError("a search needs a records database (search_db)")
            self.search(agent, search_db, progress)

    def _add_layout(self, factors: Factors, space: LoopSpace) -> int:
        """The index of ``factors`` among the workload's layouts, added if new."""
        for i, lay in enumerate(self.layouts):
            if freeze(lay["factors"]) == factors:
                return i
        self.layouts.append({"factors": dict(factors),
                             "framework": factors == self.task.default_factors(),
                             "subspaces": space.describe(),
                             "designs": [list(space.design_slots(d))
                                         for d in range(space.num_designs)]})
        return len(self.layouts) - 1

    def sample(self, progress: Callable[[int], None]) -> None:
        """Per layout of :func:`layout_plan`, MetaSchedule's samples and their mutants."""
        lanes = max(1, vector_bits(self.task.target) // 32)
        plan = layout_plan(self.task.template, self.plan.layouts, self.rng, lanes)
        for factors in plan:
            try:
                space = self.task.space(factors)
            except Exception as err:  # noqa: BLE001 (a layout TVM cannot schedule is skipped)
                warnings.warn(f"{self.name}: layout {dict(factors)} has no loop space "
                              f"({type(err).__name__}: {err}); left out", stacklevel=2)
                continue
            index = self._add_layout(factors, space)
            sampled = list(dict.fromkeys(space.canonical(p) for p in
                                         space.sample(self.plan.samples, self.rng)))
            timed = self._measure(index, factors, space, sampled, "sample")
            progress(len(sampled))
            ranked = sorted((lat, i) for i, lat in enumerate(timed) if math.isfinite(lat))
            elites = [sampled[i] for _, i in ranked[:ELITES]]
            mutants = self._mutants(space, elites, set(sampled))
            self._measure(index, factors, space, mutants, "search")
            progress(len(mutants))

    def search(self, agent: Agent, db: RecordDB, progress: Callable[[int], None]) -> None:
        """A tuning job of ``agent`` on the workload, run as a user's search runs (cold:
        started from the data's programs, a search did not go back to a layout whose
        sampled programs were all slow, where cold searches found far faster ones), for
        :attr:`Plan.search_trials` trials journaled in ``db`` (a killed search resumes).
        Its :attr:`Plan.bests` fastest programs not among the sampled ones are then timed
        like the rest (rows of origin ``best``), and its other trials join with the one
        timing the search took (rows of origin ``trial``: where searches go, a surrogate
        fitted on the sampled programs alone predicted the fastest 2.4x too slow); a
        layout outside the workload's list joins it."""
        task = self.task
        job = TuningJob(task, agent, Budget.split(self.plan.search_trials),
                        SearchOptions(finalists=0))
        session = job.session(QuietTrials(self.measurer, self), db)  # trials become rows
        before = session.trials
        job.run(session, progress=False)
        progress(session.trials - before)
        sampled = {self._key(r) for r in self.rows if r["origin"] in ("sample", "search")}
        present = {self._key(r) for r in self.rows}
        trials: dict[tuple[Factors, tuple[int, ...]], tuple[Record, LoopPoint]] = {}
        for record in db.records(task.key):
            factors = freeze(record.layouts["factors"])
            space = task.space(factors)
            point = space.canonical(space.from_vector(record.decisions))
            key = (factors, tuple(int(v) for v in space.to_vector(point)))
            if key not in sampled and (key not in trials or record.median < trials[key][0].median):
                trials[key] = (record, point)
        fastest = sorted((k for k in trials if math.isfinite(trials[k][0].median)),
                         key=lambda k: trials[k][0].median)[:self.plan.bests]
        for origin, keys in (("best", fastest),
                             ("trial", [k for k in trials if k not in fastest])):
            by_layout: dict[Factors, list[tuple[int, ...]]] = {}
            for key in keys:
                if key not in present:  # a search resumed after its rows were written
                    by_layout.setdefault(key[0], []).append(key[1])
            for factors, vectors in by_layout.items():
                space = task.space(factors)
                index = self._add_layout(factors, space)
                points = [trials[(factors, v)][1] for v in vectors]
                if origin == "best":
                    self._measure(index, factors, space, points, origin)
                else:
                    self._add_rows(index, space, points,
                                   [trials[(factors, v)][0] for v in vectors], origin)
                progress(len(points))
        self.searched = {"agent": self.plan.search_agent, "trials": self.plan.search_trials,
                         "measured": session.trials, "bests": len(fastest),
                         "trial_rows": len(trials) - len(fastest)}

    def _key(self, row: dict[str, Any]) -> tuple[Factors, tuple[int, ...]]:
        return (freeze(self.layouts[row["layout"]]["factors"]),
                tuple(int(v) for v in row["decisions"]))

    def _mutants(self, space: LoopSpace, elites: list[LoopPoint],
                 seen: set[LoopPoint]) -> list[LoopPoint]:
        out: list[LoopPoint] = []
        for i in range(20 * self.plan.searched if elites else 0):
            if len(out) >= self.plan.searched:
                break
            point = space.canonical(space.mutate(elites[i % len(elites)], self.rng))
            if point not in seen and space.is_valid(point):
                seen.add(point)
                out.append(point)
        return out

    def _measure(self, index: int, factors: Factors, space: LoopSpace,
                 points: list[LoopPoint], origin: str) -> list[float]:
        """Measure the points not journaled yet, add a row per point; their latencies."""
        vectors = [tuple(int(v) for v in space.to_vector(p)) for p in points]
        new = [i for i, v in enumerate(vectors) if (factors, v) not in self._known]
        if new:
            check = self.task.check(factors)
            inputs = [MeasureCandidate(space.decode(points[i]).mod, check) for i in new]
            results = self._time(inputs)
            layouts = self.task.layouts_json(factors)
            for i, result in zip(new, results):
                record = self.journal.add_result(self.task.key, self.task.target, layouts,
                                                 None, list(vectors[i]), result)
                self._known[(factors, vectors[i])] = record
        return self._add_rows(index, space, points,
                              [self._known[(factors, v)] for v in vectors], origin)

    def _add_rows(self, index: int, space: LoopSpace, points: list[LoopPoint],
                  records: list[Record], origin: str) -> list[float]:
        """A row per point of layout ``index``, timed as its record says; their latencies."""
        schedules = [space.decode(p) for p in points]
        features = extract_features(space.context, schedules)
        out = []
        for point, record, feats in zip(points, records, features):
            latency = record.median
            self.rows.append({
                "layout": index, "origin": origin,
                "decisions": [int(v) for v in space.to_vector(point)],
                "encoding": space.encode(point).tolist(), "features": feature_bytes(feats).tolist(),
                "latencies": list(record.latencies), "latency": latency,
                "error": record.error, "timestamp": record.timestamp,
                "reference": (self.reference.at(record.timestamp)
                              if self.reference is not None else math.nan),
                "build_seconds": record.build_seconds,
            })
            out.append(latency)
        return out

    def _time(self, inputs: list[MeasureCandidate]) -> list[MeasureResult]:
        """Build a batch once and time it in :attr:`Plan.rounds` interleaved rounds
        (:meth:`_quietly`)."""
        return self._quietly(lambda: [combine(r) for r in
                                      self.measurer.retime(inputs, self.plan.rounds)])

    def _quietly(self, timing: Callable[[], list[MeasureResult]]) -> list[MeasureResult]:
        """``timing()``, with ``quiet_host`` and a measurer that times on this host only on
        a host nothing else keeps busy, and again (up to :data:`RETRIES` times) when other
        work ran while it timed."""
        load = OtherLoad()
        for attempt in range(RETRIES + 1):
            if self.quiet:
                self.waited += wait_for_quiet_host()
            if self.reference is not None:
                self.reference.maybe()
            start = load.reading()
            results = timing()
            busy = load.since(start)
            if not self.quiet or busy < QUIET or attempt == RETRIES:
                return results
            print(f"dataset: {self.name}: other processes used {busy:.1f} cores while a "
                  "batch was timed; timing it again")
        return results

    def meta(self) -> dict[str, Any]:
        workload = self.workload
        return {"name": self.name, "spec": str(workload), "epilogue": list(self.task.epilogue),
                "target": target_string(self.task.target),
                "knobs": [{"name": k.name, "extent": k.extent}
                          for k in self.task.template.knobs],
                "layouts": self.layouts,
                "workload_features": workload_features(workload).tolist(),
                "flops": float(operator_for(workload).flops()),
                **({} if self.searched is None else {"search": self.searched})}


def _host() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent, check=False).stdout.strip()
    except OSError:
        commit = ""
    return {"cpu": cpu, "hostname": platform.node(), "commit": commit or "unknown"}


def collect(out: str | Path, workloads: Sequence[tuple[str, str | Workload]], plan: Plan,
            measure: MeasureConfig, target: Any = None, measurer: Measurer | None = None,
            card: dict[str, Any] | None = None, progress: bool = True,
            agent: Callable[[int], Agent] | None = None,
            only: Sequence[str] | None = None) -> Progress:
    """Collect ``workloads`` (``(name, spec or Workload)`` pairs) into the dataset directory
    ``out``; workloads already there are skipped, a half-collected one resumes from its
    journal.

    ``measurer`` (default: one on this host, or on the RPC devices of ``measure.rpc``)
    builds and times; ``card`` adds fields to the dataset card (how the workloads were
    drawn, the host's roofline, the command); ``agent(seed)`` builds the agent of a plan's
    search (:meth:`WorkloadCollector.search`), which a workload collected without one then
    gets too; ``only`` names the workloads to collect now (all: ``None``). Only one process
    collects into a directory at a time."""
    from ..measure import create

    out = Path(out)
    if out.exists() or out.is_symlink():
        check_tree(out)  # a dataset from elsewhere: nothing written through a link
    parsed = [(name, parse_workload(spec)) for name, spec in workloads]
    unknown = sorted(set(only or ()) - {n for n, _ in parsed})
    if unknown:
        raise UserError(f"workload: {unknown[0]!r} is not one of this dataset config's "
                        f"workloads; allowed: {', '.join(n for n, _ in parsed)}")
    if plan.search_trials and agent is None:
        raise ValueError("a plan with search_trials needs the agent that searches (agent=)")
    target = make_target(target)
    refuse_another_target(out, target)
    make_dir(out)
    write_text(out / ".gitignore", "journal/\n.lock\n")
    done = Progress()
    with DirLock(out / ".lock", f"dataset {out}"):
        own = measurer is None
        measurer = measurer or create(None, measure, target)
        try:
            meta = _card(out, [(n, str(w)) for n, w in parsed], plan, target,
                         measurer.timed_on, card)
            reference = ReferenceTimer(measurer, target, out / "journal" / "reference.jsonl",
                                       plan.reference_every, plan.rounds,
                                       history=out / "reference.parquet")
            meta["reference_decisions"] = reference.decisions
            data = Dataset(out, meta)
            todo = []  # (index, name, workload, collected before: only its search is due)
            for i, (n, w) in enumerate(parsed):
                if only is not None and n not in only:
                    continue
                if not (out / PROGRAMS / f"{n}.parquet").is_file():
                    todo.append((i, n, w, False))
                elif plan.search_trials and "trial_rows" not in data.meta(n).get("search", {}):
                    todo.append((i, n, w, True))
            per = plan.layouts * (plan.samples + plan.searched)
            search = plan.search_trials + plan.bests if plan.search_trials else 0
            bar = tqdm(total=sum(search + (0 if again else per) for *_, again in todo),
                       desc="dataset", unit="program", disable=not progress)
            for index, name, workload, again in todo:
                start = time.perf_counter()
                path = out / "journal" / f"{name}.jsonl"
                for attempt in range(DRIFT_RETRIES + 1):
                    searching = RecordDB(out / "journal" / f"{name}.search.jsonl") \
                        if agent is not None and plan.search_trials else nullcontext()
                    with RecordDB(path) as journal, searching as searched:
                        collector = WorkloadCollector(name, workload, target, measurer, journal,
                                                      plan, index, reference,
                                                      data.load(name) if again else None)
                        bar.set_postfix(workload=name)
                        collector.run(bar.update, None if agent is None else
                                      agent(SEARCH_SEED + plan.seed * 10_000 + index),
                                      searched)
                    drift = reference_drift(collector.rows[collector.kept:])
                    if drift <= plan.drift or attempt == DRIFT_RETRIES:
                        break
                    print(f"dataset: {name}: the reference kernel's timings moved "
                          f"{drift:.2f}x while it was collected; collecting it again")
                    path.rename(path.with_name(f"{name}.drifted-{attempt}.jsonl"))
                write_atomic(program_table(collector.rows, collector.meta()),
                             out / PROGRAMS / f"{name}.parquet")
                seconds = time.perf_counter() - start
                done.workloads += 1
                new = collector.rows[collector.kept:]
                done.programs += len(new)
                done.failed += sum(not math.isfinite(r["latency"]) for r in new)
                done.per_workload[name] = seconds
                meta["seconds"][name] = meta["seconds"].get(name, 0.0) + seconds
                write_atomic(reference.table(), out / "reference.parquet")
                _count(out, meta)
                write_json_atomic(meta, out / CARD)
            bar.close()
        finally:
            if own:
                measurer.close()
    return done


def refuse_another_target(out: Path, target: Any) -> None:
    """A dataset holds one kind of hardware's timings: refuse to add to one whose programs
    were timed on another target (e.g. a clone resumed on another machine, whose card
    would otherwise take this host's target and roofline)."""
    path = out / CARD
    if not path.is_file() or not any((out / PROGRAMS).glob("*.parquet")):
        return
    theirs, ours = json.loads(path.read_text()).get("target"), target_string(target)
    if theirs is not None and theirs != ours:
        raise UserError(f"dataset {out}: its programs were timed on target {theirs}, this "
                        f"collection's target is {ours}; one dataset holds one kind of "
                        "hardware's timings: collect on that kind of host, or into another "
                        "directory (output:)")


def _card(out: Path, workloads: Sequence[tuple[str, str]], plan: Plan, target: Any,
          timed_on: str | None, extra: dict[str, Any] | None) -> dict[str, Any]:
    """The card as it stands (a resumed collection keeps its seconds and creation time);
    ``timed_on``: where the measurer times, when not on the host the card describes."""
    path = out / CARD
    meta = json.loads(path.read_text()) if path.is_file() else {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": {}}
    meta.update(extra or {})
    meta.update({"name": out.name, "target": target_string(target), "host": _host(),
                 "timed_on": timed_on or "host",
                 "plan": vars(plan), "reference_kernel": REFERENCE_SPEC,
                 "workloads": [{"name": n, "spec": s} for n, s in workloads]})
    write_json_atomic(meta, path)
    return meta


def _count(out: Path, meta: dict[str, Any]) -> None:
    """Counts over the workloads collected so far."""
    data = Dataset(out, meta)
    programs = valid = layouts = 0
    for name in data.workloads():
        w = data.load(name)
        programs += len(w)
        valid += int(np.isfinite(w.latency).sum())
        layouts += len(w.layouts)
    meta["counts"] = {"workloads": len(data.workloads()), "layouts": layouts,
                      "programs": programs, "valid": valid, "failed": programs - valid}
    meta["collection_hours"] = round(sum(meta["seconds"].values()) / 3600, 3)
