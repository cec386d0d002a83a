"""Drive the altenv environments with Stable-Baselines3: a custom features extractor for
PPO on ``altenv/JointTuning-v0``, and A2C on the discrete ``altenv/LayoutTuning-v0``.

Run from the repository root (about half a minute with the defaults)::

    .venv/bin/python examples/sb3_custom_extractor.py
    .venv/bin/python examples/sb3_custom_extractor.py --timesteps 256 \\
        --cost-model runs/mm64/costmodel.npz

Rewards come from the cost model (``reward_source="cost_model"``, nothing is measured).
Without ``--cost-model`` that model is untrained and the rewards are random scores (the
env warns): the script then only shows the plumbing. For rewards that mean something,
give the ``costmodel.npz`` of a tuning run of the same workload, e.g. after
``altenv tune --workload gmm:M=64,N=64,K=64 --name mm64 --budget 32``, or use
``reward_source="measure"`` (real timings, much slower).
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

import envs  # noqa: F401  (registers the altenv/ ids)

WORKLOAD = "gmm:M=64,N=64,K=64"
TIMESTEPS = 64  # layout steps per algorithm
N_STEPS = 16  # rollout length between policy updates
ENV_OPTIONS = {"batch": 16, "episode_length": 4, "loop_rounds": 1}
JOINT_OPTIONS = {"walk_length": 8}  # loop random-walk steps per round of a layout


class LayoutStateExtractor(BaseFeaturesExtractor):
    """Two MLP branches over the layout observation: the knob part (per knob the chosen
    factor and the dim's size, ``2 * n_knobs`` entries) and the tensor part (every
    tensor's primitive state), joined into ``features_dim`` features."""

    def __init__(self, observation_space: gym.spaces.Box, n_knobs: int,
                 features_dim: int = 64, hidden: int = 32):
        super().__init__(observation_space, features_dim)
        self.n_knobs = n_knobs
        tensor_size = int(np.prod(observation_space.shape)) - 2 * n_knobs
        self.knobs = nn.Sequential(nn.Linear(2 * n_knobs, hidden), nn.ReLU())
        self.tensors = nn.Sequential(nn.Linear(tensor_size, hidden), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(2 * hidden, features_dim), nn.ReLU())

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        split = 2 * self.n_knobs
        return self.head(torch.cat([self.knobs(observations[:, :split]),
                                    self.tensors(observations[:, split:])], dim=1))


def make_env(env_id: str, workload: str, cost_model: str | None, **options: object
             ) -> gym.Env:
    """An altenv env rewarded by the cost model (a saved ``costmodel.npz`` or untrained)."""
    return gym.make(env_id, workload=workload, reward_source="cost_model",
                    cost_model=cost_model, **{**ENV_OPTIONS, **options})


def policy_layout(model: PPO | A2C, env: gym.Env) -> dict[str, int]:
    """The template factors the trained policy picks from the starting state."""
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, deterministic=True)
    return dict(env.unwrapped.factors_of(action))


def train_joint_ppo(workload: str = WORKLOAD, timesteps: int = TIMESTEPS,
                    cost_model: str | None = None, seed: int = 0) -> dict[str, int]:
    """PPO with :class:`LayoutStateExtractor` as the layout actor of the joint env; the
    layout its policy picks after training."""
    env = make_env("altenv/JointTuning-v0", workload, cost_model, **JOINT_OPTIONS)
    policy_kwargs = {
        "features_extractor_class": LayoutStateExtractor,
        "features_extractor_kwargs": {"n_knobs": env.action_space.shape[0]},
        "net_arch": {"pi": [32], "vf": [32]},
        "activation_fn": nn.Tanh,
    }
    n_steps = min(N_STEPS, timesteps)
    model = PPO("MlpPolicy", env, policy_kwargs=policy_kwargs, n_steps=n_steps,
                batch_size=n_steps, n_epochs=4, seed=seed, device="cpu")
    model.learn(timesteps)
    layout = policy_layout(model, env)
    env.close()
    return layout


def train_layout_a2c(workload: str = WORKLOAD, timesteps: int = TIMESTEPS,
                     cost_model: str | None = None, seed: int = 0) -> dict[str, int]:
    """A2C with SB3's default MLP on ``LayoutTuning-v0``'s discrete variant (one divisor
    index per knob, ``MultiDiscrete``); the layout its policy picks after training."""
    env = make_env("altenv/LayoutTuning-v0", workload, cost_model, action_type="discrete")
    model = A2C("MlpPolicy", env, n_steps=min(N_STEPS, timesteps), seed=seed, device="cpu")
    model.learn(timesteps)
    layout = policy_layout(model, env)
    env.close()
    return layout


def main(argv: list[str] | None = None) -> dict[str, dict[str, int]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=WORKLOAD)
    parser.add_argument("--timesteps", type=int, default=TIMESTEPS)
    parser.add_argument("--cost-model", help="costmodel.npz of a tuning run (else untrained)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    layouts = {}
    for name, train in (("ppo/JointTuning-v0", train_joint_ppo),
                        ("a2c/LayoutTuning-v0", train_layout_a2c)):
        layouts[name] = train(args.workload, args.timesteps, args.cost_model, args.seed)
        print(f"{name}: policy picks {layouts[name]}")
    return layouts


if __name__ == "__main__":
    main()
