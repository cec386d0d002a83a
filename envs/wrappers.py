"""Fixed-size loop interfaces, so one loop policy serves every layout and workload.

A loop space's size depends on the program: its subspaces (one per MetaSchedule
sampling decision) and their directions change with the layout. ALT trains its loop
actors across layouts and pretrains them across workloads (§6, §7.3.1), which needs one
observation and action shape. :class:`PaddedLoop` pads ``altenv/LoopTuning-v0``'s
observation to ``max_vector`` point entries and widens its action to ``max_subspaces``
heads of ``max_directions``; a head's choice is folded onto its subspace's directions
(``a mod nvec``) and heads past the last subspace are ignored. :class:`LoopActor` turns a
trained policy into the ``loop_policy`` callable of ``altenv/JointTuning-v0``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from altenv.costmodel import extract_features, feature_summary
from altenv.space import LoopPoint, LoopSpace

from .common import FEATURES, checked_action, finite_action

MAX_SUBSPACES = 48
MAX_DIRECTIONS = 32
MAX_VECTOR = 96


def padded_observation(space: LoopSpace, encoded: np.ndarray, summary: np.ndarray,
                       max_vector: int = MAX_VECTOR) -> np.ndarray:
    """``[encode(point) zero-padded to max_vector, feature summary]``."""
    if space.vector_size > max_vector:
        raise ValueError(f"loop space of {space.vector_size} entries exceeds max_vector="
                         f"{max_vector}")
    out = np.zeros(max_vector + 2 * FEATURES, dtype=np.float32)
    out[:space.vector_size] = encoded
    out[max_vector:] = summary
    return out


def fit_directions(space: LoopSpace, action: np.ndarray) -> np.ndarray:
    """A padded action as one direction per subspace of ``space``."""
    n = space.num_subspaces
    if n > len(action):
        raise ValueError(f"loop space has {n} subspaces, the policy only {len(action)} heads")
    return finite_action(action)[:n].astype(np.int64) % space.action_nvec


class PaddedLoop(gym.Wrapper):
    """Pad a ``LoopTuningEnv`` to fixed observation and action shapes.

    Parameters
    ----------
    env:
        An ``altenv/LoopTuning-v0`` environment.
    max_subspaces, max_directions, max_vector:
        The fixed shapes: action ``MultiDiscrete([max_directions] * max_subspaces)``,
        observation ``Box(0, 1, (max_vector + 328,))``.

    An action outside that action space raises ``ValueError`` naming the head and its
    allowed range; inside it, a head is folded onto its subspace's directions.
    """

    def __init__(self, env: gym.Env, max_subspaces: int = MAX_SUBSPACES,
                 max_directions: int = MAX_DIRECTIONS, max_vector: int = MAX_VECTOR):
        super().__init__(env)
        self.max_vector = max_vector
        space = self.loop_space
        if space.num_subspaces > max_subspaces or int(space.action_nvec.max()) > max_directions:
            raise ValueError(f"loop space with {space.num_subspaces} subspaces and up to "
                             f"{int(space.action_nvec.max())} directions exceeds the padding "
                             f"({max_subspaces} x {max_directions})")
        self.action_space = spaces.MultiDiscrete(np.full(max_subspaces, max_directions))
        self._head_names = tuple(f"loop direction {j}" for j in range(max_subspaces))
        self.observation_space = spaces.Box(0.0, 1.0, (max_vector + 2 * FEATURES,),
                                            dtype=np.float32)

    @property
    def loop_space(self) -> LoopSpace:
        return self.env.unwrapped.space

    def _pad(self, obs: np.ndarray) -> np.ndarray:
        n = self.loop_space.vector_size
        return padded_observation(self.loop_space, obs[:n], obs[n:], self.max_vector)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._pad(obs), info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        action = checked_action(self.action_space, action, self._head_names)
        obs, reward, terminated, truncated, info = self.env.step(
            fit_directions(self.loop_space, action))
        return self._pad(obs), reward, terminated, truncated, info


class LoopActor:
    """A padded loop policy (e.g. SB3 ``model.predict``) as JointTuning's ``loop_policy``.

    Parameters
    ----------
    predict:
        ``predict(observation) -> action``, e.g. ``lambda o: model.predict(o)[0]``.
    max_vector:
        The padding the policy was trained with.
    """

    def __init__(self, predict: Any, max_vector: int = MAX_VECTOR):
        self.predict = predict
        self.max_vector = max_vector

    def __call__(self, space: LoopSpace, point: LoopPoint, rng: np.random.Generator
                 ) -> np.ndarray:
        schedule = space.decode(point)
        feats = extract_features(space.context, [schedule])[0] if schedule is not None \
            else np.zeros((0, FEATURES), np.float32)
        obs = padded_observation(space, space.encode(point), feature_summary(feats),
                                 self.max_vector)
        return fit_directions(space, np.asarray(self.predict(obs)))
