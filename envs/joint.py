"""``altenv/JointTuning-v0``: ALT's cross exploration (§5.2, Fig. 8) of layouts and loops."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from altenv.costmodel import CostModel
from altenv.measure import Measurer
from altenv.space import LoopPoint, LoopSpace
from altenv.tuning import Candidate, OpTask, TuningSession
from altenv.tuning.task import Factors

from .layout import LayoutTuningEnv

LoopPolicy = Callable[[LoopSpace, LoopPoint, np.random.Generator], Sequence[int]]
"""A loop actor: one direction per subspace of ``space`` at ``point``
(a ``MultiDiscrete(space.action_nvec)`` action)."""


def random_directions(space: LoopSpace, point: LoopPoint, rng: np.random.Generator
                      ) -> np.ndarray:
    """The default loop actor: a uniformly random direction on every subspace."""
    return rng.integers(space.action_nvec)


class JointTuningEnv(LayoutTuningEnv):
    """Layout actor with loop tuning rounds in between (ALT's joint stage, Fig. 8).

    ## Description

    Each step the layout actor (the agent) picks the template's split factors, as in
    ``altenv/LayoutTuning-v0``; the layout's loop space is then explored by
    ``loop_rounds`` rounds of ALT's random walk (§5.2.2): sample ``batch`` points (the best
    so far kept), start from the best-predicted one, walk ``walk_length`` steps with the
    loop actor ``loop_policy``, and (measure mode) measure the ``top_k`` best-predicted
    points of the round. The best latency after the rounds is the layout's reward.

    ## Action Space

    As ``altenv/LayoutTuning-v0``: ``Box(0, 1, (n_knobs,), float32)`` (ALT Eq. 2) or, with
    ``action_type="discrete"``, ``MultiDiscrete([n_div] * n_knobs)``. With
    ``mapping="amos"`` (an int8 workload) the layout action is the choice of an intrinsic
    mapping instead: ``Box(0, 1, (1,))`` (mapping ``floor(a * n)``) or
    ``MultiDiscrete([n])``, ``n`` the mappings AMOS found (``altenv.mapping``); the loop
    rounds then tile around the tensorized dot product. An action outside the action space
    raises ``ValueError`` naming the head and its allowed range, as in
    ``altenv/LayoutTuning-v0``.

    ## Observation Space

    As ``altenv/LayoutTuning-v0``: the normalized layout state,
    ``Box(0, 1, (2 * n_knobs + sum_t rank_t * (1 + levels),), float32)``; with a mapping,
    ``Box(0, 1, (dims * (loops + 1),))``: which loops each intrinsic dim fuses and its
    padding (``MappingTemplate.observation``).

    ## Rewards

    | reward_source | reward of a step                                                      |
    |---------------|-----------------------------------------------------------------------|
    | "measure"     | ``max(1 - l / U, -1)``, ``l`` the best measured latency of the rounds |
    |               | (ALT: best latency after several loop rounds); ``U`` the default     |
    |               | layout's (or reference_latency)                                      |
    | "cost_model"  | the best predicted relative throughput over all visited loop points   |

    ## Starting State

    The template's default layout. In measure mode the first reset runs the loop rounds
    on it to fix ``U``.

    ## Episode End

    Truncated after ``episode_length`` layout steps; never terminated.

    ## Arguments

    Those of ``altenv/LayoutTuning-v0`` (defaults ``episode_length=4``, ``batch=128``,
    ``top_k=8``), and:

    | argument     | default             | meaning                                            |
    |--------------|---------------------|----------------------------------------------------|
    | loop_rounds  | 2                   | loop tuning rounds per layout                      |
    | walk_length  | 64                  | random-walk steps per round (ALT's loop episode)   |
    | loop_policy  | random_directions   | ``f(space, point, rng) -> directions``; e.g. a     |
    |              |                     | trained loop actor wrapped to the space            |

    ``env.unwrapped`` exposes ``best_candidate``, ``best_latency``, ``best_layouts``,
    ``best_schedule`` (see :class:`envs.common.TuningEnv`).
    """

    def __init__(self, workload: str | OpTask | None = None, target: Any = None, *,
                 reward_source: str = "measure", action_type: str = "continuous",
                 episode_length: int = 4, batch: int = 128, top_k: int = 8,
                 loop_rounds: int = 2, walk_length: int = 64,
                 loop_policy: LoopPolicy = random_directions, epilogue: Sequence[str] = (),
                 levels: int = 1, mapping: str = "none", session: TuningSession | None = None,
                 measurer: Measurer | None = None, db_path: str | Path | None = None,
                 cost_model: CostModel | str | Path | None = None,
                 reference_latency: float | None = None, render_mode: str | None = None):
        if walk_length < 0:
            raise ValueError(f"walk_length must be >= 0, got {walk_length}")
        self.walk_length = walk_length
        self.loop_policy = loop_policy
        super().__init__(workload, target, reward_source=reward_source,
                         action_type=action_type, episode_length=episode_length, batch=batch,
                         top_k=top_k, loop_rounds=loop_rounds, epilogue=epilogue,
                         levels=levels, mapping=mapping, session=session, measurer=measurer,
                         db_path=db_path,
                         cost_model=cost_model, reference_latency=reference_latency,
                         render_mode=render_mode)

    def _explore(self, factors: Factors, space: LoopSpace, start: LoopPoint | None
                 ) -> tuple[list[Candidate], np.ndarray]:
        """One round: a sampled batch, then a walk from its best-predicted point."""
        candidates, scores = super()._explore(factors, space, start)
        if not candidates or not self.walk_length:
            return candidates, scores
        point = candidates[int(np.argmax(scores))].point
        walked = []
        for _ in range(self.walk_length):
            point = space.step(point, self.loop_policy(space, point, self.np_random))
            walked.append(point)
        more, more_scores = self._score(factors, space, walked)
        return candidates + more, np.concatenate([scores, more_scores])
