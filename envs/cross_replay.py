"""``altenv/CrossExploration-v0`` with ``reward_source="dataset"``: cross exploration
replayed from a measured-program dataset, thousands of steps a second, no device."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from altenv.datapath import DEFAULT_DATASET
from altenv.dataset.replay import LayoutReplay, Point
from altenv.dataset.surrogate import Surrogate
from altenv.ops.features import WORKLOAD_FEATURES

from .common import FEATURES, checked_action
from .cross import (
    ACTION_NVEC,
    BINS,
    HEAD_NAMES,
    MAX_SCORE,
    OBS_SIZE,
    PHASE,
    SLOTS,
    bin_choices,
    factors_from_bins,
)
from .replay_common import ReplaySource
from .wrappers import MAX_DIRECTIONS, MAX_SUBSPACES, MAX_VECTOR


class CrossExplorationReplayEnv(gym.Env):
    """Cross exploration (:class:`envs.CrossExplorationEnv`) on a dataset's programs.

    ## Description

    The same episodes, spaces and rewards as ``CrossExplorationEnv`` in ``cost_model``
    mode, with the dataset in place of the device and the cost model. Each reset draws a
    workload of ``workload`` (a URI ``altenv://<dataset>/<workload>``, a list of them, or
    ``None``: every workload of ``dataset``). A layout step picks split factors as the
    live env does; the visit then explores the dataset's layout nearest them (a dataset
    holds up to a dozen layouts a workload; ``info["layout_in_data"]`` says whether the
    choice was one of them). A round's batch is ``batch`` of the layout's measured
    programs; a loop step moves every subspace one step in its direction on the layout's
    loop space (rebuilt from the dataset, so the moves are ``LoopSpace``'s).

    ## Rewards

    A point's score is its throughput relative to the workload's best program in the
    dataset: ``best / latency``. A measured program is **replayed**: its latency is one
    of its own timings drawn at random, so the reward carries the measured noise; any
    other point is **predicted** by the dataset's surrogate (``altenv dataset
    surrogate``). ``info["replayed"]`` says which. A layout step earns the best score of
    the visit's first batch, a loop step how much it raised the visit's best score.

    ## Action Space, Observation Space, Episode End

    As ``CrossExplorationEnv``: ``MultiDiscrete([12] * 16 + [32] * 48)`` with
    ``action_masks()``, ``Box(0, 1, (575,), float32)``, truncated after
    ``episode_layouts`` visits, never terminated. An action outside the action space
    raises ``ValueError``.

    ## Arguments

    | argument        | default   | meaning                                              |
    |-----------------|-----------|------------------------------------------------------|
    | workload        | None      | a dataset URI, a list of them, or None (all)         |
    | dataset         | "cpu-v0"  | dataset name or directory (when no URI names one)    |
    | episode_layouts | 4         | layout visits per episode                            |
    | loop_rounds     | 2         | sampled batches (and walks) per visit                |
    | walk_length     | 16        | loop steps per round                                 |
    | batch           | 32        | measured programs drawn per round                    |
    | surrogate       | None      | a ``Surrogate`` or path (default: the dataset's)     |

    ``env.unwrapped`` exposes ``best_latency`` (the fastest latency seen, replayed or
    predicted), ``best_replayed`` and ``workload`` (the current ``WorkloadReplay``).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, workload: str | Sequence[str] | None = None, *,
                 dataset: str = DEFAULT_DATASET, episode_layouts: int = 4,
                 loop_rounds: int = 2, walk_length: int = 16, batch: int = 32,
                 surrogate: Surrogate | str | None = None, render_mode: str | None = None,
                 reward_source: str = "dataset", **unused: Any):
        if reward_source != "dataset":
            raise ValueError(f"CrossExplorationReplayEnv replays a dataset; reward_source "
                             f"must be 'dataset', got {reward_source!r}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if min(episode_layouts, loop_rounds, walk_length, batch) < 1:
            raise ValueError("episode_layouts, loop_rounds, walk_length and batch must be >= 1")
        self.source = ReplaySource(workload, dataset, surrogate, unused)
        self.dataset, self.names = self.source.dataset, self.source.names
        self.episode_layouts, self.loop_rounds, self.walk_length, self.batch = (
            episode_layouts, loop_rounds, walk_length, batch)
        self.render_mode = render_mode
        self.action_space = spaces.MultiDiscrete(np.array(ACTION_NVEC))
        self.observation_space = spaces.Box(0.0, 1.0, (OBS_SIZE,), dtype=np.float32)
        self._select(self.names[0])
        self._visit = self._round = self._walked = 0
        self._score = self._best = 0.0
        self.best_latency, self.best_replayed = math.inf, False
        self._last: dict[str, Any] = {}

    # ------------------------------------------------------------------ workloads
    def _select(self, name: str) -> None:
        self.workload, self.template = self.source.get(name)
        self.layout: LayoutReplay = self.workload.framework()
        self.point: Point | None = None
        self._summary = np.zeros(2 * FEATURES, dtype=np.float32)

    @property
    def layout_phase(self) -> bool:
        return self.point is None

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._select(self.names[int(self.np_random.integers(len(self.names)))])
        self._visit = 0
        self.best_latency, self.best_replayed = math.inf, False
        info = {"workload": self.source.uri(self.workload.name)}
        self._last = info
        return self._observe(), info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        action = checked_action(self.action_space, action, HEAD_NAMES)
        info: dict[str, Any] = {}
        if self.layout_phase:
            factors = factors_from_bins(self.template, action[:len(SLOTS)])
            self.layout, exact = self.workload.nearest_layout(factors)
            info.update(factors=dict(self.layout.factors), layout_in_data=exact)
            self._start_visit(info)
            reward = self._best
        else:
            reward = self._walk(action[len(SLOTS):], info)
        truncated = self._visit >= self.episode_layouts
        info["score"] = self._score
        self._last = info
        return self._observe(), float(reward), False, truncated, info

    def action_masks(self) -> np.ndarray:
        masks = np.zeros((len(SLOTS) * BINS + MAX_SUBSPACES * MAX_DIRECTIONS,), dtype=bool)
        layout = masks[:len(SLOTS) * BINS].reshape(len(SLOTS), BINS)
        loop = masks[len(SLOTS) * BINS:].reshape(MAX_SUBSPACES, MAX_DIRECTIONS)
        layout[:, 0] = loop[:, 0] = True
        if self.layout_phase:
            for knob in self.template.knobs:
                layout[SLOTS.index(knob.name)] = [
                    c is not None or b == 0 for b, c in enumerate(bin_choices(knob.extent))]
        else:
            for i, n in enumerate(self.layout.nvec[:MAX_SUBSPACES]):
                loop[i, :min(int(n), MAX_DIRECTIONS)] = True
        return masks

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        last = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in self._last.items())
        return (f"{self.workload.name} visit {self._visit}/{self.episode_layouts} round "
                f"{self._round} step {self._walked}: {last}\n")

    # ------------------------------------------------------------------ visits
    def _score_of(self, point: Point, info: dict[str, Any] | None = None) -> float:
        latency, replayed = self.workload.latency(self.layout, point, self.np_random)
        if latency < self.best_latency:
            self.best_latency, self.best_replayed = latency, replayed
        if info is not None:
            info.update(latency=latency, replayed=replayed)
        return min(self.workload.best / latency, MAX_SCORE) if latency > 0 else 0.0

    def _start_visit(self, info: dict[str, Any]) -> None:
        self._round, self._best = 0, 0.0
        self._sample_round(info)

    def _sample_round(self, info: dict[str, Any]) -> None:
        rows = self.layout.sampled
        if not rows:  # a layout every program of which failed to build
            self.point = None
            self._end_visit()
            return
        take = self.np_random.choice(len(rows), min(self.batch, len(rows)), replace=False)
        points = [self.workload.data.decisions[rows[i]] for i in take]
        if self.point is not None:
            points.append(self.point)
        scores = [self._score_of(p) for p in points]
        i = int(np.argmax(scores))
        self.point, self._score, self._walked = points[i], float(scores[i]), 0
        self._summary = self.workload.features(self.layout, self.point)
        self._best = max(self._best, self._score)
        info.setdefault("replayed", True)

    def _walk(self, directions: np.ndarray, info: dict[str, Any]) -> float:
        assert self.point is not None
        before = self._best
        self.point = self.layout.step(self.point, directions)
        self._score = self._score_of(self.point, info)
        self._summary = self.workload.features(self.layout, self.point)
        self._best = max(self._best, self._score)
        self._walked += 1
        reward = self._best - before
        if self._walked >= self.walk_length:
            self._round += 1
            if self._round < self.loop_rounds:
                seen = self._best
                self._sample_round(info)
                reward += self._best - seen
            else:
                self._end_visit()
        return reward

    def _end_visit(self) -> None:
        self._visit += 1
        self.point = None

    # ------------------------------------------------------------------ observation
    def _observe(self) -> np.ndarray:
        obs = np.zeros(OBS_SIZE, dtype=np.float32)
        loop = not self.layout_phase
        obs[PHASE] = float(not loop)
        obs[1] = self._walked / self.walk_length if loop else 0.0
        obs[2] = self._visit / self.episode_layouts
        at = 3
        obs[at:at + WORKLOAD_FEATURES] = self.workload.workload_features
        at += WORKLOAD_FEATURES
        for knob in self.template.knobs:
            s = at + 3 * SLOTS.index(knob.name)
            obs[s:s + 3] = (min(math.log2(self.layout.factors[knob.name]) / BINS, 1.0),
                            min(math.log2(knob.extent) / BINS, 1.0), 1.0)
        at += 3 * len(SLOTS)
        if loop:
            assert self.point is not None
            enc = self.layout.encode(self.point)[:MAX_VECTOR]
            obs[at:at + len(enc)] = enc
            obs[at + MAX_VECTOR:at + MAX_VECTOR + 2 * FEATURES] = self._summary
            obs[-2:] = (self._score / MAX_SCORE, self._best / MAX_SCORE)
        return np.clip(obs, 0.0, 1.0)

