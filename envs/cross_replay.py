"""``altenv/CrossExploration-v0`` with ``reward_source="dataset"``: cross exploration
replayed from a measured-program dataset, thousands of steps a second, no device."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from altenv.datapath import DEFAULT_DATASET
from altenv.dataset.replay import LayoutReplay, Point
from altenv.dataset.surrogate import Surrogate

from .cross import MAX_SCORE, CrossExplorationBase
from .replay_common import ReplaySource


class CrossExplorationReplayEnv(CrossExplorationBase):
    """Cross exploration (:class:`envs.CrossExplorationEnv`) on a dataset's programs.

    ## Description

    The same episodes, spaces and rewards as ``CrossExplorationEnv`` in ``cost_model``
    mode (:class:`envs.cross.CrossExplorationBase` runs both), with the dataset in place
    of the device and the cost model. Each reset draws a workload of ``workload`` (a URI
    ``altenv://<dataset>/<workload>``, a list of them, or ``None``: every workload of
    ``dataset``). A layout step picks split factors as the live env does; the visit then
    explores the dataset's layout nearest them (a dataset holds up to a dozen layouts a
    workload; ``info["layout_in_data"]`` says whether the choice was one of them). A
    round's batch is ``batch`` of the layout's measured programs; a loop step moves every
    subspace one step in its direction on the layout's loop space (rebuilt from the
    dataset, so the moves are ``LoopSpace``'s).

    ## Rewards

    A point's score is its throughput relative to the workload's best program in the
    dataset: ``best / latency``. A measured program is **replayed**: its latency is one
    of its own timings drawn at random, so the reward carries the measured noise; any
    other point is **predicted** by the dataset's surrogate (``altenv dataset
    surrogate``). ``info["replayed"]`` says which. The rewards are made of these scores
    as in ``cost_model`` mode.

    ## Action Space, Observation Space, Episode End

    As ``CrossExplorationEnv`` (the observation's features are a measured program's own,
    elsewhere those of the layout's measured program nearest the point).

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

    def __init__(self, workload: str | Sequence[str] | None = None, *,
                 dataset: str = DEFAULT_DATASET, episode_layouts: int = 4,
                 loop_rounds: int = 2, walk_length: int = 16, batch: int = 32,
                 surrogate: Surrogate | str | None = None, render_mode: str | None = None,
                 reward_source: str = "dataset", **unused: Any):
        super().__init__(episode_layouts, loop_rounds, walk_length, batch, render_mode)
        self.source = ReplaySource(self, workload, dataset, surrogate, reward_source, unused)
        self.dataset, self.names = self.source.dataset, self.source.names
        self._select(self.names[0])
        self.best_latency, self.best_replayed = math.inf, False

    def _select(self, name: str) -> None:
        self.workload, self.template = self.source.get(name)
        self.layout: LayoutReplay = self.workload.framework()
        self._workload_features = self.workload.workload_features

    @property
    def factors(self) -> dict[str, int]:  # the visit's layout's
        return self.layout.factors

    def render(self) -> str | None:
        text = super().render()
        return None if text is None else f"{self.workload.name} {text}"

    # ------------------------------------------------------------------ the replayed visit
    def _start_episode(self) -> str:
        self._select(self.names[int(self.np_random.integers(len(self.names)))])
        self.best_latency, self.best_replayed = math.inf, False
        return self.source.uri(self.workload.name)

    def _enter(self, factors: Mapping[str, int], info: dict[str, Any]) -> None:
        self.layout, exact = self.workload.nearest_layout(factors)
        info.update(factors=dict(self.layout.factors), layout_in_data=exact)
        if self.layout.sampled:  # else every program of the layout failed to build
            info["replayed"] = True  # the first batch

    def _round_points(self) -> list[Point]:
        rows = self.layout.sampled
        if not rows:
            return []
        take = self.np_random.choice(len(rows), min(self.batch, len(rows)), replace=False)
        return [self.workload.data.decisions[rows[i]] for i in take]

    def _scores(self, points: list[Point], info: dict[str, Any] | None = None
                ) -> tuple[list[Point], np.ndarray]:
        scores = np.empty(len(points))
        for j, point in enumerate(points):
            latency, replayed = self.workload.latency(self.layout, point, self.np_random)
            if latency < self.best_latency:
                self.best_latency, self.best_replayed = latency, replayed
            if info is not None:
                info.update(latency=latency, replayed=replayed)
            scores[j] = min(self.workload.best / latency, MAX_SCORE) if latency > 0 else 0.0
        return points, scores

    def _summary_of(self, point: Point) -> np.ndarray:
        return self.workload.features(self.layout, point)

    def _move(self, point: Point, directions: np.ndarray) -> Point:
        return self.layout.step(point, directions)

    def _encode(self, point: Point) -> np.ndarray:
        return self.layout.encode(point)

    def _loop_nvec(self) -> Sequence[int]:
        return self.layout.nvec
