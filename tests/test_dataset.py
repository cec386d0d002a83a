"""Measured-program datasets: collection (checked, timed in interleaved rounds, the
framework layout always in, resumable with nothing measured twice), Parquet storage read
one workload at a time, dataset URIs, the surrogate, and the replay environment."""

from __future__ import annotations

import csv
import json
import math

import gymnasium as gym
import numpy as np
import pytest
import xgboost as xgb
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import envs
from altenv.dataset import Dataset
from altenv.dataset.collect import Plan, collect
from altenv.dataset.layouts import layout_plan
from altenv.dataset.replay import WorkloadReplay, program_key
from altenv.dataset.surrogate import (
    Calibration,
    Surrogate,
    TreeEnsemble,
    evaluate,
    layout_vector,
    point_features,
    spearman,
    top_recall,
    workload_rows,
)
from altenv.measure import LocalMeasurer, MeasureConfig, MeasureResult, RPCMeasurer
from altenv.ops import LayoutTemplate, parse_workload
from altenv.records import RecordDB
from altenv.tuning import freeze

WORKLOADS = [("gmm-000", "gmm:M=16,N=32,K=64"),
             ("dep-000", "dep:N=1,C=16,H=14,W=14,KH=3,KW=3,pad=1")]
PLAN = Plan(layouts=3, samples=4, searched=2, rounds=5, reference_every=1e9,
            quiet_host=False, drift=math.inf)
TIMING = MeasureConfig(number=1, repeat=1, min_repeat_ms=1)
DATASET = pytest.mark.xdist_group("dataset")


class CountingMeasurer(LocalMeasurer):
    """Counts the programs it builds; raises after ``fail_after`` batches (a kill)."""

    def __init__(self, fail_after: int | None = None):
        super().__init__(TIMING)
        self.built = 0
        self.batches = 0
        self.fail_after = fail_after

    def retime(self, candidates, rounds, cold=False):
        if self.fail_after is not None and self.batches >= self.fail_after:
            raise KeyboardInterrupt("killed")
        self.batches += 1
        self.built += len(candidates)
        return super().retime(candidates, rounds, cold)


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> Dataset:
    """A small dataset collected once, in two calls: the first killed mid-workload."""
    out = tmp_path_factory.mktemp("ds") / "tiny"
    killed = CountingMeasurer(fail_after=3)  # the reference, then two batches of gmm-000
    try:
        with pytest.raises(KeyboardInterrupt):
            collect(out, WORKLOADS, PLAN, TIMING, measurer=killed, progress=False)
        resumed = CountingMeasurer()
        collect(out, WORKLOADS, PLAN, TIMING, measurer=resumed, progress=False)
    finally:
        killed.close()
        resumed.close()
    data = Dataset.open(out)
    data.card["_built"] = killed.built + resumed.built - 2  # less the reference's two
    return data


@pytest.mark.slow
@DATASET
def test_collect_rows_layouts_and_timings(collected):
    assert collected.workloads() == ["gmm-000", "dep-000"]
    for name, spec in WORKLOADS:
        w = collected.load(name)
        assert w.spec == str(parse_workload(spec)) and len(w.layouts) == PLAN.layouts
        framework = freeze(LayoutTemplate(spec).default_factors())
        assert freeze(w.layouts[w.framework_layout()]["factors"]) == framework
        assert w.layouts[0]["framework"] and not any(lay["framework"] for lay in w.layouts[1:])
        assert np.isfinite(w.latency).all()  # every program passed its check against torch
        assert all(len(t) == PLAN.rounds for t in w.latencies)
        assert np.allclose(w.latency, [np.median(t) for t in w.latencies])
        per_layout = np.bincount(w.layout)
        assert per_layout.max() <= PLAN.samples + PLAN.searched
        origins = w.table.column("origin").to_pylist()
        assert origins.count("sample") == PLAN.layouts * PLAN.samples
        assert 0 < origins.count("search") <= PLAN.layouts * PLAN.searched
        assert len(set(zip(w.layout.tolist(), w.decisions))) == len(w)  # all distinct
        assert w.features.shape == (len(w), 400) and w.features.max() <= 1.0
        assert np.isfinite(w.table.column("reference").to_numpy()).all()
    card = collected.card
    assert card["counts"]["workloads"] == 2 and card["counts"]["failed"] == 0
    assert card["target"] and card["host"]["cpu"] and set(card["seconds"]) == {"gmm-000",
                                                                                "dep-000"}
    assert collected.reference().num_rows >= 1


@pytest.mark.slow
@DATASET
def test_killed_collection_resumes_without_measuring_twice(collected):
    programs = sum(len(w) for w in collected)
    assert collected.card["_built"] == programs  # each program built (and timed) once
    journal = collected.path / "journal" / "gmm-000.jsonl"
    keys = [json.loads(line)["key"] for line in journal.read_text().splitlines()
            if line.strip() and "key" in json.loads(line)]
    assert len(keys) == len(set(keys)) == len(collected.load("gmm-000"))


@pytest.mark.slow
@DATASET
def test_dataset_uri_names_a_workload(collected, monkeypatch):
    monkeypatch.setenv("ALTENV_DATASETS", str(collected.path.parent))
    assert parse_workload("altenv://tiny/dep-000") == parse_workload(WORKLOADS[1][1])
    with pytest.raises(ValueError, match="has no workload 'c2d-009'"):
        parse_workload("altenv://tiny/c2d-009")
    with pytest.raises(ValueError, match="not a dataset directory nor a known dataset"):
        parse_workload("altenv://nope/c2d-000")


@pytest.mark.slow
@DATASET
def test_replay_env_passes_checkers_and_replays_timings(collected):
    env = envs.CrossExplorationReplayEnv(dataset=str(collected.path), batch=4,
                                         walk_length=3, loop_rounds=1, episode_layouts=2)
    check_env(env, skip_render_check=True)
    sb3_check_env(env)
    obs, info = env.reset(seed=3)
    assert info["workload"].startswith("altenv://tiny/")
    w = env.workload.data
    seen = {"replayed": 0, "predicted": 0}
    rng = np.random.default_rng(0)
    for _ in range(40):
        mask = env.action_masks()
        action = np.zeros(len(env.action_space.nvec), dtype=np.int64)
        at = 0
        for h, n in enumerate(env.action_space.nvec):
            action[h] = rng.choice(np.flatnonzero(mask[at:at + n]))
            at += n
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs) and not terminated
        if "replayed" in info and "latency" in info:
            seen["replayed" if info["replayed"] else "predicted"] += 1
            if info["replayed"]:
                row = env.layout.points[env.point]
                assert info["latency"] in w.latencies[row]  # one of its own timings
        if truncated:
            obs, info = env.reset()
            w = env.workload.data
    assert seen["replayed"] + seen["predicted"] > 0
    with pytest.raises(ValueError, match=r"action head 0 is 99: must be an integer in \[0, 11"):
        env.step(np.full(len(env.action_space.nvec), 99))


@pytest.mark.slow
@DATASET
def test_gym_make_dispatches_on_reward_source(collected):
    env = gym.make("altenv/CrossExploration-v0", reward_source="dataset",
                   dataset=str(collected.path), batch=4, walk_length=2)
    assert isinstance(env.unwrapped, envs.CrossExplorationReplayEnv)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="takes no session"):
        gym.make("altenv/CrossExploration-v0", reward_source="dataset",
                 dataset=str(collected.path), session=object())


@pytest.mark.slow
@DATASET
def test_loop_and_layout_replays(collected, monkeypatch):
    monkeypatch.setenv("ALTENV_DATASETS", str(collected.path.parent))
    loop = gym.make("altenv/LoopTuning-v0", workload="altenv://tiny/dep-000",
                    reward_source="dataset", batch=4, episode_length=5)
    check_env(loop.unwrapped, skip_render_check=True)
    sb3_check_env(loop.unwrapped)
    obs, info = loop.reset(seed=0)
    assert info["factors"] == collected.load("dep-000").layouts[0]["factors"]
    for _ in range(5):
        obs, reward, terminated, truncated, info = loop.step(loop.action_space.sample())
        best = loop.unwrapped.workload.best  # a drawn timing may beat the best median
        assert reward == pytest.approx(best / info["latency"]) and reward > 0
        assert isinstance(info["replayed"], bool)
    assert truncated
    with pytest.raises(ValueError, match="not in the dataset"):
        gym.make("altenv/LoopTuning-v0", workload="altenv://tiny/dep-000",
                 reward_source="dataset", layout={"ht": 7, "wt": 7, "ot": 2, "it": 2,
                                                  "it_w": 1, "ot_w": 2})
    for action_type in ("continuous", "discrete"):
        layout = gym.make("altenv/LayoutTuning-v0", workload="altenv://tiny/gmm-000",
                          reward_source="dataset", action_type=action_type, batch=4)
        check_env(layout.unwrapped, skip_render_check=True)
        layout.reset(seed=1)
        obs, reward, _, _, info = layout.step(layout.action_space.sample())
        held = [lay["factors"] for lay in collected.load("gmm-000").layouts]
        best = layout.unwrapped.workload.best
        assert info["factors"] in held and reward == pytest.approx(best / info["latency"])
    with pytest.raises(ValueError, match="JointTuning-v0: reward_source='dataset' is not"):
        gym.make("altenv/JointTuning-v0", workload="altenv://tiny/gmm-000",
                 reward_source="dataset")


@pytest.mark.slow
@DATASET
def test_surrogate_holds_out_and_replay_predicts_off_data(collected):
    scores, model = evaluate(collected, holdout=0.3, seed=0, rounds=30)
    assert {s.workload for s in scores} <= {"gmm-000", "dep-000"}
    # nan where a few trees predict every held-out program of the tiny data alike
    assert all((math.isnan(s.spearman) or -1 <= s.spearman <= 1) and 0 <= s.recall <= 1
               for s in scores)
    replay = WorkloadReplay(collected.load("gmm-000"), model)
    layout = replay.layouts[0]
    point = replay.data.decisions[int(layout.rows[0])]
    moved = next(q for q in (layout.step(point, [0] + [d] * 40) for d in range(1, 13))
                 if q not in layout.points)
    latency, replayed = replay.latency(layout, moved, np.random.default_rng(0))
    assert not replayed and latency >= replay.best * (1 - 1e-6)
    assert replay.features(layout, moved).shape == (400,)


def test_calibration_restores_the_measured_spread_and_keeps_a_programs_value():
    """Predictions shrunk towards the middle are mapped back onto the measured quantiles
    (ranking kept); the noise is drawn once per program; the JSON round-trips."""
    rng = np.random.default_rng(0)
    measured = -rng.gamma(2.0, 0.8, 500)
    shrunk = 0.3 * measured - 1.0 + rng.normal(0, 0.05, 500)
    plain = Calibration.fit({"w": (shrunk, measured)}, noise=0.0)
    mapped = np.array([plain.value("w", p, i) for i, p in enumerate(shrunk)])
    assert np.all(np.diff(mapped[np.argsort(shrunk)]) >= -1e-9)
    assert mapped.max() > measured.max() - 0.1 and shrunk.max() < measured.max() - 0.5
    assert plain.value("unknown", -1.5, 0) == -1.5
    noisy = Calibration.fit({"w": (shrunk, measured)}, noise=0.5)
    values = [noisy.value("w", -1.2, ("layout", (1, 2, k))) for k in range(20)]
    assert values[3] == noisy.value("w", -1.2, ("layout", (1, 2, 3)))
    assert len(set(values)) == 20 and max(values) <= 0.0
    again = Calibration.from_json(json.loads(json.dumps(noisy.to_json())))
    assert again.value("w", -1.2, "p") == pytest.approx(noisy.value("w", -1.2, "p"), abs=1e-4)


@pytest.mark.slow
@DATASET
def test_the_surrogate_command_saves_a_calibration_replays_use(collected, tmp_path, capsys):
    import shutil

    from altenv.cli import main

    data_dir = tmp_path / "tiny"
    shutil.copytree(collected.path, data_dir)
    assert main(["dataset", "surrogate", str(data_dir), "--holdout", "0.3",
                 "--calibrate", "0.5"]) == 0
    assert "surrogate-calibration.json" in capsys.readouterr().out
    data = Dataset.open(data_dir)
    model = Surrogate.load(data_dir / "surrogate.ubj.gz")
    assert set(model.calibration.predicted) == {"gmm-000", "dep-000"}
    replay = WorkloadReplay(data.load("gmm-000"), model)
    layout = replay.layouts[1]
    x = point_features(replay.workload_features, layout_vector(layout.factors, replay.extents),
                       layout.encodings[0], replay.data.decisions[int(layout.rows[0])],
                       layout.description)
    assert replay.predict(layout.factors, layout.encodings[0],
                          replay.data.decisions[int(layout.rows[0])], layout.description
                          ) == pytest.approx(replay.best / 2.0 ** model.value(
                              "gmm-000", x, program_key(layout.factors, replay.data.decisions[
                                  int(layout.rows[0])])))
    # refitted without --calibrate: the calibration of the earlier fit is gone
    assert main(["dataset", "surrogate", str(data_dir), "--holdout", "0.3"]) == 0
    assert Surrogate.load(data_dir / "surrogate.ubj.gz").calibration is None


@pytest.mark.slow
@DATASET
def test_a_sessions_programs_are_replayed_by_the_program_surrogate(collected, tmp_path,
                                                                    capsys):
    """``dataset surrogate`` fits the program surrogate beside the point one; a replay
    that has it asks the session for each candidate's features and predicts from them."""
    import shutil

    from altenv.cli import main
    from altenv.costmodel import extract_features, feature_bytes
    from altenv.dataset.measurer import ReplayMeasurer
    from altenv.dataset.surrogate import program_input
    from altenv.tuning import Candidate, OpTask, TuningSession

    data_dir = tmp_path / "tiny"
    shutil.copytree(collected.path, data_dir)
    assert main(["dataset", "surrogate", str(data_dir), "--holdout", "0.3"]) == 0
    assert "program surrogate" in capsys.readouterr().out
    accuracy = json.loads((data_dir / "surrogate-accuracy.json").read_text())
    assert accuracy["program"]["workloads"] == accuracy["workloads"]
    data = Dataset.open(data_dir)
    measurer = ReplayMeasurer(data, seed=0)
    assert measurer.reads_features
    program_model = Surrogate.load(data_dir / "surrogate-program.ubj.gz")
    assert program_model.calibration is None
    w = data.load("gmm-000")
    task = OpTask(w.spec, measurer.target)
    replay = measurer.workload(w.spec)
    layout = replay.framework()
    space = task.space(freeze(layout.factors))
    point = next(p for p in space.sample(64, seed=1)
                 if tuple(space.to_vector(space.canonical(p))) not in layout.points)
    with RecordDB(tmp_path / "records.jsonl") as db:
        session = TuningSession(task, measurer, db)
        (latency,) = session.measure([Candidate(freeze(layout.factors), point)])
    assert measurer.predicted == 1 and measurer.replayed == 0
    canonical = space.canonical(point)
    feats = feature_bytes(extract_features(space.context, [space.decode(canonical)])[0])
    x = point_features(replay.workload_features, layout_vector(layout.factors, replay.extents),
                       space.encode(canonical), space.to_vector(canonical), space.describe())
    want = replay.best / 2.0 ** program_model.predict_one(program_input(x, feats))
    assert latency == pytest.approx(want, rel=1e-5)
    assert latency != pytest.approx(replay.predict(layout.factors, space.encode(canonical),
                                                   space.to_vector(canonical),
                                                   space.describe()), rel=1e-6)


def test_tree_ensemble_equals_xgboost():
    rng = np.random.default_rng(0)
    x = rng.random((300, 12)).astype(np.float32)
    y = np.sin(4 * x[:, 0]) + x[:, 3] * x[:, 5] - (x[:, 7] > 0.5)
    booster = xgb.train({"max_depth": 6, "eta": 0.3, "nthread": 1, "base_score": 0.25},
                        xgb.DMatrix(x, label=y), num_boost_round=40)
    fast = TreeEnsemble(booster)
    want = booster.inplace_predict(x)
    got = np.array([fast.predict_one(row) for row in x])
    assert np.allclose(got, want, atol=1e-5)
    surrogate = Surrogate(booster)
    assert surrogate.predict_one(x[0]) == pytest.approx(min(float(want[0]), 0.0), abs=1e-5)


def test_rank_metrics():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833)  # scipy's value
    assert top_recall([5, 4, 3, 2, 1, 0], [5, 4, 0, 0, 0, 0], k=2) == 1.0
    assert top_recall([5, 4, 3, 2, 1, 0], [0, 0, 0, 0, 5, 4], k=2) == 0.0


def test_layout_plan_keeps_framework_and_stratifies():
    template = LayoutTemplate("c2d:N=1,I=64,O=64,H=28,W=28,KH=3,KW=3,pad=1")
    plan = layout_plan(template, 12, np.random.default_rng(0), lanes=16)
    assert plan[0] == freeze(template.default_factors())
    assert plan[1] == freeze(template.blocked_factors(16))
    assert len(plan) == 12 == len(set(plan))
    for factors in plan:
        template.check(dict(factors))
    ot = {dict(f)["ot"] for f in plan[2:]}
    assert len(ot) >= 4  # stratified: many tile sizes of each knob, not one
    small = LayoutTemplate("gmm:M=4,N=4,K=2")  # 3 x 3 x 2 layouts: all under the cap
    assert len(layout_plan(small, 100, np.random.default_rng(0), lanes=8)) == 3 * 3 * 2


def test_workload_rows_label_failed_programs_lowest(collected_free_table):
    x, y = workload_rows(collected_free_table)
    assert y.max() == 0.0 and y.min() == -8.0 and len(x) == len(y) == 3
    assert math.isclose(float(y[1]), -1.0)


@pytest.fixture
def collected_free_table():
    """A hand-made workload: the best program, one twice as slow, one failed."""
    from altenv.dataset.store import WorkloadData, program_table

    meta = {"name": "gmm-000", "spec": "gmm:M=4,N=4,K=4", "knobs": [
        {"name": "mt", "extent": 4}, {"name": "nt", "extent": 4}, {"name": "kt", "extent": 4}],
        "layouts": [{"factors": {"mt": 1, "nt": 1, "kt": 1}, "framework": True,
                     "subspaces": []}], "workload_features": [0.0] * 26}
    rows = [{"layout": 0, "origin": "sample", "decisions": [i], "encoding": [0.1 * i],
             "features": [0] * 400, "latencies": lat, "latency": float(np.median(lat))
             if lat else math.inf, "error": None if lat else "crash", "reference": 1e-3,
             "timestamp": 0.0, "build_seconds": 0.1}
            for i, lat in enumerate([[1e-3] * 5, [2e-3] * 5, []])]
    table = program_table(rows, meta)
    return WorkloadData(meta, table)


@pytest.mark.slow
@DATASET
def test_altenv_train_pretrains_ppo_on_a_replayed_dataset(collected, tmp_path, capsys):
    from altenv.cli import main

    config = tmp_path / "train.yaml"
    config.write_text(
        "name: replayed\n"
        f"pretrain: {{reward_source: dataset, dataset: {collected.path}, timesteps: 64,\n"
        "           envs: 1, batch: 4}\n"
        "agent: {name: ppo, options: {checkpoint: null, walk_length: 2, loop_rounds: 1,\n"
        "                             n_steps: 16, batch_size: 16}}\n")
    assert main(["train", str(config), "--output-dir", str(tmp_path), "--quiet"]) == 0
    state = json.loads((tmp_path / "replayed" / "train-state.json").read_text())
    assert state["pretrain_steps"] >= 64
    assert state["pretrain_workloads"] == [f"altenv://tiny/{n}" for n, _ in WORKLOADS]
    assert (tmp_path / "replayed" / "checkpoint" / "policy.npz").is_file()
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\npretrain: {reward_source: dataset, dataset: nope, "
                   "timesteps: 8}\n")
    assert main(["train", str(bad), "--output-dir", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pretrain" in err[0] and "'nope'" in err[0]
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
@DATASET
def test_replay_measurer_answers_from_the_dataset(collected):
    from altenv.dataset.measurer import ReplayMeasurer
    from altenv.measure import MeasureCandidate, ProgramPoint

    measurer = ReplayMeasurer(collected, seed=0)
    w = collected.load("gmm-000")
    row = 5
    layout = w.layouts[int(w.layout[row])]
    point = ProgramPoint(w.spec, freeze(layout["factors"]), w.decisions[row],
                         tuple(w.encoding[row].tolist()))
    (rounds,) = measurer.retime([MeasureCandidate(None, point=point)], rounds=8)
    assert all(r.latencies[0] in w.latencies[row] for r in rounds)
    assert measurer.replayed == 8 and measurer.predicted == 0
    off = ProgramPoint(w.spec, point.factors, tuple(v + 1000 for v in point.decisions),
                       point.encoding)
    (pred,) = measurer.measure([MeasureCandidate(None, point=off)])
    assert measurer.predicted == 1 and pred.median >= w.best * (1 - 1e-6)
    with pytest.raises(ValueError, match="not in dataset"):
        measurer.measure([MeasureCandidate(None, point=ProgramPoint(
            "gmm:M=1,N=1,K=999", point.factors, point.decisions, point.encoding))])


@pytest.mark.slow
@DATASET
def test_bench_offline_runs_bench_ops_cells_on_the_replay(collected, tmp_path, capsys):
    from altenv.cli import main

    out = tmp_path / "offline"
    assert main(["bench", "offline", "--dataset", str(collected.path), "--tuners", "random",
                 "--seeds", "2", "--budgets", "4", "--filter", "gmm", "--output", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "random" in printed and (out / "regret.png").is_file()
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["workload"], r["seed"], r["budget"]) for r in rows] == [
        ("gmm-000", "0", "4"), ("gmm-000", "1", "4")]
    assert all(float(r["regret"]) >= -1e-9 and int(r["trials"]) == 4 for r in rows)
    records = RecordDB(out / "b4" / "gmm-000" / "random-seed0" / "records.jsonl")
    assert records.count() == 4  # bench ops' own cell, its records
    # the layouts the cell measured, and its best program's
    measured = [r for r in records.records() if math.isfinite(r.median)]
    best = min(measured, key=lambda r: r.median).layouts["factors"]
    assert int(rows[0]["layouts"]) == len({tuple(sorted(r.layouts["factors"].items()))
                                           for r in records.records()})
    assert rows[0]["best_layout"] == " ".join(f"{k}={v}" for k, v in best.items())
    assert main(["bench", "offline", "--dataset", str(collected.path), "--tuners",
                 "metaschedule", "--output", str(out)]) == 2
    assert "metaschedule has no replay" in capsys.readouterr().err
    # the same cells in two processes at once: the same rows
    apart = tmp_path / "apart"
    assert main(["bench", "offline", "--dataset", str(collected.path), "--tuners", "random",
                 "--seeds", "2", "--budgets", "4", "--filter", "gmm", "--output", str(apart),
                 "--quiet", "--jobs", "2"]) == 0
    again = list(csv.DictReader((apart / "results.csv").open()))
    assert [(r["workload"], r["seed"], r["regret"], r["replayed"], r["predicted"])
            for r in again] == [(r["workload"], r["seed"], r["regret"], r["replayed"],
                                 r["predicted"]) for r in rows]


@pytest.mark.slow
@DATASET
def test_an_interrupted_offline_run_stops_its_processes_and_resumes(collected, tmp_path,
                                                                    monkeypatch):
    """Interrupted after its first cell, a two-process run leaves no process running;
    the next run finishes every cell, none measured twice."""
    import multiprocessing

    from altenv.bench import offline

    def interrupted(futures, **_):
        yield futures[0]
        raise KeyboardInterrupt

    out = tmp_path / "offline"
    seeds = 6
    args = dict(tuners=["random"], seeds=seeds, budgets=[4], output=out, pattern="gmm")
    cells = [out / "b4" / "gmm-000" / f"random-seed{seed}" / "records.jsonl"
             for seed in range(seeds)]
    monkeypatch.setattr(offline, "tqdm", interrupted)
    with pytest.raises(KeyboardInterrupt):
        offline.run_offline(collected, jobs=2, **args)
    assert not multiprocessing.active_children()
    assert not (out / "results.csv").exists()
    # the queued cells were dropped, not tuned before the interrupt got through
    assert sum(path.is_file() and RecordDB(path).count() == 4 for path in cells) < seeds
    monkeypatch.undo()
    rows = offline.run_offline(collected, jobs=1, **args)
    assert [int(r["trials"]) for r in rows] == [4] * seeds
    for path in cells:
        records = RecordDB(path)
        assert records.count() == 4 and len({r.key for r in records.records()}) == 4


@pytest.mark.slow
@DATASET
def test_an_offline_evolution_cell_repeats_from_its_seed(collected, tmp_path):
    """MetaSchedule's search in the loop-only stage included (a replay runs it on one
    thread: with more, its threads take candidates as they free up)."""
    from altenv.cli import main

    keys = []
    for run in ("a", "b"):
        out = tmp_path / run
        assert main(["bench", "offline", "--dataset", str(collected.path), "--tuners", "evo",
                     "--agent", "evo=evolution{ms_population: 64, ms_batch: 8}",
                     "--seeds", "1", "--budgets", "40", "--filter", "gmm-000",
                     "--output", str(out), "--quiet"]) == 0
        db = RecordDB(out / "b40" / "gmm-000" / "evo-seed0" / "records.jsonl")
        keys.append([r.key for r in db.records()])
    assert len(keys[0]) == 40 and keys[0] == keys[1]


@pytest.mark.slow
@DATASET
def test_a_batch_disturbed_by_other_work_is_timed_again(tmp_path, monkeypatch):
    from altenv.dataset import collect as collection

    busy = iter([1.5, 0.0, 0.0, 0.0])  # others used 1.5 cores while the first batch ran
    monkeypatch.setattr(collection, "wait_for_quiet_host", lambda: 0.0)
    monkeypatch.setattr(collection.OtherLoad, "since", lambda self, start: next(busy, 0.0))
    plan = Plan(layouts=1, samples=3, searched=1, rounds=5, reference_every=1e9)
    measurer = CountingMeasurer()
    try:
        collect(tmp_path / "ds", WORKLOADS[:1], plan, TIMING, measurer=measurer,
                progress=False)
    finally:
        measurer.close()
    w = Dataset.open(tmp_path / "ds").load("gmm-000")
    # the reference (1), the sampled batch twice (3 + 3), the searched batch (1)
    assert measurer.built == 1 + 2 * 3 + len(w) - 3
    assert len(w) == 4 and np.isfinite(w.latency).all()


@pytest.mark.slow
@DATASET
def test_a_workload_the_host_drifted_under_is_collected_again(tmp_path, monkeypatch):
    from altenv.dataset import collect as collection

    drifts = iter([2.0, 1.0])  # the reference moved 2x during the first collection
    monkeypatch.setattr(collection, "reference_drift", lambda rows: next(drifts, 1.0))
    plan = Plan(layouts=1, samples=3, searched=0, rounds=5, reference_every=1e9,
                quiet_host=False)
    measurer = CountingMeasurer()
    try:
        collect(tmp_path / "ds", WORKLOADS[:1], plan, TIMING, measurer=measurer,
                progress=False)
    finally:
        measurer.close()
    journal = tmp_path / "ds" / "journal"
    assert (journal / "gmm-000.drifted-0.jsonl").is_file()
    assert measurer.built == 1 + 3 + 3  # the reference, the workload twice
    assert len(Dataset.open(tmp_path / "ds").load("gmm-000")) == 3


@pytest.mark.slow
@DATASET
def test_a_clone_without_the_journal_keeps_the_reference_history(tmp_path):
    """The journal is not shipped: a collection resumed from a clone adds its reference
    timings to those of ``reference.parquet`` instead of replacing them."""
    import shutil

    plan = Plan(layouts=1, samples=2, searched=0, rounds=2, reference_every=1e9,
                quiet_host=False)
    measurer = CountingMeasurer()
    try:
        collect(tmp_path / "ds", WORKLOADS[:1], plan, TIMING, measurer=measurer,
                progress=False)
        (first,) = Dataset.open(tmp_path / "ds").reference().to_pylist()
        shutil.rmtree(tmp_path / "ds" / "journal")
        collect(tmp_path / "ds", WORKLOADS, plan, TIMING, measurer=measurer, progress=False)
    finally:
        measurer.close()
    history = Dataset.open(tmp_path / "ds").reference().to_pylist()
    assert len(history) == 2 and history[0] == first


@pytest.mark.slow
@DATASET
def test_a_dataset_timed_on_another_target_is_not_added_to(collected, tmp_path):
    """A clone of a dataset resumed on another kind of CPU is refused (one line), and
    nothing of it changes."""
    import shutil

    from altenv.errors import UserError

    clone = tmp_path / "clone"
    shutil.copytree(collected.path, clone, ignore=shutil.ignore_patterns("journal", ".lock"))
    card = json.loads((clone / "card.json").read_text())
    card["target"] = '{"kind":"llvm","mcpu":"znver3","num-cores":2}'
    (clone / "card.json").write_text(json.dumps(card))
    before = sorted(p.name for p in clone.rglob("*"))
    with pytest.raises(UserError, match="timed on target .*znver3.*one kind of hardware"):
        collect(clone, [*WORKLOADS, ("gmm-001", "gmm:M=8,N=16,K=32")], PLAN, TIMING,
                measurer=StandInMeasurer(None), progress=False)
    assert sorted(p.name for p in clone.rglob("*")) == before


class KilledSearchMeasurer(CountingMeasurer):
    """Counts single timings too (a search's trials) and raises after ``kill_at`` of them."""

    def __init__(self, kill_at: int | None = None):
        super().__init__()
        self.trials = 0
        self.kill_at = kill_at

    def measure(self, candidates):
        if self.kill_at is not None and self.trials >= self.kill_at:
            raise KeyboardInterrupt("killed")
        self.trials += len(candidates)
        return super().measure(candidates)


@pytest.mark.slow
@DATASET
def test_a_search_adds_its_bests_to_a_collected_workload_and_resumes(collected, tmp_path):
    """A collection asking for a search gives a workload collected without one its search:
    the old rows stay as they were and the search's fastest programs not among them join
    them, checked and timed in rounds; killed mid-search, it resumes from the search's
    records, seeded as before. An unknown workload name is refused."""
    import shutil

    import agents
    from altenv.errors import UserError

    clone = tmp_path / "clone"
    shutil.copytree(collected.path, clone, ignore=shutil.ignore_patterns("journal", ".lock"))
    before = Dataset.open(clone).load("gmm-000")
    plan = Plan(**{**vars(PLAN), "search_trials": 16, "bests": 3, "search_agent": "evolution"})
    seeds = []

    def agent(seed):
        seeds.append(seed)
        return agents.create("evolution", seed=seed, ms_population=32, population=16,
                             children=16, samples=16)

    with pytest.raises(UserError, match="workload: 'nope' is not one of .*gmm-000"):
        collect(clone, WORKLOADS, plan, TIMING, measurer=StandInMeasurer(None),
                progress=False, agent=agent, only=["nope"])
    killed, resumed = KilledSearchMeasurer(kill_at=8), KilledSearchMeasurer()
    try:
        with pytest.raises(KeyboardInterrupt):
            collect(clone, WORKLOADS, plan, TIMING, measurer=killed, progress=False,
                    agent=agent, only=["gmm-000"])
        collect(clone, WORKLOADS, plan, TIMING, measurer=resumed, progress=False,
                agent=agent, only=["gmm-000"])
    finally:
        killed.close()
        resumed.close()
    assert seeds[0] == seeds[1]  # the resumed search is the same search
    assert seeds[0] >= 1_000_000  # never a benchmark cell's seed
    assert killed.trials + resumed.trials == 16  # no trial measured twice
    after = Dataset.open(clone).load("gmm-000")
    assert after.table.slice(0, len(before)).equals(before.table)  # old rows untouched
    new = after.table.slice(len(before)).to_pylist()
    bests = [r for r in new if r["origin"] == "best"]
    trials = [r for r in new if r["origin"] == "trial"]
    assert 1 <= len(bests) <= 3 and len(bests) + len(trials) == len(new)
    assert all(len(r["latencies"]) == PLAN.rounds and r["error"] is None for r in bests)
    assert all(len(r["latencies"]) <= 1 for r in trials)  # the search's own timing
    # built once each: the reference, the resumed trials, the bests (timed in rounds)
    assert resumed.built == 1 + resumed.trials + len(bests)
    assert len(after.layouts) >= len(before.layouts) and all(
        r["layout"] < len(after.layouts) for r in new)  # a layout the search found joins
    keys = [(r["layout"], tuple(r["decisions"])) for r in new]
    assert len(set(keys)) == len(keys) and not set(keys) & set(
        zip(before.layout.tolist(), before.decisions))
    assert after.meta["search"] == {"agent": "evolution", "trials": 16, "measured": 16,
                                    "bests": len(bests), "trial_rows": len(trials)}
    assert after.best <= before.best
    assert "search" not in Dataset.open(clone).meta("dep-000")  # not asked for this time
    again = StandInMeasurer(None)  # a collection asked again measures nothing new
    collect(clone, WORKLOADS, plan, TIMING, measurer=again, progress=False, agent=agent,
            only=["gmm-000"])
    assert again.batches == 0 and len(Dataset.open(clone).load("gmm-000")) == len(after)
    search = RecordDB(clone / "journal" / "gmm-000.search.jsonl")
    assert len(search.records()) == 16
    search.close()


class StandInMeasurer:
    """Builds nothing: every candidate 1 ms a round, "timed" where ``timed_on`` says."""

    def __init__(self, timed_on: str | None):
        self.timed_on = timed_on
        self.batches = 0

    def retime(self, candidates, rounds, cold=False):
        self.batches += 1
        return [[MeasureResult(latencies=[1e-3]) for _ in range(rounds)] for _ in candidates]


@pytest.mark.parametrize("timed_on", [None, "rpc tracker 127.0.0.1:9190, key k"])
def test_only_timings_on_this_host_wait_for_a_quiet_host(tmp_path, monkeypatch, timed_on):
    """On a busy host, a measurer timing here waits before each timing and re-times its
    batch; one timing elsewhere (RPC devices, a Ray cluster) does neither, and the card
    says where the timings come from."""
    from altenv.dataset import collect as collection
    from altenv.dataset.info import format_info

    waits: list[float] = []
    monkeypatch.setattr(collection, "wait_for_quiet_host", lambda: waits.append(0.0) or 0.0)
    monkeypatch.setattr(collection.OtherLoad, "since", lambda self, start: 4.0)
    plan = Plan(layouts=1, samples=3, searched=0, rounds=5, reference_every=1e9)
    measurer = StandInMeasurer(timed_on)
    collect(tmp_path / "ds", WORKLOADS[:1], plan, TIMING, measurer=measurer, progress=False)
    here = timed_on is None
    timings = 1 + collection.RETRIES if here else 1  # of the sampled batch
    assert len(waits) == (timings if here else 0)
    assert measurer.batches == 1 + timings  # and the reference's, once
    card = Dataset.open(tmp_path / "ds").card
    assert card["plan"]["quiet_host"] and card["timed_on"] == (timed_on or "host")
    assert (f"(timed on {timed_on})" in format_info(str(tmp_path / "ds"))) == bool(timed_on)


def test_rpc_devices_and_ray_clusters_time_elsewhere_but_ray_local():
    """What each measurer's ``timed_on`` says of its settings (read without starting its
    workers or joining a cluster)."""
    from types import SimpleNamespace

    from altenv.cluster.settings import RaySettings

    assert LocalMeasurer.timed_on.fget(SimpleNamespace()) is None
    rpc = MeasureConfig(rpc={"tracker": "127.0.0.1:9190", "key": "k"})
    assert RPCMeasurer.timed_on.fget(SimpleNamespace(config=rpc)) == \
        "rpc tracker 127.0.0.1:9190, key k"
    pytest.importorskip("ray")
    from altenv.cluster.measurer import RayMeasurer

    def ray(address: str) -> str | None:
        return RayMeasurer.timed_on.fget(SimpleNamespace(settings=RaySettings(address=address)))

    assert ray("HEAD:6379") == "ray cluster HEAD:6379" and ray("local") is None


def test_dataset_config_takes_ray_and_refuses_bad_values(tmp_path, capsys):
    """``ray:`` in a dataset config (``--ray`` overrides its address); a bad value is one
    line naming the field, exit 2, and no dataset directory."""
    from altenv.cli import main
    from altenv.config import DatasetConfig, load_config

    config, out = tmp_path / "ds.yaml", tmp_path / "ds"
    head = f"output: {out}\nworkloads: ['gmm:M=16,N=16,K=16']\n"
    config.write_text(head + "ray: {address: 'HEAD:6379', build_cpus: 2}\n")
    cfg = load_config(config, DatasetConfig, **{"ray.address": "auto"})
    assert (cfg.ray.address, cfg.ray.build_cpus) == ("auto", 2)
    assert load_config(None, DatasetConfig, output="x", workloads=["gmm:M=16,N=16,K=16"]
                       ).ray is None
    for ray, field in [("{address: ''}", "ray.address"),
                       ("{address: local, build_cpus: 0}", "ray.build_cpus"),
                       ("{address: local, adress: x}", "ray.adress"), ("local", "ray")]:
        config.write_text(head + f"ray: {ray}\n")
        assert main(["dataset", "collect", str(config), "--quiet"]) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert f"config {config}: {field}: " in err
    config.write_text(head + "measure: {rpc: {tracker: '127.0.0.1:9190', key: k}}\n")
    assert main(["dataset", "collect", str(config), "--ray", "local", "--quiet"]) == 2
    assert "measure.rpc is allowed only without ray" in capsys.readouterr().err
    config.write_text(head)
    assert main(["dataset", "collect", str(config), "--ray", "127.0.0.1:1", "--quiet"]) == 2
    assert "ray.address: nothing answers at '127.0.0.1:1'" in capsys.readouterr().err
    assert not out.exists()


def test_unread_subspaces_take_canonical_values():
    from altenv.dataset.replay import LayoutReplay
    from altenv.dataset.store import WorkloadData, program_table
    from altenv.space.subspace import TileSubspace

    tile = TileSubspace(name="1:PerfectTile", extent=12, levels=3, max_innermost=4)
    assert tile.is_valid(tile.canonical)
    entry = {"factors": {"mt": 1}, "subspaces": [
        {"type": "DesignSubspace", "name": "design", "count": 2},
        {"type": "TileSubspace", "name": "1:PerfectTile", "extent": 12, "levels": 3,
         "max_innermost": 4},
        {"type": "CategoricalSubspace", "name": "2:Categorical", "candidates": [0, 16, 64]}],
        "designs": [[1, 2], [1]]}  # design 1 does not read the categorical
    meta = {"name": "w", "spec": "gmm:M=4,N=4,K=4", "knobs": [], "layouts": [entry],
            "workload_features": []}
    data = WorkloadData(meta, program_table([], meta))
    layout = LayoutReplay(0, entry, np.zeros(0, dtype=np.int64), data)
    assert layout.canonical([(1,), (3, 2, 2), (2,)]) == (1, 3, 2, 2, 0)
    assert layout.canonical([(0,), (3, 2, 2), (2,)]) == (0, 3, 2, 2, 2)
    # a move to design 1 leaves the categorical unread: canonical, whatever it held
    assert layout.step((0, 3, 2, 2, 2), [1, 0, 0]) == (1, 3, 2, 2, 0)


def test_other_load_sees_work_outside_the_process_tree():
    import subprocess
    import time

    from altenv.dataset.collect import OtherLoad

    load = OtherLoad()
    before = load.reading()
    # a process that is not ours: started by a shell that exits at once (reparented)
    subprocess.run(["sh", "-c", "python3 -c 'import time\nt = time.time()\n"
                    "while time.time() - t < 1.5: pass' >/dev/null 2>&1 &"], check=True)
    time.sleep(1.5)
    assert load.since(before) >= 0.6


def test_the_shipped_dataset_loads_lazily_and_replays():
    """A slice of the shipped cpu-v0: its card, one workload's rows without the others',
    its URIs, and the default replay env on it."""
    from altenv.datapath import DEFAULT_DATASET, dataset_dir

    data = Dataset.open(dataset_dir(DEFAULT_DATASET))
    names = data.workloads()
    assert names and data.card["counts"]["workloads"] == len(names)
    assert (data.path / "surrogate.ubj.gz").is_file()  # shipped with it: no fit at env start
    first = data.load(names[0])
    timed = [len(t) for t, o in zip(first.latencies, first.origin) if len(t) and o != "trial"]
    assert len(first) >= 200 and min(timed) >= 5  # interleaved rounds; a trial: one timing
    assert all(len(t) <= 1 for t, o in zip(first.latencies, first.origin) if o == "trial")
    assert first.layouts[first.framework_layout()]["framework"]
    assert str(parse_workload(f"altenv://{data.name}/{names[0]}")) == first.spec
    env = gym.make("altenv/CrossExploration-v0", reward_source="dataset",
                   workload=f"altenv://{data.name}/{names[0]}", walk_length=4, batch=8)
    obs, info = env.reset(seed=0)
    assert info["workload"] == f"altenv://{data.name}/{names[0]}"
    for _ in range(12):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs) and 0.0 <= reward <= 4.0


@pytest.mark.slow
@DATASET
def test_dataset_best_measures_the_datas_fastest_programs_in_order(collected, tmp_path,
                                                                     monkeypatch, capsys):
    """`bench ops` with the dataset's best as a tuner: it measures the dataset's fastest
    programs of the workload, fastest first, and the bench re-times its pick beside
    another tuner's; `bench agree` then sets that run beside the same tuner offline."""
    from altenv.cli import main

    monkeypatch.setenv("ALTENV_DATASETS", str(collected.path.parent))
    out = tmp_path / "bench"
    assert main(["bench", "ops", "--workload", "altenv://tiny/gmm-000", "--tuners",
                 "data,random", "--agent", "data=dataset_best{dataset: tiny, top: 3}",
                 "--versus", "data", "--budget", "6", "--output", str(out), "--quiet"]) == 0
    assert "data" in capsys.readouterr().out
    (records,) = out.glob("*/data-seed0/records.jsonl")
    measured = [(freeze(r.layouts["factors"]), tuple(r.decisions))
                for r in RecordDB(records).records()]
    w = collected.load("gmm-000")
    fastest = np.argsort(w.latency)[:3]
    assert measured == [(freeze(w.layouts[int(w.layout[i])]["factors"]), w.decisions[i])
                        for i in fastest]

    # the same tuner offline, and the two runs compared: every ratio is the run's own
    offline = tmp_path / "offline"
    assert main(["bench", "offline", "--dataset", str(collected.path), "--tuners", "random",
                 "--seeds", "1", "--budgets", "6", "--filter", "gmm", "--output",
                 str(offline), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["bench", "agree", "--dataset", "tiny", "--offline", str(offline),
                 "--hardware", str(out), "--budget", "6"]) == 0
    assert "Kendall tau" in capsys.readouterr().out
    (cell,) = csv.DictReader((out / "agree.csv").open())
    (hw,) = [r for r in csv.DictReader((out / "results.csv").open()) if r["tuner"] == "random"]
    (off,) = csv.DictReader((offline / "results.csv").open())
    assert (cell["workload"], cell["tuner"]) == ("gmm-000", "random")
    assert float(cell["hardware"]) == pytest.approx(1 / float(hw["speedup_vs_data"]), 1e-4)
    assert float(cell["offline"]) == pytest.approx(1 + float(off["regret"]))
    (trials,) = csv.DictReader((out / "agree-trials.csv").open())
    (random_records,) = out.glob("*/random-seed0/records.jsonl")
    assert int(trials["predicted"]) + int(trials["in_dataset"]) <= RecordDB(
        random_records).count()
    assert (out / "agree.png").is_file()
    assert main(["bench", "agree", "--dataset", "tiny", "--offline", str(tmp_path / "none"),
                 "--hardware", str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
@DATASET
def test_dataset_best_refuses_a_workload_the_dataset_lacks(collected, tmp_path):
    import agents
    from altenv.tuning import OpTask, TuningSession

    agent = agents.create("dataset_best", dataset=str(collected.path))
    with RecordDB(tmp_path / "records.jsonl") as db:
        session = TuningSession(OpTask("gmm:M=8,N=8,K=8"), None, db)
        with pytest.raises(ValueError, match="gmm:M=8,N=8,K=8 is not in dataset tiny"):
            agent.setup(session)
