"""``altenv/CrossExploration-v0``: ALT's cross exploration (§5.2, Fig. 8) as one environment,
so that one policy holds the layout actor, the loop actors and their shared critic."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from altenv.costmodel import CostModel, feature_summary
from altenv.measure import Measurer
from altenv.ops import LayoutTemplate, divisors
from altenv.ops.features import WORKLOAD_FEATURES, workload_features
from altenv.ops.templates import KNOB_ROLES, Template
from altenv.space import LoopPoint, LoopSpace
from altenv.space.constraints import Hardware, LayoutConstraints
from altenv.tuning import Candidate, OpTask, TuningSession, freeze
from altenv.tuning.task import Factors

from .common import (
    FEATURES,
    RENDER_MODES,
    REWARD_SOURCES,
    Backend,
    TuningEnv,
    check_render_mode,
    checked_action,
    default_cost_model,
    info_line,
    make_task,
)
from .wrappers import MAX_DIRECTIONS, MAX_SUBSPACES, MAX_VECTOR, fit_directions

SLOTS = KNOB_ROLES
"""Layout action heads, one per knob role (outer levels of two-level templates last), so
a knob keeps its head across operators and shapes."""
BINS = 12
"""Values of a layout head: bin ``b`` is the largest divisor of the knob's extent (what
outer levels left) that is at most ``2**b``."""
MAX_SCORE = 4.0
"""Scores and relative throughputs are clipped to this in observations and rewards."""
PHASE = 0
"""Observation entry that is 1 on a layout step and 0 on a loop step."""
OBS_SIZE = 3 + WORKLOAD_FEATURES + 3 * len(SLOTS) + MAX_VECTOR + 2 * FEATURES + 2
"""Length of the observation, the same for every workload."""
ACTION_NVEC = [BINS] * len(SLOTS) + [MAX_DIRECTIONS] * MAX_SUBSPACES
"""The action's ``MultiDiscrete`` sizes, the same for every workload."""
HEAD_NAMES = tuple([f"layout {s}" for s in SLOTS] + [f"loop direction {j}"
                                                     for j in range(MAX_SUBSPACES)])
"""The action heads' names, for the message of an action outside the space."""


def bin_choices(extent: int) -> list[int | None]:
    """The factor of each bin for a knob of ``extent``; ``None`` where a bin repeats a
    smaller bin's factor (masked)."""
    choices: list[int | None] = []
    seen: set[int] = set()
    options = divisors(extent)
    for b in range(BINS):
        best = max(d for d in options if d <= 2 ** b)
        choices.append(None if best in seen else best)
        seen.add(best)
    if max(options) not in seen:  # extents past 2**(BINS-1): the last bin takes the whole dim
        choices[-1] = max(options)
    return choices


def check_template(template: Template) -> None:
    """Refuse templates the layout heads cannot express."""
    if template.tensor_intrin is not None:
        raise ValueError("CrossExploration-v0 tunes layout templates; intrinsic mappings "
                         "(mapping=...) are tuned with altenv/JointTuning-v0")
    unknown = [k.name for k in template.knobs if k.name not in SLOTS]
    if unknown:
        raise ValueError(f"CrossExploration-v0: knobs {unknown} have no layout head "
                         f"(levels <= 2 supported); heads: {', '.join(SLOTS)}")


def factors_from_bins(template: LayoutTemplate, bins: Sequence[int]) -> dict[str, int]:
    """Template factors of a layout action (one bin per :data:`SLOTS` head); a masked bin
    takes the nearest smaller allowed one. Outer levels divide what inner ones left."""
    out: dict[str, int] = {}
    left: dict[str, int] = {}
    for knob in template.knobs:
        key = knob.name.rstrip("0123456789")
        choices = bin_choices(left.get(key, knob.extent))
        b = min(int(bins[SLOTS.index(knob.name)]), BINS - 1)
        out[knob.name] = next(c for c in choices[b::-1] if c is not None)
        left[key] = left.get(key, knob.extent) // out[knob.name]
    return out


class CrossExplorationBase(gym.Env, ABC):
    """The episodes of ``CrossExploration-v0``, whatever scores their points: the spaces,
    layout and loop steps, a visit's rounds, masks, observation, rewards and episode end
    that :class:`CrossExplorationEnv` documents. Its subclasses, that env and its dataset
    replay (:class:`envs.cross_replay.CrossExplorationReplayEnv`), supply the workloads,
    the layout template (``template``), the visit's layout (``factors``) and loop space,
    and the scores of its points: the abstract methods below."""

    metadata = {"render_modes": RENDER_MODES, "render_fps": 4}
    template: LayoutTemplate
    factors: Factors | Mapping[str, int]
    fixed: Factors | None = None
    """The fixed layout of the loop-only stage; None: visits start with a layout step."""
    layout_constraints: LayoutConstraints | None = None
    """Constraints a layout step's factors are projected onto and the masks obey."""
    _workload_features: np.ndarray
    """The workload's part of the observation (``workload_features``)."""

    def __init__(self, episode_layouts: int, loop_rounds: int, walk_length: int, batch: int,
                 render_mode: str | None):
        check_render_mode(render_mode)
        if min(episode_layouts, loop_rounds, walk_length, batch) < 1:
            raise ValueError("episode_layouts, loop_rounds, walk_length and batch must be >= 1")
        self.episode_layouts, self.loop_rounds, self.walk_length, self.batch = (
            episode_layouts, loop_rounds, walk_length, batch)
        self.render_mode = render_mode
        self.action_space = spaces.MultiDiscrete(np.array(ACTION_NVEC))
        self.observation_space = spaces.Box(0.0, 1.0, (OBS_SIZE,), dtype=np.float32)
        self.point: Any = None
        self._visit = self._round = self._walked = 0
        self._score = self._best = 0.0
        self._summary = np.zeros(2 * FEATURES, dtype=np.float32)
        self._last: dict[str, Any] = {}

    # ------------------------------------------------------------------ what a subclass supplies
    @abstractmethod
    def _start_episode(self) -> str:
        """Draw the episode's workload (``template``, ``factors`` and ``_workload_features``
        of its start); its name for ``info["workload"]``."""

    @abstractmethod
    def _enter(self, factors: Mapping[str, int] | Factors, info: dict[str, Any]) -> None:
        """Make the layout of ``factors`` the visit's (``factors`` and its loop space),
        noting it in a layout step's ``info``."""

    @abstractmethod
    def _round_points(self) -> list[Any]:
        """A round's batch of points of the visit's layout."""

    @abstractmethod
    def _scores(self, points: list[Any], info: dict[str, Any] | None = None
                ) -> tuple[list[Any], np.ndarray]:
        """The ones of ``points`` that have a score and their scores (clipped to
        :data:`MAX_SCORE`); a loop step's ``info`` notes how its point was scored."""

    @abstractmethod
    def _summary_of(self, point: Any) -> np.ndarray:
        """The feature summary of a scored point (``2 * FEATURES`` entries)."""

    @abstractmethod
    def _move(self, point: Any, directions: np.ndarray) -> Any:
        """``point`` with every subspace moved one step in its direction."""

    @abstractmethod
    def _encode(self, point: Any) -> np.ndarray:
        """The point's encoding (``LoopSpace.encode``)."""

    @abstractmethod
    def _loop_nvec(self) -> Sequence[int]:
        """Directions of each subspace of the visit's loop space."""

    # ------------------------------------------------------------------ gym API
    @property
    def layout_phase(self) -> bool:
        """Whether the next step is a layout step."""
        return self.point is None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._visit, self.point = 0, None
        self._key = self._start_episode()
        if self.fixed is not None:
            self._start_visit(self.fixed, {})
        info: dict[str, Any] = {"workload": self._key}
        self._last = info
        return self._observe(), info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        action = checked_action(self.action_space, action, HEAD_NAMES)
        info: dict[str, Any] = {}
        if self.layout_phase:
            self._start_visit(self.layout_of(action), info)
            reward = self._best  # the visit's first batch
        else:
            reward = self._walk(action[len(SLOTS):], info)
        truncated = self._visit >= self.episode_layouts
        info["score"] = self._score
        self._last = info
        return self._observe(), float(reward), False, truncated, info

    def layout_of(self, action: np.ndarray) -> dict[str, int]:
        """The factors a layout step's ``action`` chooses: its layout heads' bins, projected
        onto the layout constraints where there are some."""
        factors = factors_from_bins(self.template, action[:len(SLOTS)])
        constraints = self.layout_constraints
        return factors if constraints is None else constraints.nearest(factors)

    def action_masks(self) -> np.ndarray:
        """Flat bool mask over the heads (sb3-contrib's ``MaskablePPO``)."""
        masks = np.zeros((len(SLOTS) * BINS + MAX_SUBSPACES * MAX_DIRECTIONS,), dtype=bool)
        layout = masks[:len(SLOTS) * BINS].reshape(len(SLOTS), BINS)
        loop = masks[len(SLOTS) * BINS:].reshape(MAX_SUBSPACES, MAX_DIRECTIONS)
        layout[:, 0] = loop[:, 0] = True
        if self.layout_phase:
            constraints = self.layout_constraints
            for knob in self.template.knobs:
                legal = (constraints.knob_values(knob.name)
                         if constraints is not None and knob.level == 0 else None)
                layout[SLOTS.index(knob.name)] = [
                    c is not None and (legal is None or c in legal) or b == 0
                    for b, c in enumerate(bin_choices(knob.extent))]
        else:
            for i, n in enumerate(self._loop_nvec()[:MAX_SUBSPACES]):
                loop[i, :min(int(n), MAX_DIRECTIONS)] = True
        return masks

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        last = info_line(self._last)
        return (f"visit {self._visit}/{self.episode_layouts} round {self._round} step "
                f"{self._walked}: {last}\n")

    # ------------------------------------------------------------------ visits
    def _start_visit(self, factors: Mapping[str, int] | Factors, info: dict[str, Any]) -> None:
        self._enter(factors, info)
        self._round, self._best = 0, 0.0
        self._sample_round()

    def _sample_round(self) -> None:
        """A round's batch (and the point so far); the walk starts from its best-scored
        point. A layout without a scored point ends the visit."""
        points = self._round_points()
        if self.point is not None:
            points.append(self.point)
        points, scores = self._scores(points)
        if not points:
            if self.fixed is not None:
                raise RuntimeError(f"{self._key}: no valid loop point in {self.batch} "
                                   f"samples of the fixed layout {dict(self.fixed)}")
            self.point, self._score, self._walked = None, 0.0, 0
            self._end_visit()
            return
        i = int(np.argmax(scores))
        self.point, self._score, self._walked = points[i], float(scores[i]), 0
        self._summary = self._summary_of(self.point)
        self._best = max(self._best, self._score)

    def _walk(self, directions: np.ndarray, info: dict[str, Any]) -> float:
        """One loop step; returns its reward."""
        before = self._best
        self.point = self._move(self.point, directions)
        scored, scores = self._scores([self.point], info)
        if scored:
            self._score = float(scores[0])
            self._summary = self._summary_of(self.point)
            self._best = max(self._best, self._score)
        self._walked += 1
        reward = self._best - before
        if self._walked >= self.walk_length:
            self._round += 1
            if self._round < self.loop_rounds:
                seen = self._best
                self._sample_round()
                reward += self._best - seen
            else:
                reward += self._end_visit(info)
        return reward

    def _end_visit(self, info: dict[str, Any] | None = None) -> float:
        """Close a visit; the reward its last step earns besides its score gain (none
        here). Then the next layout step (or, with a fixed layout, the next visit's first
        round)."""
        self._visit += 1
        self.point = None
        if self.fixed is not None and self._visit < self.episode_layouts:
            self._start_visit(self.fixed, {})
        return 0.0

    # ------------------------------------------------------------------ observation
    def _observe(self) -> np.ndarray:
        obs = np.zeros(OBS_SIZE, dtype=np.float32)
        loop = not self.layout_phase
        obs[PHASE] = float(not loop)
        obs[1] = self._walked / self.walk_length if loop else 0.0
        obs[2] = self._visit / self.episode_layouts
        at = 3
        obs[at:at + WORKLOAD_FEATURES] = self._workload_features
        at += WORKLOAD_FEATURES
        chosen = dict(self.factors)
        for knob in self.template.knobs:
            s = at + 3 * SLOTS.index(knob.name)
            obs[s:s + 3] = (min(math.log2(chosen[knob.name]) / BINS, 1.0),
                            min(math.log2(knob.extent) / BINS, 1.0), 1.0)
        at += 3 * len(SLOTS)
        if loop:
            encoded = self._encode(self.point)[:MAX_VECTOR]
            obs[at:at + len(encoded)] = encoded
            obs[at + MAX_VECTOR:at + MAX_VECTOR + 2 * FEATURES] = self._summary
            obs[-2:] = (self._score / MAX_SCORE, self._best / MAX_SCORE)
        return np.clip(obs, 0.0, 1.0)


class CrossExplorationEnv(CrossExplorationBase, TuningEnv):
    """Layouts and loops explored by one policy, as ALT's cross exploration (§5.2).

    ## Description

    An episode visits ``episode_layouts`` layouts. Visiting one takes a **layout step**
    (the layout actor picks the template's split factors, ALT §5.1) and then
    ``loop_rounds`` rounds of **loop steps**: each round samples ``batch`` points of the
    layout's loop space (MetaSchedule's sampling; the layout's best measured points and
    the best point so far join it, with ``mutations`` random neighbours of those best
    measured points) and walks ``walk_length`` steps from its best-predicted point, every
    subspace moved in the direction its loop actor chose (§5.2.2). In measure mode the
    ``top_k`` best-predicted points of the visit are measured at its end. All actors are
    heads of one policy with one value function, the critic ALT shares among them; action
    masks switch the heads that do not act.

    With ``layout=`` the layout is fixed (ALT's loop-only stage): there are no layout
    steps and every visit is loop rounds on that layout. ``workload`` may be a list of
    specs (cost-model rewards only): each reset draws one, for pretraining across
    workloads.

    ## Action Space

    ``MultiDiscrete([12] * 16 + [32] * 48)``: 16 layout heads, one per knob role
    (``dt ht wt ot it it_w ot_w mt nt kt`` and the outer levels ``dt1 ht1 wt1 ot1 it_w1
    ot_w1``), value ``b`` picking the largest divisor of the knob's extent up to ``2**b``
    (so a 16-lane tile is bin 4 on every shape); then 48 loop heads, one direction per
    loop subspace (``LoopSpace.action_nvec``; 0 stays). ``action_masks()`` (sb3-contrib's
    ``MaskablePPO``) allows, on a layout step, the bins of the operator's knobs that give
    distinct factors, and on a loop step the directions of its subspaces; every other
    head is held at 0. An action outside the action space (a head out of its range, a
    non-integer or NaN head, a wrong shape) raises ``ValueError`` naming the head and its
    allowed range.

    ## Observation Space

    ``Box(0, 1, (575,), float32)``: the phase (1 on a layout step), the walk's and the
    episode's progress; the workload (``altenv.ops.features.workload_features``: kind,
    batch, channels, sizes, kernel window, stride, dilation, groups, dtype, FLOPs,
    arithmetic intensity); per layout head the chosen factor, the knob's extent
    (``log2 / 12``) and whether the operator has that knob; the loop point
    (``LoopSpace.encode`` padded to 96) and the mean and max of its program features
    (MetaSchedule's per-store features and the loop nest, /64); the point's predicted
    score and the visit's best (/4). Loop entries are 0 on a layout step.

    ## Rewards

    The cost model predicts a point's throughput relative to the best measured for the
    workload (about 1 for the best seen). A layout step earns the best score of the
    visit's first batch; a loop step earns how much it raised the visit's best score,
    so a visit's rewards sum to its best score. In measure mode the visit's last step
    also earns ``min(U / l, 4) - best score``, ``l`` the best measured latency of the
    visit's top-k and ``U`` the first latency measured (or ``reference_latency``): the
    visit's return is then its measured throughput relative to ``U`` (ALT: the layout's
    reward is its best latency after loop rounds), and 0 if every candidate failed.

    ## Starting State

    A layout step (with ``layout=``: the first round's sampled batch).

    ## Episode End

    Truncated after ``episode_layouts`` visits; never terminated.

    ## Arguments

    | argument          | default    | meaning                                             |
    |-------------------|------------|-----------------------------------------------------|
    | workload          | required   | spec, OpTask, or a list of specs (cost_model only)  |
    | target            | None       | target (None: this CPU)                             |
    | reward_source     | "measure"  | "measure" or "cost_model"                           |
    | episode_layouts   | 4          | layout visits per episode                           |
    | loop_rounds       | 2          | sampled batches (and walks) per visit               |
    | walk_length       | 16         | loop steps per round                                |
    | batch             | 32         | points sampled per round                            |
    | top_k             | 8          | points measured per visit (measure mode)            |
    | mutations         | 0          | neighbours of the layout's best measured points     |
    |                   |            | added to each round's batch (measure mode)          |
    | layout            | None       | fixed template factors (the loop-only stage)        |
    | hardware_constraints | False   | layouts obey the SIMD-length layout constraints     |
    | epilogue, levels  | (), 1      | OpTask options (with spec strings; levels <= 2)     |
    | session           | None       | TuningSession to share (task, records, cost model)  |
    | measurer, db_path | None       | share a measurer / records file (else made lazily)  |
    | cost_model        | None       | CostModel or saved path (default: the pretrained    |
    |                   |            | cross-workload model, ``altenv.pretrained``)        |
    | reference_latency | None       | ``U`` in seconds                                    |
    | render_mode       | None       | None or "ansi"                                      |

    ``env.unwrapped`` exposes ``best_candidate``, ``best_latency``, ``best_layouts``,
    ``best_schedule`` (see :class:`envs.common.TuningEnv`) and ``visited`` (the current
    visit's candidates and scores).
    """

    def __init__(self, workload: str | OpTask | Sequence[str] | None = None, target: Any = None,
                 *, reward_source: str = "measure", episode_layouts: int = 4,
                 loop_rounds: int = 2, walk_length: int = 16, batch: int = 32, top_k: int = 8,
                 layout: dict[str, int] | Factors | None = None, epilogue: Sequence[str] = (),
                 levels: int = 1, session: TuningSession | None = None,
                 measurer: Measurer | None = None, db_path: str | Path | None = None,
                 cost_model: CostModel | str | Path | None = None,
                 reference_latency: float | None = None, hardware_constraints: bool = False,
                 mutations: int = 0, render_mode: str | None = None):
        super().__init__(episode_layouts, loop_rounds, walk_length, batch, render_mode)
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if mutations < 0:
            raise ValueError(f"mutations must be >= 0, got {mutations}")
        if reward_source not in REWARD_SOURCES:
            raise ValueError(f"reward_source must be one of {REWARD_SOURCES}, "
                             f"got {reward_source!r}")
        many = isinstance(workload, Sequence) and not isinstance(workload, str)
        if many and (reward_source != "cost_model" or session is not None or not workload):
            raise ValueError("a list of workloads needs reward_source='cost_model' and no "
                             "session (each reset draws one workload)")
        if isinstance(cost_model, str | Path):
            cost_model = CostModel.load(cost_model)
        if session is None and cost_model is None:  # one model for every workload's backend
            cost_model = default_cost_model(target)
        self._backend_args = (reward_source, session, measurer, db_path, cost_model,
                              reference_latency)
        self._target, self._epilogue, self._levels = target, tuple(epilogue), levels
        self.hardware_constraints = hardware_constraints
        self._backends: dict[str, Backend] = {}
        self._constraints: dict[str, LayoutConstraints | None] = {}
        specs = list(workload) if many else [workload]
        self.workloads = [s for s in specs if isinstance(s, str)]
        self.backend = self._backend(specs[0])
        self.fixed = None if layout is None else freeze(dict(layout))
        if self.fixed is not None:
            self.task.template.check(dict(self.fixed))
        self.top_k, self.mutations = top_k, mutations
        self.factors: Factors = self.task.default_factors()
        self.space: LoopSpace | None = None
        self.visited: dict[Candidate, float] = {}
        self._features: dict[LoopPoint, np.ndarray] = {}
        self._workload_features = workload_features(self.task.workload)

    def _backend(self, workload: str | OpTask | None) -> Backend:
        """The backend of ``workload`` (one per workload, sharing the cost model)."""
        key = workload if isinstance(workload, str) else None
        if key in self._backends:
            return self._backends[key]
        task = make_task(workload, self._target, self._epilogue, self._levels,
                         self._backend_args[1])
        check_template(task.template)
        backend = Backend(task, *self._backend_args)
        if key is not None:
            self._backends[key] = backend
        return backend

    @property
    def template(self) -> LayoutTemplate:
        """The current workload's layout template."""
        return self.task.template

    @property
    def layout_constraints(self) -> LayoutConstraints | None:
        """The current workload's SIMD-length layout constraints (``hardware_constraints``):
        the masks keep each knob's allowed bins and a layout step's factors are projected
        onto the nearest legal layout (constraints between knobs, which independent heads
        cannot express)."""
        if not self.hardware_constraints:
            return None
        key = self.task.key
        if key not in self._constraints:
            self._constraints[key] = LayoutConstraints(self.task.template,
                                                       Hardware.of(self.task.target))
        return self._constraints[key]

    def render(self) -> str | None:
        text = super().render()
        return None if text is None else f"{text}{self.best_summary()}\n"

    # ------------------------------------------------------------------ the live visit
    def _start_episode(self) -> str:
        if len(self.workloads) > 1:
            self.backend = self._backend(self.workloads[int(self.np_random.integers(
                len(self.workloads)))])
            self._workload_features = workload_features(self.task.workload)
        self.factors = self.fixed or self.task.default_factors()
        self.space, self.visited = None, {}
        return self.task.key

    def _enter(self, factors: Mapping[str, int] | Factors, info: dict[str, Any]) -> None:
        factors = freeze(dict(factors))
        space = self.task.space(factors)
        if (space.num_subspaces > MAX_SUBSPACES or space.vector_size > MAX_VECTOR
                or int(space.action_nvec.max(initial=0)) > MAX_DIRECTIONS):
            raise ValueError(f"{self.task.key}, layout {dict(factors)}: a loop space of "
                             f"{space.num_subspaces} subspaces, {space.vector_size} entries and "
                             f"up to {int(space.action_nvec.max(initial=0))} directions exceeds "
                             f"the loop heads ({MAX_SUBSPACES} x {MAX_DIRECTIONS}, {MAX_VECTOR})")
        self.factors, self.space, self.visited = factors, space, {}
        info["factors"] = dict(factors)

    def _round_points(self) -> list[LoopPoint]:
        """``batch`` sampled points (MetaSchedule's sampling), in measure mode with the
        layout's best measured points and ``mutations`` of their neighbours."""
        assert self.space is not None
        points = self.space.sample(self.batch, self.np_random)
        if self.backend.measures:
            measured = sorted((lat, i, c.point) for i, (c, lat) in enumerate(
                self.backend.session().measured_items()) if c.factors == self.factors
                and math.isfinite(lat))
            elites = [p for _, _, p in measured[:4]]
            points += elites
            if elites:
                points += [self.space.mutate(elites[i % len(elites)], self.np_random)
                           for i in range(self.mutations)]
        return points

    def _scores(self, points: list[LoopPoint], info: dict[str, Any] | None = None
                ) -> tuple[list[LoopPoint], np.ndarray]:
        """The distinct valid ``points`` and their predicted scores, remembered in
        :attr:`visited`."""
        assert self.space is not None
        valid = [p for p in dict.fromkeys(points) if self.space.decode(p) is not None]
        if not valid:
            return [], np.zeros(0)
        feats = self.backend.features(self.space, valid)
        cands = [Candidate(self.factors, p) for p in valid]
        scores = np.clip(self.backend.scores(cands, feats, self.np_random), 0.0, MAX_SCORE)
        self.visited.update(zip(cands, scores.tolist()))
        self._features = dict(zip(valid, feats))
        return valid, scores

    def _summary_of(self, point: LoopPoint) -> np.ndarray:
        return feature_summary(self._features[point])

    def _move(self, point: LoopPoint, directions: np.ndarray) -> LoopPoint:
        return self.space.step(point, fit_directions(self.space, directions))

    def _encode(self, point: LoopPoint) -> np.ndarray:
        return self.space.encode(point)

    def _loop_nvec(self) -> Sequence[int]:
        return self.space.action_nvec

    def _end_visit(self, info: dict[str, Any] | None = None) -> float:
        """In measure mode, measure the visit's top-k: the reward correction that makes the
        visit's return its measured relative throughput."""
        correction = 0.0
        if self.backend.measures:
            session = self.backend.session()
            known = [lat for c in self.visited if (lat := session.measured(c)) is not None]
            fresh = sorted((c for c in self.visited if session.measured(c) is None),
                           key=self.visited.__getitem__, reverse=True)[:self.top_k]
            latency = min(known + self.backend.measure(fresh), default=math.inf)
            self.backend.calibrate(latency)
            u = self.backend.reference_latency
            value = min(u / latency, MAX_SCORE) if u and math.isfinite(latency) else 0.0
            correction = value - self._best
            if info is not None:
                info["latency"] = latency
        return correction + super()._end_visit(info)
