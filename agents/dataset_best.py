"""``dataset_best``: the fastest programs a dataset holds for a workload, measured here.

A dataset's regret is measured against its best program; how far that program is from
what a long search finds is a question for the device. With this agent as one of its
tuners, ``bench ops`` answers it with its own machinery: the agent measures the ``top``
fastest programs the dataset holds for the workload being tuned (by their median timing
in the dataset), in that order, and then has nothing more to propose; the bench re-times
its pick beside the searches' picks, interleaved, on one host. Nothing is searched and no
cost model chooses. The workload must be one of the dataset's (``altenv://<dataset>/<name>``
names them), and the run should be on the kind of machine the dataset was timed on (it
warns otherwise); the dataset is read as data (Parquet and JSON), nothing of it runs.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence

import numpy as np

from altenv.datapath import dataset_dir
from altenv.dataset import Dataset
from altenv.records import target_string
from altenv.space.loop_space import StaleRecordError
from altenv.tuning.session import TuningSession
from altenv.tuning.task import Candidate, Factors, freeze

from .base import Agent, register
from .options import DatasetBestOptions

log = logging.getLogger(__name__)


@register("dataset_best")
class DatasetBestAgent(Agent):
    """The dataset's best programs as a tuner; options:
    :class:`~agents.options.DatasetBestOptions`."""

    Options = DatasetBestOptions

    def __init__(self, options: DatasetBestOptions | None = None):
        self.options = DatasetBestOptions() if options is None else options
        self.pending: list[Candidate] = []

    def setup(self, session: TuningSession) -> None:
        self.pending = [c for c in self.best_programs(session) if session.measured(c) is None]

    def best_programs(self, session: TuningSession) -> list[Candidate]:
        """The dataset's ``top`` fastest programs of the session's workload, fastest first
        (failed programs and any whose decisions this build's loop space does not take are
        left out, the latter with a warning)."""
        data = Dataset.open(dataset_dir(self.options.dataset))
        name = data.name_of(session.task.key)
        if name is None:
            raise ValueError(f"agent dataset_best: workload {session.task.key} is not in "
                             f"dataset {data.name} (name one of its workloads as "
                             f"altenv://{data.name}/<workload>)")
        theirs, ours = data.card.get("target"), target_string(session.task.target)
        if theirs != ours:
            warnings.warn(f"dataset_best: dataset {data.name} was timed on target {theirs}, "
                          f"this run's target is {ours}: its best programs were found for "
                          "another machine", stacklevel=2)
        rows = data.load(name)
        order = [int(i) for i in np.argsort(rows.latency, kind="stable")
                 if np.isfinite(rows.latency[i])]
        out: list[Candidate] = []
        for i in order[:self.options.top]:
            factors = freeze(rows.layouts[int(rows.layout[i])]["factors"])
            try:
                point = session.task.space(factors).from_vector(rows.decisions[i])
            except StaleRecordError as err:
                log.warning("dataset_best: program %d of %s left out: %s", i, name, err)
                continue
            out.append(Candidate(factors, point))
        return out

    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        """The dataset's best programs not chosen yet, in order (none once all were)."""
        return self.pending[:n]

    def choose(self, session: TuningSession, candidates: Sequence[Candidate], k: int
               ) -> list[Candidate]:
        """The first ``k``, in the dataset's order (the cost model has no say); each
        program is chosen once, so one that cannot be built is not offered again."""
        chosen = list(candidates[:k])
        self.pending = [c for c in self.pending if c not in chosen]
        return chosen
