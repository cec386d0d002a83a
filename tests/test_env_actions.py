"""Every env checks its action against ``action_space`` (issue 97): a head out of its
range, a negative or non-integer head, NaN or a wrong shape is one ``ValueError`` naming
the head and its allowed range (never an ``IndexError``, a wrap or a clip), the env's
state is left as it was, and a valid action still steps."""

from __future__ import annotations

import copy
import math
import re
import warnings
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import envs
from altenv.costmodel import CostModel
from altenv.datapath import DEFAULT_DATASET, dataset_dir
from altenv.dataset import Dataset
from envs import replay_common
from envs.common import checked_action
from envs.cross import HEAD_NAMES
from envs.wrappers import PaddedLoop

GMM = "gmm:M=8,N=8,K=8"
LIVE = {"reward_source": "cost_model", "batch": 2}


def _uri() -> str:
    data = Dataset.open(dataset_dir(DEFAULT_DATASET))
    return f"altenv://{data.name}/{data.workloads()[0]}"


def _knob(env: gym.Env, h: int) -> str:
    return f"knob {env.template.knobs[h].name}"


# name -> (make the env, the name of head h in its messages)
ENVS: dict[str, tuple[Callable[[], gym.Env], Callable[[gym.Env, int], str]]] = {
    "cross": (lambda: envs.CrossExplorationEnv(GMM, cost_model=CostModel(), walk_length=2,
                                               loop_rounds=1, top_k=1, **LIVE),
              lambda env, h: HEAD_NAMES[h]),
    "loop": (lambda: envs.LoopTuningEnv(GMM, cost_model=CostModel(), episode_length=64,
                                        **LIVE),
             lambda env, h: f"subspace {env.space.subspaces[h].name}"),
    "layout": (lambda: envs.LayoutTuningEnv(GMM, cost_model=CostModel(), episode_length=64,
                                            **LIVE), _knob),
    "layout-discrete": (lambda: envs.LayoutTuningEnv(GMM, cost_model=CostModel(),
                                                     action_type="discrete",
                                                     episode_length=64, **LIVE), _knob),
    "joint-discrete": (lambda: envs.JointTuningEnv(GMM, cost_model=CostModel(),
                                                   action_type="discrete", walk_length=1,
                                                   loop_rounds=1, episode_length=64, **LIVE),
                       _knob),
    "cross-replay": (lambda: envs.CrossExplorationReplayEnv(_uri(), batch=2, walk_length=2,
                                                            loop_rounds=1),
                     lambda env, h: HEAD_NAMES[h]),
    "loop-replay": (lambda: envs.LoopTuningReplayEnv(_uri(), batch=2, episode_length=64),
                    lambda env, h: f"subspace {env.layout.subspaces[h].name}"),
    "layout-replay": (lambda: envs.LayoutTuningReplayEnv(_uri(), batch=2, episode_length=64),
                      _knob),
    "layout-discrete-replay": (lambda: envs.LayoutTuningReplayEnv(
        _uri(), action_type="discrete", batch=2, episode_length=64), _knob),
}
STATE = ("point", "factors", "layout", "visited", "_visited", "_t", "_visit", "_round",
         "_walked", "_score", "_best", "best_latency", "_last")


@pytest.fixture(scope="module", params=list(ENVS))
def env(request):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # untrained cost model: random scores
        made = ENVS[request.param][0]()
        made.reset(seed=0)
        made.head_name = ENVS[request.param][1]  # for the expected messages
        yield made
    made.close()


def state(env: gym.Env) -> dict:
    """What an action could change: the walk, the episode, and the random stream."""
    out = {k: getattr(env, k) for k in STATE if hasattr(env, k)}
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in out.items()}  # others: frozen
    out["rng"] = copy.deepcopy(env.np_random.bit_generator.state)
    return out


def valid_action(env: gym.Env) -> np.ndarray:
    return np.zeros(env.action_space.shape, dtype=env.action_space.dtype)


def bad_actions(env: gym.Env) -> dict[str, tuple[np.ndarray, str]]:
    """case -> (action, regex its message must match)."""
    space, base = env.action_space, valid_action(env).astype(np.float64)
    k = space.shape[0]
    last, mid = k - 1, k // 2
    cases: dict[str, tuple[np.ndarray, str]] = {}

    def head(h: int, value: float) -> np.ndarray:
        action = base.copy()
        action[h] = value
        return action

    def shown(value: float) -> str:  # as the message prints it: 7, not 7.0
        return str(int(value)) if math.isfinite(value) and value == round(value) else str(value)

    if isinstance(space, spaces.MultiDiscrete):
        nvec = [int(n) for n in space.nvec]

        def allowed(h: int, value: float) -> str:
            return (rf"^action head {h} is {re.escape(shown(value))}: must be an integer in "
                    rf"\[0, {nvec[h] - 1}\] \({re.escape(env.head_name(env, h))}\)")

        high = 17 if k > 16 else last  # the cross envs: a loop head
        cases["above"] = (head(high, nvec[high]), allowed(high, float(nvec[high])))
        cases["far above"] = (head(last, 10**6), allowed(last, 1e6))
        cases["negative"] = (head(0, -1), allowed(0, -1.0))
        cases["non-integer"] = (head(mid, 0.5), allowed(mid, 0.5))
    else:
        def allowed(h: int, value: float) -> str:
            return (rf"^action head {h} is {re.escape(shown(value))}: must be in "
                    rf"\[0\.0, 1\.0\] \({re.escape(env.head_name(env, h))}\)")

        cases["above"] = (head(last, 1.5), allowed(last, 1.5))
        cases["far above"] = (head(last, 1e6), allowed(last, 1e6))
        cases["negative"] = (head(0, -0.25), allowed(0, -0.25))
    cases["inf"] = (head(mid, -math.inf),
                    allowed(mid, -math.inf) + rf"; entries \[{mid}\] are NaN or infinite$")
    cases["nan"] = (head(mid, math.nan),
                    allowed(mid, math.nan) + rf"; entries \[{mid}\] are NaN or infinite$")
    shape = re.escape(str(space.shape))
    cases["too long"] = (np.append(base, 0), rf"^action of shape \({k + 1},\): expected "
                                             rf"shape {shape}")
    cases["too short"] = (base[:-1], rf"^action of shape \({k - 1},\): expected shape {shape}")
    cases["2-d"] = (base[None], rf"^action of shape \(1, {k}\): expected shape {shape}")
    cases["scalar"] = (np.float64(0), rf"^action of shape \(\): expected shape {shape}")
    cases["text"] = (np.array(["a"] * k), r"^action is not an array of numbers")
    return cases


CASES = ["above", "far above", "negative", "non-integer", "inf", "nan", "too long",
         "too short", "2-d", "scalar", "text"]


@pytest.mark.parametrize("case", CASES)
def test_action_outside_the_space_is_one_value_error(env, case):
    cases = bad_actions(env)
    if case not in cases:
        pytest.skip(f"no {case} action in {env.action_space}")
    action, message = cases[case]
    before = state(env)
    with pytest.raises(ValueError, match=message) as err:
        env.step(action)
    assert "\n" not in str(err.value)
    if hasattr(env, "factors_of"):  # public: checked as step is
        with pytest.raises(ValueError, match=message):
            env.factors_of(action)
    after = state(env)
    assert after.keys() == before.keys()
    for key in before:
        assert after[key] == before[key], key
    # and the env still steps
    obs, reward, terminated, truncated, info = env.step(valid_action(env))
    assert env.observation_space.contains(obs) and math.isfinite(reward)


def test_valid_actions_of_any_integral_dtype(env):
    """The check is no stricter than the space: lists, int32 and integral floats step."""
    base = valid_action(env)
    for action in (base.tolist(), base.astype(np.int32), base.astype(np.float32)):
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs) and not terminated


@given(data=st.data())
@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
def test_step_raises_exactly_when_a_head_is_outside(data):
    """Random integer actions of the right shape, heads drawn from a range wider than
    ``nvec``: ``step`` raises exactly when some head is outside ``[0, n - 1]``."""
    env = _PROPERTY_ENVS[data.draw(st.sampled_from(sorted(_PROPERTY_ENVS)), label="env")]
    nvec = [int(n) for n in env.action_space.nvec]
    action = np.array([data.draw(st.integers(0, n - 1)) for n in nvec], dtype=np.int64)
    for h, value in data.draw(st.lists(st.tuples(st.integers(0, len(nvec) - 1),
                                                 st.integers(-3, max(nvec) + 3)),
                                       max_size=3), label="overrides"):
        action[h] = value
    outside = [h for h, (a, n) in enumerate(zip(action, nvec)) if not 0 <= a < n]
    event("outside" if outside else "inside")
    if outside:
        h = outside[0]
        with pytest.raises(ValueError, match=rf"^action head {h} is {int(action[h])}: "
                                             rf"must be an integer in \[0, {nvec[h] - 1}\]"):
            env.step(action)
        return
    result = env.step(action)
    assert len(result) == 5
    obs, reward, terminated, truncated, info = result
    assert env.observation_space.contains(obs) and math.isfinite(reward)
    assert terminated is False and isinstance(truncated, bool) and isinstance(info, dict)
    if truncated:
        env.reset()


_PROPERTY_ENVS: dict[str, gym.Env] = {}


@pytest.fixture(scope="module", autouse=True)
def _property_envs():
    """The envs of the property test (a fast step each): the live loop walk, the
    cross-exploration replay (64 heads, both phases)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for name in ("loop", "cross-replay"):
            _PROPERTY_ENVS[name] = ENVS[name][0]()
            _PROPERTY_ENVS[name].reset(seed=1)
    yield
    for made in _PROPERTY_ENVS.values():
        made.close()
    _PROPERTY_ENVS.clear()


def test_padded_loop_checks_its_wider_space():
    """``PaddedLoop`` folds a head inside its space onto the subspace's directions and
    refuses one outside it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        padded = PaddedLoop(ENVS["loop"][0]())
        padded.reset(seed=0)
    n = padded.action_space.shape[0]
    with pytest.raises(ValueError, match=r"^action head 5 is 32: must be an integer in "
                                         r"\[0, 31\] \(loop direction 5\)$"):
        padded.step(np.r_[np.zeros(5), 32, np.zeros(n - 6)])
    obs, *_ = padded.step(np.full(n, 31))  # inside: folded, as before
    assert padded.observation_space.contains(obs)
    padded.close()


def test_checked_action_spaces():
    """One function, in ``envs.common``: Discrete, MultiDiscrete (with ``start``) and Box,
    the head's name after its range."""
    assert not hasattr(replay_common, "checked_action")
    space = spaces.Discrete(4, start=1)
    assert checked_action(space, np.int64(4)) == 4
    assert checked_action(space, 2.0).dtype == np.int64
    with pytest.raises(ValueError, match=r"^action is 0: must be an integer in \[1, 4\]$"):
        checked_action(space, 0)
    with pytest.raises(ValueError, match=r"^action of shape \(1,\): expected shape \(\)"):
        checked_action(space, [1])
    space = spaces.MultiDiscrete([3, 5], start=[-1, 0])
    assert checked_action(space, [-1, 4]).tolist() == [-1, 4]
    with pytest.raises(ValueError, match=r"^action head 0 is 2: must be an integer in "
                                         r"\[-1, 1\] \(a\)$"):
        checked_action(space, [2, 0], names=["a", "b"])
    with pytest.raises(ValueError, match=r"^action head 1 is 5: must be an integer in "
                                         r"\[0, 4\]$"):
        checked_action(space, [0, 5])  # no names
    box = spaces.Box(np.array([0, -2], np.float32), np.array([1, 2], np.float32))
    np.testing.assert_array_equal(checked_action(box, [1.0, -2.0]), [1.0, -2.0])
    with pytest.raises(ValueError, match=r"^action head 1 is -2\.5: must be in "
                                         r"\[-2\.0, 2\.0\] \(y\)$"):
        checked_action(box, [0.5, -2.5], names=("x", "y"))
    with pytest.raises(ValueError, match="not an array of numbers"):
        checked_action(box, [[1.0], 2.0])  # ragged
    with pytest.raises(TypeError, match="unsupported action space"):
        checked_action(spaces.MultiBinary(2), [0, 1])
