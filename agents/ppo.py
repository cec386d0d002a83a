"""``ppo``: ALT's PPO cross exploration (§5.2) with one actor-critic, pretrained by default.

One sb3-contrib ``MaskablePPO`` policy acts on ``altenv/CrossExploration-v0``: its layout
heads are ALT's layout actor, its loop heads the loop actors, and its single value head
the critic they share (§5.2.2). A run tunes in ALT's two stages:

* **joint stage**: the policy picks layouts and walks their loop spaces; each layout
  visit measures its ``top_k`` best-predicted points, and the visit's return is its
  measured throughput, so the layout actor learns from measurements inside the run;
* **loop-only stage**: the best layout fixed, the loop actors keep walking and learning;
* with a budget of at most ``zero_shot_budget`` trials there is nothing to learn from:
  the policy searches on the cost model alone for ``zero_shot_seconds`` and the best
  few predicted candidates are measured.

By default the agent starts from the shipped checkpoint (:mod:`altenv.pretrained`): a
policy pretrained on cost-model rewards across drawn workloads and the cross-workload
cost model it was trained with, which the run's cost model then continues from (ALT
§7.3.1's PPO-Pret). ``checkpoint=None`` starts from scratch (PPO-woPret).
"""

from __future__ import annotations

import importlib
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.distributions import MaskableMultiCategoricalDistribution
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.logger import Logger

from altenv import pretrained
from altenv.costmodel import CostModel
from altenv.space.constraints import Hardware
from altenv.tuning.budget import Budget
from altenv.tuning.loop import propose_and_measure
from altenv.tuning.session import TuningSession
from altenv.tuning.task import Candidate, Factors, freeze
from envs.cross import ACTION_NVEC, OBS_SIZE, PHASE, CrossExplorationEnv

from .base import Agent, register
from .checkpoint import check_policy, has_policy, load_policy, save_policy
from .masked_heads import MaskedHeads
from .options import PPOOptions

FOREVER = 10**9
PRETRAINED = pretrained.PRETRAINED
ACTIVATIONS = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "elu": torch.nn.ELU,
               "leaky_relu": torch.nn.LeakyReLU, "gelu": torch.nn.GELU}
DEFAULT_POLICY_KWARGS: dict[str, Any] = {"net_arch": {"pi": [256, 128], "vf": [256, 128]}}
ZERO_SHOT_BATCH = 32
"""Loop points sampled per round in zero-shot search."""
LAYOUT_DRAWS = 10
"""Draws of the layout heads per distinct layout wanted (:meth:`PPOAgent.layouts`)."""


class _UntilBudget(BaseCallback):
    """Stops ``learn`` once the session reached ``limit`` trials or its deadline, or after
    ``patience`` environment steps that measured nothing new; reports each new
    measurement."""

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
        return (self.session.trials < self.limit and self._idle < self.patience
                and not self.session.out_of_time)


class ActorWeights(BaseCallback):
    """Gives the layout actor's steps ``layout_share`` of each update's policy loss.

    ALT trains the layout actor and the loop actors each on a loss of its own (§5.2.2).
    In one policy a visit's single layout step is one of ``1 + loop_rounds *
    walk_length`` steps, so a plain PPO update spends about 1/33 of its policy gradient
    on the layout actor. After each rollout this normalizes the advantages over the whole
    rollout and scales them by step weights averaging 1: ``layout_share * n / k`` on the
    ``k`` layout steps of ``n``, ``(1 - layout_share) * n / (n - k)`` on the others (the
    model must not normalize advantages again per minibatch). Rollouts without layout
    steps (the loop-only stage) are only normalized. PPO's clipped objective is linear in
    a step's advantage, so this weights the steps' loss terms; the critic is untouched."""

    def __init__(self, layout_share: float):
        super().__init__()
        self.layout_share = layout_share  # in (0, 1): PPOOptions.layout_share

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer
        adv = buffer.advantages
        adv -= adv.mean()
        adv /= adv.std() + 1e-8
        layout = buffer.observations[..., PHASE] == 1.0
        n, k = adv.size, int(layout.sum())
        if 0 < k < n:
            adv[layout] *= self.layout_share * n / k
            adv[~layout] *= (1.0 - self.layout_share) * n / (n - k)


def _import(name: str) -> Any:
    module, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"ppo: cannot import {name!r} ({err})") from err


def resolve_policy_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """SB3 ``policy_kwargs`` from config data: ``activation_fn`` by name (``tanh``, ``relu``,
    ...), classes (``*_class``) as ``module:Class`` strings (user code the config names)."""
    out = dict(kwargs)
    if isinstance(out.get("activation_fn"), str):
        name = out["activation_fn"]
        if name not in ACTIVATIONS:
            raise ValueError(f"ppo: policy_kwargs.activation_fn {name!r}; allowed: "
                             f"{', '.join(ACTIVATIONS)}")
        out["activation_fn"] = ACTIVATIONS[name]
    for key, value in kwargs.items():
        if key.endswith("_class") and isinstance(value, str):
            out[key] = _import(value)
    return out


@register("ppo")
class PPOAgent(Agent):
    """ALT's cross exploration with one masked PPO actor-critic; options:
    :class:`~agents.options.PPOOptions`."""

    Options = PPOOptions

    def __init__(self, options: PPOOptions | None = None):
        o = PPOOptions() if options is None else options
        checkpoint = o.checkpoint
        self.seed = o.seed
        self.env_options = {"episode_layouts": o.episode_layouts, "loop_rounds": o.loop_rounds,
                            "walk_length": o.walk_length,
                            "hardware_constraints": o.hardware_constraints,
                            "mutations": o.mutations}
        self.ppo_options = {"n_steps": o.n_steps, "batch_size": o.batch_size,
                            "n_epochs": o.n_epochs, "learning_rate": o.learning_rate,
                            "gamma": o.gamma, "gae_lambda": o.gae_lambda,
                            "ent_coef": o.ent_coef,
                            "normalize_advantage": o.layout_share is None}
        self.weights = None if o.layout_share is None else ActorWeights(o.layout_share)
        self.policy_name = o.policy
        self.policy_kwargs = dict(DEFAULT_POLICY_KWARGS if o.policy_kwargs is None
                                  else o.policy_kwargs)
        self.zero_shot_budget, self.zero_shot_seconds = o.zero_shot_budget, o.zero_shot_seconds
        self.zero_shot_prior = o.zero_shot_prior
        self.learn_in_run = o.learn
        self.tensorboard_log = o.tensorboard_log
        self.shipped = checkpoint == PRETRAINED
        self.model: MaskablePPO | None = None
        self._use_checkpoint(self._checkpoint_dir(checkpoint))
        if self.checkpoint is not None and not self.shipped:  # checked before a run starts
            check_policy(self.checkpoint, self._expected(), self._policy_shapes())
        self.updates: dict[str, int] = {"joint": 0, "loop": 0, "pretrain": 0}
        self.rng = np.random.default_rng(o.seed)
        self._warned: set[str] = set()

    def _use_checkpoint(self, path: Path | None) -> None:
        self.checkpoint = path
        self.base: CostModel | None = pretrained.cost_model(path) if path else None

    @staticmethod
    def _checkpoint_dir(checkpoint: str | None, target: Any = None) -> Path | None:
        if checkpoint is None:
            return None
        if checkpoint == PRETRAINED:
            path = pretrained.ppo_checkpoint(target)
            return path if path is not None and has_policy(path) else None
        path = Path(checkpoint)
        if not path.is_dir():
            raise ValueError(f"ppo: checkpoint {checkpoint!r} is not a directory")
        return path

    # ----------------------------------------------------------------- model
    def _settings(self) -> dict[str, Any]:
        """What a checkpoint must share with this agent to load (the env's spaces are
        fixed by its class, whatever the workload)."""
        return {"algorithm": "MaskablePPO", "policy": self.policy_name,
                "policy_kwargs": self.policy_kwargs, "env": "altenv/CrossExploration-v0",
                "observation": [OBS_SIZE], "action_nvec": ACTION_NVEC}

    def _expected(self) -> dict[str, Any]:
        settings = self._settings()
        return {k: settings[k] for k in ("policy", "policy_kwargs", "observation",
                                         "action_nvec")}

    def _policy_class(self) -> Any:
        return self.policy_name if ":" not in self.policy_name else _import(self.policy_name)

    def _policy_shapes(self) -> dict[str, tuple[int, ...]]:
        """The tensors of this agent's policy, by name and shape (built on the env's spaces,
        which are the same for every workload)."""
        policy = self._policy_class()
        policy = MaskablePPO.policy_aliases.get(policy, policy) if isinstance(policy, str) \
            else policy
        net = policy(spaces.Box(0.0, 1.0, (OBS_SIZE,), dtype=np.float32),
                     spaces.MultiDiscrete(ACTION_NVEC), lambda _: 0.0,
                     **resolve_policy_kwargs(self.policy_kwargs))
        return {k: tuple(v.shape) for k, v in net.state_dict().items()}

    def model_for(self, env: Any) -> MaskablePPO:
        """The policy on ``env`` (a Gymnasium env or an SB3 VecEnv): reused, made and
        loaded from the checkpoint, or new."""
        previous = self.model
        n_envs = getattr(env, "num_envs", 1)
        if previous is not None and previous.n_envs == n_envs:
            previous.set_env(env)
            return previous
        self.model = MaskablePPO(self._policy_class(), env, policy_kwargs=resolve_policy_kwargs(
            self.policy_kwargs), seed=self.seed, tensorboard_log=self.tensorboard_log,
            verbose=0, device="cpu", **self.ppo_options)
        dist = self.model.policy.action_dist
        if type(dist) is MaskableMultiCategoricalDistribution:  # same distribution, batched
            self.model.policy.action_dist = MaskedHeads(dist.action_dims)
        if self.tensorboard_log is None:
            # SB3's default logger makes an empty SB3-<time> folder in /tmp on every learn()
            self.model.set_logger(Logger(None, []))
        if previous is not None:  # SB3 models keep their number of envs: carry the policy over
            self.model.policy.load_state_dict(previous.policy.state_dict())
            self.model.num_timesteps = previous.num_timesteps
        elif self.checkpoint is not None:
            loaded = load_policy(self.model.policy, self.checkpoint, self._expected())
            self.updates["pretrain"] = int(loaded.get("updates", 0))
        return self.model

    def _shipped_for(self, session: TuningSession) -> None:
        """With the shipped checkpoint, the one for the session's target (until the policy
        is made)."""
        if self.shipped and self.model is None:
            chosen = self._checkpoint_dir(PRETRAINED, session.task.target)
            if chosen != self.checkpoint:
                self._use_checkpoint(chosen)

    def setup(self, session: TuningSession) -> None:
        """Start the session's cost model from the checkpoint's cross-workload model (the
        shipped checkpoint for the session's target, unless the policy is already made)."""
        self._shipped_for(session)
        if self.checkpoint is None or self.base is None:
            return
        key = str(self.checkpoint)
        if key not in self._warned:
            pretrained.warn_host_mismatch(self.checkpoint, session.task.target)
            self._warned.add(key)
        session.cost_model.adopt(self.base)

    # --------------------------------------------------------------- stages
    def run(self, session: TuningSession, budget: Budget, batch: int, top_k: int,
            report: Callable[[TuningSession], None]) -> None:
        self.setup(session)
        if budget.total <= self.zero_shot_budget:
            self.zero_shot(session, budget.total - session.trials, batch, report)
        else:
            if session.trials < budget.joint:
                self._learn(session, budget.joint, batch, top_k, report, None, "joint")
            best = session.best[0]
            if best is not None and session.trials < budget.total:
                self._learn(session, budget.total, batch, top_k, report, best.factors, "loop")
        # whatever the actors left unspent (e.g. a walk that found nothing new)
        propose_and_measure(session, self, budget, batch, top_k, report)

    def _env(self, session: TuningSession, batch: int, top_k: int,
             layout: Factors | None, reward_source: str = "measure") -> CrossExplorationEnv:
        return CrossExplorationEnv(session=session, reward_source=reward_source, batch=batch,
                                   top_k=top_k, layout=layout, **self.env_options)

    def _learn(self, session: TuningSession, limit: int, batch: int, top_k: int,
               report: Callable[[TuningSession], None], layout: Factors | None,
               stage: str) -> None:
        """One stage: the policy acts (and learns) on measured rewards until the session
        holds ``limit`` trials. The session measures no more than ``limit`` meanwhile: a
        visit measures ``top_k`` at once and would otherwise eat into the next stage."""
        outer = session.limit
        session.limit = limit if outer is None else min(limit, outer)
        env = self._env(session, batch, top_k, layout)
        visit = 1 + self.env_options["loop_rounds"] * self.env_options["walk_length"]
        until = _UntilBudget(session, limit, report, patience=4 * visit)
        try:
            env.reset(seed=int(self.rng.integers(1 << 31)))
            model = self.model_for(env)
            if self.learn_in_run:
                before = model._n_updates  # optimizer epochs; a stopped rollout trains none
                model.learn(FOREVER, callback=self._callbacks(until), reset_num_timesteps=False,
                            tb_log_name=stage)
                self.updates[stage] += (model._n_updates - before) // model.n_epochs
            else:
                self._act(env, until)
        finally:
            session.limit = outer
            env.close()

    def _callbacks(self, callback: BaseCallback | None) -> CallbackList:
        """``callback`` with the actors' loss weights (:class:`ActorWeights`)."""
        chain = [c for c in (callback, self.weights) if c is not None]
        return CallbackList(chain)

    def _act(self, env: CrossExplorationEnv, until: Callable[[], bool] | BaseCallback,
             deterministic: bool = False) -> None:
        """Run the policy on ``env`` without learning until ``until`` says stop."""
        assert self.model is not None
        obs, _ = env.reset(seed=int(self.rng.integers(1 << 31)))
        if isinstance(until, BaseCallback):
            until.init_callback(self.model)
            go = until.on_step
        else:
            go = until
        while True:
            action, _ = self.model.predict(obs, action_masks=env.action_masks(),
                                           deterministic=deterministic)
            obs, _, _, truncated, _ = env.step(action)
            if not go():
                return
            if truncated:
                obs, _ = env.reset()

    def zero_shot(self, session: TuningSession, n: int, batch: int,
                  report: Callable[[TuningSession], None]) -> list[Candidate]:
        """Search with cost-model rewards only for ``zero_shot_seconds``, then measure the
        ``n`` best-predicted new candidates. The layout actor chooses layouts for the first
        ``1 - zero_shot_prior`` of the time; for the rest the loop actors walk the
        vendor-style blocked layout (the one ``evolution`` also starts from), whose best
        predicted ``ceil(n * zero_shot_prior)`` points are measured whatever the ranking
        across layouts says (the cost model is least sure across layouts, and a
        checkpoint trained on another CPU may prefer tiles that do not fit this one's
        vectors). The rest go by predicted score, at most half of them of one layout.
        Returns the measured candidates."""
        if n <= 0:
            return []
        blocked = session.task.blocked_factors(Hardware.of(session.task.target).lanes())
        if blocked == session.task.default_factors():
            blocked = None
        prior = self.zero_shot_prior if blocked is not None else 0.0
        scores: dict[Candidate, float] = {}
        # small rounds: in a few seconds the policy should see many layouts, not many samples
        for layout, seconds in ((None, (1 - prior) * self.zero_shot_seconds),
                                (blocked, prior * self.zero_shot_seconds)):
            if seconds <= 0:
                continue
            env = self._env(session, min(batch, ZERO_SHOT_BATCH), 1, layout,
                            reward_source="cost_model")
            self.model_for(env)
            deadline = time.perf_counter() + seconds

            def collect(env: CrossExplorationEnv = env, deadline: float = deadline) -> bool:
                scores.update(env.visited)
                return time.perf_counter() < deadline

            try:
                self._act(env, collect)
            finally:
                env.close()
        ranked = sorted((c for c in scores if session.measured(c) is None),
                        key=scores.__getitem__, reverse=True)
        reserved = math.ceil(n * prior)
        chosen = [c for c in ranked if c.factors == blocked][:reserved]
        per_layout = Counter(c.factors for c in chosen)
        cap = max(math.ceil(n / 2), 1)
        for cand in ranked:
            if len(chosen) == n:
                break
            if cand not in chosen and per_layout[cand.factors] < cap:
                chosen.append(cand)
                per_layout[cand.factors] += 1
        session.measure(chosen)
        report(session)
        return chosen

    def layouts(self, session: TuningSession, n: int, seed: int = 0) -> list[Factors]:
        """Up to ``n`` distinct layouts the layout actor picks for the session's task at an
        episode's first step: its most probable choice first, then its draws (the layout
        heads' choices projected onto the layout constraints, as a visit's). Nothing is
        measured and the session's cost model is left as it is."""
        self._shipped_for(session)
        env = self._env(session, ZERO_SHOT_BATCH, 1, None, reward_source="cost_model")
        try:
            model = self.model_for(env)
            obs, _ = env.reset(seed=seed)
            masks = env.action_masks()
            picks: dict[Factors, None] = {}
            for i in range(LAYOUT_DRAWS * n):
                if len(picks) >= n:
                    break
                action, _ = model.predict(obs, action_masks=masks, deterministic=i == 0)
                picks.setdefault(freeze(env.layout_of(action)))
            return list(picks)
        finally:
            env.close()

    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        """Fallback batches once the policy stops finding new points: samples of the best
        (or a random) layout's loop space."""
        factors = layout if layout is not None else session.task.random_factors(self.rng)
        return [Candidate(factors, p) for p in session.task.space(factors).sample(n, self.rng)]

    def summary(self) -> dict[str, Any]:
        """Policy updates so far, by stage (``pretrain``: those of the checkpoint)."""
        return {"updates": dict(self.updates)}

    # ------------------------------------------------------------ pretraining
    def pretrain(self, make_env: Callable[[], Any], timesteps: int, callback: Any = None
                 ) -> float:
        """Learn for ``timesteps`` environment steps on the (vectorized) env ``make_env()``
        returns, e.g. ``altenv/CrossExploration-v0`` copies with cost-model rewards over
        many workloads; returns environment steps per second."""
        env = make_env()
        try:
            model = self.model_for(env)
            start, before, updates = time.perf_counter(), model.num_timesteps, model._n_updates
            model.learn(timesteps, callback=self._callbacks(callback), reset_num_timesteps=False,
                        tb_log_name="pretrain")
            self.updates["pretrain"] += (model._n_updates - updates) // model.n_epochs
            return (model.num_timesteps - before) / (time.perf_counter() - start)
        finally:
            env.close()

    # ------------------------------------------------------------ checkpoints
    def save(self, path: str | Path) -> None:
        """Write the policy (``policy.npz`` + ``policy.json``) and the cross-workload cost
        model it started from (``costmodel.npz``, booster only) to ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.model is not None:
            save_policy(self.model.policy, path, {
                **self._settings(), "timesteps": int(self.model.num_timesteps),
                "updates": int(sum(self.updates.values()))})
        if self.base is not None:
            self.base.save(path / pretrained.COST_MODEL, records=False)

    def use_cost_model(self, model: CostModel) -> None:
        """Make ``model`` (trained) the cross-workload cost model runs start from."""
        self.base = model
