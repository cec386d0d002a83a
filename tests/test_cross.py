"""``altenv/CrossExploration-v0``: checkers, layout bins, masks, rewards that sum to a visit's
best score, the fixed-layout (loop-only) mode, workload lists, and PPO that learns on it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import envs
from altenv import pretrained
from altenv.costmodel import CostModel
from altenv.ops import LayoutTemplate, parse_workload
from altenv.ops.draw import draw_workloads
from altenv.ops.features import WORKLOAD_FEATURES, workload_features
from altenv.ops.operators import operator_for
from altenv.tuning import OpTask
from envs.cross import (
    ACTION_NVEC,
    BINS,
    OBS_SIZE,
    SLOTS,
    CrossExplorationEnv,
    bin_choices,
    factors_from_bins,
)

GMM = "gmm:M=16,N=16,K=16"
C2D = "c2d:N=1,I=8,O=16,H=8,W=8,KH=3,KW=3,pad=1"
SMALL = {"episode_layouts": 2, "loop_rounds": 2, "walk_length": 3, "batch": 4}


@pytest.fixture(scope="module")
def gmm() -> OpTask:
    return OpTask(GMM, cache_size=512)


@pytest.fixture(scope="module")
def cost_model() -> CostModel:
    """The shipped cross-workload cost model (fixed predictions)."""
    model = pretrained.cost_model()
    assert model is not None and model.is_trained
    return model


def masked_random(env: CrossExplorationEnv, rng: np.random.Generator) -> np.ndarray:
    heads = np.split(env.action_masks(), np.cumsum(ACTION_NVEC)[:-1])
    return np.array([rng.choice(np.flatnonzero(h)) for h in heads])


def test_bins_pick_powers_of_two_and_mask_repeats():
    assert bin_choices(64)[:7] == [1, 2, 4, 8, 16, 32, 64] and bin_choices(64)[7:] == [None] * 5
    assert bin_choices(7) == [1, None, None, 7] + [None] * 8  # only 1 and the whole dim
    assert bin_choices(960)[10] == 960 and bin_choices(960)[4] == 16
    assert bin_choices(4096)[-1] == 4096  # past the last bin: it takes the whole dim
    template = LayoutTemplate(C2D)
    bins = [0] * len(SLOTS)
    bins[SLOTS.index("ot")] = 4
    bins[SLOTS.index("ht")] = 11  # past the extent: the whole dim
    factors = factors_from_bins(template, bins)
    template.check(factors)
    assert factors["ot"] == 16 and factors["ht"] == 8 and factors["it"] == 1
    two = LayoutTemplate(C2D, levels=2)
    bins = [BINS - 1] * len(SLOTS)
    factors = factors_from_bins(two, bins)
    two.check(factors)
    assert factors["ot"] == 16 and factors["ot1"] == 1  # the outer level gets what is left


def test_workload_features_tell_operators_apart():
    feats = [workload_features(parse_workload(s)) for s in (
        "c2d:N=1,I=64,O=64,H=56,W=56,KH=3,KW=3,pad=1",
        "c2d:N=1,I=64,O=64,H=56,W=56,KH=7,KW=7,pad=3",
        "c2d:N=1,I=64,O=64,H=56,W=56,KH=3,KW=3,pad=1,stride=2",
        "c2d:N=16,I=64,O=64,H=56,W=56,KH=3,KW=3,pad=1",
        "grp:N=1,I=64,O=64,H=56,W=56,KH=3,KW=3,pad=1,groups=4", GMM)]
    assert all(f.shape == (WORKLOAD_FEATURES,) and 0 <= f.min() and f.max() <= 1 for f in feats)
    assert len({f.tobytes() for f in feats}) == len(feats)


def test_draw_is_seeded_distinct_and_excludes():
    first = draw_workloads(18, seed=3, max_gflop=0.05)
    assert first == draw_workloads(18, seed=3, max_gflop=0.05)
    assert draw_workloads(9, seed=3, max_gflop=0.05) == first[:9]  # a prefix of longer draws
    assert len(set(first)) == 18 and {w.split(":")[0] for w in first} == set(
        ["c1d", "c2d", "c3d", "grp", "dep", "dil", "gmm", "t2d", "t3d"])
    assert first[0] not in draw_workloads(18, seed=3, max_gflop=0.05, exclude=[first[0]])
    with pytest.raises(ValueError, match="kinds"):
        draw_workloads(2, 0, kinds=["c4d"])
    sized = draw_workloads(9, seed=3, max_gflop=0.05, min_gflop=0.01)
    assert min(operator_for(parse_workload(w)).flops() for w in sized) >= 0.01e9
    assert min(operator_for(parse_workload(w)).flops() for w in first) < 0.01e9
    with pytest.raises(ValueError, match="min_gflop"):
        draw_workloads(2, 0, max_gflop=0.05, min_gflop=0.05)


def test_checkers_and_masks(gmm, cost_model):
    env = CrossExplorationEnv(gmm, reward_source="cost_model", cost_model=cost_model, **SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        check_env(env)
        sb3_check_env(env)
    obs, info = env.reset(seed=0)
    assert obs.shape == (OBS_SIZE,) and obs[0] == 1.0 and env.layout_phase
    masks = np.split(env.action_masks(), np.cumsum(ACTION_NVEC)[:-1])
    assert all(m.any() for m in masks)
    knobs = {k.name for k in gmm.template.knobs}
    for slot, m in zip(SLOTS, masks[:len(SLOTS)]):
        assert m.sum() == (5 if slot in knobs else 1)  # 1..16: five bins
    assert all(m.sum() == 1 for m in masks[len(SLOTS):])  # loop heads wait
    env.step(masked_random(env, np.random.default_rng(0)))
    masks = np.split(env.action_masks(), np.cumsum(ACTION_NVEC)[:-1])
    assert all(m.sum() == 1 for m in masks[:len(SLOTS)])
    nvec = env.space.action_nvec
    assert [m.sum() for m in masks[len(SLOTS):len(SLOTS) + len(nvec)]] == nvec.tolist()
    env.close()


def test_hardware_constraints_mask_bins_and_project_knob_pairs(cost_model):
    """Layout heads act independently, so a depthwise convolution's tied channel tiles
    (input blocked like the output) are projected; lone knobs are masked to the SIMD rule."""
    spec = "dep:N=1,C=64,H=8,W=8,KH=3,KW=3,pad=1"
    env = CrossExplorationEnv(spec, reward_source="cost_model", cost_model=cost_model,
                              hardware_constraints=True, **SMALL)
    env.reset(seed=0)
    constraints = env.layout_constraints
    lanes = constraints.hardware.lanes()
    masks = np.split(env.action_masks(), np.cumsum(ACTION_NVEC)[:-1])
    allowed = [c for c, m in zip(bin_choices(64), masks[SLOTS.index("ot")]) if m]
    assert allowed == [c for c in bin_choices(64) if c in (1, 64) or (c or 1) % lanes == 0]
    action = np.zeros(len(ACTION_NVEC), dtype=np.int64)
    action[SLOTS.index("it")] = 0  # it = 1 ...
    action[SLOTS.index("ot")] = int(np.log2(lanes))  # ... with ot = lanes: not allowed
    _, _, _, _, info = env.step(action)
    assert info["factors"]["it"] == info["factors"]["ot"] != 1
    assert constraints.holds(constraints.genes_of(info["factors"]))
    free = CrossExplorationEnv(spec, reward_source="cost_model", cost_model=cost_model, **SMALL)
    free.reset(seed=0)
    assert free.layout_constraints is None
    assert free.step(action)[-1]["factors"]["it"] == 1
    env.close()
    free.close()


def test_a_visit_earns_its_best_score(gmm, cost_model):
    env = CrossExplorationEnv(gmm, reward_source="cost_model", cost_model=cost_model, **SMALL)
    rng = np.random.default_rng(1)
    env.reset(seed=1)
    visit_steps = 1 + SMALL["loop_rounds"] * SMALL["walk_length"]
    for visit in range(SMALL["episode_layouts"]):
        total = 0.0
        for t in range(visit_steps):
            _, reward, terminated, truncated, _ = env.step(masked_random(env, rng))
            assert reward >= 0 and not terminated
            total += reward
            if t == visit_steps - 2:
                best = max(env.visited.values())
        assert total == pytest.approx(best)
        assert truncated == (visit == SMALL["episode_layouts"] - 1)
    env.close()


def test_fixed_layout_has_no_layout_steps(gmm, cost_model):
    layout = {"mt": 16, "nt": 8, "kt": 4}
    env = CrossExplorationEnv(gmm, reward_source="cost_model", cost_model=cost_model,
                              layout=layout, **SMALL)
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    steps = 0
    while True:
        assert not env.layout_phase and obs[0] == 0.0
        obs, _, _, truncated, _ = env.step(masked_random(env, rng))
        steps += 1
        assert {c.factors for c in env.visited} <= {tuple(sorted(layout.items()))}
        if truncated:
            break
    assert steps == SMALL["episode_layouts"] * SMALL["loop_rounds"] * SMALL["walk_length"]
    env.close()


def test_workload_lists_draw_one_per_reset(cost_model):
    specs = [GMM, "gmm:M=16,N=64,K=8", C2D]
    env = CrossExplorationEnv(specs, reward_source="cost_model", cost_model=cost_model,
                              **SMALL)
    seen = {env.reset(seed=s)[1]["workload"] for s in range(12)}
    assert seen == {str(parse_workload(s)) for s in specs}
    with pytest.raises(ValueError, match="list of workloads"):
        CrossExplorationEnv(specs)  # measure mode needs one workload
    with pytest.raises(ValueError, match="no layout head"):
        CrossExplorationEnv(C2D, levels=3)
    env.close()


def test_registered_and_default_cost_model_is_trained():
    import gymnasium as gym

    env = gym.make("altenv/CrossExploration-v0", workload=GMM, reward_source="cost_model")
    assert isinstance(env.unwrapped, CrossExplorationEnv)
    assert "altenv/CrossExploration-v0" in envs.ENV_IDS
    env.close()


def episode_return(env: CrossExplorationEnv, act, seed: int) -> float:
    obs, _ = env.reset(seed=seed)
    total = 0.0
    while True:
        obs, reward, _, truncated, _ = env.step(act(obs))
        total += reward
        if truncated:
            return total


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["c2d:N=1,I=16,O=32,H=14,W=14,KH=3,KW=3,pad=1",
                                  "dep:N=1,C=64,H=28,W=28,KH=3,KW=3,pad=1"])
def test_pretrained_policy_beats_random_on_unseen_workloads(spec):
    """The shipped policy, pretrained on other drawn workloads, picks layouts the shipped
    cost model scores higher than a random policy's on the same episodes (on the CPU it was
    trained for: 1.24x and 1.16x on these two, e.g. channel blocks of 2 x 16 lanes)."""
    import agents
    from altenv import pretrained

    if pretrained.card() is None:
        pytest.skip("no shipped checkpoint")
    env = CrossExplorationEnv(OpTask(spec, cache_size=256), reward_source="cost_model",
                              episode_layouts=4, loop_rounds=1, walk_length=1, batch=4)
    model = agents.create("ppo").model_for(env)
    rng = np.random.default_rng(0)
    seeds = range(100, 110)
    random_returns = [episode_return(env, lambda _: masked_random(env, rng), s) for s in seeds]
    learned = [episode_return(env, lambda o: model.predict(
        o, action_masks=env.action_masks(), deterministic=True)[0], s) for s in seeds]
    assert np.mean(learned) > 1.05 * np.mean(random_returns)
    env.close()
