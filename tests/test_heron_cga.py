"""Heron's constraint models and CGA agent: CP-SAT samples satisfy their constraints and
decode, the exact model accepts MetaSchedule's own samples, hardware constraints bite,
crossover/mutation offspring are valid, the agent tunes through ``tune``, and the envs'
action masks work with sb3-contrib's MaskablePPO."""

from __future__ import annotations

import math
import os
import signal
import time

import numpy as np
import pytest
from sb3_contrib import MaskablePPO
from test_plugins import SyntheticMeasurer

import agents
import envs
from altenv.costmodel import CostModel, extract_features
from altenv.measure import MeasureConfig, create
from altenv.ops import run_numpy
from altenv.records import RecordDB
from altenv.space import TileSubspace
from altenv.space.constraints import (
    LAYOUT,
    Capacity,
    Hardware,
    LayoutConstraints,
    cache_bytes,
    loop_constraints,
)
from altenv.tuning import Budget, OpTask, TuningSession, freeze, tune

GMM = "gmm:M=16,N=16,K=16"
C2D = "c2d:N=1,I=4,O=8,H=8,W=8,KH=3,KW=3,pad=1"
C2D_LAYOUT = {"ht": 8, "wt": 8, "ot": 4, "it": 1, "it_w": 1, "ot_w": 4}


@pytest.fixture(scope="module")
def tasks() -> dict[str, OpTask]:
    # the c2d epilogue adds a compute-location subspace
    return {GMM: OpTask(GMM), C2D: OpTask(C2D, epilogue=("bias", "relu"))}


def space_of(tasks, spec):
    task = tasks[spec]
    factors = freeze({**dict(task.default_factors()), **C2D_LAYOUT}) if spec == C2D \
        else task.default_factors()
    return task.space(factors)


@pytest.mark.parametrize("spec", [GMM, C2D])
def test_samples_satisfy_constraints_decode_and_differ(tasks, spec):
    space = space_of(tasks, spec)
    model = loop_constraints(space)
    genes = model.sample(16, np.random.default_rng(0))
    assert len(genes) == 16
    points = [model.point(g) for g in genes]
    for g, p in zip(genes, points):
        assert model.holds(g) and model.genes_of(p) == g
        assert space.is_valid(p)
        for sub, value in zip(space.subspaces, p.values):
            assert not isinstance(sub, TileSubspace) or sub.is_valid(value)
        for c in model.constraints:
            assert not isinstance(c, Capacity) or c.total(g) <= c.limit
    assert len({p.design for p in points}) > 1
    tiles = [k for k, s in enumerate(space.subspaces) if isinstance(s, TileSubspace)
             and s.extent > 4]
    assert max(len({p.values[k] for p in points}) for k in tiles) >= 4


@pytest.mark.parametrize("spec", [GMM, C2D])
def test_exact_model_accepts_metaschedule_samples_hardware_prunes(tasks, spec):
    space = space_of(tasks, spec)
    exact, hardware = loop_constraints(space, hardware=False), loop_constraints(space)
    samples = space.sample(24, np.random.default_rng(1))
    assert samples and all(exact.satisfied(p) for p in samples)
    pruned = [p for p in samples if not hardware.satisfied(p)]
    assert pruned  # MetaSchedule's sampling ignores vector length and caches


def test_vector_length_constraint(tasks):
    """GMM 16x16x16, default layout: the innermost tile of N (the output's contiguous
    dim) is a multiple of the SIMD lanes."""
    space = space_of(tasks, GMM)
    model = loop_constraints(space)
    lanes = Hardware.of(space.target).lanes()
    n_axis = [k for k, s in enumerate(space.subspaces) if isinstance(s, TileSubspace)][1]
    for g in model.sample(12, np.random.default_rng(2)):
        inner = model.point(g).values[n_axis][-1]
        assert inner % lanes == 0 or (lanes > 16 and inner == 16)


def test_cache_sizes_from_sysfs(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Instruction", "64K"), (1, "Data", "48K"),
                                             (2, "Unified", "2048K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert cache_bytes(1, tmp_path) == 48 * 1024
    assert cache_bytes(2, tmp_path) == 2048 * 1024
    assert cache_bytes(2, tmp_path / "none") == 1024 * 1024
    assert cache_bytes(1) >= 4096


def test_layout_model_multi_level_and_vector_knobs():
    task = OpTask("c2d:N=1,I=16,O=32,H=8,W=8,KH=3,KW=3,pad=1", levels=2)
    hw = Hardware(256, 32768, 524288)
    model = LayoutConstraints(task.template, hw)
    genes = model.sample(20, np.random.default_rng(3))
    assert len(genes) == 20
    for g in genes:
        factors = model.factors(g)
        task.template.check(factors)  # levels of a dim divide it together
        assert factors["ot"] in (1, 32) or factors["ot"] % 8 == 0
    assert model.knob_values("ot") == {1, 8, 16, 32}


def test_ctrl_c_is_still_pythons_after_a_layout_solve():
    """CP-SAT installs a SIGINT handler of its own for a solve and leaves SIG_DFL behind
    unless told not to: Ctrl-C then killed a run without a word. After a solve it must
    still raise KeyboardInterrupt (if it does not, this test process dies)."""
    model = LayoutConstraints(OpTask("gmm:M=16,N=16,K=16").template, Hardware(256, 32768, 524288))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # xdist ignores it
    try:
        assert model.sample(2, np.random.default_rng(0))
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # delivered here
    finally:
        signal.signal(signal.SIGINT, previous)


def test_layout_model_blocks_depthwise_input_like_its_output():
    """A depthwise output lane reads its own input channel: ``it`` is 1 exactly when
    ``ot`` is, and vector-sized otherwise; other convolutions leave ``it`` free."""
    hw = Hardware(256, 32768, 524288)
    dep = LayoutConstraints(OpTask("dep:C=32,H=8,W=8,KH=3,KW=3,pad=1").template, hw)
    base = {"ht": 8, "wt": 8, "it_w": 1, "ot_w": 8}
    for (it, ot), ok in {(1, 1): True, (8, 8): True, (16, 8): True, (32, 16): True,
                         (1, 8): False, (8, 1): False, (4, 8): False}.items():
        assert dep.holds(dep.genes_of({**base, "it": it, "ot": ot})) == ok, (it, ot)
    for g in dep.sample(20, np.random.default_rng(0)):
        f = dep.factors(g)
        assert (f["it"] == 1) == (f["ot"] == 1) and (f["it"] == 1 or f["it"] % 8 == 0)
    grp = LayoutConstraints(OpTask("grp:I=32,O=32,groups=4,H=8,W=8,KH=3,KW=3,pad=1").template,
                            hw)
    assert grp.holds(grp.genes_of({**base, "it": 1, "ot": 8, "it_w": 1}))


def test_crossover_constraints_and_forbidden(tasks):
    model = loop_constraints(space_of(tasks, GMM))
    rng = np.random.default_rng(4)
    a, b = model.sample(2, rng)
    allowed = {n: {a[n], b[n]} for n in model.genes}
    for _ in range(5):
        child = model.solve(rng, allowed, forbidden=[a])
        assert child is not None and child != a and model.holds(child)
        assert all(child[n] in allowed[n] for n in model.genes)
    assert model.solve(rng, {"design": {99}}) is None


@pytest.fixture
def session(tasks, tmp_path):
    with RecordDB(tmp_path / "records.jsonl") as db:
        yield TuningSession(tasks[GMM], SyntheticMeasurer(), db, check=False)


def test_offspring_are_valid_and_inherit_genes(session):
    agent = agents.create("heron_cga", seed=0, mutation_prob=0.0)
    agent.setup(session)
    pool = agent._random(12, None)
    assert pool and len({c.factors for c in pool}) > 1
    pairs = [(pool[i], pool[(i + 1) % len(pool)]) for i in range(len(pool))]
    children = [(pair, agent._offspring(pair, None, None)) for pair in pairs]
    children = [(pair, c) for pair, c in children if c is not None]
    assert len(children) >= 8
    for (a, b), child in children:
        space = session.task.space(child.factors)
        assert space.is_valid(child.point)
        genes = agent.genes(child)
        assert loop_constraints(space).holds(genes)
        # the child takes one parent's layout whole; crossover binds every loop gene to
        # its parents' values, mutation (mutation_prob 0) frees exactly one
        assert child.factors in (a.factors, b.factors) and child not in (a, b)
        ga, gb = agent.genes(a), agent.genes(b)
        outside = [n for n, v in genes.items() if v not in (ga.get(n), gb.get(n))]
        assert len(outside) <= 1 and not any(n.startswith(LAYOUT) for n in outside)


def test_agent_stages_and_key_variables(session):
    agent = agents.create("heron_cga", seed=1, population=12, generations=2, min_records=8,
                          key_variables=3)
    agent.setup(session)
    joint = agent.propose(session, 12, None)
    assert joint and all(session.schedule(c) is not None for c in joint)
    assert len({c.factors for c in joint}) > 1  # the joint stage varies layouts
    chosen = [joint[i] for i in session.select(joint, 10)]
    agent.observe(chosen, session.measure(chosen))
    key = agent.key_genes()
    assert key is not None and 1 <= len(key) <= 3
    assert set(key) <= set().union(*(agent.genes(c) for c in chosen))
    layout = chosen[0].factors
    loop = agent.propose(session, 12, layout)
    assert loop and {c.factors for c in loop} == {layout}


def test_agent_moved_to_another_task_keeps_only_its_state(session, tasks, tmp_path):
    agent = agents.create("heron_cga", seed=2, population=8, min_records=4)
    first = agent.propose(session, 8, None)
    agent.observe(first[:4], session.measure(first[:4]))
    assert agent.key_genes() is not None
    with RecordDB(tmp_path / "c2d.jsonl") as db:
        other = TuningSession(tasks[C2D], SyntheticMeasurer(), db, check=False)
        proposed = agent.propose(other, 8, None)
        # records, population and chromosomes of the GMM task are gone: ranking key
        # genes would otherwise decode GMM points in C2D's loop spaces
        assert agent._records == [] and agent.key_genes() is None
        assert proposed and all(other.schedule(c) is not None for c in proposed)
        knobs = set(dict(tasks[C2D].default_factors()))
        assert agent._genes and all(set(dict(c.factors)) == knobs for c in agent._genes)


@pytest.mark.slow
def test_heron_cga_tunes_end_to_end(tasks, tmp_path):
    with create("local", MeasureConfig(number=1, repeat=2, min_repeat_ms=5)) as measurer, \
            RecordDB(tmp_path / "records.jsonl") as db:
        task = tasks[C2D]
        session = TuningSession(task, measurer, db)
        best = tune(session, agents.create("heron_cga", seed=0, generations=1),
                    Budget.split(8), batch=16, top_k=4, progress=False)
        assert session.trials == 8 and math.isfinite(best)
        cand, _ = session.best
        program = task.program(cand.factors)
        raw = program.random_inputs(3)
        out = run_numpy(program, raw, func=session.schedule(cand).mod)
        np.testing.assert_allclose(out, program.reference(raw), rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def cost_model(tasks) -> CostModel:
    """Synthetic labels: the env tests need fixed predictions, not good ones."""
    model, rng = CostModel(), np.random.default_rng(0)
    space = space_of(tasks, GMM)
    points = space.sample(8, rng)
    feats = extract_features(space.context, [space.decode(p) for p in points])
    model.update(tasks[GMM].key, feats, rng.uniform(1e-5, 1e-4, len(feats)))
    return model


def test_loop_env_masks_keep_the_walk_valid(tasks, cost_model):
    env = envs.LoopTuningEnv(tasks[GMM], reward_source="cost_model", cost_model=cost_model,
                             batch=8, episode_length=8, hardware_constraints=True)
    env.reset(seed=0)
    rng = np.random.default_rng(5)
    nvec = env.action_space.nvec
    bounds = np.concatenate([[0], np.cumsum(nvec)])
    moved = 0
    for _ in range(8):
        mask = env.action_masks()
        assert mask.shape == (nvec.sum(),) and not mask.all()
        assert all(mask[bounds[k]] for k in range(len(nvec)))  # staying is always allowed
        action = [int(rng.choice(np.flatnonzero(mask[bounds[k]:bounds[k + 1]])))
                  for k in range(len(nvec))]
        before = env.point
        env.step(np.array(action))
        moved += env.point != before
        assert env.space.is_valid(env.point) and env.constraints.satisfied(env.point)
    assert moved
    model = MaskablePPO("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0,
                        device="cpu")
    model.learn(16)
    assert env.constraints.satisfied(env.point)
    env.close()


def test_layout_env_masks(tasks, cost_model):
    env = envs.LayoutTuningEnv(tasks[C2D], reward_source="cost_model", cost_model=cost_model,
                               action_type="discrete", hardware_constraints=True)
    mask = env.action_masks()
    nvec = env.action_space.nvec
    assert mask.shape == (nvec.sum(),)
    bounds = np.concatenate([[0], np.cumsum(nvec)])
    rng = np.random.default_rng(6)
    for _ in range(10):
        action = np.array([int(rng.choice(np.flatnonzero(mask[bounds[k]:bounds[k + 1]])))
                           for k in range(len(nvec))])
        factors = env.factors_of(action)
        assert env.layout_constraints.holds(env.layout_constraints.genes_of(dict(factors)))
    it = env.template.knob_names.index("it")  # I=4: index 3 is past its divisor list
    assert not mask[bounds[it] + 3]
    ot = env.template.knob_names.index("ot")  # O=8: 2 and 4 are not vector-friendly
    assert list(mask[bounds[ot]:bounds[ot + 1]]) == [True, False, False, True]
    with pytest.raises(ValueError, match="discrete"):
        envs.LayoutTuningEnv(tasks[GMM], reward_source="cost_model",
                             cost_model=cost_model).action_masks()
