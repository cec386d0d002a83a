"""Cost model: loop-nest features, ranking quality on measured records, workload
normalization, save/load."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.s_tir import Schedule

from altenv.costmodel import (
    FEATURE_LENGTH,
    NEST_FEATURES,
    NEST_LOOPS,
    PER_STORE_FEATURES,
    CostModel,
    extract_features,
    loop_nest_features,
    top_k,
)
from altenv.space import LoopSpace
from altenv.space.subspace import TileSubspace
from altenv.target import make_target, target_cores, use_tvm_threads
from altenv.tuning import OpTask

SIZE = 128


def _matmul(n: int, transposed_b: bool = False) -> tvm.tirx.PrimFunc:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    if transposed_b:  # the same workload with B stored as N x K
        c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[j, k], axis=k), name="C")
    else:
        c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, c])


@pytest.fixture(scope="session")
def target() -> tvm.target.Target:
    return make_target(None)


@pytest.fixture(scope="session")
def matmul_records(target) -> tuple[list[np.ndarray], np.ndarray]:
    """60 sampled schedules of a 128^3 matmul, built and timed on this CPU.

    Timed on one thread, as the minimum of several >= 20 ms repeats: the test suite runs
    two workers on two cores, and a spinning thread pool on a shared core turns medians
    into noise."""
    space = LoopSpace(_matmul(SIZE), target)
    points = space.sample(60, seed=1)
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, (SIZE, SIZE)).astype("float32") for _ in range(2))
    args = [tvm.runtime.tensor(x, dev) for x in (a, b, np.zeros((SIZE, SIZE), "float32"))]
    latencies = []
    use_tvm_threads(1)
    try:
        for point in points:
            lib = tvm.compile(space.decode(point).mod, target=target).jit()
            timer = lib.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=20)
            latencies.append(float(np.min(timer(*args).results)))
    finally:
        use_tvm_threads(target_cores(target))
    np.testing.assert_allclose(args[2].numpy(), a @ b, rtol=1e-4, atol=1e-4)
    return extract_features(space.context, [space.decode(p) for p in points]), np.array(latencies)


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


@pytest.mark.slow
def test_ranks_held_out_records_better_than_random(matmul_records):
    """3-fold cross-validation on real measurements, five shuffles: the predicted order
    correlates with the measured throughput (a random order has Spearman 0), and the
    top-10 it would send to the device are faster on average than the average record
    (what ALT's top-k selection needs; a random pick has ratio 1)."""
    features, latencies = matmul_records
    n, k = len(latencies), 10
    throughput = 1.0 / latencies
    spearmans, gains = [], []
    for seed in range(5):
        order = np.random.default_rng(seed).permutation(n)
        scores = np.zeros(n)
        for fold in np.array_split(order, 3):
            train = np.setdiff1d(order, fold)
            model = CostModel()
            model.update("matmul", [features[i] for i in train], latencies[train])
            scores[fold] = model.predict([features[i] for i in fold])
        spearmans.append(_spearman(scores, -latencies))
        gains.append(float(throughput[top_k(scores, k)].mean() / throughput.mean()))
    print(f"spearman {spearmans}, top-{k} throughput / mean {gains}")
    assert np.mean(spearmans) > 0.1, spearmans
    assert np.mean(gains) > 1.0, gains


@pytest.fixture(scope="module")
def layouts(target) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Features of sampled schedules of one 64^3 matmul workload in two layouts of B."""
    out = []
    for transposed in (False, True):
        space = LoopSpace(_matmul(64, transposed), target)
        out.append(extract_features(space.context,
                                    [space.decode(p) for p in space.sample(12, seed=2)]))
    return out[0], out[1]


def test_scores_are_relative_to_the_workload_best_across_layouts(layouts):
    plain, transposed = layouts
    model = CostModel(retrain_growth=0.0)
    model.update("mm64", plain, [1e-3] * len(plain))
    model.update("mm64", transposed, [2e-3] * len(transposed))
    assert model.num_records == len(plain) + len(transposed)
    # one workload: the slower layout scores about half of the faster one
    assert model.predict(plain).mean() == pytest.approx(1.0, abs=0.1)
    assert model.predict(transposed).mean() == pytest.approx(0.5, abs=0.1)


def test_failed_measurements_do_not_shift_the_best(layouts):
    plain, _ = layouts
    model = CostModel()
    model.update("mm64", plain, [1e-3] * 6 + [None, float("inf"), -1.0] + [2e-3] * 3)
    assert model.num_records == len(plain)
    scores = model.predict(plain)
    assert scores[:6].mean() == pytest.approx(1.0, abs=0.15)
    assert scores[9:].mean() == pytest.approx(0.5, abs=0.15)


def test_untrained_model_predicts_random_scores(layouts):
    model = CostModel(seed=3)
    scores = model.predict(layouts[0])
    assert not model.is_trained and scores.shape == (len(layouts[0]),)
    assert np.all((scores >= 0) & (scores < 1)) and np.ptp(scores) > 0


def test_save_load_round_trip(layouts, tmp_path):
    plain, transposed = layouts
    model = CostModel()
    model.update("mm64", plain, np.linspace(1e-3, 3e-3, len(plain)))
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = CostModel.load(path)
    assert loaded.num_records == model.num_records and loaded.is_trained
    np.testing.assert_allclose(loaded.predict(transposed), model.predict(transposed))
    loaded.update("mm64", transposed, [5e-3] * len(transposed))
    assert loaded.num_records == len(plain) + len(transposed)


def test_a_model_saved_with_other_features_is_refused(layouts, tmp_path):
    model = CostModel()
    model.update("mm64", layouts[0], np.linspace(1e-3, 3e-3, len(layouts[0])))
    path = tmp_path / "model.npz"
    model.save(path)
    with np.load(path) as data:  # as saved before the loop-nest features existed
        arrays = dict(data)
    settings = json.loads(str(arrays["settings"]))
    del settings["feature_length"]
    arrays["settings"] = np.array(json.dumps(settings))
    arrays["rows"] = arrays["rows"][:, :PER_STORE_FEATURES]
    np.savez_compressed(path, **arrays)
    with pytest.raises(ValueError, match=f"164 features per store.*extracts {FEATURE_LENGTH}"):
        CostModel.load(path)


def test_loop_nest_features_describe_the_loops_around_the_reduction():
    sch = Schedule(tvm.IRModule({"main": _matmul(32)}))
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    i0, i1 = sch.split(i, [4, 8])
    k0, k1 = sch.split(k, [8, 4])
    sch.reorder(i0, j, k0, i1, k1)
    sch.parallel(i0)
    rows = loop_nest_features(sch).reshape(NEST_LOOPS, NEST_FEATURES)
    # innermost first: k1, i1, k0, j, i0 (parallel); kinds are ForKind + 1
    expected = [(4, 1, 1), (8, 0, 1), (8, 1, 1), (32, 0, 1), (4, 0, 2)]
    np.testing.assert_allclose(rows[:5], [(np.log2(e + 1), r, kind) for e, r, kind in expected])
    assert not rows[5:].any()


@pytest.mark.slow
def test_features_tell_apart_programs_one_tile_move_apart(target):
    """Neighbours of sampled points of a grouped convolution (each one tile move away)
    are distinct programs; the loop-nest features tell every two of them apart, also
    where MetaSchedule's per-store features alone do not."""
    task = OpTask("grp:I=16,O=16,groups=4,H=14,W=14,KH=3,KW=3,pad=1", target)
    space = task.space(task.default_factors())
    points = set()
    for base in space.sample(3, seed=2):
        points.add(base)
        for index, sub in enumerate(space.subspaces):
            if isinstance(sub, TileSubspace):
                points.update(space.move(base, index, d) for d in range(1, sub.num_directions))
    schedules = [s for s in map(space.decode, points) if s is not None]
    programs = {s.mod.script() for s in schedules}
    features = extract_features(space.context, schedules)
    assert all(f.shape[1] == FEATURE_LENGTH for f in features)
    ours = {f.tobytes() for f in features}
    per_store = {f[:, :PER_STORE_FEATURES].tobytes() for f in features}
    assert len(programs) > 50
    assert len(ours) == len(programs) and len(per_store) < len(programs)


def test_top_k_picks_the_best_first():
    scores = np.array([0.1, 0.9, 0.5, 0.9, 0.3])
    assert top_k(scores, 3).tolist() == [1, 3, 2]
    assert top_k(scores, 10).tolist() == [1, 3, 2, 4, 0]


def test_update_checks_lengths(layouts):
    with pytest.raises(ValueError):
        CostModel().update("mm64", layouts[0], [1e-3])


def test_a_base_predicts_until_warmup_then_trees_are_added(layouts):
    plain, transposed = layouts
    base = CostModel(retrain_growth=0.0)
    base.update("mm", plain, np.linspace(1e-4, 2e-4, len(plain)))
    model = CostModel(base=base, base_warmup=len(plain) + 2, retrain_growth=0.0)
    np.testing.assert_allclose(model.predict(transposed), base.predict(transposed))
    model.update("other", plain, np.linspace(2e-4, 1e-4, len(plain)))
    assert model.booster is base.booster  # fewer records than the warm-up: the base alone
    model.update("other", transposed[:2], [1e-4, 1e-4])
    assert model.booster is not base.booster  # continued from the base on its own records
    assert model.booster.num_boosted_rounds() > base.booster.num_boosted_rounds()
    online = CostModel(retrain_growth=0.0)
    online.adopt(base)  # in place, as a run's shared model takes a checkpoint's
    np.testing.assert_allclose(online.predict(plain), base.predict(plain))
    with pytest.raises(ValueError, match="trained"):
        CostModel(base=CostModel())


def test_prediction_without_a_dmatrix_matches_packsum(layouts):
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum

    plain, _ = layouts
    model = CostModel(retrain_growth=0.0)
    model.update("mm", plain, np.linspace(1e-4, 2e-4, len(plain)))
    pack = PackSum(list(plain), None)
    expected = np.bincount(pack.ids, weights=model.booster.predict(pack.dmatrix))
    np.testing.assert_allclose(model.predict(plain), expected, rtol=1e-6)


def test_booster_only_save_and_loaded_booster_thread_count(layouts, tmp_path):
    plain, _ = layouts
    model = CostModel(retrain_growth=0.0)
    model.update("mm", plain, np.linspace(1e-4, 2e-4, len(plain)))
    model.save(tmp_path / "m.npz", records=False)
    loaded = CostModel.load(tmp_path / "m.npz")
    assert loaded.num_records == 0 and loaded.is_trained
    np.testing.assert_allclose(loaded.predict(plain), model.predict(plain), rtol=1e-6)
    config = json.loads(loaded.booster.save_config())
    assert config["learner"]["generic_param"]["nthread"] == "1"
