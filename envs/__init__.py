"""Gymnasium environments of altenv; importing this package registers their ids.

| id                          | class                        | explores                          |
|-----------------------------|------------------------------|-----------------------------------|
| ``altenv/LayoutTuning-v0``  | :class:`LayoutTuningEnv`     | layout template split factors     |
| ``altenv/LoopTuning-v0``    | :class:`LoopTuningEnv`       | one loop space, layouts fixed     |
| ``altenv/JointTuning-v0``   | :class:`JointTuningEnv`      | layouts, loop rounds in between   |
| ``altenv/CrossExploration-v0`` | :class:`CrossExplorationEnv` | layouts and loops, one policy  |

The ids are registered as nondeterministic: by default rewards are measured latencies.
With ``reward_source="cost_model"`` and a seed, episodes are reproducible.
With ``reward_source="dataset"``, ``CrossExploration-v0``, ``LayoutTuning-v0`` and
``LoopTuning-v0`` replay a measured-program dataset (:data:`REPLAYS`; CrossExploration with
no workload: every workload of the shipped dataset).
"""

import gymnasium as gym

from .cross import CrossExplorationEnv
from .cross_replay import CrossExplorationReplayEnv
from .joint import JointTuningEnv, random_directions
from .layout import LayoutTuningEnv
from .layout_replay import LayoutTuningReplayEnv
from .loop import LoopTuningEnv
from .loop_replay import LoopTuningReplayEnv

ENV_IDS = {
    "altenv/LayoutTuning-v0": LayoutTuningEnv,
    "altenv/LoopTuning-v0": LoopTuningEnv,
    "altenv/JointTuning-v0": JointTuningEnv,
    "altenv/CrossExploration-v0": CrossExplorationEnv,
}

REPLAYS = {
    "altenv/LayoutTuning-v0": LayoutTuningReplayEnv,
    "altenv/LoopTuning-v0": LoopTuningReplayEnv,
    "altenv/JointTuning-v0": None,
    "altenv/CrossExploration-v0": CrossExplorationReplayEnv,
}
"""The class each id makes with ``reward_source="dataset"`` (a dataset replayed)."""


def _entry_point(env_id: str):
    """``gym.make``'s entry point of ``env_id``: the live env, or its replay for
    ``reward_source="dataset"``."""
    live, replay = ENV_IDS[env_id], REPLAYS[env_id]

    def make(*args, reward_source: str = "measure", **kwargs) -> gym.Env:
        if reward_source != "dataset":
            return live(*args, reward_source=reward_source, **kwargs)
        if replay is None:
            raise ValueError(f"{env_id}: reward_source='dataset' is not available (its "
                             "loop_policy walks a live LoopSpace); replay with "
                             "altenv/CrossExploration-v0, LayoutTuning-v0 or LoopTuning-v0")
        return replay(*args, **kwargs)

    return make


for _id in ENV_IDS:
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry_point(_id), nondeterministic=True)

__all__ = ["ENV_IDS", "REPLAYS", "CrossExplorationEnv", "CrossExplorationReplayEnv",
           "JointTuningEnv", "LayoutTuningEnv", "LayoutTuningReplayEnv", "LoopTuningEnv",
           "LoopTuningReplayEnv", "random_directions"]
