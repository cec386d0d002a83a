"""A measurer that answers from a dataset: tuning offline, on the device's own timings.

``bench ops`` tunes an agent on a :class:`~altenv.measure.Measurer`; with a
:class:`ReplayMeasurer` in its place the same tuning code runs offline: a program the
dataset measured is answered with one of its own timings drawn at random (so a search meets
the measured noise), any other program with the dataset's surrogate (its program surrogate
where the dataset has one: the candidate then carries its program's features), and nothing
is built.
It reads which program a candidate is from the candidate's
:class:`~altenv.measure.ProgramPoint` (a tuning session's candidates carry theirs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..measure import MeasureCandidate, MeasureConfig, MeasureResult, ProgramPoint
from ..target import make_target
from .replay import WorkloadReplay
from .store import Dataset
from .surrogate import Surrogate, load_or_fit, load_program


class ReplayMeasurer:
    """Measures candidates of a dataset's workloads from the dataset.

    Parameters
    ----------
    dataset:
        The dataset.
    seed:
        Seeds the draw of each replayed program's timing.
    surrogate:
        Predicts programs the dataset does not hold (default: the dataset's).
    program_surrogate:
        Predicts them from their programs' features where a candidate carries them
        (default: the dataset's, if it has one; :attr:`reads_features` asks a tuning
        session for them).
    """

    rpc = False
    search_threads = 1
    """MetaSchedule's searches in a replayed session run on one thread: with more, its
    threads take candidates as they free up and a seed does not repeat (the cells of
    ``bench offline --jobs`` run side by side instead)."""

    def __init__(self, dataset: Dataset, seed: int = 0, surrogate: Surrogate | None = None,
                 program_surrogate: Surrogate | None = None):
        self.dataset = dataset
        self.config = MeasureConfig()
        self.target = make_target(json_target(dataset.card.get("target")))
        self.surrogate = surrogate or load_or_fit(dataset)
        self.program_surrogate = program_surrogate or load_program(dataset)
        self.rng = np.random.default_rng(seed)
        self._replays: dict[str, WorkloadReplay] = {}
        self.replayed = self.predicted = 0

    @property
    def reads_features(self) -> bool:
        """Whether candidates should carry their programs' features
        (``ProgramPoint.features``): only if the program surrogate will read them."""
        return self.program_surrogate is not None

    def workload(self, key: str) -> WorkloadReplay:
        """The replay of the workload whose records key (spec) is ``key``."""
        name = self.dataset.name_of(key)
        if name is None:
            raise ValueError(f"workload {key}: not in dataset {self.dataset.name}")
        if name not in self._replays:
            self._replays[name] = WorkloadReplay(self.dataset.load(name), self.surrogate)
        return self._replays[name]

    def latency(self, candidate: MeasureCandidate) -> tuple[float, str | None, bool]:
        """One drawn latency (s), the dataset's error if the program failed there, and
        whether it was replayed (else predicted)."""
        if candidate.point is None:
            raise ValueError("a replayed measurement needs the candidate's ProgramPoint "
                             "(TuningSession's candidates carry it)")
        return self.answer(candidate.point)

    def answer(self, point: ProgramPoint) -> tuple[float, str | None, bool]:
        """:meth:`latency` of the program at ``point``."""
        replay = self.workload(point.workload)
        factors = dict(point.factors)
        layout = replay.layout_of(factors)
        if layout is not None and point.decisions in layout.points:
            latency, _ = replay.latency(layout, point.decisions, self.rng)
            row = layout.points[point.decisions]
            error = replay.data.table.column("error")[row].as_py()
            return latency, error or (None if math.isfinite(latency) else "failed"), True
        program = (self.program_surrogate, point.features) if point.features and \
            self.program_surrogate is not None else None
        return (replay.predict(factors, point.encoding, point.decisions,
                               list(point.subspaces) or None, program), None, False)

    def measure(self, candidates: Sequence[MeasureCandidate]) -> list[MeasureResult]:
        return [rounds[0] for rounds in self.retime(candidates, rounds=1)]

    def retime(self, candidates: Sequence[MeasureCandidate], rounds: int, cold: bool = False
               ) -> list[list[MeasureResult]]:
        """``rounds`` drawn timings of each candidate (a failed one fails every round)."""
        out = []
        for candidate in candidates:
            results = []
            for _ in range(rounds):
                latency, error, replayed = self.latency(candidate)
                self.replayed += replayed
                self.predicted += not replayed
                results.append(MeasureResult(error=f"in the dataset: {error}")
                               if error else MeasureResult(latencies=[latency]))
            out.append(results)
        return out

    def metaschedule_pair(self) -> None:
        return None

    def device_session(self) -> None:
        return None

    def close(self) -> None:
        pass

    def __enter__(self) -> ReplayMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def json_target(text: Any) -> Any:
    """A dataset card's target (TVM's JSON text) as the dict ``make_target`` takes."""
    import json

    if isinstance(text, str) and text.startswith("{"):
        target = json.loads(text)
        return {k: v for k, v in target.items() if k in ("kind", "mtriple", "mcpu", "num-cores",
                                                        "mattr")}
    return text
