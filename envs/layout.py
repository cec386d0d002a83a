"""``altenv/LayoutTuning-v0``: ALT's layout split actor (§5.2.1) on one operator's template."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from altenv.costmodel import CostModel
from altenv.measure import Measurer
from altenv.space import LoopPoint, LoopSpace
from altenv.space.constraints import Hardware, LayoutConstraints
from altenv.tuning import Candidate, OpTask, TuningSession, freeze
from altenv.tuning.task import Factors

from .common import (
    WORST_REWARD,
    Backend,
    TuningEnv,
    check_render_mode,
    checked_action,
    info_line,
    make_task,
)

ACTION_TYPES = ("continuous", "discrete")


class LayoutTuningEnv(TuningEnv):
    """Choose the split factors of an operator's layout template (ALT §5.1, §5.2.1).

    ## Description

    The template of the operator (C2D: output ``N H/ht W/wt O/ot ht wt ot``, input
    unfolded to match, weight ``O/ot' I/it' KH KW it' ot'``; GMM: ``M/mt N/nt mt nt`` and
    its operands) leaves only split factors to choose. Each step picks all of them; the
    layout is then evaluated by a few rounds of loop sampling on the program it generates.

    ## Action Space

    | action_type  | space                                   | meaning                          |
    |--------------|-----------------------------------------|----------------------------------|
    | "continuous" | ``Box(0, 1, (n_knobs,), float32)``      | ALT Eq. 2: factor ``R(D * a)``   |
    | "discrete"   | ``MultiDiscrete([n_div] * n_knobs)``    | ``i``-th divisor of the dim      |

    With ``"discrete"``, ``action_masks()`` gives sb3-contrib's ``MaskablePPO`` a flat bool
    mask (knob by knob): indices past a knob's divisor list are masked, and so are values
    the layout constraint model forbids (``altenv.space.constraints.LayoutConstraints``;
    with ``hardware_constraints=True`` the knobs tiling a tensor's innermost dim must be 1,
    a multiple of the SIMD lanes, or the whole dim). Outer levels of multi-level knobs
    divide what the inner level left, so only their list length is masked.

    Knobs are ``template.knobs`` in order (C2D: ``ht wt ot it it_w ot_w``, 6; GMM:
    ``mt nt kt``, 3; ``levels=2`` adds outer levels). ``n_div`` is the longest divisor list
    of any knob; a shorter list is clipped to its last divisor. A multi-level knob divides
    what its outer levels left. An action outside the action space (a value outside
    ``[0, 1]`` or an index outside ``[0, n_div - 1]``, a non-integer index, NaN, a wrong
    shape) raises ``ValueError`` naming the head (knob) and its allowed range, in ``step``
    and ``factors_of``.

    ## Observation Space

    ``Box(0, 1, (2 * n_knobs + sum_t rank_t * (1 + levels),), float32)``, fixed per template
    kind: per knob ``log(factor) / log(extent)`` and ``log2(extent) / 16``, then the
    concatenated primitive states of every tensor (``data``, ``out``, ``weight``): for each
    logical dim the parts its split/unfold made, ``log(part) / log(dim)`` (ALT's state
    ``[2, 16]`` for ``O = 32`` split by 16).

    ## Rewards

    | reward_source | reward of a step                                                     |
    |---------------|----------------------------------------------------------------------|
    | "measure"     | ``max(1 - l / U, -1)``, ``l`` the best latency of the layout's      |
    |               | measured top-k; ``U`` the default layout's (or reference_latency)   |
    | "cost_model"  | the best predicted relative throughput over the sampled loop points  |

    A layout evaluation runs ``loop_rounds`` rounds: sample ``batch`` loop points (the
    best so far kept), score them with the cost model, and in measure mode measure the
    ``top_k`` best-scored (the cost model trains on every measurement).

    ## Starting State

    The template's default layout (untiled channels, whole spatial tiles). In measure
    mode the first reset evaluates it to fix ``U``.

    ## Episode End

    Truncated after ``episode_length`` steps; never terminated.

    ## Arguments

    | argument            | default      | meaning                                            |
    |---------------------|--------------|----------------------------------------------------|
    | workload            | required     | spec string (``"gmm:M=64,N=64,K=64"``) or OpTask   |
    | target              | None         | target (None: this CPU)                            |
    | reward_source       | "measure"    | "measure" or "cost_model"                          |
    | action_type         | "continuous" | "continuous" or "discrete"                         |
    | episode_length      | 4            | layout steps per episode                           |
    | batch               | 128          | loop points sampled per round                      |
    | top_k               | 8            | points measured per round (measure mode)           |
    | loop_rounds         | 1            | rounds per layout evaluation                       |
    | hardware_constraints| False        | masks also apply the SIMD-length layout constraint |
    | epilogue, levels    | (), 1        | OpTask options (with a spec string)                |
    | mapping             | "none"       | OpTask option: "amos" makes the action the choice  |
    |                     |              | of an intrinsic mapping (one knob; docs/mappings)  |
    | session             | None         | TuningSession to share (task, records, cost model) |
    | measurer, db_path   | None         | share a measurer / records file (else made lazily) |
    | cost_model          | None         | CostModel or saved path (default: a new one)       |
    | reference_latency   | None         | ``U`` in seconds                                   |
    | render_mode         | None         | None or "ansi"                                     |

    ``env.unwrapped`` exposes ``best_candidate``, ``best_latency``, ``best_layouts``,
    ``best_schedule`` (see :class:`envs.common.TuningEnv`).
    """

    def __init__(self, workload: str | OpTask | None = None, target: Any = None, *,
                 reward_source: str = "measure", action_type: str = "continuous",
                 episode_length: int = 4, batch: int = 128, top_k: int = 8,
                 loop_rounds: int = 1, epilogue: Sequence[str] = (), levels: int = 1,
                 mapping: str = "none",
                 hardware_constraints: bool = False,
                 session: TuningSession | None = None, measurer: Measurer | None = None,
                 db_path: str | Path | None = None,
                 cost_model: CostModel | str | Path | None = None,
                 reference_latency: float | None = None, render_mode: str | None = None):
        if action_type not in ACTION_TYPES:
            raise ValueError(f"action_type must be one of {ACTION_TYPES}, got {action_type!r}")
        check_render_mode(render_mode)
        if min(episode_length, batch, top_k, loop_rounds) < 1:
            raise ValueError("episode_length, batch, top_k and loop_rounds must be >= 1")
        task = make_task(workload, target, epilogue, levels, session, mapping)
        self.backend = Backend(task, reward_source, session, measurer, db_path, cost_model,
                               reference_latency)
        self.template = task.template
        self.action_type = action_type
        self.episode_length = episode_length
        self.batch = batch
        self.top_k = top_k
        self.loop_rounds = loop_rounds
        self.layout_constraints = LayoutConstraints(
            self.template, Hardware.of(task.target) if hardware_constraints else None)
        self.render_mode = render_mode
        n = len(self.template.knobs)
        self.action_space = (spaces.Box(0.0, 1.0, (n,), dtype=np.float32)
                             if action_type == "continuous" else
                             spaces.MultiDiscrete(self.template.action_nvec()))
        self._head_names = tuple(f"knob {k.name}" for k in self.template.knobs)
        size = len(self.template.observation(dict(task.default_factors())))
        self.observation_space = spaces.Box(0.0, 1.0, (size,), dtype=np.float32)
        self.factors: Factors = task.default_factors()
        self._t = 0
        self._last: dict[str, Any] = {}

    def factors_of(self, action: np.ndarray) -> Factors:
        """Template factors of an action (``ValueError`` if it is outside the action
        space)."""
        action = checked_action(self.action_space, action, self._head_names)
        if self.action_type == "continuous":
            return freeze(self.template.factors_from_actions(action))
        return freeze(self.template.factors_from_indices(action))

    def action_masks(self) -> np.ndarray:
        """Flat bool mask of the discrete layout action (sb3-contrib's ``MaskablePPO``)."""
        if self.action_type != "discrete":
            raise ValueError("action masks need action_type='discrete'")
        return self.template.action_mask(self.layout_constraints.knob_values)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.factors = self.task.default_factors()
        self._t = 0
        info: dict[str, Any] = {"factors": dict(self.factors)}
        if self.backend.measures and self.backend.reference_latency is None:
            latency = self._evaluate(self.factors)
            self.backend.calibrate(latency)
            info["latency"] = latency
        self._last = info
        return self.template.observation(dict(self.factors)), info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.factors = self.factors_of(action)
        self._t += 1
        value = self._evaluate(self.factors)
        info: dict[str, Any] = {"factors": dict(self.factors)}
        if self.backend.measures:
            reward = self.backend.reward(value)
            info["latency"] = value
        else:
            reward = value
            info["score"] = value
        info["reward"] = reward
        self._last = info
        obs = self.template.observation(dict(self.factors))
        return obs, float(reward), False, self._t >= self.episode_length, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        last = info_line(self._last)
        return f"layout step {self._t}/{self.episode_length}: {last}\n{self.best_summary()}\n"

    # ------------------------------------------------------------------ evaluation
    def _evaluate(self, factors: Factors) -> float:
        """Loop rounds on one layout: the best measured latency (s) in measure mode, the
        best predicted score in cost-model mode."""
        space = self.task.space(factors)
        best_latency, best_score = math.inf, -math.inf
        start: LoopPoint | None = None
        for _ in range(self.loop_rounds):
            candidates, scores = self._explore(factors, space, start)
            if not candidates:  # no valid loop point found for this layout
                continue
            i = int(np.argmax(scores))
            start, best_score = candidates[i].point, max(best_score, float(scores[i]))
            if self.backend.measures:
                latency = self.backend.measure_top(candidates, scores, self.top_k)
                best_latency = min(best_latency, latency)
        if self.backend.measures:
            return best_latency
        return best_score if math.isfinite(best_score) else WORST_REWARD

    def _explore(self, factors: Factors, space: LoopSpace, start: LoopPoint | None
                 ) -> tuple[list[Candidate], np.ndarray]:
        """One round: ``batch`` sampled points (plus ``start``) and their scores."""
        points = space.sample(self.batch, self.np_random) + ([start] if start else [])
        return self._score(factors, space, points)

    def _score(self, factors: Factors, space: LoopSpace, points: Sequence[LoopPoint]
               ) -> tuple[list[Candidate], np.ndarray]:
        candidates = [Candidate(factors, p) for p in points]
        features = self.backend.features(space, points)
        return candidates, self.backend.scores(candidates, features, self.np_random)
