"""Gymnasium environments of altenv; importing this package registers their ids.

| id                          | class                        | explores                          |
|-----------------------------|------------------------------|-----------------------------------|
| ``altenv/LayoutTuning-v0``  | :class:`LayoutTuningEnv`     | layout template split factors     |
| ``altenv/LoopTuning-v0``    | :class:`LoopTuningEnv`       | one loop space, layouts fixed     |
| ``altenv/JointTuning-v0``   | :class:`JointTuningEnv`      | layouts, loop rounds in between   |
| ``altenv/CrossExploration-v0`` | :class:`CrossExplorationEnv` | layouts and loops, one policy  |

The ids are registered as nondeterministic: by default rewards are measured latencies.
With ``reward_source="cost_model"`` and a seed, episodes are reproducible.
``altenv/CrossExploration-v0`` with ``reward_source="dataset"`` replays a measured-program
dataset (:class:`CrossExplorationReplayEnv`; no workload: the shipped dataset's).
"""

import gymnasium as gym

from .cross import CrossExplorationEnv
from .cross_replay import CrossExplorationReplayEnv, make_cross_exploration
from .joint import JointTuningEnv, random_directions
from .layout import LayoutTuningEnv
from .loop import LoopTuningEnv

ENV_IDS = {
    "altenv/LayoutTuning-v0": LayoutTuningEnv,
    "altenv/LoopTuning-v0": LoopTuningEnv,
    "altenv/JointTuning-v0": JointTuningEnv,
    "altenv/CrossExploration-v0": CrossExplorationEnv,
}

ENTRY_POINTS = {"altenv/CrossExploration-v0": make_cross_exploration}
"""Ids whose entry point picks the class by ``reward_source`` (``"dataset"``: a replay)."""

for _id, _cls in ENV_IDS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=ENTRY_POINTS.get(
            _id, f"{_cls.__module__}:{_cls.__name__}"), nondeterministic=True)

__all__ = ["ENV_IDS", "CrossExplorationEnv", "CrossExplorationReplayEnv", "JointTuningEnv",
           "LayoutTuningEnv", "LoopTuningEnv", "random_directions"]
