"""``altenv bench envs``: environment steps per second, one env against parallel copies.

Pretraining runs ``altenv/CrossExploration-v0`` without a device: on cost-model rewards a
step costs CPU (sampling and replaying MetaSchedule schedules, program features, a
cost-model prediction); on a dataset's (``reward_source="dataset"``) it is a table lookup
or a surrogate's prediction. Its speed decides how much a policy can learn in an hour.
This times random masked actions for each number of envs, the copies in SB3's
``SubprocVecEnv`` (one process each), after a warm-up that pays imports and first
programs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

from envs.cross import ACTION_NVEC, CrossExplorationEnv
from envs.cross_replay import CrossExplorationReplayEnv

from ..ops.draw import draw_workloads
from ..suites import suite_specs


def _masked_actions(masks: np.ndarray, nvec: Sequence[int], rng: np.random.Generator
                    ) -> np.ndarray:
    """One uniformly random allowed value per head, for each env's flat mask (heads of
    equal size drawn together, so that drawing costs little next to a replayed step)."""
    out, at, head = [], 0, 0
    nvec = list(nvec)
    while head < len(nvec):
        run = next((j for j in range(head, len(nvec)) if nvec[j] != nvec[head]), len(nvec))
        width = nvec[head] * (run - head)
        block = masks[:, at:at + width].reshape(len(masks), run - head, nvec[head])
        noise = np.where(block, rng.random(block.shape), -1.0)
        out.append(noise.argmax(axis=2))
        at, head = at + width, run
    return np.concatenate(out, axis=1)


def env_speed(n_envs: Sequence[int], steps: int, workloads: int = 64, seed: int = 0,
              cost_model: Any = None, warmup: int = 64, reward_source: str = "cost_model",
              dataset: str | None = None, **env_options: Any) -> list[dict[str, float]]:
    """Steps per second of ``altenv/CrossExploration-v0`` for each count in ``n_envs``:
    ``steps`` steps per env, timed after ``warmup``; cost-model rewards over ``workloads``
    drawn operators, or (``reward_source="dataset"``) every workload of ``dataset``
    replayed (``None``: the shipped one)."""
    if reward_source == "dataset":
        extra = {"dataset": dataset} if dataset is not None else {}
        env_fn = functools.partial(CrossExplorationReplayEnv, **extra, **env_options)
    else:
        specs = draw_workloads(workloads, seed + 1000, exclude=suite_specs())
        env_fn = functools.partial(CrossExplorationEnv, specs, reward_source="cost_model",
                                   cost_model=cost_model, **env_options)
    rows = []
    rng = np.random.default_rng(seed)
    for n in n_envs:
        vec = make_vec_env(env_fn, n_envs=n, seed=seed,
                           vec_env_cls=SubprocVecEnv if n > 1 else DummyVecEnv)
        try:
            vec.reset()
            for i in range(warmup + steps):
                if i == warmup:
                    start = time.perf_counter()
                masks = np.stack(vec.env_method("action_masks"))
                vec.step(_masked_actions(masks, ACTION_NVEC, rng))
            seconds = time.perf_counter() - start
        finally:
            vec.close()
        rows.append({"envs": n, "steps": n * steps, "seconds": seconds,
                     "steps_per_second": n * steps / seconds})
    base = rows[0]["steps_per_second"]
    for row in rows:
        row["speedup"] = row["steps_per_second"] / base
    return rows


def format_rows(rows: Sequence[dict[str, float]]) -> str:
    lines = [f"{'envs':>5s} {'steps':>7s} {'seconds':>8s} {'steps/s':>8s} {'speedup':>8s}"]
    for r in rows:
        lines.append(f"{r['envs']:5d} {r['steps']:7d} {r['seconds']:8.1f} "
                     f"{r['steps_per_second']:8.1f} {r['speedup']:7.2f}x")
    return "\n".join(lines)
