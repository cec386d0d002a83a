"""``ppo``: ALT's PPO cross exploration (§5.2) driven by stable-baselines3.

Two SB3 ``PPO`` models:

* the **layout actor** learns on ``altenv/JointTuning-v0`` bound to the run's session:
  each step picks the template's split factors (Eq. 2), the layout's loop space is
  explored for a few rounds and the best *measured* latency is the reward (Fig. 8);
* the **loop actors** are one ``MultiDiscrete`` policy: a categorical head per loop
  subspace giving its direction, and one value head, so all actors share one critic
  (§5.2.2). It walks from the best of a sampled batch, rewarded by the cost model, and
  only the top-k points of an episode are measured (§7). Padded to fixed shapes
  (``envs.wrappers``), one loop model serves every layout and workload.

The joint stage runs the layout actor (the loop actor walks inside each layout step);
the loop-only stage fixes the best layout and trains the loop actor on it. Both models
save to a checkpoint directory; ``checkpoint=`` loads one (PPO-Pret, ALT §7.3.1).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback

from altenv.tuning.loop import Budget, propose_and_measure
from altenv.tuning.session import TuningSession
from altenv.tuning.task import Candidate, Factors
from envs.joint import JointTuningEnv
from envs.loop import LoopTuningEnv
from envs.wrappers import LoopActor, PaddedLoop

from .base import Agent, register

FOREVER = 10**9


class _UntilBudget(BaseCallback):
    """Stops ``learn`` once the session reached ``limit`` trials, or after ``patience``
    environment steps that measured nothing new; reports each new measurement."""

    def __init__(self, session: TuningSession, limit: int,
                 report: Callable[[TuningSession], None], patience: int):
        super().__init__()
        self.session, self.limit, self.report, self.patience = session, limit, report, patience
        self._seen, self._idle = session.trials, 0

    def _on_step(self) -> bool:
        if self.session.trials > self._seen:
            self._seen, self._idle = self.session.trials, 0
            self.report(self.session)
        else:
            self._idle += 1
        return self.session.trials < self.limit and self._idle < self.patience


@register("ppo")
class PPOAgent(Agent):
    """PPO layout and loop actors (ALT §5.2).

    Parameters
    ----------
    seed:
        Seed of both models and of the environments.
    checkpoint:
        A directory written by :meth:`save` (pretrained models) or ``None``.
    loop_rounds, walk_length:
        Loop rounds per layout step and random-walk steps per round (joint stage).
    layout_episode:
        Layout steps per episode (and per PPO update) of the layout actor.
    loop_episode:
        Steps per loop episode (and per PPO update) of the loop actor.
    learning_rate, gamma:
        PPO hyper-parameters of both models.
    tensorboard_log:
        Directory for SB3's TensorBoard logs.
    """

    def __init__(self, seed: int = 0, checkpoint: str | None = None, loop_rounds: int = 2,
                 walk_length: int = 32, layout_episode: int = 4, loop_episode: int = 64,
                 learning_rate: float = 3e-4, gamma: float = 0.9,
                 tensorboard_log: str | None = None):
        self.seed = seed
        self.loop_rounds, self.walk_length = loop_rounds, walk_length
        self.layout_episode, self.loop_episode = layout_episode, loop_episode
        self.ppo_kwargs = {"learning_rate": learning_rate, "gamma": gamma, "seed": seed,
                           "tensorboard_log": tensorboard_log, "verbose": 0, "device": "cpu"}
        self.layout_models: dict[str, PPO] = {}
        self.loop_model: PPO | None = None
        self._checkpoint = Path(checkpoint) if checkpoint else None
        self.rng = np.random.default_rng(seed)

    # ----------------------------------------------------------------- models
    def _model(self, key: str, env: Any, n_steps: int) -> PPO:
        """The model for ``key``: reused, loaded from the checkpoint, or new."""
        current = self.loop_model if key == "loop" else self.layout_models.get(key)
        if current is not None:
            current.set_env(env)
            return current
        path = self._checkpoint / f"{key}.zip" if self._checkpoint else None
        if path is not None and path.exists():
            model = PPO.load(path, env=env, device="cpu", **{
                k: v for k, v in self.ppo_kwargs.items() if k in ("tensorboard_log", "seed")})
        else:
            model = PPO("MlpPolicy", env, n_steps=n_steps, batch_size=n_steps, n_epochs=10,
                        **self.ppo_kwargs)
        if key == "loop":
            self.loop_model = model
        else:
            self.layout_models[key] = model
        return model

    @staticmethod
    def layout_key(env: JointTuningEnv) -> str:
        """Layout models are per template shape (e.g. all C2Ds share one)."""
        obs, act = env.observation_space.shape[0], env.action_space.shape[0]
        return f"layout-{env.task.workload.kind}-{obs}x{act}"

    def _loop_actor(self) -> Callable[..., np.ndarray] | None:
        if self.loop_model is None:
            return None
        model = self.loop_model
        return LoopActor(lambda obs: model.predict(obs, deterministic=False)[0])

    # --------------------------------------------------------------- stages
    def run(self, session: TuningSession, budget: Budget, batch: int, top_k: int,
            report: Callable[[TuningSession], None]) -> None:
        if session.trials < budget.joint:
            self.joint_stage(session, budget.joint, batch, top_k, report)
        if session.best[0] is not None and session.trials < budget.total:
            self.loop_stage(session, budget.total, batch, top_k, report)
        # whatever the actors left unspent (e.g. a walk that found nothing new)
        propose_and_measure(session, self, budget, batch, top_k, report)

    def joint_stage(self, session: TuningSession, limit: int, batch: int, top_k: int,
                    report: Callable[[TuningSession], None]) -> None:
        """Cross exploration: the layout actor learns from measured loop rounds. The
        session measures no more than ``limit`` trials meanwhile: one step measures several
        loop rounds, and the stage would otherwise eat into the loop-only stage's trials."""
        outer = session.limit
        session.limit = limit if outer is None else min(limit, outer)
        try:
            self._joint_learn(session, limit, batch, top_k, report)
        finally:
            session.limit = outer

    def _joint_learn(self, session: TuningSession, limit: int, batch: int, top_k: int,
                     report: Callable[[TuningSession], None]) -> None:
        actor = self._loop_actor()
        env = JointTuningEnv(session.task, session=session, episode_length=self.layout_episode,
                             batch=batch, top_k=top_k, loop_rounds=self.loop_rounds,
                             walk_length=self.walk_length,
                             **({"loop_policy": actor} if actor else {}))
        env.reset(seed=self.seed)
        model = self._model(self.layout_key(env), env, self.layout_episode)
        model.learn(FOREVER, callback=_UntilBudget(session, limit, report, patience=8),
                    reset_num_timesteps=False, tb_log_name="layout")
        env.close()

    def loop_stage(self, session: TuningSession, limit: int, batch: int, top_k: int,
                   report: Callable[[TuningSession], None]) -> None:
        """Loop-only stage: the best layout fixed, the loop actors learn on it."""
        best = session.best[0]
        env = PaddedLoop(LoopTuningEnv(session.task, layout=dict(best.factors), session=session,
                                       batch=batch, episode_length=self.loop_episode,
                                       top_k=top_k))
        env.reset(seed=self.seed)
        model = self._model("loop", env, self.loop_episode)
        model.learn(FOREVER, callback=_UntilBudget(session, limit, report,
                                                   patience=3 * self.loop_episode),
                    reset_num_timesteps=False, tb_log_name="loop")
        env.close()

    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        """Fallback batches once the actors stop finding new points: samples of the best
        (or a random) layout's loop space."""
        factors = layout if layout is not None else session.task.random_factors(self.rng)
        return [Candidate(factors, p) for p in session.task.space(factors).sample(n, self.rng)]

    # ------------------------------------------------------------ checkpoints
    def save(self, path: str | Path) -> None:
        """Write every model to ``path/<key>.zip`` and an index ``path/models.json``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        models = dict(self.layout_models)
        if self.loop_model is not None:
            models["loop"] = self.loop_model
        for key, model in models.items():
            model.save(path / f"{key}.zip")
        (path / "models.json").write_text(json.dumps(sorted(models), indent=1))
