"""``altenv/LoopTuning-v0``: ALT's loop actors (§5.2.2), a random walk in one loop space."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from altenv.costmodel import CostModel, feature_summary
from altenv.measure import Measurer
from altenv.space import LoopPoint
from altenv.space.constraints import LoopConstraints, loop_constraints
from altenv.tuning import Candidate, OpTask, TuningSession
from altenv.tuning.task import Factors

from .common import (
    FEATURES,
    Backend,
    TuningEnv,
    as_factors,
    check_render_mode,
    checked_action,
    info_line,
    make_task,
)


class LoopTuningEnv(TuningEnv):
    """Walk the loop space of one operator with its layouts fixed (ALT §5.2.2, §4.3).

    ## Description

    The loop space is MetaSchedule's design spaces of the program the layouts generate
    (``altenv.space.LoopSpace``): a design index and one subspace per sampling decision
    (tile sizes, unroll/vectorize choices, compute locations). ALT's random walk: reset
    samples a batch and starts from its best point; each step moves every subspace one
    step in the direction the agent chose (one actor per subspace, ``LoopSpace.step``).

    ## Action Space

    ``MultiDiscrete(space.action_nvec)``: one direction per subspace; 0 stays put
    (e.g. a 4-level tile subspace has 13 directions: stay, or move a prime factor between
    two levels). An action outside the action space (a direction out of its subspace's
    range, a non-integer or NaN, a wrong shape) raises ``ValueError`` naming the head
    (subspace) and its allowed range.

    ``action_masks()`` gives sb3-contrib's ``MaskablePPO`` a flat bool mask over those
    directions: a direction is masked when it leads nowhere or only to points that
    violate the task's constraint model (``altenv.space.constraints.LoopConstraints``,
    Heron §4; its SIMD-length and cache-capacity constraints too with
    ``hardware_constraints=True``); staying put never is.

    ## Observation Space

    ``Box(0, 1, (space.vector_size + 400,), float32)``: ``space.encode(point)`` (tile
    factors as ``log(f) / log(extent)``, indices scaled), then the mean and the max over
    buffer stores of the program's 200 features (MetaSchedule's 164 ``PerStoreFeature``
    features and 36 of the main loop nest, ``altenv.costmodel.extract_features``),
    divided by 64 (they are log2-scaled counts).

    ## Rewards

    | reward_source, mode          | reward of a step                                      |
    |------------------------------|-------------------------------------------------------|
    | "cost_model"                 | predicted relative throughput of the new point        |
    | "measure" (default)          | as cost_model, except the last step of an episode:    |
    |                              | the ``top_k`` best-predicted visited points are       |
    |                              | measured and the reward is ``max(1 - l / U, -1)``     |
    |                              | with ``l`` their best latency (ALT §7: only the top-k |
    |                              | of an episode are measured)                           |
    | "measure", measure_every_step| ``max(1 - l / U, -1)`` with ``l`` the new point's     |
    |                              | measured latency                                      |

    Predicted throughput is relative to the best measured latency of the workload (about
    1 for the best seen). ``U`` is ``reference_latency`` or the first latency measured
    (the best of the first reset's measured top-k). Every measurement trains the cost
    model.

    ## Starting State

    ``batch`` points sampled with MetaSchedule's sampling (seeded by ``reset(seed=)``);
    the walk starts from the best-predicted one, or in measure mode the fastest of the
    batch's ``top_k`` best-predicted, which are measured.

    ## Episode End

    Truncated after ``episode_length`` steps; never terminated (every point is valid:
    a move that would be invalid stays put).

    ## Arguments

    | argument            | default    | meaning                                               |
    |---------------------|------------|-------------------------------------------------------|
    | workload            | required   | spec string (``"gmm:M=64,N=64,K=64"``) or OpTask      |
    | target              | None       | target (None: this CPU)                               |
    | layout              | None       | template factors (mapping); None: template default    |
    | reward_source       | "measure"  | "measure" or "cost_model"                             |
    | batch               | 128        | points sampled at reset                               |
    | episode_length      | 128        | steps per episode                                     |
    | top_k               | 8          | points measured at reset and at episode end           |
    | measure_every_step  | False      | measure every new point (measure mode)                |
    | hardware_constraints| False      | keep the walk inside the hardware-constrained space   |
    |                     |            | (reset samples it with CP-SAT, steps and masks obey)  |
    | epilogue, levels    | (), 1      | OpTask options (with a spec string)                   |
    | session             | None       | TuningSession to share (task, records, cost model)    |
    | measurer, db_path   | None       | share a measurer / records file (else made lazily)    |
    | cost_model          | None       | CostModel or saved path (default: a new one)          |
    | reference_latency   | None       | ``U`` in seconds                                      |
    | render_mode         | None       | None or "ansi"                                        |

    ``env.unwrapped`` exposes ``best_candidate``, ``best_latency``, ``best_layouts``,
    ``best_schedule`` (see :class:`envs.common.TuningEnv`), and ``space``, ``point``.
    """

    def __init__(self, workload: str | OpTask | None = None, target: Any = None, *,
                 layout: Mapping[str, int] | Factors | None = None,
                 reward_source: str = "measure", batch: int = 128,
                 episode_length: int = 128, top_k: int = 8, measure_every_step: bool = False,
                 hardware_constraints: bool = False,
                 epilogue: Sequence[str] = (), levels: int = 1,
                 session: TuningSession | None = None, measurer: Measurer | None = None,
                 db_path: str | Path | None = None,
                 cost_model: CostModel | str | Path | None = None,
                 reference_latency: float | None = None, render_mode: str | None = None):
        check_render_mode(render_mode)
        if min(batch, episode_length, top_k) < 1:
            raise ValueError("batch, episode_length and top_k must be >= 1")
        task = make_task(workload, target, epilogue, levels, session)
        self.backend = Backend(task, reward_source, session, measurer, db_path, cost_model,
                               reference_latency)
        self.factors: Factors = as_factors(task.template, layout)
        self.space = task.space(self.factors)
        self.batch = batch
        self.episode_length = episode_length
        self.top_k = top_k
        self.measure_every_step = measure_every_step
        self.hardware_constraints = hardware_constraints
        self.render_mode = render_mode
        self.action_space = spaces.MultiDiscrete(self.space.action_nvec)
        self._head_names = tuple(f"subspace {sub.name}" for sub in self.space.subspaces)
        self.observation_space = spaces.Box(0.0, 1.0, (self.space.vector_size + 2 * FEATURES,),
                                            dtype=np.float32)
        self.point: LoopPoint | None = None
        self._t = 0
        self._visited: dict[LoopPoint, float] = {}
        self._last: dict[str, Any] = {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        points = (self.constraints.sample_points(self.batch, self.np_random)
                  if self.hardware_constraints else self.space.sample(self.batch, self.np_random))
        if not points:
            raise RuntimeError(f"no valid loop point in {self.batch} samples of "
                               f"{self.task.key} with layout {dict(self.factors)}")
        candidates = [Candidate(self.factors, p) for p in points]
        features = self.backend.features(self.space, points)
        scores = self.backend.scores(candidates, features, self.np_random)
        best = int(np.argmax(scores))
        info: dict[str, Any] = {}
        if self.backend.measures:
            top = [int(i) for i in np.argsort(-scores, kind="stable")[:self.top_k]]
            latencies = self.backend.measure([candidates[i] for i in top])
            if math.isfinite(min(latencies)):
                best = top[int(np.argmin(latencies))]
                self.backend.calibrate(min(latencies))
                info["latency"] = min(latencies)
        self.point, self._t = points[best], 0
        self._visited = {self.point: float(scores[best])}
        info["score"] = float(scores[best])
        self._last = info
        return self._observe(self.point, features[best]), info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.point is None:
            raise RuntimeError("call reset() before step()")
        directions = [int(a) for a in checked_action(self.action_space, action,
                                                     self._head_names)]
        self.point = (self.constraints.step(self.point, directions) if self.hardware_constraints
                      else self.space.step(self.point, directions))
        self._t += 1
        truncated = self._t >= self.episode_length
        candidate = Candidate(self.factors, self.point)
        features = self.backend.features(self.space, [self.point])
        score = float(self.backend.scores([candidate], features, self.np_random)[0])
        self._visited[self.point] = score
        info: dict[str, Any] = {"score": score}
        reward = score
        if self.backend.measures and self.measure_every_step:
            info["latency"] = self.backend.measure([candidate])[0]
            reward = self.backend.reward(info["latency"])
        elif self.backend.measures and truncated:
            visited = [Candidate(self.factors, p) for p in self._visited]
            info["latency"] = self.backend.measure_top(
                visited, np.fromiter(self._visited.values(), dtype=float), self.top_k)
            reward = self.backend.reward(info["latency"])
        self._last = info
        return self._observe(self.point, features[0]), float(reward), False, truncated, info

    @property
    def constraints(self) -> LoopConstraints:
        """The constraint model of the loop space (built on first use, cached)."""
        return loop_constraints(self.space, self.hardware_constraints)

    def action_masks(self) -> np.ndarray:
        """Flat bool mask of the directions (sb3-contrib's ``MaskablePPO``)."""
        if self.point is None:
            raise RuntimeError("call reset() before action_masks()")
        return self.constraints.masks(self.point)

    def _observe(self, point: LoopPoint, features: np.ndarray) -> np.ndarray:
        return np.concatenate([self.space.encode(point), feature_summary(features)])

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.point is None:
            return None
        last = info_line(self._last)
        point = self.space.to_json(self.point)
        return (f"loop step {self._t}/{self.episode_length}: {last}\n"
                f"point: {point}\n{self.best_summary()}\n")
