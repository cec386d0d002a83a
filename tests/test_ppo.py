"""The PPO agent: cross exploration then loop-only, within budget, checkpoints reused on
another workload (PPO-Pret), and pretraining through ``altenv train``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import agents
from altenv.cli import main
from altenv.measure import MeasureConfig, create
from altenv.records import RecordDB
from altenv.tuning import Budget, OpTask, TuningSession, tune
from envs.loop import LoopTuningEnv
from envs.wrappers import PaddedLoop

SMALL = {"walk_length": 8, "loop_episode": 16, "layout_episode": 2}


@pytest.fixture(scope="module")
def measurer():
    with create("local", MeasureConfig(number=1, repeat=2, min_repeat_ms=5)) as m:
        yield m


def test_padded_loop_env_has_fixed_shapes():
    shapes = set()
    for spec in ("gmm:M=16,N=16,K=16", "c2d:N=1,I=8,O=8,H=6,W=6,KH=3,KW=3,pad=1"):
        env = PaddedLoop(LoopTuningEnv(spec, reward_source="cost_model", batch=8,
                                       episode_length=4))
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs)
        for _ in range(4):
            obs, reward, term, trunc, _ = env.step(env.action_space.sample())
            assert env.observation_space.contains(obs) and np.isfinite(reward)
        shapes.add((env.observation_space.shape, env.action_space.shape))
        env.close()
    assert len(shapes) == 1  # one policy fits both workloads


@pytest.mark.slow
def test_ppo_tunes_within_budget_and_pretrains(measurer, tmp_path):
    task = OpTask("c2d:N=1,I=8,O=16,H=8,W=8,KH=3,KW=3,pad=1", epilogue=("bias", "relu"))
    db = RecordDB(tmp_path / "r.jsonl")
    session = TuningSession(task, measurer, db)
    agent = agents.create("ppo", seed=0, **SMALL)
    best = tune(session, agent, Budget(10, 14), batch=16, top_k=4, progress=False)
    assert np.isfinite(best) and session.trials == 24 and db.count() == 24
    keys = [r.key for r in db.records()]
    assert len(set(keys)) == len(keys)
    assert agent.loop_model is not None and agent.layout_models
    agent.save(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "models.json").read_text())
    assert "loop" in saved and any(k.startswith("layout-c2d") for k in saved)

    # PPO-Pret: the checkpoint drives another C2D shape
    other = OpTask("c2d:N=1,I=16,O=8,H=10,W=10,KH=3,KW=3,pad=1")
    pret = agents.create("ppo", seed=1, checkpoint=str(tmp_path / "ckpt"), **SMALL)
    session2 = TuningSession(other, measurer, RecordDB(tmp_path / "r2.jsonl"))
    assert np.isfinite(tune(session2, pret, Budget(6, 6), batch=16, top_k=4, progress=False))
    assert session2.trials == 12


@pytest.mark.slow
def test_altenv_train_writes_a_checkpoint(tmp_path, capsys):
    config = tmp_path / "train.yaml"
    config.write_text(
        "name: pre\n"
        "workloads: ['gmm:M=16,N=16,K=16', 'gmm:M=16,N=32,K=16']\n"
        "budget: {joint: 4, loop_only: 4}\n"
        "agent: {name: ppo, options: {walk_length: 4, loop_episode: 8, layout_episode: 2}}\n"
        "search: {batch: 8, top_k: 2}\n"
        "measure: {number: 1, repeat: 2, min_repeat_ms: 5}\n")
    assert main(["train", str(config), "--output-dir", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint" in out
    assert (tmp_path / "pre" / "checkpoint" / "loop.zip").exists()
    records = RecordDB(tmp_path / "pre" / "records.jsonl")
    assert records.workloads() == ["gmm:M=16,N=16,K=16", "gmm:M=16,N=32,K=16"]
    assert records.count() == 16


@pytest.mark.slow
def test_joint_stage_keeps_to_its_trials(measurer, tmp_path):
    """One joint step measures two loop rounds of top 2; the stage still stops at its
    share, so the loop-only stage keeps its trials, and the session's limit is restored."""
    session = TuningSession(OpTask("gmm:M=16,N=16,K=16"), measurer,
                            RecordDB(tmp_path / "records.jsonl"))
    session.limit = 8
    agent = agents.create("ppo", seed=0, walk_length=4, loop_episode=8, layout_episode=2)
    agent.joint_stage(session, 4, 8, 2, lambda _: None)
    assert session.trials == 4 and session.limit == 8
