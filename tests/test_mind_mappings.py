"""The ``mind_mappings`` agent: candidate encoding and projection, the MLP surrogate
(learning, input gradients, checkpoints) and the agent in the tuning loop."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr
from synthetic import SyntheticMeasurer

import agents
from agents.mind_mappings import MindMappingsAgent, gradient_search
from agents.mm_surrogate import (
    FORMAT,
    INPUT_SIZE,
    LAYOUT_SLICE,
    LOOP_SLICE,
    CandidateCodec,
    Surrogate,
    nearest_value,
    normalized_costs,
    pretrain,
    records_dataset,
    workload_features,
)
from agents.options import MindMappingsOptions
from altenv.cli import main
from altenv.config import RunConfig, TrainConfig, load_config
from altenv.measure import MeasureConfig, create
from altenv.records import RecordDB
from altenv.space import TileSubspace
from altenv.tuning import Budget, OpTask, TuningSession, tune

GMM = "gmm:M=16,N=16,K=16"
C2D = "c2d:N=1,I=4,O=8,H=8,W=8,KH=3,KW=3,pad=1"


@pytest.fixture(scope="module")
def gmm_data() -> tuple[CandidateCodec, list, np.ndarray]:
    """160 random valid GMM candidates (random layouts) and their encodings."""
    codec = CandidateCodec(OpTask(GMM), np.random.default_rng(0))
    cands = [codec.random() for _ in range(160)]
    return codec, cands, codec.encode_many(cands)


def bowl(x: np.ndarray) -> np.ndarray:
    """A synthetic log-latency over real encodings: a quadratic bowl around a fixed
    centre of the searchable entries (drawn for them alone, so that a workload key added
    to the encoding leaves it as it is), plus an interaction term."""
    movable = x[:, LAYOUT_SLICE.start:]
    c = np.random.default_rng(7).uniform(0.2, 0.8, INPUT_SIZE - LAYOUT_SLICE.start)
    return ((movable - c) ** 2).sum(axis=1) + 2 * movable[:, 0] * movable[:, 1]


def test_encoding_round_trips_and_projection_is_valid():
    rng = np.random.default_rng(1)
    for spec, epilogue in ((GMM, ()), (C2D, ("bias", "relu"))):
        task = OpTask(spec, epilogue=epilogue)
        codec = CandidateCodec(task, np.random.default_rng(0))
        cands = [codec.random() for _ in range(10)]
        x = codec.encode_many(cands)
        assert x.shape == (10, INPUT_SIZE) and x.min() >= 0 and x.max() <= 1
        assert np.all(x[:, :LAYOUT_SLICE.start] == workload_features(task.workload))
        for cand, row in zip(cands, x):
            assert codec.project(row) == (cand, True)  # encodings of valid points round-trip
        # arbitrary vectors land on valid candidates; a fixed layout stays fixed
        fixed = cands[0].factors
        for _ in range(12):
            v = rng.uniform(0, 1, INPUT_SIZE).astype(np.float32)
            for layout in (None, fixed):
                cand, _ = codec.project(v, layout)
                task.template.check(dict(cand.factors))
                assert task.space(cand.factors).is_valid(cand.point)
                assert layout is None or cand.factors == layout
        mask = codec.movable(fixed, fixed_layout=True)
        assert not mask[LAYOUT_SLICE].any()
        assert mask[LOOP_SLICE].sum() == task.space(fixed).vector_size
        assert codec.movable(fixed, fixed_layout=False)[LAYOUT_SLICE].sum() == \
            len(task.template.knobs)
    # every projection above is a real candidate: rounding alone, or the sampled fallback
    assert codec.stats["projections"] == len(cands) + 12 * 2


@pytest.mark.slow
def test_projection_falls_back_to_the_nearest_sampled_point():
    """On a CUDA space most roundings fail MetaSchedule's ``VerifyGPUCode`` (CPU spaces of
    the fused operators round to valid points): the projection then takes the pool's
    sampled valid point nearest to the vector's loop entries."""
    task = OpTask(GMM, target="cuda")
    codec = CandidateCodec(task, np.random.default_rng(0))
    layout = task.default_factors()
    space = task.space(layout)
    rng = np.random.default_rng(1)
    fell_back = 0
    for _ in range(2):
        v = rng.uniform(0, 1, INPUT_SIZE).astype(np.float32)
        cand, rounded = codec.project(v, layout)
        assert cand.factors == layout and space.is_valid(cand.point)
        if rounded:
            continue
        fell_back += 1
        pool = codec.pool(layout)
        target = v[LOOP_SLICE][:space.vector_size]
        distances = [((space.encode(p) - target) ** 2).sum() for p in pool]
        assert cand.point == pool[int(np.argmin(distances))]
    assert fell_back > 0 and codec.stats["fallbacks"] == fell_back


def test_nearest_value_and_workload_features():
    sub = TileSubspace("t", extent=12, levels=3, max_innermost=2)
    for value in ((2, 3, 2), (12, 1, 1), (1, 6, 2)):
        assert nearest_value(sub, np.array(sub.encode(value))) == value
    off = nearest_value(sub, np.array([0.1, 0.2, 0.9]))  # innermost 12 is not allowed
    assert sub.is_valid(off) and off[-1] <= 2
    a, b = (workload_features(OpTask(s).workload) for s in (GMM, C2D))
    assert a.shape == b.shape and not np.array_equal(a, b)
    assert np.allclose(normalized_costs([2e-3, 1e-3, 4e-3]), [math.log(2), 0, math.log(4)])


def test_surrogate_learns_and_its_gradient_descends(gmm_data):
    codec, cands, x = gmm_data
    y = normalized_costs(np.exp(bowl(x)))
    train, test = slice(0, 120), slice(120, None)
    model = Surrogate((256, 128), seed=0)
    untrained = spearmanr(model.predict(x[test]), y[test]).statistic
    history = model.fit(x[train], y[train], epochs=300, lr=1e-3)
    assert history[-1] < 0.1 * history[0]
    rho = spearmanr(model.predict(x[test]), y[test]).statistic
    assert rho > 0.75 and rho > untrained + 0.3, (rho, untrained)

    # small steps against the input gradient lower the predicted cost of every start
    start = x[test][:8]
    before, grad = model.gradient(start)
    after = model.predict(start - 0.01 * grad / np.abs(grad).max(axis=1, keepdims=True))
    assert np.all(after < before)

    # projected descent finds candidates the true (synthetic) cost prefers
    starts = cands[120:128]
    visited = gradient_search(codec, model, starts, None, steps=12, step_size=0.1,
                              injection_period=4, temperature=0.1,
                              rng=np.random.default_rng(0))
    assert set(starts) <= set(visited) and len(visited) > len(starts)
    for cand in visited:
        assert codec.task.space(cand.factors).is_valid(cand.point)
    best = sorted(visited, key=visited.get)[:8]
    assert bowl(codec.encode_many(best)).mean() < bowl(codec.encode_many(starts)).mean()


def test_checkpoints_give_identical_predictions(gmm_data, tmp_path):
    _, _, x = gmm_data
    agent = MindMappingsAgent(MindMappingsOptions(seed=3, hidden_sizes=(32, 16)))
    agent.surrogate.fit(x[:40], np.linspace(0, 1, 40, dtype=np.float32), epochs=5)
    agent.save(tmp_path / "ckpt")
    loaded = agents.create("mind_mappings", checkpoint=str(tmp_path / "ckpt"), seed=9)
    assert loaded.surrogate.hidden_sizes == (32, 16) and loaded.pretrained
    np.testing.assert_array_equal(loaded.surrogate.predict(x), agent.surrogate.predict(x))
    direct = Surrogate.load(tmp_path / "ckpt" / "surrogate.pt")
    np.testing.assert_array_equal(direct.predict(x), agent.surrogate.predict(x))

    import torch  # a checkpoint of another encoding is refused

    state = torch.load(tmp_path / "ckpt" / "surrogate.pt", weights_only=True)
    torch.save({**state, "format": FORMAT + "-old"}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="surrogate encoding"):
        Surrogate.load(tmp_path / "old.pt")


def test_agent_in_the_tuning_loop(tmp_path):
    """Both stages through ``tune``: budget spent, distinct candidates, the loop-only
    stage on the best layout, the surrogate trained on every measurement."""
    task = OpTask(GMM)
    with RecordDB(tmp_path / "records.jsonl") as db:
        session = TuningSession(task, SyntheticMeasurer(), db, check=False)
        agent = agents.create("mind_mappings", seed=0, chains=4, steps=6, injection_period=3,
                              min_records=4, epochs=5, hidden_sizes=(32,))
        tune(session, agent, Budget(8, 8), batch=16, top_k=4, progress=False)
        assert session.trials == 16
        keys = [r.key for r in db.records()]
        assert len(set(keys)) == 16
        best, _ = session.best
        assert {str(r.layouts["factors"]) for r in db.records()[8:]} == \
            {str(dict(best.factors))}
        assert agent.ready and len(agent.data[task.key]) == 16
        x, y = agent.dataset()
        assert x.shape == (16, INPUT_SIZE) and y.min() == 0
        proposed = agent.propose(session, 16, best.factors)
        assert proposed and len(set(proposed)) == len(proposed)
        assert all(c.factors == best.factors and session.measured(c) is None for c in proposed)
        assert all(session.schedule(c) is not None for c in proposed)

        # a resumed session's records train a new agent before its first proposal
        again = MindMappingsAgent(MindMappingsOptions(seed=1, min_records=4, hidden_sizes=(32,),
                                                      epochs=5))
        again.setup(TuningSession(task, SyntheticMeasurer(), db, check=False))
        assert len(again.data[task.key]) == 16 and again.ready

    # offline Phase 1 from a records file: the same training set the agent built
    xr, yr = records_dataset(RecordDB(tmp_path / "records.jsonl"))
    assert sorted(map(tuple, xr)) == sorted(map(tuple, x)) and sorted(yr) == sorted(y)
    surrogate = pretrain([tmp_path / "records.jsonl"], hidden_sizes=(16,), epochs=3)
    assert surrogate.samples_seen == 48 and np.isfinite(surrogate.predict(xr)).all()


@pytest.mark.slow
def test_agent_tunes_with_real_measurements(tmp_path):
    task = OpTask(C2D, epilogue=("bias", "relu"))
    with create("local", MeasureConfig(number=1, repeat=2, min_repeat_ms=5)) as measurer, \
            RecordDB(tmp_path / "r.jsonl") as db:
        session = TuningSession(task, measurer, db)
        agent = agents.create("mind_mappings", seed=0, chains=4, steps=8, min_records=4)
        best = tune(session, agent, Budget(4, 8), batch=16, top_k=4, progress=False)
        assert np.isfinite(best) and session.trials == 12
        ok = [r for r in db.records() if r.ok]
        assert len(ok) == len(agent.data[task.key]) > 4


@pytest.mark.slow
def test_altenv_train_pretrains_a_surrogate(tmp_path, capsys, gmm_data):
    config = tmp_path / "train.yaml"
    config.write_text(
        "name: pre\n"
        "workloads: ['gmm:M=16,N=16,K=16', 'gmm:M=16,N=32,K=16']\n"
        "budget: {joint: 4, loop_only: 4}\n"
        "agent: {name: mind_mappings, options: {chains: 4, steps: 6, min_records: 4}}\n"
        "search: {batch: 8, top_k: 2}\n"
        "measure: {number: 1, repeat: 2, min_repeat_ms: 5}\n")
    assert main(["train", str(config), "--output-dir", str(tmp_path), "--quiet"]) == 0
    assert "checkpoint" in capsys.readouterr().out
    ckpt = tmp_path / "pre" / "checkpoint"
    pret = agents.create("mind_mappings", checkpoint=str(ckpt))
    assert pret.pretrained and pret.surrogate.samples_seen > 0
    assert np.isfinite(pret.surrogate.predict(gmm_data[2])).all()


def test_shipped_configs_name_real_options():
    configs = Path(__file__).resolve().parent.parent / "configs"
    for name, schema in (("c2d_resnet_3x3_mind.yaml", RunConfig),
                         ("pretrain_mind.yaml", TrainConfig)):
        cfg = load_config(configs / name, schema)
        assert cfg.agent.name == "mind_mappings"
        assert isinstance(agents.build(cfg.agent.name, cfg.agent.options), MindMappingsAgent)
