"""``random``: uniform random layouts and MetaSchedule-sampled loop points.

The baseline of ALT's Fig. 11: in the joint stage each batch gets a random layout from
the template; loop points are drawn by MetaSchedule's own sampling. The cost model still
picks which of a batch are measured.
"""

from __future__ import annotations

import numpy as np

from altenv.tuning.session import TuningSession
from altenv.tuning.task import Candidate, Factors

from .base import Agent, register
from .options import RandomOptions


@register("random")
class RandomAgent(Agent):
    """Random search; options: :class:`~agents.options.RandomOptions`."""

    Options = RandomOptions

    def __init__(self, options: RandomOptions | None = None):
        options = RandomOptions() if options is None else options
        self.rng = np.random.default_rng(options.seed)

    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        factors = layout if layout is not None else session.task.random_factors(self.rng)
        points = session.task.space(factors).sample(n, self.rng)
        return [Candidate(factors, p) for p in points]
