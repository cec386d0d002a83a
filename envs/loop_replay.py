"""``altenv/LoopTuning-v0`` with ``reward_source="dataset"``: ALT's loop walk on one layout
of a dataset's workload, replayed."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from altenv.dataset.replay import Point
from altenv.dataset.surrogate import Surrogate

from .common import FEATURES, RENDER_MODES, check_render_mode, checked_action, info_line
from .replay_common import ReplaySource


class LoopTuningReplayEnv(gym.Env):
    """The loop walk of :class:`envs.LoopTuningEnv` on a dataset's programs.

    ## Description

    One workload of a dataset (``workload``: a URI ``altenv://<dataset>/<workload>``) and
    one of its layouts (``layout``: template factors the dataset holds; default the
    framework layout). Reset draws ``batch`` of the layout's measured programs and starts
    from the fastest (one of each program's timings drawn at random); each step moves
    every subspace one step in its direction on the layout's loop space, rebuilt from the
    dataset (``LoopSpace``'s moves, less the validity check that needs the program).

    ## Action Space

    ``MultiDiscrete(nvec)``: one direction per subspace, as ``LoopTuning-v0``'s; 0 stays.
    ``action_masks()`` allows every direction of every subspace. An action outside the
    space raises ``ValueError``.

    ## Observation Space

    ``Box(0, 1, (vector_size + 400,), float32)``: the point's encoding, then the mean and
    max of its program features (a measured program's own; elsewhere those of the layout's
    measured program nearest it).

    ## Rewards

    The new point's throughput relative to the workload's best program in the dataset,
    ``best / latency``: a measured program's latency is one of its own timings drawn at
    random (``info["replayed"]`` True), any other point's the dataset surrogate's
    prediction (False); 0 for a program that failed.

    ## Episode End

    Truncated after ``episode_length`` steps; never terminated.

    ## Arguments

    | argument       | default  | meaning                                              |
    |----------------|----------|------------------------------------------------------|
    | workload       | required | a dataset URI                                        |
    | layout         | None     | template factors held by the dataset (None: the      |
    |                |          | framework layout)                                    |
    | batch          | 128      | measured programs drawn at reset (at most the        |
    |                |          | layout's)                                            |
    | episode_length | 128      | steps per episode                                    |
    | surrogate      | None     | a ``Surrogate`` or path (default: the dataset's)     |
    """

    metadata = {"render_modes": RENDER_MODES, "render_fps": 4}

    def __init__(self, workload: str | None = None, *, layout: Mapping[str, int] | None = None,
                 batch: int = 128, episode_length: int = 128, dataset: str | None = None,
                 surrogate: Surrogate | str | None = None, render_mode: str | None = None,
                 reward_source: str = "dataset", **unused: Any):
        if min(batch, episode_length) < 1:
            raise ValueError("batch and episode_length must be >= 1")
        check_render_mode(render_mode)
        self.source = ReplaySource(self, workload, dataset, surrogate, reward_source, unused,
                                   one="LoopTuning-v0")
        self.workload, _ = self.source.get(self.source.names[0])
        if layout is None:
            self.layout = self.workload.framework()
        else:
            found, exact = self.workload.nearest_layout(dict(layout))
            if not exact:
                held = [lay.factors for lay in self.workload.layouts]
                raise ValueError(f"layout {dict(layout)}: not in the dataset for "
                                 f"{workload}; it holds {held}")
            self.layout = found
        if not len(self.layout.rows):
            raise ValueError(f"layout {self.layout.factors}: no program of it in the dataset")
        self.batch, self.episode_length, self.render_mode = batch, episode_length, render_mode
        self.action_space = spaces.MultiDiscrete(self.layout.nvec)
        self._head_names = tuple(f"subspace {sub.name}" for sub in self.layout.subspaces)
        size = sum(self.layout.sizes) + 2 * FEATURES
        self.observation_space = spaces.Box(0.0, 1.0, (size,), dtype=np.float32)
        self.point: Point = self.workload.data.decisions[int(self.layout.rows[0])]
        self.best_latency, self.best_replayed = math.inf, False
        self._t = 0
        self._last: dict[str, Any] = {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        rows = self.layout.sampled
        take = self.np_random.choice(len(rows), min(self.batch, len(rows)), replace=False)
        points = [self.workload.data.decisions[rows[i]] for i in take]
        latencies = [self._latency(p)[0] for p in points]
        self.point = points[int(np.argmin(latencies))]
        self._t = 0
        self._last = {"workload": self.source.uri(self.workload.name),
                      "factors": dict(self.layout.factors)}
        return self._observe(), dict(self._last)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        directions = checked_action(self.action_space, action, self._head_names)
        self.point = self.layout.step(self.point, directions)
        latency, replayed = self._latency(self.point)
        self._t += 1
        reward = self.workload.best / latency if math.isfinite(latency) else 0.0
        info = {"latency": latency, "replayed": replayed, "score": reward}
        self._last = info
        return self._observe(), float(reward), False, self._t >= self.episode_length, info

    def action_masks(self) -> np.ndarray:
        return np.ones(int(self.layout.nvec.sum()), dtype=bool)

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        last = info_line(self._last)
        return f"step {self._t}/{self.episode_length}: {last}\n"

    def _latency(self, point: Point) -> tuple[float, bool]:
        latency, replayed = self.workload.latency(self.layout, point, self.np_random)
        if latency < self.best_latency:
            self.best_latency, self.best_replayed = latency, replayed
        return latency, replayed

    def _observe(self) -> np.ndarray:
        obs = np.concatenate([self.layout.encode(self.point),
                              self.workload.features(self.layout, self.point)])
        return np.clip(obs, 0.0, 1.0).astype(np.float32)
