"""A tuning job: one operator task, its agent, its budget and how it searches, built once.

Every entry point that tunes an operator (``altenv tune``, each task of a model run,
``altenv train``, the training corpus, ``bench ops`` cells, ``bench scale``) builds a
:class:`TuningJob` and runs it, so a benchmark cell measures exactly what a user's run
does: a changed default reaches all of them, or none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..costmodel import CostModel
from ..measure import Measurer
from ..records import RecordDB
from .budget import Budget
from .loop import Agent, tune
from .session import TuningSession
from .task import OpTask


@dataclass(frozen=True)
class SearchOptions:
    """How a job searches a batch and picks its best (``search:`` of a config, resolved).

    Parameters
    ----------
    batch, top_k : int
        Candidates proposed per batch, and the cost model's best of them measured.
    finalists, finalist_rounds : int
        The fastest measured candidates re-timed side by side at the end (0: keep the
        fastest at tuning time), and the interleaved rounds of that re-timing.
    finalists_cold : bool
        Re-time the finalists with their weights flushed from the CPU caches (as a network
        runs them) rather than warm.
    check : bool
        Check every measured candidate against the reference (torch) on random inputs.
    """

    batch: int = 128
    top_k: int = 8
    finalists: int = 8
    finalist_rounds: int = 3
    finalists_cold: bool = False
    check: bool = True


@dataclass
class TuningJob:
    """An operator ``task`` tuned by ``agent`` within ``budget``, searching as ``search``
    says, and within ``seconds`` of tuning time where given (the trials that fit then,
    the budget's stages the plan). :meth:`run` is the one way altenv tunes an operator."""

    task: OpTask
    agent: Agent
    budget: Budget
    search: SearchOptions = field(default_factory=SearchOptions)
    seconds: float | None = None

    def session(self, measurer: Measurer, db: RecordDB,
                cost_model: CostModel | None = None) -> TuningSession:
        """The measurement session of this job's task on ``measurer``, its records in ``db``
        (a resumed session continues from them)."""
        return open_session(self.task, measurer, db, cost_model, self.search)

    def run(self, session: TuningSession, progress: bool = True,
            callbacks: Sequence[Callable[[TuningSession], None]] = (),
            spent: float = 0.0) -> float:
        """Tune ``session`` (:meth:`session`) to the budget and re-time the finalists;
        returns the best latency (s). ``spent``: seconds an interrupted earlier attempt
        tuned, counted against :attr:`seconds`."""
        return tune(session, self.agent, self.budget, batch=self.search.batch,
                    top_k=self.search.top_k, progress=progress, callbacks=callbacks,
                    finalists=self.search.finalists,
                    finalist_rounds=self.search.finalist_rounds,
                    finalists_cold=self.search.finalists_cold,
                    seconds=None if self.seconds is None else self.seconds - spent)


def open_session(task: OpTask, measurer: Measurer, db: RecordDB,
                 cost_model: CostModel | None = None,
                 search: SearchOptions = SearchOptions()) -> TuningSession:
    """A measurement session of ``task`` as a job searching as ``search`` opens it: a job's
    own (:meth:`TuningJob.session`) and the one an environment measures its rewards in, so
    that both check candidates alike."""
    return TuningSession(task, measurer, db, cost_model, check=search.check)
