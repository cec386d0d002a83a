"""The Gymnasium environments: API checkers, seeded episodes, observations, discrete
layout actions, a short PPO run, the best program against torch, and measure mode."""

from __future__ import annotations

import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3 import PPO
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import envs
from altenv.costmodel import CostModel, extract_features
from altenv.layout import Layout
from altenv.layout.state import tensor_state
from altenv.ops import run_numpy
from altenv.records import RecordDB
from altenv.tuning import OpTask, TuningSession
from envs.wrappers import PaddedLoop

GMM = "gmm:M=16,N=16,K=16"
C2D = "c2d:N=1,I=8,O=16,H=8,W=8,KH=3,KW=3,pad=1"
SMALL = {"batch": 8, "episode_length": 3}
CONFIGS = {
    "loop": (envs.LoopTuningEnv, GMM, {"batch": 8, "episode_length": 6}),
    "layout": (envs.LayoutTuningEnv, GMM, SMALL),
    "layout-discrete-c2d": (envs.LayoutTuningEnv, C2D, {**SMALL, "action_type": "discrete"}),
    "joint": (envs.JointTuningEnv, GMM, {**SMALL, "walk_length": 4, "loop_rounds": 1}),
}


@pytest.fixture(scope="module")
def tasks() -> dict[str, OpTask]:
    return {GMM: OpTask(GMM), C2D: OpTask(C2D)}


@pytest.fixture(scope="module")
def cost_model(tasks) -> CostModel:
    """A trained cost model (labels are synthetic: the tests need fixed predictions, not
    good ones)."""
    model = CostModel()
    rng = np.random.default_rng(0)
    for task in tasks.values():
        feats = []
        for _ in range(3):
            space = task.space(task.random_factors(rng))
            points = space.sample(8, rng)
            feats += extract_features(space.context, [space.decode(p) for p in points])
        model.update(task.key, feats, rng.uniform(1e-5, 1e-4, len(feats)))
    return model


def make(name: str, tasks, cost_model, **kwargs) -> gym.Env:
    cls, spec, options = CONFIGS[name]
    return cls(tasks[spec], reward_source="cost_model", cost_model=cost_model,
               **{**options, **kwargs})


def rollout(env: gym.Env, seed: int) -> tuple[list[float], list[bool], list[np.ndarray]]:
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    rewards, truncs, observations = [], [], [obs]
    while True:
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert not terminated
        rewards.append(reward)
        truncs.append(truncated)
        observations.append(obs)
        if truncated:
            return rewards, truncs, observations


@pytest.mark.parametrize("name", list(CONFIGS))
def test_env_checkers(name, tasks, cost_model):
    env = make(name, tasks, cost_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # no spec; SB3 prefers [-1, 1] boxes
        check_env(env)
        sb3_check_env(env)
    env.close()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_seeded_random_episodes(name, tasks, cost_model):
    env = make(name, tasks, cost_model, render_mode="ansi")
    rewards, truncs, observations = rollout(env, seed=3)
    assert len(rewards) == CONFIGS[name][2]["episode_length"]
    assert truncs[-1] and not any(truncs[:-1])
    assert all(math.isfinite(r) for r in rewards)
    assert all(env.observation_space.contains(o) for o in observations)
    assert "best:" in env.render()
    again = rollout(env, seed=3)[0]
    np.testing.assert_allclose(again, rewards)
    # the best program is the best predicted one (nothing measured in cost_model mode)
    assert env.best_candidate is not None and env.best_latency == math.inf
    assert set(env.best_layouts) == {"data", "weight", "out"}
    assert env.best_schedule is not None
    env.close()


def test_registered_ids_make_and_render(cost_model):
    assert set(envs.ENV_IDS) <= set(gym.registry)
    for env_id, name in zip(envs.ENV_IDS, ["layout", "loop", "joint"]):
        cls, spec, options = CONFIGS[name]
        # a spec string (not an OpTask, which cannot be deep-copied) keeps env.spec
        env = gym.make(env_id, workload=spec, reward_source="cost_model",
                       cost_model=cost_model, render_mode="ansi", **options)
        assert isinstance(env.unwrapped, cls) and env.spec.nondeterministic
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            check_env(env.unwrapped)  # render modes via env.spec.make, close twice
        env.close()


def test_layout_state_is_alts_primitive_state():
    # ALT §5.2.1: O = 32 split by 16 has state [2, 16] (initially [1, 32] in ALT's notation;
    # an untouched dim is [D, 1] here: all of it in the outer part, as with factor 1)
    out = Layout((1, 32, 8, 8), "NOHW").split(1, [2, 16]).reorder([0, 1, 3, 4, 2])
    state = tensor_state(out, slots=2)
    np.testing.assert_allclose(state[2:4], [math.log(2) / math.log(32), 0.8], rtol=1e-6)
    np.testing.assert_allclose(state[4:6], [1.0, 0.0])
    # unfold: [tiles, tile] of the dim, and reorders move no state
    data = Layout((1, 8, 10, 10), "NIHW").unfold(2, 6, 4).reorder([0, 2, 1, 3, 4])
    np.testing.assert_allclose(tensor_state(data, 2)[4:6],
                               [math.log(2) / math.log(10), math.log(6) / math.log(10)])


def test_layout_observation_fixed_length_per_kind(tasks):
    template = tasks[C2D].template
    rng = np.random.default_rng(1)
    sizes = {len(template.observation(dict(tasks[C2D].random_factors(rng))))
             for _ in range(6)}
    assert sizes == {len(template.observation(template.default_factors()))}
    other = OpTask("c2d:N=1,I=16,O=32,H=14,W=14,KH=1,KW=1").template
    assert len(other.observation(other.default_factors())) == sizes.pop()


def test_discrete_layout_actions():
    task = OpTask("gmm:M=16,N=12,K=7")  # divisor lists of 5, 6 and 2 entries
    template = task.template
    env = envs.LayoutTuningEnv(task, reward_source="cost_model", action_type="discrete")
    assert env.action_space.nvec.tolist() == [6, 6, 6]
    assert template.factors_from_indices([0, 5, 5]) == {"mt": 1, "nt": 12, "kt": 7}
    assert template.factors_from_indices([2, 1, 1]) == {"mt": 4, "nt": 2, "kt": 7}
    two = OpTask("c2d:N=1,I=8,O=16,H=8,W=8,KH=3,KW=3,pad=1", levels=2).template
    indices = [len(two.knobs)] * len(two.knobs)  # past every list: the largest divisor
    factors = two.factors_from_indices(indices)
    two.check(factors)
    assert factors["ot"] == 16 and factors["ot1"] == 1  # the outer level gets what is left


def test_ppo_learns_on_loop_env(tasks, cost_model):
    env = make("loop", tasks, cost_model, episode_length=16)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(64)
    action, _ = model.predict(env.reset(seed=0)[0], deterministic=True)
    assert env.action_space.contains(action)
    env.close()


def test_best_program_matches_torch(tasks, cost_model):
    env = make("layout-discrete-c2d", tasks, cost_model)
    rollout(env, seed=5)
    cand = env.best_candidate
    program = env.task.program(cand.factors)
    assert program.layouts == env.best_layouts
    raw = program.random_inputs(3)
    out = run_numpy(program, raw, func=env.best_schedule.mod)
    np.testing.assert_allclose(out, program.reference(raw), rtol=1e-4, atol=1e-4)
    env.close()


def test_untrained_cost_model_warns_and_stays_seeded(tasks, tmp_path):
    env = envs.LoopTuningEnv(tasks[GMM], reward_source="cost_model", batch=8,
                             episode_length=3, cost_model=CostModel())
    with pytest.warns(UserWarning, match="untrained"):
        first = rollout(env, seed=0)[0]
    assert rollout(env, seed=0)[0] == first
    env.close()
    # on a session the model trains on the session's measurements: no advice to give
    session = TuningSession(tasks[GMM], measurer=None, db=RecordDB(tmp_path / "r.jsonl"))
    env = envs.LoopTuningEnv(reward_source="cost_model", batch=8, episode_length=3,
                             session=session)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rollout(env, seed=0)
    env.close()
    session.db.close()


def test_an_env_on_a_session_charges_its_features_and_predictions_to_the_cost_model(
        tasks, cost_model, tmp_path):
    """An agent that steps an env (``ppo``) has its rankings in the ``cost_model`` part of
    the run's time split, as the session's own predictions are, not in ``search``."""
    session = TuningSession(tasks[GMM], measurer=None, db=RecordDB(tmp_path / "r.jsonl"),
                            cost_model=cost_model)
    env = envs.LoopTuningEnv(reward_source="cost_model", batch=8, episode_length=3,
                             session=session)
    before = session.seconds["cost_model"]  # reading back the (empty) records
    rollout(env, seed=0)
    assert session.seconds["cost_model"] > before
    assert session.seconds["measure_wall"] == session.seconds["search"] == 0
    env.close()
    session.db.close()


def test_argument_errors(tasks, cost_model):
    with pytest.raises(ValueError, match="reward_source"):
        envs.LoopTuningEnv(tasks[GMM], reward_source="latency")
    with pytest.raises(ValueError, match="action_type"):
        envs.LayoutTuningEnv(tasks[GMM], action_type="box")
    with pytest.raises(ValueError, match="workload="):
        envs.LoopTuningEnv()
    with pytest.raises(ValueError, match="must divide"):
        envs.LoopTuningEnv(tasks[GMM], layout={"mt": 3, "nt": 1, "kt": 1})


@pytest.mark.parametrize("name, bad", list(zip(CONFIGS, [math.nan, math.inf, -math.inf, math.nan])))
def test_nan_and_inf_actions_are_refused(name, bad, tasks, cost_model):
    """A diverged policy's action is an error naming the entry, not factor 1 or an
    arbitrary direction (the padded loop wrapper too)."""
    env = make(name, tasks, cost_model)
    env.reset(seed=0)
    action = env.action_space.sample().astype(np.float64)
    action[-1] = bad
    with pytest.raises(ValueError, match=rf"entries \[{len(action) - 1}\] are NaN or infinite"):
        env.step(action)
    if name == "loop":
        padded = PaddedLoop(env)
        padded.reset(seed=0)
        with pytest.raises(ValueError, match="NaN or infinite"):
            padded.step(np.full(padded.action_space.shape, bad))
    env.close()


@pytest.mark.slow
def test_measure_mode(tmp_path):
    """Measure mode on real timings: U from the first measurement, the last step of an
    episode measures the episode's top-k, records go to db_path, checkers pass, and a
    second env shares the session."""
    env = gym.make("altenv/LoopTuning-v0", workload=GMM, batch=8, episode_length=4,
                   top_k=2, db_path=str(tmp_path / "records.jsonl"))
    loop = env.unwrapped
    obs, info = env.reset(seed=0)
    assert math.isfinite(info["latency"]) and loop.backend.reference_latency == info["latency"]
    *_, truncated, info = env.step(env.action_space.sample())
    assert "latency" not in info and not truncated  # cost-model reward inside the episode
    rewards, _, _ = rollout(env, seed=1)
    assert -1.0 <= rewards[-1] <= 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        check_env(loop, skip_render_check=True)  # nondeterministic id: no determinism check
        sb3_check_env(loop)
    session = loop.backend.session()
    assert math.isfinite(loop.best_latency) and loop.best_latency == min(session.history)
    assert session.db.count(loop.task.key) == session.trials > 0
    program = loop.task.program(loop.best_candidate.factors)
    raw = program.random_inputs(1)
    out = run_numpy(program, raw, func=loop.best_schedule.mod)
    np.testing.assert_allclose(out, program.reference(raw), rtol=1e-4, atol=1e-4)

    layout = envs.LayoutTuningEnv(session=session, batch=8, episode_length=2, top_k=2)
    _, info = layout.reset(seed=0)  # evaluates the default layout: U
    u = layout.backend.reference_latency
    assert u == info["latency"]
    _, reward, _, _, info = layout.step(layout.action_space.sample())
    assert reward == pytest.approx(max(1 - info["latency"] / u, -1.0))
    layout.close()
    env.close()
