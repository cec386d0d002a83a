"""What ``altenv envs [ID]`` prints: the registered env ids, their spaces and docs.

Each env is made on a tiny workload (:data:`WORKLOAD`) with ``reward_source="cost_model"``
(nothing is measured, no device is needed) and closed again. Space sizes depend on the
workload's template kind (GMM: 3 knobs, C2D: 6) and its loop space; the docstrings give
the general form.
"""

from __future__ import annotations

import inspect

import gymnasium as gym

from . import ENV_IDS, REPLAYS

WORKLOAD = "gmm:M=16,N=16,K=16"
"""The workload the envs are instantiated on to show concrete spaces."""


def env_ids() -> list[str]:
    """Every registered ``altenv/`` id (the built-in ones first)."""
    extra = sorted(i for i in gym.registry if i.startswith("altenv/") and i not in ENV_IDS)
    return [*ENV_IDS, *extra]


def _spaces(env_id: str, workload: str) -> list[str]:
    """Lines on ``env_id`` made on ``workload``: class, action and observation space (or
    why it could not be made, e.g. an id registered by other code with other arguments)."""
    try:
        env = gym.make(env_id, workload=workload, reward_source="cost_model",
                       disable_env_checker=True)
    except (TypeError, ValueError) as err:
        return [env_id, f"  cannot be made with workload= and reward_source= ({err})"]
    try:
        return [f"{env_id}  ({type(env.unwrapped).__name__})",
                f"  action:      {env.action_space}",
                f"  observation: {env.observation_space}"]
    finally:
        env.close()


def describe(env_id: str | None = None, workload: str = WORKLOAD) -> str:
    """All altenv env ids with their spaces on ``workload``; with ``env_id``, that env's
    spaces and its full docstring (description, spaces, rewards, episodes, arguments).

    Raises ``ValueError`` for an id that is not registered.
    """
    ids = env_ids()
    if env_id is not None and env_id not in ids:
        raise ValueError(f"unknown env id {env_id!r}; registered: {', '.join(ids)}")
    lines = [f"spaces on workload {workload} (reward_source='cost_model')", ""]
    for i in ids if env_id is None else [env_id]:
        lines += _spaces(i, workload)
    if env_id is None:
        lines += ["", "details: altenv envs ID"]
    else:
        cls = ENV_IDS.get(env_id) or gym.spec(env_id).entry_point
        if isinstance(cls, str):
            cls = gym.envs.registration.load_env_creator(cls)
        lines += ["", inspect.getdoc(cls) or ""]
        replay = REPLAYS.get(env_id)
        if replay is not None:
            lines += ["", f"# With reward_source='dataset': {replay.__name__}", "",
                      inspect.getdoc(replay) or ""]
    return "\n".join(lines) + "\n"
