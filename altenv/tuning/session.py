"""``TuningSession``: measure joint-space candidates with a cost model in front (ALT §5.2.3).

Agents propose batches of candidates; the session ranks them with the XGBoost cost
model, measures the top-k on the device (each checked against torch), appends every
result to the records database and trains the cost model on it. A session opened on an
existing database resumes: its records count against the budget, train the cost model,
and are never measured again.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tvm.s_tir import Schedule

from ..costmodel import CostModel, extract_features, feature_bytes
from ..errors import NothingMeasuredError
from ..measure import MeasureCandidate, Measurer, ProgramPoint
from ..ops.operators import operator_for
from ..records import Final, Record, RecordDB, candidate_key, target_string
from ..space.loop_space import StaleRecordError
from .task import Candidate, Factors, OpTask, freeze

FEATURE_CACHE_SIZE = 10_000
"""Candidates whose features a session keeps (a few KB each)."""


MAX_FLOPS = 1e16
"""More floating-point operations a second than any device reaches (10 PFLOP/s): a record
faster than that was not measured."""


@dataclass(frozen=True)
class Deadline:
    """A wall-clock budget of a session: it ends at ``end`` (``time.monotonic()``), was
    set at ``start`` when the session held ``trials``, and keeps time for ``builds``
    candidate builds (on ``workers`` builders at once) and ``runs`` timings after the
    trials (the finalists')."""

    end: float
    start: float
    trials: int
    builds: int
    runs: int
    workers: int

    def fits(self, session: TuningSession) -> int | None:
        """Trials that fit in the time left at the session's pace since :attr:`start`
        (search included), after the reserved builds and runs at the mean build and run
        time of its trials; ``None`` before the pace is known (no trial yet), 0 once the
        time is up."""
        now = time.monotonic()
        done = session.trials - self.trials
        if done <= 0:
            return None if now < self.end else 0
        measured = max(session.trials - session.resumed, 1)
        reserve = (math.ceil(self.builds / self.workers) * session.seconds["build"]
                   + self.runs * session.seconds["run"]) / measured
        left = self.end - now - reserve
        return max(0, math.floor(left / ((now - self.start) / done)))


def program_point(task: OpTask, candidate: Candidate) -> ProgramPoint:
    """What a candidate is, for a measurer that answers from a dataset: its layout, its
    canonical loop point as decisions and as the space's encoding, and the space."""
    space = task.space(candidate.factors)
    point = space.canonical(candidate.point)
    return ProgramPoint(task.key, candidate.factors,
                        tuple(int(v) for v in space.to_vector(point)),
                        tuple(float(v) for v in space.encode(point)),
                        tuple(space.describe()))


def with_features(point: ProgramPoint, features: np.ndarray) -> ProgramPoint:
    """``point`` carrying its program's per-store ``features`` as a dataset stores them
    (what a replay's program surrogate reads)."""
    return dataclasses.replace(point, features=tuple(int(v) for v in feature_bytes(features)))


class TuningSession:
    """Measurement, records and cost model of one :class:`OpTask`.

    Parameters
    ----------
    task:
        The operator task.
    measurer:
        Builds and times candidates (``altenv.measure.create``).
    db:
        The records database (shared across tasks of a run).
    cost_model:
        The cost model (a new one if ``None``).
    check:
        Check every measured candidate's output against torch before timing it.
    """

    def __init__(self, task: OpTask, measurer: Measurer, db: RecordDB,
                 cost_model: CostModel | None = None, check: bool = True):
        self.task = task
        self.measurer = measurer
        self.db = db
        self.cost_model = cost_model or CostModel()
        self.check = check
        self.limit: int | None = None  # at most this many trials, whoever asks
        self.deadline: Deadline | None = None  # a wall-clock budget (set_deadline)
        self.history: list[float] = []  # best latency after each trial
        self.seconds: dict[str, float] = dict.fromkeys(
            ("search", "cost_model", "build", "run", "measure_wall", "finalists"), 0.0)
        self._latency: dict[Candidate, float] = {}
        self._feature_cache: OrderedDict[Candidate, np.ndarray] = OrderedDict()
        self._resume()
        self.resumed = self.trials  # trials read back from the records

    # ------------------------------------------------------------ bookkeeping
    @property
    def trials(self) -> int:
        """Candidates measured for this task (resumed records included)."""
        return len(self.history)

    @property
    def best(self) -> tuple[Candidate | None, float]:
        """The fastest measured candidate and its median latency (s): once
        :meth:`finalize` ran, the fastest finalist and its re-timed latency."""
        record = self.db.best(self.task.key)
        if record is None:
            return None, math.inf
        final = self.db.final(self.task.key)
        return self._candidate(record), final.winner[1] if final else record.median

    def seconds_per_trial(self) -> dict[str, float]:
        """Where the tuning time went (search, cost model, build, run, measurement wall,
        finalists), in seconds per trial measured by this session (resumed ones not)."""
        return {k: v / max(self.trials - self.resumed, 1) for k, v in self.seconds.items()}

    def nothing_measured(self, what: str) -> NothingMeasuredError:
        """The error of a tuning ``what`` (a phrase) that ended without a successful
        candidate: how many failed, the first error and where the rest are."""
        failed = [r for r in self.db.records(self.task.key) if not r.ok]
        first = " ".join((failed[0].error or "no timings").split())[:160] if failed else ""
        return NothingMeasuredError(
            f"{what}: all {len(failed)} candidates of {self.task.key} failed"
            + (f" (the first: {first})" if first else "")
            + f"; every error is in {self.db.path}")

    def measured(self, candidate: Candidate) -> float | None:
        """The recorded latency of a candidate (``inf`` if it failed), ``None`` if new."""
        return self._latency.get(candidate)

    def measured_items(self) -> list[tuple[Candidate, float]]:
        """Every measured candidate with its latency (s, ``inf`` if it failed)."""
        return list(self._latency.items())

    def _candidate(self, record: Record) -> Candidate:
        factors = freeze(record.layouts["factors"])
        return Candidate(factors, self.task.space(factors).from_vector(record.decisions))

    def _resume(self) -> None:
        by_layout: dict[Factors, list[tuple[Candidate, float]]] = defaultdict(list)
        best = math.inf
        unusable: list[tuple[Record, str]] = []
        target = target_string(self.task.target)
        fastest = operator_for(self.task.workload).flops() / MAX_FLOPS
        for record in self.db.records(self.task.key):
            if record.target != target:
                unusable.append((record, f"measured for target {record.target}, not this "
                                         f"run's {target}"))
                continue
            if record.ok and min(record.latencies) < fastest:
                unusable.append((record, f"a latency of {min(record.latencies):.3g} s, faster "
                                         f"than {MAX_FLOPS:.0e} FLOP/s, which no device runs"))
                continue
            try:
                cand = self._candidate(record)
            except StaleRecordError as err:
                raise StaleRecordError(
                    f"{self.db.path}: cannot resume {self.task.key} (layout "
                    f"{dict(record.layouts['factors'])}): {err}. Resume with the altenv "
                    "version that wrote these records, or tune into a new run directory"
                ) from err
            except (KeyError, TypeError, ValueError, IndexError) as err:
                unusable.append((record, f"not a candidate of {self.task.key} "
                                         f"({type(err).__name__}: {err})"))
                continue
            self._latency[cand] = record.median
            by_layout[cand.factors].append((cand, record.median))
            best = min(best, record.median)
            self.history.append(best)
        if unusable and not self.db.repair:
            record, reason = unusable[0]
            raise self.db.corrupt(self.db.line_of(record), reason)
        if unusable:
            self.db.reject(unusable)
        start = time.perf_counter()
        for factors, pairs in by_layout.items():
            self._train(factors, [c for c, _ in pairs], [lat for _, lat in pairs])
        self.seconds["cost_model"] += time.perf_counter() - start

    # -------------------------------------------------------------- programs
    def schedule(self, candidate: Candidate) -> Schedule | None:
        """The scheduled program of a candidate, ``None`` if the point is invalid."""
        return self.task.space(candidate.factors).decode(candidate.point)

    def _features(self, factors: Factors, candidates: Sequence[Candidate]
                  ) -> list[np.ndarray]:
        """Per-store features of the valid candidates (all of one layout), cached: search
        strategies score the same points again as the cost model retrains."""
        space = self.task.space(factors)
        valid = [c for c in candidates if space.decode(c.point) is not None]
        new = [c for c in dict.fromkeys(valid) if c not in self._feature_cache]
        if new:
            feats = extract_features(space.context, [space.decode(c.point) for c in new])
            for cand, feat in zip(new, feats):
                self._feature_cache[cand] = feat
            while len(self._feature_cache) > FEATURE_CACHE_SIZE:
                self._feature_cache.popitem(last=False)
        return [self._feature_cache[c] if c in self._feature_cache else
                extract_features(space.context, [space.decode(c.point)])[0] for c in valid]

    def _train(self, factors: Factors, candidates: Sequence[Candidate],
               latencies: Sequence[float]) -> None:
        space = self.task.space(factors)
        ok = [(c, lat) for c, lat in zip(candidates, latencies) if space.decode(c.point)]
        if ok:
            feats = self._features(factors, [c for c, _ in ok])
            self.cost_model.update(self.task.key, feats, [lat for _, lat in ok])

    def _points(self, candidates: Sequence[Candidate]) -> list[ProgramPoint]:
        """The candidates' :class:`ProgramPoint`, with their programs' features where the
        measurer reads them (``reads_features``: a replay whose surrogate reads programs;
        the features come from the cache the cost model fills)."""
        points = [program_point(self.task, c) for c in candidates]
        if not getattr(self.measurer, "reads_features", False):
            return points
        by_layout: dict[Factors, list[int]] = defaultdict(list)
        for i, cand in enumerate(candidates):
            by_layout[cand.factors].append(i)
        for factors, rows in by_layout.items():
            feats = self._features(factors, [candidates[i] for i in rows])
            for i, feat in zip(rows, feats, strict=True):
                points[i] = with_features(points[i], feat)
        return points

    def _key(self, candidate: Candidate, schedule: Schedule) -> str:
        space = self.task.space(candidate.factors)
        return candidate_key(self.task.key, self.task.target,
                             self.task.layouts_json(candidate.factors), schedule.trace.as_json(),
                             space.to_vector(candidate.point).tolist())

    def finalize(self, finalists: int, rounds: int = 3, cold: bool = False) -> Final | None:
        """Re-time the ``finalists`` fastest measured candidates side by side (built once,
        ``rounds`` interleaved runs each, no new trials) and record them: the fastest of
        that re-timing becomes :attr:`best`. Tuning-time latencies were taken minutes
        apart on a host whose speed drifts, and the fastest of many noisy measurements
        is flattered by its noise; a side-by-side re-timing compares the finalists
        fairly. With ``cold`` they are timed with their weights flushed from the CPU
        caches before each call (:meth:`~altenv.measure.Measurer.retime`), as a network
        runs them. Nothing happens with fewer than two successful candidates, or when
        current finalists, timed as ``cold`` asks, are recorded already (a resumed run)."""
        current = self.db.final(self.task.key)
        if finalists < 2 or (current is not None and current.cold == cold):
            return current
        ranked = sorted((lat, i, c) for i, (c, lat) in enumerate(self._latency.items())
                        if math.isfinite(lat))
        top = [c for _, _, c in ranked[:finalists]]
        if len(top) < 2:
            return None
        schedules = [self.schedule(c) for c in top]
        start = time.perf_counter()
        results = self.measurer.retime([MeasureCandidate(s.mod, point=p) for s, p in
                                        zip(schedules, self._points(top))], rounds, cold)
        self.seconds["finalists"] += time.perf_counter() - start
        latencies = [statistics.median(r.median for r in rs) for rs in results]
        return self.db.add_final(Final(self.task.key, [self._key(c, s) for c, s in
                                                       zip(top, schedules)],
                                       latencies, self.trials, cold))

    # ------------------------------------------------------------ the two verbs
    def predict(self, candidates: Sequence[Candidate]) -> np.ndarray:
        """Cost-model scores (higher is faster); ``-inf`` for invalid points."""
        start = time.perf_counter()
        scores = np.full(len(candidates), -np.inf)
        groups: dict[Factors, list[int]] = defaultdict(list)
        for i, cand in enumerate(candidates):
            if self.schedule(cand) is not None:
                groups[cand.factors].append(i)
        for factors, idx in groups.items():
            feats = self._features(factors, [candidates[i] for i in idx])
            scores[idx] = self.cost_model.predict(feats)
        self.seconds["cost_model"] += time.perf_counter() - start
        return scores

    def select(self, candidates: Sequence[Candidate], k: int) -> list[int]:
        """Indices of the ``k`` best-predicted valid candidates not measured before."""
        scores = self.predict(candidates)
        order = np.argsort(-scores, kind="stable")
        chosen: list[int] = []
        seen: set[Candidate] = set()
        for i in order:
            cand = candidates[int(i)]
            if len(chosen) == k or not np.isfinite(scores[i]):
                break
            if cand in seen or cand in self._latency:
                continue
            seen.add(cand)
            chosen.append(int(i))
        return chosen

    def set_deadline(self, seconds: float | None, builds: int = 0, runs: int = 0) -> None:
        """Measure no trial that would end later than ``seconds`` from now (``None``: no
        wall-clock budget), keeping time for ``builds`` candidate builds and ``runs``
        timings after the trials (the finalists' re-timing)."""
        workers = getattr(getattr(self.measurer, "config", None), "build_workers", 1)
        self.deadline = None if seconds is None else Deadline(
            time.monotonic() + seconds, time.monotonic(), self.trials, builds, runs,
            max(int(workers), 1))

    @property
    def remaining(self) -> int | None:
        """Trials left under :attr:`limit` and the :attr:`deadline` (``None``: no limit)."""
        fits = None if self.deadline is None else self.deadline.fits(self)
        if self.limit is None:
            return fits
        left = max(self.limit - self.trials, 0)
        return left if fits is None else min(left, fits)

    @property
    def out_of_time(self) -> bool:
        """Whether the :attr:`deadline` leaves no time for another trial."""
        return self.deadline is not None and self.deadline.fits(self) == 0

    def measure(self, candidates: Sequence[Candidate]) -> list[float]:
        """Median latency (s) of each candidate, ``inf`` where it failed or the trial
        :attr:`limit` left it unmeasured; candidates measured before are answered from the
        records, not measured again."""
        new = [c for c in dict.fromkeys(candidates)
               if c not in self._latency and self.schedule(c) is not None]
        if self.remaining is not None:
            new = new[:self.remaining]
        if new:
            self._measure_new(new)
        return [self._latency.get(c, math.inf) for c in candidates]

    def _measure_new(self, candidates: list[Candidate]) -> None:
        schedules = [self.schedule(c) for c in candidates]
        checks = {f: self.task.check(f) for f in {c.factors for c in candidates}} \
            if self.check else {}
        inputs = [MeasureCandidate(s.mod, checks.get(c.factors), p) for c, s, p in
                  zip(candidates, schedules, self._points(candidates))]
        start = time.perf_counter()
        results = self.measurer.measure(inputs)
        self.seconds["measure_wall"] += time.perf_counter() - start
        best = self.history[-1] if self.history else math.inf
        by_layout: dict[Factors, list[tuple[Candidate, float]]] = defaultdict(list)
        for cand, sch, result in zip(candidates, schedules, results):
            space = self.task.space(cand.factors)
            if not self.db.has(self._key(cand, sch)):
                self.db.add_result(self.task.key, self.task.target,
                                   self.task.layouts_json(cand.factors), sch.trace,
                                   space.to_vector(cand.point).tolist(), result)
            self._latency[cand] = result.median
            self.seconds["build"] += result.build_seconds
            self.seconds["run"] += result.run_seconds
            best = min(best, result.median)
            self.history.append(best)
            by_layout[cand.factors].append((cand, result.median))
        start = time.perf_counter()
        for factors, pairs in by_layout.items():
            self._train(factors, [c for c, _ in pairs], [lat for _, lat in pairs])
        self.seconds["cost_model"] += time.perf_counter() - start
