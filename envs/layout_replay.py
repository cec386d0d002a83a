"""``altenv/LayoutTuning-v0`` with ``reward_source="dataset"``: ALT's layout split actor on
a dataset's workloads, each layout valued by its replayed programs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from altenv.dataset.surrogate import Surrogate
from altenv.tuning import freeze

from .common import RENDER_MODES, check_render_mode, checked_action, info_line
from .replay_common import ReplaySource

ACTION_TYPES = ("continuous", "discrete")


class LayoutTuningReplayEnv(gym.Env):
    """The split factors of :class:`envs.LayoutTuningEnv`, valued on a dataset.

    ## Description

    One workload of a dataset (``workload``: a URI). Each step picks every split factor
    of the workload's layout template, as ``LayoutTuning-v0`` does; the dataset's layout
    nearest them (in ``log2`` of every tile; ``info["layout_in_data"]`` says whether it is
    the one chosen) is valued by ``loop_rounds`` rounds of ``batch`` of its measured
    programs, each timed by one of its own timings drawn at random.

    ## Action Space, Observation Space

    As ``LayoutTuning-v0``: ``Box(0, 1, (n_knobs,))`` (ALT Eq. 2) or, with
    ``action_type="discrete"``, ``MultiDiscrete([n_div] * n_knobs)`` with
    ``action_masks()``; the template's layout state. An action outside the space raises
    ``ValueError``.

    ## Rewards

    The best throughput of the layout's drawn programs relative to the workload's best
    program in the dataset (``best / latency``: about 1 for the best program, a little
    more when one of its timings falls below its median); 0 if they all failed.

    ## Starting State, Episode End

    The template's default (framework) layout; truncated after ``episode_length`` steps,
    never terminated.

    ## Arguments

    | argument       | default      | meaning                                       |
    |----------------|--------------|-----------------------------------------------|
    | workload       | required     | a dataset URI                                 |
    | action_type    | "continuous" | "continuous" or "discrete"                    |
    | episode_length | 4            | layout steps per episode                      |
    | batch          | 128          | measured programs drawn per round             |
    | loop_rounds    | 1            | rounds per layout evaluation                  |
    """

    metadata = {"render_modes": RENDER_MODES, "render_fps": 4}

    def __init__(self, workload: str | None = None, *, action_type: str = "continuous",
                 episode_length: int = 4, batch: int = 128, loop_rounds: int = 1,
                 dataset: str | None = None, surrogate: Surrogate | str | None = None,
                 render_mode: str | None = None, reward_source: str = "dataset",
                 **unused: Any):
        if action_type not in ACTION_TYPES:
            raise ValueError(f"action_type must be one of {ACTION_TYPES}, got {action_type!r}")
        if min(episode_length, batch, loop_rounds) < 1:
            raise ValueError("episode_length, batch and loop_rounds must be >= 1")
        check_render_mode(render_mode)
        self.source = ReplaySource(self, workload, dataset, surrogate, reward_source, unused,
                                   one="LayoutTuning-v0")
        self.workload, self.template = self.source.get(self.source.names[0])
        self.action_type, self.episode_length = action_type, episode_length
        self.batch, self.loop_rounds, self.render_mode = batch, loop_rounds, render_mode
        n = len(self.template.knobs)
        self.action_space = (spaces.Box(0.0, 1.0, (n,), dtype=np.float32)
                             if action_type == "continuous" else
                             spaces.MultiDiscrete(self.template.action_nvec()))
        self._head_names = tuple(f"knob {k.name}" for k in self.template.knobs)
        size = len(self.template.observation(self.template.default_factors()))
        self.observation_space = spaces.Box(0.0, 1.0, (size,), dtype=np.float32)
        self.factors = self.template.default_factors()
        self.best_latency = math.inf
        self._t = 0
        self._last: dict[str, Any] = {}

    def action_masks(self) -> np.ndarray:
        if self.action_type != "discrete":
            raise ValueError("action masks need action_type='discrete'")
        return self.template.action_mask(lambda knob: set(
            self.template.choices(next(k for k in self.template.knobs if k.name == knob))))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.factors = self.template.default_factors()
        self._t = 0
        self.best_latency = math.inf
        self._last = {"workload": self.source.uri(self.workload.name),
                      "factors": dict(self.factors)}
        return self._observe(), dict(self._last)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        values = checked_action(self.action_space, action, self._head_names)
        chosen = (self.template.factors_from_actions(values)
                  if self.action_type == "continuous"
                  else self.template.factors_from_indices(values))
        layout, exact = self.workload.nearest_layout(chosen)
        self.factors = dict(layout.factors)
        latency = self._evaluate(layout)
        self._t += 1
        score = self.workload.best / latency if math.isfinite(latency) else 0.0
        info = {"factors": dict(self.factors), "layout_in_data": exact,
                "chosen": dict(freeze(chosen)), "latency": latency, "score": score}
        self._last = info
        return self._observe(), float(score), False, self._t >= self.episode_length, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        last = info_line(self._last)
        return f"layout step {self._t}/{self.episode_length}: {last}\n"

    def _evaluate(self, layout: Any) -> float:
        rows: Sequence[int] = layout.sampled
        best = math.inf
        for _ in range(self.loop_rounds if rows else 0):
            take = self.np_random.choice(len(rows), min(self.batch, len(rows)), replace=False)
            for i in take:
                point = self.workload.data.decisions[rows[i]]
                best = min(best, self.workload.latency(layout, point, self.np_random)[0])
        self.best_latency = min(self.best_latency, best)
        return best

    def _observe(self) -> np.ndarray:
        return np.clip(self.template.observation(self.factors), 0.0, 1.0).astype(np.float32)
