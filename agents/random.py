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


@register("random")
class RandomAgent(Agent):
    """Random search.

    Parameters
    ----------
    seed:
        Seed of the layout and loop-point draws.
    """

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        factors = layout if layout is not None else session.task.random_factors(self.rng)
        points = session.task.space(factors).sample(n, self.rng)
        return [Candidate(factors, p) for p in points]
